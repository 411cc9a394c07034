//! The command line of CONTRACT §8: parsing and the commands that need only
//! the database (`migrate`, `events list`, `events retry`, `config`).
//!
//! Exit codes: 0 success, 1 a refused or failed operation, 2 bad usage or
//! configuration.

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use entity::{OutboxEventRow, Status};

use std::fmt::Write as _;

use crate::config::Settings;
use crate::operator;
use crate::store::history::{Caller, Record, Via};
use crate::store::{ListFilter, RetryRefused, Store};

pub const EXIT_OK: i32 = 0;
pub const EXIT_FAILED: i32 = 1;
pub const EXIT_USAGE: i32 = 2;

#[derive(Debug, Parser)]
#[command(
    name = "outbox-sidecar",
    version,
    about = "Delivers outbox_events rows announced by Debezium on Kafka to HTTP receivers"
)]
pub struct Cli {
    /// The TOML configuration file (environment variables OUTBOX__SECTION__KEY override it).
    #[arg(long, global = true, env = "OUTBOX_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Consume the change events and dispatch pending rows (the main job).
    Run,
    /// Create or upgrade the outbox table; safe to run any number of times.
    Migrate,
    /// List, show, resend, retrigger events; prune the attempt log and old
    /// sent events.
    #[command(subcommand)]
    Events(EventsCommand),
    /// List, pause or resume dispatchers (group-wide).
    #[command(subcommand)]
    Dispatchers(DispatchersCommand),
    /// Show the operations started from the admin API or the console (a
    /// resume, retrigger or bulk resend): the recent ones, or one by id.
    Operations(OperationsArgs),
    /// Print the effective configuration, secrets replaced by ***.
    Config,
    /// Play R-004's decision table with everything embedded.
    Demo(DemoArgs),
}

#[derive(Debug, Args)]
pub struct OperationsArgs {
    /// One operation (e.g. op-20261207T180000-1a2b3c4d); none: the 20 most recent.
    pub id: Option<String>,
    /// With an id: print its progress every second until it ends; exit 1
    /// when it failed or was cut.
    #[arg(long, requires = "id")]
    pub wait: bool,
}

