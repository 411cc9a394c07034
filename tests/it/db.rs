//! Test databases: each test gets its own, on the real servers, dropped when
//! the guard goes out of scope. `OUTBOX_TEST_PG_URL` / `OUTBOX_TEST_MYSQL_URL`
//! name the servers (a URL whose database part is an existing database used
//! only to run `CREATE DATABASE`).

use std::sync::atomic::{AtomicU32, Ordering};

use outbox_sidecar::store::Store;
use sea_orm::{ConnectionTrait, Database};

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

fn server_url(backend: Backend) -> String {
    match backend {
        Backend::Postgres => {
            std::env::var("OUTBOX_TEST_PG_URL").unwrap_or_else(|_| DEFAULT_PG_URL.into())
        }
        Backend::MySql => {
            std::env::var("OUTBOX_TEST_MYSQL_URL").unwrap_or_else(|_| DEFAULT_MYSQL_URL.into())
        }
        Backend::Sqlite => String::new(),
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
            panic!("cannot reach the {backend:?} test server at {admin_url}: {e} (set OUTBOX_TEST_PG_URL / OUTBOX_TEST_MYSQL_URL)")
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
    pub async fn store(&self, max_attempts: i32) -> Store {
        let store = Store::connect(
            &self.url,
            "outbox_events",
            max_attempts,
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
