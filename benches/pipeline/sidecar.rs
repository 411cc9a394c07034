//! `outbox-sidecar run` in its own process.

use super::*;

/// `outbox-sidecar run` in its own process (the binary cargo built with
/// this bench's profile), so its memory and CPU are its own. `extra` is
/// TOML appended to the bench's configuration (whole sections).
pub(crate) struct Sidecar {
    pub(crate) child: std::process::Child,
    pub(crate) pid: u32,
    pub(crate) admin: SocketAddr,
    pub(crate) http: reqwest::Client,
    pub(crate) _dir: tempfile::TempDir,
    pub(crate) stderr: std::path::PathBuf,
    /// `perf record` attached to the sidecar (`BENCH_PERF_DATA`).
    pub(crate) perf: Option<std::process::Child>,
}

impl Sidecar {
    pub(crate) fn start(
        env: &Env,
        db_url: &str,
        broker: &Broker,
        history: bool,
        receiver: &Receiver,
        extra: &str,
    ) -> Result<Sidecar> {
        Sidecar::start_with_env(env, db_url, broker, history, receiver, extra, &[])
    }

    /// [`Sidecar::start`] with another build of the sidecar (`--versus`).
    pub(crate) fn start_versus(
        env: &Env,
        db_url: &str,
        broker: &Broker,
        receiver: &Receiver,
        extra: &str,
    ) -> Result<Sidecar> {
        let bin = env
            .opts
            .versus
            .clone()
            .ok_or_else(|| anyhow!("--versus is not set"))?;
        let vars = [("BENCH_SIDECAR_BIN".to_owned(), bin)];
        Sidecar::start_with_env(env, db_url, broker, true, receiver, extra, &vars)
    }

    /// [`Sidecar::start`] with `vars` set in the child's environment
    /// (`OUTBOX__…` settings over the configuration file).
    pub(crate) fn start_with_env(
        env: &Env,
        db_url: &str,
        broker: &Broker,
        history: bool,
        receiver: &Receiver,
        extra: &str,
        vars: &[(String, String)],
    ) -> Result<Sidecar> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let toml = env.settings(
            db_url,
            &broker.brokers,
            &broker.topic,
            port,
            receiver,
            extra,
        )?;
        let dir = tempfile::tempdir()?;
        let config = dir.path().join("sidecar.toml");
        std::fs::write(&config, toml)?;
        // BENCH_SIDECAR_LOG_DIR keeps each sidecar's log (its stderr) there;
        // with OUTBOX__LOG__LEVEL=… (inherited) it shows what the sidecar did.
        let stderr = match std::env::var_os("BENCH_SIDECAR_LOG_DIR") {
            Some(keep) => std::path::PathBuf::from(keep).join(format!(
                "sidecar-{}-{}.log",
                std::process::id(),
                env.next_db.load(Ordering::Relaxed)
            )),
            None => dir.path().join("stderr.log"),
        };
        // BENCH_SIDECAR_BIN runs another build of the sidecar (an earlier
        // commit's, to compare side by side); by default the one cargo built.
        let bin = vars
            .iter()
            .find(|(k, _)| k == "BENCH_SIDECAR_BIN")
            .map(|(_, v)| std::ffi::OsString::from(v))
            .or_else(|| std::env::var_os("BENCH_SIDECAR_BIN"))
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_outbox-sidecar").into());
        let child = std::process::Command::new(bin)
            .arg("run")
            .arg("--config")
            .arg(&config)
            .env("OUTBOX__HISTORY__ENABLED", history.to_string())
            .envs(vars.iter().map(|(k, v)| (k, v)))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&stderr)?)
            .spawn()
            .context("starting outbox-sidecar run")?;
        // BENCH_PERF_DATA=FILE (`make profile`): perf samples the sidecar's
        // CPU (the software clock, with DWARF call chains) into FILE until
        // the sidecar stops.
        let perf = match std::env::var_os("BENCH_PERF_DATA") {
            Some(out) => Some(
                std::process::Command::new("perf")
                    .args([
                        "record",
                        "-e",
                        "cpu-clock",
                        "-F",
                        "499",
                        "--call-graph",
                        "dwarf",
                    ])
                    .arg("-p")
                    .arg(child.id().to_string())
                    .arg("-o")
                    .arg(out)
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .context("starting perf record (BENCH_PERF_DATA)")?,
            ),
            None => None,
        };
        Ok(Sidecar {
            perf,
            pid: child.id(),
            child,
            admin: SocketAddr::from(([127, 0, 0, 1], port)),
            http: reqwest::Client::new(),
            _dir: dir,
            stderr,
        })
    }

    pub(crate) fn stderr_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    pub(crate) async fn wait_ready(&mut self) -> Result<()> {
        let url = format!("http://{}/readyz", self.admin);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = self.http.get(&url).send().await {
                if r.status().is_success() {
                    return Ok(());
                }
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("the sidecar exited ({status}):\n{}", self.stderr_tail());
            }
            if Instant::now() > deadline {
                bail!(
                    "the sidecar was not ready within 60 s:\n{}",
                    self.stderr_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Samples of /metrics, by series name with labels as printed.
    pub(crate) async fn metrics(&self) -> Result<HashMap<String, f64>> {
        let text = self
            .http
            .get(format!("http://{}/metrics", self.admin))
            .send()
            .await?
            .text()
            .await?;
        Ok(text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (name, value) = l.rsplit_once(' ')?;
                Some((name.to_owned(), value.parse().ok()?))
            })
            .collect())
    }

    pub(crate) fn cpu_ticks(&self) -> u64 {
        pid_cpu_ticks(self.pid)
    }

    /// Peak resident memory of the process so far (`VmHWM`).
    pub(crate) fn peak_rss(&self) -> u64 {
        status_bytes(self.pid, "VmHWM:")
    }

    /// SIGTERM, then wait for the drain (SIGKILL after 30 s).
    pub(crate) async fn stop(mut self) -> Result<()> {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait()? {
                if let Some(mut perf) = self.perf.take() {
                    // SIGINT: perf writes its file and ends (if its target's
                    // exit has not ended it already).
                    let _ = std::process::Command::new("kill")
                        .args(["-INT", &perf.id().to_string()])
                        .status();
                    let _ = perf.wait();
                }
                if !status.success() {
                    bail!("the sidecar exited with {status}:\n{}", self.stderr_tail());
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("the sidecar did not stop within 30 s of SIGTERM");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
