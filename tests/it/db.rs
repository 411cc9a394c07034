//! Test databases: each test gets its own, on a real server, dropped when
//! the guard goes out of scope.
//!
//! The servers (and the Kafka broker, see `harness::kafka`) are chosen once
//! per test process, in this order:
//! 1. URLs from the environment: `OUTBOX_TEST_PG_URL`, `OUTBOX_TEST_MYSQL_URL`
//!    (a URL whose database part is an existing database used only to run
//!    `CREATE DATABASE`), `OUTBOX_TEST_KAFKA_BROKERS`;
//! 2. when a Docker engine answers, containers started by testcontainers on
//!    first use, one per server kind, shared by every test of the process;
//! 3. the local servers at 127.0.0.1:5432 / 3306 and librdkafka's mock broker.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Once, OnceLock};
use std::time::Duration;

use outbox_sidecar::store::Store;
use sea_orm::{ConnectionTrait, Database};
use testcontainers_modules::testcontainers::runners::SyncRunner;
use testcontainers_modules::testcontainers::{Container, ContainerRequest, Image, ImageExt};

pub const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
pub const DEFAULT_MYSQL_URL: &str = "mysql://root@127.0.0.1:3306/mysql";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    MySql,
    Sqlite,
}

pub struct TestDb {
    pub backend: Backend,
    /// The URL of this test's own database.
    pub url: String,
    admin_url: String,
    name: String,
    _dir: Option<tempfile::TempDir>,
}

pub const PG_URL_ENV: &str = "OUTBOX_TEST_PG_URL";
pub const MYSQL_URL_ENV: &str = "OUTBOX_TEST_MYSQL_URL";
pub const KAFKA_BROKERS_ENV: &str = "OUTBOX_TEST_KAFKA_BROKERS";

/// Where one kind of test server comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Env,
    Container,
    Local,
}

/// The source for a server kind whose URL variable is `env`.
pub fn source(env: &str) -> Source {
    announce();
    choose(env)
}

fn choose(env: &str) -> Source {
    if std::env::var_os(env).is_some() {
        Source::Env
    } else if docker_engine_answers() {
        Source::Container
    } else {
        Source::Local
    }
}

/// Says once per test process where the servers come from, on the real
/// stderr: `eprintln!` would be swallowed by the test harness' capture.
fn announce() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let describe = |env: &str, what: &str, local: &str| match choose(env) {
            Source::Env => format!("{what} from {env}"),
            Source::Container => format!("{what} in a testcontainers container"),
            Source::Local => local.to_owned(),
        };
        let line = format!(
            "test services: {}, {}, {}\n",
            describe(PG_URL_ENV, "PostgreSQL", "local PostgreSQL"),
            describe(MYSQL_URL_ENV, "MySQL", "local MariaDB/MySQL"),
            crate::harness::kafka::describe(),
        );
        let _ = std::io::stderr().write_all(line.as_bytes());
    });
}

/// Whether a Docker engine answers: `GET /_ping` on `DOCKER_HOST` (or the
/// default socket), else `docker info` (which knows about docker contexts).
pub fn docker_engine_answers() -> bool {
    static ANSWERS: OnceLock<bool> = OnceLock::new();
    *ANSWERS.get_or_init(|| ping_docker().unwrap_or_else(docker_info_succeeds))
}

/// `None` when there is no engine address to try.
fn ping_docker() -> Option<bool> {
    const PING: &[u8] = b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n";
    const TIMEOUT: Duration = Duration::from_secs(2);
    let host = std::env::var("DOCKER_HOST").unwrap_or_default();
    let mut reply = String::new();
    if let Some(addr) = host.strip_prefix("tcp://") {
        let addr = std::net::ToSocketAddrs::to_socket_addrs(addr)
            .ok()?
            .next()?;
        let mut s = std::net::TcpStream::connect_timeout(&addr, TIMEOUT).ok()?;
        s.set_read_timeout(Some(TIMEOUT)).ok()?;
        s.write_all(PING).ok()?;
        s.read_to_string(&mut reply).ok()?;
    } else {
        let path = host
            .strip_prefix("unix://")
            .unwrap_or("/var/run/docker.sock");
        if !std::path::Path::new(path).exists() {
            return None;
        }
        let Ok(mut s) = std::os::unix::net::UnixStream::connect(path) else {
            return Some(false);
        };
        s.set_read_timeout(Some(TIMEOUT)).ok()?;
        s.write_all(PING).ok()?;
        s.read_to_string(&mut reply).ok()?;
    }
    Some(reply.starts_with("HTTP/1.") && reply.lines().next()?.contains(" 200 "))
}