#[derive(Debug, Subcommand)]
pub enum EventsCommand {
    /// List events as a table.
    List {
        #[arg(long, value_parser = parse_status)]
        status: Option<Status>,
        #[arg(long)]
        event_name: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: u64,
        /// The next page: events with an id below this one (newest first).
        #[arg(long)]
        before: Option<i64>,
        /// Only pending events held behind a failed earlier event of their
        /// aggregate ([ordering], on_failed = "hold").
        #[arg(long)]
        held: bool,
    },
    /// Resend failed events: back to pending with 0 attempts.
    Retry {
        #[arg(required_unless_present = "all_failed", conflicts_with = "all_failed")]
        ids: Vec<i64>,
        /// Resend every failed event (narrowed by the filters below).
        #[arg(long)]
        all_failed: bool,
        /// With --all-failed: only events of this name.
        #[arg(long, requires = "all_failed")]
        event_name: Option<String>,
        /// With --all-failed: only events of this dispatcher's event names.
        #[arg(long, requires = "all_failed")]
        dispatcher: Option<String>,
        /// With --all-failed: only events whose last_error contains this text.
        #[arg(long, requires = "all_failed")]
        error_contains: Option<String>,
        /// With --all-failed: only events that failed at or after this time
        /// (RFC 3339, or "YYYY-MM-DD HH:MM[:SS]" in UTC).
        #[arg(long, requires = "all_failed")]
        failed_since: Option<String>,
        /// With --all-failed: only events that failed before this time.
        #[arg(long, requires = "all_failed")]
        failed_until: Option<String>,
        /// Print how many events would be resent and a sample; change nothing.
        #[arg(long, requires = "all_failed")]
        dry_run: bool,
        /// Confirm a resend of more than 1,000 events.
        #[arg(long, requires = "all_failed")]
        yes: bool,
        /// Recorded with each resend in the attempt log (who, why).
        #[arg(long)]
        label: Option<String>,
    },
    /// One event: the row, then its attempts and resends (the attempt log).
    Show { id: i64 },
    /// Send sent events again (the receiver lost them): back to pending in
    /// id order at --rate, as an operation that can be followed and
    /// cancelled; requests carry `Outbox-Replay: <operation id>`.
    Replay(crate::replay_cli::ReplayArgs),
    /// Why an event is not sent yet: the one reason, its evidence and what
    /// to do (a replica's GET /admin/events/{id}/why also sees its memory).
    Why { id: i64 },
    /// Delete attempt-log rows older than history.retention (or
    /// --older-than); with --sent-older-than, old sent outbox rows too.
    ///
    /// With --sent-older-than: delete the application's `sent` rows sent
    /// longer ago than that, with their attempt-log rows, in batches of
    /// --batch committed one by one; pending and failed rows are never
    /// touched. The attempt log is then pruned by age only when
    /// --older-than is given as well.
    Prune {
        /// Attempt-log rows older than this (e.g. 30d, 12h); default:
        /// history.retention (without --sent-older-than).
        #[arg(long)]
        older_than: Option<String>,
        /// Delete outbox rows with status sent and sent_at older than this
        /// (e.g. 30d), and their attempt-log rows.
        #[arg(long)]
        sent_older_than: Option<String>,
        /// With --sent-older-than: count the rows it would delete, delete
        /// nothing.
        #[arg(long, requires = "sent_older_than")]
        dry_run: bool,
        /// Rows deleted per statement (per transaction for sent rows).
        #[arg(long, default_value_t = 1000)]
        batch: u64,
    },
    /// Touch pending events (updated_at = now) so Debezium announces them
    /// again; no status or attempts change. The remedy for change events
    /// that are gone (an offset reset, a recreated connector).
    Retrigger {
        #[arg(
            required_unless_present = "pending_older_than",
            conflicts_with = "pending_older_than"
        )]
        ids: Vec<i64>,
        /// Every pending event unchanged for longer than this (e.g. 10m).
        #[arg(long)]
        pending_older_than: Option<String>,
        /// Only events of this name.
        #[arg(long)]
        event_name: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum DispatchersCommand {
    /// Each dispatcher, its event names and whether it is paused.
    List,
    /// Stop sending this dispatcher's events (every replica, within
    /// dispatch.pause_refresh): they stay pending, no attempt is used.
    Pause {
        name: String,
        /// Recorded with the pause (who, why).
        #[arg(long)]
        label: Option<String>,
    },
    /// Send again: the pause is lifted and the dispatcher's pending events
    /// are announced again through the change feed.
    Resume { name: String },
}

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// The delay between attempts (R-004: 5 s).
    #[arg(long, default_value = "5s", value_parser = crate::config::duration::parse)]
    pub retry_delay: std::time::Duration,
    /// Use this PostgreSQL database instead of an embedded SQLite file.
    #[arg(long)]
    pub database_url: Option<String>,
    /// Port of the admin/metrics listener (0 picks a free one).
    #[arg(long, default_value_t = 0)]
    pub admin_port: u16,
}

fn parse_status(s: &str) -> Result<Status, String> {
    s.parse::<Status>().map_err(|e| e.to_string())
}

/// Connects to the configured database.
pub async fn open_store(settings: &Settings) -> Result<Store, crate::store::StoreError> {
    Store::open(settings).await
}

pub async fn migrate(settings: &Settings) -> i32 {
    let store = match open_store(settings).await {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    if let Err(e) = store.migrate().await {
        return fail(&e);
    }
    // An existing table (the application's) is left as it is: say whether
    // the sidecar can work with it.
    let checked = match store.check_table().await {
        Ok(()) => store.check_own_tables().await,
        Err(e) => Err(e),
    };
    match checked {
        Ok(()) => {
            println!("table {} is up to date", store.table());
            EXIT_OK
        }
        Err(crate::store::TableError::Store(e)) => fail(&e),
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_USAGE
        }
    }
}

