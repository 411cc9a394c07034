//! `outbox-sidecar events replay`: the CLI's form of a replay (the same
//! code path as `POST /admin/events/replay`). It runs the operation in the
//! foreground and prints its progress; if the command is killed, the
//! replica holding partition 0 carries it on from its cursor.

use std::io::Write;

use clap::Args;

use crate::cli::{open_store, EXIT_FAILED, EXIT_OK, EXIT_USAGE};
use crate::config::Settings;
use crate::operations::{Operations, Printed};
use crate::replay::{ReplayRefused, ReplayRequest};
use crate::store::history::{Caller, Via};

#[derive(Debug, Clone, Args)]
pub struct ReplayArgs {
    /// Only events of this name (repeat for several).
    #[arg(long = "event-name")]
    pub event_names: Vec<String>,
    /// Only events of this dispatcher's event names.
    #[arg(long)]
    pub dispatcher: Option<String>,
    /// Events sent at or after this time (RFC 3339, or "YYYY-MM-DD HH:MM[:SS]"
    /// in UTC); this or --sent-until is required.
    #[arg(long)]
    pub sent_since: Option<String>,
    /// Events sent before this time.
    #[arg(long)]
    pub sent_until: Option<String>,
    /// Only events of this aggregate ([ordering] on).
    #[arg(long)]
    pub aggregate: Option<String>,
    /// Only these ids (comma-separated).
    #[arg(long)]
    pub ids: Option<String>,
    /// Events a second (default 100; never above a dispatcher's `rate`).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Print the count, the first and last ids and a sample; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Confirm a replay of more than 1,000 events.
    #[arg(long)]
    pub yes: bool,
    /// Recorded with each replayed event in the attempt log (who, why).
    #[arg(long)]
    pub label: Option<String>,
    /// Cancel replay ID (any replica's): the rows it has not reached stay
    /// sent.
    #[arg(long, value_name = "ID", conflicts_with_all = ["dry_run", "yes"])]
    pub cancel: Option<String>,
}

/// Runs `events replay`.
pub async fn replay(settings: &Settings, args: ReplayArgs) -> i32 {
    let store = match open_store(settings).await {
        Ok(s) => s,
        Err(e) => return crate::cli::fail(&e),
    };
    // Its own name: a replica carries it on only once its heartbeat stops.
    let replica = format!(
        "{}-cli-{}",
        settings.history.replica_name(),
        std::process::id()
    );
    let ops = Operations::new(store, &replica);
    if let Some(id) = &args.cancel {
        return match ops.cancel(id).await {
            Ok(true) => {
                println!("replay {id}: cancel asked; it stops at its next step");
                match ops.print(Some(id), true).await {
                    Printed::Ok => EXIT_OK,
                    _ => EXIT_FAILED,
                }
            }
            Ok(false) => {
                eprintln!(
                    "error: no running operation {id:?} (`outbox-sidecar operations` lists the recent ones)"
                );
                EXIT_FAILED
            }
            Err(e) => crate::cli::fail(&e),
        };
    }
    let request = ReplayRequest {
        event_names: args.event_names,
        dispatcher: args.dispatcher,
        sent_since: args.sent_since,
        sent_until: args.sent_until,
        aggregate: args.aggregate,
        ids: args.ids,
        rate: args.rate,
    };
    let dispatchers = settings.dispatcher_events();
    let rates = settings.dispatcher_rates();
    let dry = match ops.replay_dry_run(&request, &dispatchers, &rates).await {
        Ok(d) => d,
        Err(ReplayRefused::Invalid(e)) => {
            eprintln!("error: {e}");
            return EXIT_USAGE;
        }
        Err(e) => return crate::cli::fail(&e),
    };
    let p = &dry.preview;
    if args.dry_run {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(
            out,
            "{} sent event(s) would be replayed at {}/s{}",
            p.count,
            dry.rate,
            match (p.first, p.last) {
                (Some(a), Some(b)) => format!(", ids {a}..{b}"),
                _ => String::new(),
            }
        );
        if !p.sample.is_empty() {
            let _ = writeln!(
                out,
                "the first: {}",
                p.sample
                    .iter()
                    .map(|i| i.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        return EXIT_OK;
    }
    if dry.confirm_required && !args.yes {
        eprintln!(
            "error: {} sent events match; add --yes to replay them (--dry-run shows a sample)",
            p.count
        );
        return EXIT_FAILED;
    }
    let caller = Caller::new(Via::Cli, args.label);
    let op = match ops
        .replay(&request, &dispatchers, &rates, Some(p.count), &caller)
        .await
    {
        Ok(op) => op,
        Err(ReplayRefused::Invalid(e)) => {
            eprintln!("error: {e}");
            return EXIT_USAGE;
        }
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_FAILED;
        }
    };
    println!(
        "replay {} started ({}); follow it with `outbox-sidecar operations {}`, stop it with \
         `outbox-sidecar events replay --cancel {}`",
        op.id, op.target, op.id, op.id
    );
    match ops.print(Some(&op.id), true).await {
        Printed::Ok => EXIT_OK,
        _ => EXIT_FAILED,
    }
}
