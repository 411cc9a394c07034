#![forbid(unsafe_code)]
//! The `outbox-sidecar` binary: parse the command line, load the
//! configuration, run the command, turn its result into an exit code.

use clap::Parser;
use outbox_sidecar::cli::{self, Cli, Command, EXIT_USAGE};
use outbox_sidecar::config::Settings;
use outbox_sidecar::dispatch::Registry;

/// mimalloc rather than the system allocator: a job per event allocates
/// and frees small objects across threads all the time, where glibc's
/// malloc cost ~25% of the sidecar's CPU in `make bench-pipeline`
/// (perf, 2026-11-30) and kept more memory resident. Built with `no_thp`:
/// mimalloc v3 otherwise asks for transparent huge pages on its arena,
/// and the 2 MiB pages made S1's peak RSS 112 MiB where 4 KiB pages give
/// 80 MiB for the same CPU per event (benches/RESULTS.md, 2026-12-08).
/// The shipped Deployment sets `MIMALLOC_ALLOW_THP=0` for nodes whose THP
/// setting is `always`.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = runtime.block_on(dispatch(cli));
    std::process::exit(code);
}

async fn dispatch(cli: Cli) -> i32 {
    let command = match cli.command {
        Command::Demo(args) => return outbox_sidecar::demo::main(args).await,
        other => other,
    };
    let settings = match Settings::load(cli.config.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_USAGE;
        }
    };
    // The dispatchers are checked by building them: a URL, a header, a TLS
    // file or a signing secret that cannot be used stops every command
    // naming its key, as a bad setting does.
    if let Err(e) = Registry::from_settings(&settings.dispatchers) {
        eprintln!("error: {e}");
        return EXIT_USAGE;
    }
    outbox_sidecar::telemetry::init_logging(&settings.log);
    match command {
        Command::Migrate => cli::migrate(&settings).await,
        Command::Events(cmd) => cli::events(&settings, cmd).await,
        Command::Dispatchers(cmd) => cli::dispatchers(&settings, cmd).await,
        Command::Operations(args) => cli::operations(&settings, args).await,
        Command::Config => {
            print!("{}", settings.redacted_toml());
            cli::EXIT_OK
        }
        Command::Run | Command::Demo(_) => {
            if let Err(e) = settings.validate_for_run() {
                eprintln!("error: {e}");
                return EXIT_USAGE;
            }
            cli::run_until_stopped(settings).await
        }
    }
}