pub async fn events(settings: &Settings, cmd: EventsCommand) -> i32 {
    if let EventsCommand::Replay(args) = cmd {
        return crate::replay_cli::replay(settings, args).await;
    }
    let store = match open_store(settings).await {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    match cmd {
        EventsCommand::List {
            status,
            event_name,
            limit,
            before,
            held,
        } => {
            if held && store.ordering().is_none() {
                eprintln!(
                    "error: --held: {}",
                    crate::store::ordering::HELD_NEEDS_ORDERING
                );
                return EXIT_USAGE;
            }
            let filter = ListFilter {
                status,
                event_name,
                limit: Some(limit),
                before,
                held,
                ..ListFilter::default()
            };
            match store.list(&filter).await {
                Ok(rows) => {
                    let mut out = std::io::stdout().lock();
                    let _ = out.write_all(render_table(&rows).as_bytes());
                    if let Some(last) = rows.last().filter(|_| rows.len() as u64 == limit) {
                        let _ = writeln!(out, "(more: --before {})", last.id);
                    }
                    EXIT_OK
                }
                Err(e) => fail(&e),
            }
        }
        EventsCommand::Retry {
            ids,
            all_failed: true,
            event_name,
            dispatcher,
            error_contains,
            failed_since,
            failed_until,
            dry_run,
            yes,
            label,
        } => {
            debug_assert!(ids.is_empty());
            let filters = crate::operator::ResendFilters {
                event_name,
                dispatcher,
                error_contains,
                failed_since,
                failed_until,
            };
            let filter = match filters.to_filter(&settings.dispatcher_events()) {
                Ok(f) => f,
                Err(e) => {
                    eprintln!("error: {e}");
                    return EXIT_USAGE;
                }
            };
            let (count, sample) = match crate::operator::preview_resend(&store, &filter).await {
                Ok(preview) => preview,
                Err(e) => return fail(&e),
            };
            if dry_run {
                println!("{count} failed event(s) would be resent; the newest:");
                let _ = std::io::stdout().write_all(render_table(&sample).as_bytes());
                return EXIT_OK;
            }
            if count > crate::operator::CONFIRM_ABOVE && !yes {
                eprintln!(
                    "error: {count} failed events match; add --yes to resend them \
                     (--dry-run shows a sample)"
                );
                return EXIT_FAILED;
            }
            let caller = Caller::new(Via::Cli, label);
            match crate::operator::resend_failed(&store, None, &filter, &caller).await {
                Ok(n) => {
                    println!("resent {n} failed event(s)");
                    EXIT_OK
                }
                Err(e) => fail(&e),
            }
        }
        EventsCommand::Retrigger {
            ids,
            pending_older_than,
            event_name,
        } => {
            let filter = match crate::operator::retrigger_filter(
                ids,
                pending_older_than.as_deref(),
                event_name,
            ) {
                Ok(f) => f,
                Err(e) => {
                    eprintln!("error: {e}");
                    return EXIT_USAGE;
                }
            };
            let mut shown = 0u64;
            let touched = store
                .retrigger_with_progress(&filter, &mut |n| {
                    if n / 10_000 > shown / 10_000 {
                        eprintln!("retriggering: {n} pending event(s) announced again so far");
                    }
                    shown = n;
                })
                .await;
            match touched {
                Ok(n) => {
                    println!("retriggered {n} pending event(s)");
                    EXIT_OK
                }
                Err(e) => fail(&e),
            }
        }
        EventsCommand::Show { id } => show(&store, id).await,
        EventsCommand::Replay(_) => unreachable!("handled before the store is opened"),
        EventsCommand::Why { id } => {
            let dispatchers = settings.dispatcher_events();
            let asked = crate::why::Asked {
                store: &store,
                dispatchers: &dispatchers,
                retry_delay: settings.dispatch.retry_delay,
                max_attempts: settings.dispatch.max_attempts,
                replica: None,
            };
            match crate::why::why(&asked, id).await {
                Ok(Some(why)) => {
                    print!("{}", why.text());
                    EXIT_OK
                }
                Ok(None) => {
                    eprintln!("error: event {id} not found");
                    EXIT_FAILED
                }
                Err(e) => fail(&e),
            }
        }
        EventsCommand::Prune {
            older_than,
            sent_older_than,
            dry_run,
            batch,
        } => {
            if batch == 0 {
                eprintln!("error: --batch: must be at least 1");
                return EXIT_USAGE;
            }
            let parse = |flag: &str, value: &str| match crate::config::duration::parse(value) {
                Ok(d) if !d.is_zero() => Ok(d),
                Ok(_) => Err(format!("error: {flag}: must be above zero")),
                Err(e) => Err(format!("error: {flag}: {e}")),
            };
            let log_age = match older_than.as_deref().map(|v| parse("--older-than", v)) {
                Some(Ok(d)) => Some(d),
                Some(Err(e)) => {
                    eprintln!("{e}");
                    return EXIT_USAGE;
                }
                None if sent_older_than.is_none() => Some(settings.history.retention),
                None => None,
            };
            if let Some(value) = sent_older_than.as_deref() {
                let age = match parse("--sent-older-than", value) {
                    Ok(d) => d,
                    Err(e) => {
                        eprintln!("{e}");
                        return EXIT_USAGE;
                    }
                };
                let code = prune_sent(&store, age, batch, dry_run).await;
                if code != EXIT_OK || log_age.is_none() {
                    return code;
                }
            }
            let Some(age) = log_age else {
                return EXIT_OK;
            };
            if store.history_table().is_none() {
                eprintln!(
                    "error: the attempt log is off (history.enabled = false): nothing to prune"
                );
                return EXIT_USAGE;
            }
            match store.prune_history(age, batch).await {
                Ok(n) => {
                    println!(
                        "pruned {n} attempt-log row(s) older than {}",
                        humantime::format_duration(age)
                    );
                    EXIT_OK
                }
                Err(e) => fail(&e),
            }
        }
        EventsCommand::Retry { ids, label, .. } => {
            let caller = Caller::new(Via::Cli, label);
            let mut code = EXIT_OK;
            for id in ids {
                match crate::operator::resend_one(&store, None, id, &caller).await {
                    Ok(Ok(row)) => println!(
                        "event {}: failed -> pending (attempts {})",
                        row.id, row.attempts
                    ),
                    Ok(Err(refused)) => {
                        eprintln!("error: {refused}");
                        code = EXIT_FAILED;
                    }
                    Err(e) => return fail(&e),
                }
            }
            code
        }
    }
}

/// `events show`: the row, its payload, then the attempt log.
/// `events prune --sent-older-than`: the old sent rows and their log rows,
/// batch by batch, with a progress line every 10,000 rows.
async fn prune_sent(store: &Store, age: std::time::Duration, batch: u64, dry_run: bool) -> i32 {
    let cutoff = Store::sent_cutoff(age);
    let verb = if dry_run { "counted" } else { "deleted" };
    let mut shown = 0u64;
    let result = store
        .prune_sent(cutoff, batch, dry_run, &mut |n| {
            if n / 10_000 > shown / 10_000 {
                eprintln!("pruning: {n} sent event(s) {verb} so far");
            }
            shown = n;
        })
        .await;
    let age = humantime::format_duration(age);
    match result {
        Ok(p) if dry_run => {
            println!("dry run: {} sent event(s) sent more than {age} ago would be deleted (before {cutoff} UTC)", p.events);
            EXIT_OK
        }
        Ok(p) => {
            println!(
                "pruned {} sent event(s) sent more than {age} ago, and {} of their attempt-log row(s)",
                p.events, p.log_rows
            );
            EXIT_OK
        }
        Err(e) => fail(&e),
    }
}

async fn show(store: &Store, id: i64) -> i32 {
    let row = match store.get(id).await {
        Ok(Some(row)) => row,
        Ok(None) => {
            eprintln!("error: event {id} not found");
            return EXIT_FAILED;
        }
        Err(e) => return fail(&e),
    };
    let history = match store.history(id).await {
        Ok(h) => h,
        Err(e) => return fail(&e),
    };
    let behind = match store.waits_behind(id).await {
        Ok(b) => b,
        Err(e) => return fail(&e),
    };
    let mut text = render_event(&row, &history, store.history_table().is_some());
    if let Some(line) = behind.map(|(b, status)| waits_behind_line(b, status)) {
        // Right under the status it explains.
        let at = text.find("  attempts").unwrap_or(text.len());
        text.insert_str(at, &format!("  {line}\n"));
    }
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    EXIT_OK
}

/// What `events show` and the console say of a pending event its
/// aggregate's earlier event holds back (`[ordering]`).
pub fn waits_behind_line(behind: i64, status: Status) -> String {
    match status {
        Status::Failed => format!(
            "held behind event {behind} (failed): sent once event {behind} is resent and sent \
             (outbox-sidecar events retry {behind})"
        ),
        _ => format!(
            "waiting behind event {behind} ({status}): its aggregate's earlier event goes first"
        ),
    }
}

/// The text of `events show`.
pub fn render_event(row: &OutboxEventRow, history: &[Record], logged: bool) -> String {
    let time = |t: &chrono::NaiveDateTime| t.format("%Y-%m-%d %H:%M:%S%.3f").to_string();
    let mut s = String::new();
    let _ = writeln!(s, "event {}  {}", row.id, row.event_name);
    let _ = writeln!(s, "  status      {}", row.status);
    let _ = writeln!(s, "  attempts    {}", row.attempts);
    let _ = writeln!(
        s,
        "  last_error  {}",
        row.last_error.as_deref().unwrap_or("-")
    );
    let _ = writeln!(s, "  created_at  {}", time(&row.created_at));
    let _ = writeln!(s, "  updated_at  {}", time(&row.updated_at));
    let _ = writeln!(
        s,
        "  sent_at     {}",
        row.sent_at.as_ref().map(time).unwrap_or_else(|| "-".into())
    );
    let payload = row.payload.pretty();
    let _ = writeln!(
        s,
        "  payload     {}",
        payload.replace('\n', "\n              ")
    );
    if !logged {
        let _ = writeln!(s, "history: off (history.enabled = false)");
        return s;
    }
    if history.is_empty() {
        let _ = writeln!(s, "history: none recorded");
        return s;
    }
    let _ = writeln!(s, "history (UTC):");
    for r in history {
        let line = match r.kind.as_str() {
            "resend" => format!(
                "  {}  resend   via {}{}",
                time(&r.started_at),
                r.via.as_deref().unwrap_or("?"),
                r.label
                    .as_deref()
                    .map(|l| format!(" ({l})"))
                    .unwrap_or_default()
            ),
            "replay" => format!(
                "  {}  replay   via {}{}, operation {} (a sent event sent again)",
                time(&r.started_at),
                r.via.as_deref().unwrap_or("?"),
                r.label
                    .as_deref()
                    .map(|l| format!(" ({l})"))
                    .unwrap_or_default(),
                r.detail.as_deref().unwrap_or("?"),
            ),
            _ => format!(
                "  {}  attempt {} {:<7} {:>5} ms  {}  on {}{}{}",
                time(&r.started_at),
                r.attempt.unwrap_or(0),
                r.outcome.as_deref().unwrap_or("?"),
                r.duration_ms.unwrap_or(0),
                r.http_status
                    .map(|c| format!("HTTP {c}"))
                    .unwrap_or_else(|| "no answer".into()),
                r.replica.as_deref().unwrap_or("?"),
                r.trace_id
                    .as_deref()
                    .map(|t| format!("  trace {t}"))
                    .unwrap_or_default(),
                r.detail
                    .as_deref()
                    .map(|d| format!("  {d}"))
                    .unwrap_or_default()
            ),
        };
        let _ = writeln!(s, "{line}");
    }
    s
}

/// `dispatchers list|pause|resume`.
pub async fn dispatchers(settings: &Settings, cmd: DispatchersCommand) -> i32 {
    let store = match open_store(settings).await {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    let configured = settings.dispatcher_events();
    let result = match cmd {
        DispatchersCommand::List => {
            return match operator::dispatchers(&store, &configured, &Default::default()).await {
                Ok(list) => {
                    for d in list {
                        let state = match (&d.paused_at, &d.paused_via) {
                            (Some(at), Some(via)) => format!(
                                "paused since {} UTC via {via}{}",
                                at.format("%Y-%m-%d %H:%M:%S"),
                                d.paused_label
                                    .as_deref()
                                    .map(|l| format!(" ({l})"))
                                    .unwrap_or_default()
                            ),
                            _ => "sending".to_owned(),
                        };
                        println!("{:<20} {:<40} {state}", d.name, d.events.join(","));
                    }
                    EXIT_OK
                }
                Err(e) => fail(&e),
            };
        }
        DispatchersCommand::Pause { name, label } => {
            let caller = Caller::new(Via::Cli, label);
            operator::pause(&store, &configured, &name, &caller).await
        }
        DispatchersCommand::Resume { name } => {
            let mut shown = 0u64;
            let result = operator::resume_with_progress(&store, &configured, &name, &mut |n| {
                if n / 10_000 > shown / 10_000 {
                    eprintln!("resuming {name}: {n} pending event(s) announced again so far");
                }
                shown = n;
            })
            .await;
            result
        }
    };
    match result {
        Ok(action) => {
            println!("{}", action.message);
            EXIT_OK
        }
        Err(e @ operator::DispatcherError::Unknown { .. }) => {
            eprintln!("error: {e}");
            EXIT_USAGE
        }
        Err(e) => fail(&e),
    }
}

/// A retry that was refused, for callers that need the reason's kind.
pub fn refused_is_not_found(r: &RetryRefused) -> bool {
    matches!(r, RetryRefused::NotFound(_))
}

pub(crate) fn fail(e: &dyn std::fmt::Display) -> i32 {
    eprintln!("error: {e}");
    EXIT_FAILED
}

/// The `events list` table: fixed columns, `last_error` shortened.
pub fn render_table(rows: &[OutboxEventRow]) -> String {
    let header = [
        "id",
        "event_name",
        "status",
        "attempts",
        "last_error",
        "updated_at",
    ];
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.id.to_string(),
                r.event_name.clone(),
                r.status.to_string(),
                r.attempts.to_string(),
                r.last_error.as_deref().map(shorten).unwrap_or_default(),
                r.updated_at.format("%Y-%m-%d %H:%M:%S%.3f").to_string(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cols: Vec<&str>| {
        let mut s = cols
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ");
        s.truncate(s.trim_end().len());
        s.push('\n');
        s
    };
    let mut out = line(header.to_vec());
    for row in &cells {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out.push_str(&format!(
        "({} row{})\n",
        rows.len(),
        if rows.len() == 1 { "" } else { "s" }
    ));
    out
}

fn shorten(s: &str) -> String {
    let one_line = s.replace(['\n', '\r'], " ");
    if one_line.chars().count() <= 60 {
        one_line
    } else {
        let cut: String = one_line.chars().take(59).collect();
        format!("{cut}…")
    }
}

/// `outbox-sidecar run`: start, stop on the first SIGTERM/SIGINT, exit at
/// once on a second one.
pub async fn run_until_stopped(settings: Settings) -> i32 {
    let app = match crate::app::App::start(settings).await {
        Ok(app) => app,
        Err(e) => {
            eprintln!("error: {e}");
            tracing::error!(error = %e, "start-up failed");
            // What the operator must change (a setting, the table) is a
            // usage error; an outage at start-up is a failure.
            return match e {
                crate::app::AppError::Config(_)
                | crate::app::AppError::Table(_)
                | crate::app::AppError::Dispatch(_)
                | crate::app::AppError::Tracing(_) => EXIT_USAGE,
                _ => EXIT_FAILED,
            };
        }
    };
    let token = app.shutdown_token();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested: draining");
        token.cancel();
        wait_for_signal().await;
        tracing::warn!("second signal: exiting at once");
        std::process::exit(130);
    });
    app.stopped().await;
    tracing::info!("stopped");
    EXIT_OK
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// `operations [ID] [--wait]`.
pub async fn operations(settings: &Settings, args: OperationsArgs) -> i32 {
    use crate::operations::{Operations, Printed};
    let store = match open_store(settings).await {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    let ops = Operations::new(store, &settings.history.replica_name());
    match ops.print(args.id.as_deref(), args.wait).await {
        Printed::Ok => EXIT_OK,
        Printed::Unfinished => EXIT_FAILED,
        Printed::NotFound => {
            eprintln!(
                "error: no operation {:?} (`outbox-sidecar operations` lists the recent ones)",
                args.id.unwrap_or_default()
            );
            EXIT_FAILED
        }
        Printed::Error(e) => fail(&e),
    }
}