fn docker_info_succeeds() -> bool {
    std::process::Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A container kept for the whole test process (statics are never dropped),
/// with the address its service answers on.
struct Shared<I: Image> {
    _container: Container<I>,
    url: String,
}

/// Starts `image` once, on a thread of its own: testcontainers' blocking
/// API runs its own runtime, which cannot nest in a test's. `url` gets the
/// host and the mapped port of `port`.
fn start_shared<I>(
    cell: &'static OnceLock<Shared<I>>,
    image: impl FnOnce() -> ContainerRequest<I> + Send + 'static,
    port: u16,
    url: impl FnOnce(&str, u16) -> String + Send + 'static,
) -> &'static str
where
    I: Image + Send + Sync + 'static,
{
    let shared = cell.get_or_init(|| {
        std::thread::spawn(move || {
            let request = image();
            let what = request.descriptor();
            let container = request
                .start()
                .unwrap_or_else(|e| panic!("start the {what} test container: {e}"));
            let host = container.get_host().expect("container host").to_string();
            let mapped = container.get_host_port_ipv4(port).expect("container port");
            remove_at_exit(container.id());
            Shared {
                url: url(&host, mapped),
                _container: container,
            }
        })
        .join()
        .expect("test container thread")
    });
    &shared.url
}

/// The process never drops its shared containers, so a watcher removes
/// each one when the test process has exited.
fn remove_at_exit(id: &str) {
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 2; done; docker rm -f -v {id} >/dev/null 2>&1",
        pid = std::process::id()
    );
    let _ = std::process::Command::new("sh")
        .args(["-c", &script])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
}

fn postgres_container() -> &'static str {
    use testcontainers_modules::postgres::Postgres;
    static PG: OnceLock<Shared<Postgres>> = OnceLock::new();
    // 13+ for `DROP DATABASE ... WITH (FORCE)`.
    start_shared(
        &PG,
        || Postgres::default().with_tag("16-alpine"),
        5432,
        |host, port| format!("postgres://postgres:postgres@{host}:{port}/postgres"),
    )
}

fn mysql_container() -> &'static str {
    use testcontainers_modules::mysql::Mysql;
    static MYSQL: OnceLock<Shared<Mysql>> = OnceLock::new();
    start_shared(
        &MYSQL,
        || Mysql::default().with_tag("8.1"),
        3306,
        |host, port| format!("mysql://root@{host}:{port}/mysql"),
    )
}

/// The bootstrap address of the shared Kafka container.
pub fn kafka_container() -> &'static str {
    use testcontainers_modules::kafka::apache::{Kafka, KAFKA_PORT};
    static KAFKA: OnceLock<Shared<Kafka>> = OnceLock::new();
    start_shared(
        &KAFKA,
        || Kafka::default().into(),
        KAFKA_PORT.as_u16(),
        |host, port| format!("{host}:{port}"),
    )
}

fn server_url(backend: Backend) -> String {
    let (env, container, local): (_, fn() -> &'static str, _) = match backend {
        Backend::Postgres => (PG_URL_ENV, postgres_container, DEFAULT_PG_URL),
        Backend::MySql => (MYSQL_URL_ENV, mysql_container, DEFAULT_MYSQL_URL),
        Backend::Sqlite => return String::new(),
    };
    match source(env) {
        Source::Env => std::env::var(env).unwrap_or_default(),
        Source::Container => container().to_owned(),
        Source::Local => local.to_owned(),
    }
}

fn unique_name() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "outbox_test_{}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        chrono::Utc::now().timestamp_micros() % 1_000_000
    )
}

fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let base = match base.rfind('/') {
        Some(i) if i > base.find("://").map(|j| j + 2).unwrap_or(0) => &base[..i],
        _ => base,
    };
    match query {
        Some(q) => format!("{base}/{db}?{q}"),
        None => format!("{base}/{db}"),
    }
}

impl TestDb {
    pub async fn new(backend: Backend) -> TestDb {
        let name = unique_name();
        if backend == Backend::Sqlite {
            let dir = tempfile::tempdir().expect("temp dir");
            let url = format!("sqlite:{}?mode=rwc", dir.path().join("outbox.db").display());
            return TestDb {
                backend,
                url,
                admin_url: String::new(),
                name,
                _dir: Some(dir),
            };
        }
        let admin_url = server_url(backend);
        let admin = Database::connect(&admin_url).await.unwrap_or_else(|e| {
            panic!("cannot reach the {backend:?} test server at {admin_url}: {e} (set OUTBOX_TEST_PG_URL / OUTBOX_TEST_MYSQL_URL, or run a Docker engine for testcontainers)")
        });
        admin
            .execute_unprepared(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name} on {admin_url}: {e}"));
        admin.close().await.ok();
        TestDb {
            backend,
            url: with_database(&admin_url, &name),
            admin_url,
            name,
            _dir: None,
        }
    }

    pub async fn postgres() -> TestDb {
        Self::new(Backend::Postgres).await
    }

    /// A store on this database with the table migrated.
    pub async fn store(&self) -> Store {
        let store = Store::connect(
            &self.url,
            "outbox_events",
            5,
            std::time::Duration::from_secs(5),
        )
        .await
        .unwrap_or_else(|e| panic!("connect {}: {e}", self.url));
        store.migrate().await.expect("migrate");
        store
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if self.backend == Backend::Sqlite {
            return;
        }
        let admin_url = self.admin_url.clone();
        let sql = match self.backend {
            Backend::Postgres => format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
            _ => format!("DROP DATABASE IF EXISTS {}", self.name),
        };
        // Drop runs inside the test's runtime; use a thread with its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                let admin = Database::connect(&admin_url).await.ok()?;
                admin.execute_unprepared(&sql).await.ok()?;
                admin.close().await.ok()
            })
        })
        .join();
    }
}
