//! The binary's database commands, run as a user would run them.

use std::process::{Command, Output};

use entity::Status;
use outbox_sidecar::store::Outcome;
use sea_orm::ConnectionTrait;
use serde_json::json;

use crate::db::{Backend, TestDb};
use crate::store::{mark_sent, register_failure};

pub fn bin() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_outbox-sidecar"));
    cmd.env_remove("OUTBOX_CONFIG").env("NO_COLOR", "1");
    for (k, _) in std::env::vars() {
        if k.starts_with("OUTBOX__") {
            cmd.env_remove(k);
        }
    }
    cmd
}

fn run(db: &TestDb, args: &[&str]) -> Output {
    bin()
        .env("OUTBOX__DATABASE__URL", &db.url)
        .args(args)
        .output()
        .expect("run the binary")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test]
async fn migrate_twice_then_over_an_existing_rails_table() {
    let db = TestDb::postgres().await;
    // The application's own table, created as Rails would, with rows in it.
    let conn = sea_orm::Database::connect(&db.url).await.unwrap();
    conn.execute_unprepared(
        "CREATE TABLE outbox_events (id bigserial primary key, event_name varchar not null, \
         payload jsonb not null, status varchar not null default 'pending', attempts integer not null default 0, \
         last_error text, sent_at timestamp(6), created_at timestamp(6) not null, updated_at timestamp(6) not null); \
         INSERT INTO outbox_events (event_name, payload, status, attempts, last_error, created_at, updated_at) VALUES \
         ('accounts.purchase_create', '{\"a\":1}', 'failed', 3, 'HTTP 500', now(), now()), \
         ('accounts.installment_paid', '{\"b\":2}', 'pending', 0, null, now(), now());",
    )
    .await
    .unwrap();
    for _ in 0..2 {
        let out = run(&db, &["migrate"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout), "table outbox_events is up to date\n");
    }
    let n: i64 = conn
        .query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            "SELECT count(*) AS n FROM outbox_events",
        ))
        .await
        .unwrap()
        .unwrap()
        .try_get("", "n")
        .unwrap();
    assert_eq!(n, 2, "every row survives");
    let out = run(&db, &["events", "list"]);
    let listing = text(&out.stdout);
    assert!(
        listing.starts_with(
            "id  event_name                 status   attempts  last_error  updated_at\n"
        ),
        "{listing}"
    );
    assert!(
        listing.contains("1   accounts.purchase_create   failed   3         HTTP 500"),
        "{listing}"
    );
    assert!(listing.ends_with("(2 rows)\n"), "{listing}");
    let out = run(&db, &["events", "list", "--status", "failed"]);
    assert!(text(&out.stdout).ends_with("(1 row)\n"));
}

/// A first deploy's migration Job, run with the production ConfigMap
/// (`[ordering]` and `[tracing]` naming columns): on a fresh database
/// `migrate` creates the table with those columns (nullable text) and the
/// ordering column's `(column, id)` index, and exits 0, twice. On the
/// application's existing table without them it changes nothing and exits
/// 2, printing the migration to add. At e0190ec the fresh case exited 2
/// after creating the table without the columns.
#[tokio::test]
async fn migrate_with_named_columns_creates_them_on_a_fresh_table_only() {
    for backend in [Backend::Postgres, Backend::MySql] {
        let fresh = TestDb::new(backend).await;
        let migrate = |db: &TestDb| {
            bin()
                .env("OUTBOX__DATABASE__URL", &db.url)
                .env("OUTBOX__ORDERING__COLUMN", "aggregate_key")
                .env("OUTBOX__TRACING__COLUMN", "trace_context")
                .args(["migrate"])
                .output()
                .unwrap()
        };
        for _ in 0..2 {
            let out = migrate(&fresh);
            assert_eq!(
                out.status.code(),
                Some(0),
                "{backend:?}: {}",
                text(&out.stderr)
            );
            assert_eq!(text(&out.stdout), "table outbox_events is up to date\n");
        }
        let store = fresh.store().await;
        let columns: Vec<String> = store
            .columns()
            .await
            .unwrap()
            .into_iter()
            .map(|c| c.name.to_lowercase())
            .collect();
        for c in ["aggregate_key", "trace_context"] {
            assert!(columns.contains(&c.to_owned()), "{backend:?}: {columns:?}");
        }
        let ordered = store.with_ordering(Some(outbox_sidecar::store::OrderingColumns {
            column: "aggregate_key".into(),
            hold: true,
        }));
        assert_eq!(
            ordered.ordering_index_advice().await.unwrap(),
            None,
            "{backend:?}: the (aggregate_key, id) index is there"
        );

        // The application's table without them: refused, untouched.
        let existing = TestDb::new(backend).await;
        let plain = bin()
            .env("OUTBOX__DATABASE__URL", &existing.url)
            .args(["migrate"])
            .output()
            .unwrap();
        assert_eq!(plain.status.code(), Some(0), "{}", text(&plain.stderr));
        let out = migrate(&existing);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{backend:?}: {}",
            text(&out.stdout)
        );
        let err = text(&out.stderr);
        assert!(
            err.contains("does not exist")
                && (err.contains("aggregate_key") || err.contains("trace_context")),
            "{backend:?}: {err}"
        );
        let columns: Vec<String> = existing
            .store()
            .await
            .columns()
            .await
            .unwrap()
            .into_iter()
            .map(|c| c.name.to_lowercase())
            .collect();
        assert!(
            !columns.contains(&"aggregate_key".to_owned()),
            "{columns:?}"
        );
    }
}

#[tokio::test]
async fn events_retry_exit_codes_and_messages() {
    let db = TestDb::postgres().await;
    let store = db.store().await;
    let failed_id = store
        .insert("accounts.purchase_create", &json!({}))
        .await
        .unwrap();
    let row = store.get(failed_id).await.unwrap().unwrap();
    assert!(matches!(
        register_failure(&store, &row, "HTTP 500", 1).await.unwrap(),
        Outcome::Applied(_)
    ));
    let sent_id = store
        .insert("accounts.purchase_create", &json!({}))
        .await
        .unwrap();
    let row = store.get(sent_id).await.unwrap().unwrap();
    assert!(matches!(
        mark_sent(&store, &row).await.unwrap(),
        Outcome::Applied(_)
    ));

    let out = run(&db, &["events", "retry", &failed_id.to_string()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        format!("event {failed_id}: failed -> pending (attempts 0)\n")
    );
    assert_eq!(
        store.get(failed_id).await.unwrap().unwrap().status,
        Status::Pending
    );

    let out = run(&db, &["events", "retry", &sent_id.to_string()]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        format!("error: event {sent_id} is sent: only failed events can be resent\n")
    );

    let out = run(&db, &["events", "retry", "987654"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stderr), "error: event 987654 not found\n");

    let out = run(
        &db,
        &[
            "events",
            "retry",
            "--all-failed",
            "--event-name",
            "accounts.purchase_create",
        ],
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "resent 0 failed event(s)\n");

    let out = run(&db, &["events", "retry"]);
    assert_eq!(out.status.code(), Some(2), "no ids is a usage error");
}

#[tokio::test]
async fn unreachable_database_names_the_url_without_password() {
    let out = bin()
        .env(
            "OUTBOX__DATABASE__URL",
            "postgres://app:hunter2@127.0.0.1:1/nothing",
        )
        .env("OUTBOX__DATABASE__CONNECT_TIMEOUT", "2s")
        .args(["events", "list"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("cannot connect to the database at postgres://app:***@127.0.0.1:1/nothing"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
}

#[test]
fn missing_database_url_is_a_usage_error_naming_the_key() {
    let out = bin().args(["migrate"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr),
        "error: missing setting database.url: set it in the configuration file or as OUTBOX__DATABASE__URL\n"
    );
}

/// Issue 17 item 5: a guessable admin token stops start-up (exit 2), the
/// message names the key and never the token.
#[test]
fn short_or_placeholder_admin_token_stops_start_up_naming_the_key() {
    for token in ["short-token-123", "change-me-use-openssl-rand-hex-32"] {
        let mut child = bin()
            .args(["run"])
            .env("OUTBOX__DATABASE__URL", "sqlite::memory:")
            .env("OUTBOX__KAFKA__BROKERS", "127.0.0.1:9")
            .env("OUTBOX__KAFKA__TOPIC", "t")
            .env("OUTBOX__ADMIN__TOKEN", token)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A sidecar that accepted the token would run until stopped.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert_eq!(status.and_then(|s| s.code()), Some(2), "{err}");
        assert!(
            err.starts_with("error: invalid configuration: admin.token: "),
            "{err}"
        );
        assert!(!err.contains(token), "{err}");
    }
}

/// Issue 16 item 11: a secret file that cannot be read stops every command
/// with exit 2, naming the key and the path.
#[test]
fn an_unreadable_secret_file_is_a_usage_error_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("database-url");
    let out = bin()
        .env("OUTBOX__DATABASE__URL_FILE", &missing)
        .arg("config")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.starts_with(&format!(
            "error: invalid configuration: database.url_file: cannot read {}: ",
            missing.display()
        )),
        "{err}"
    );
    std::fs::write(&missing, "sqlite::memory:\n").unwrap();
    let out = bin()
        .env("OUTBOX__DATABASE__URL_FILE", &missing)
        .arg("config")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("url = \"sqlite::memory:\""));
}

/// The morning after an outage, from the command line: a dry run of a
/// filtered resend, the resend, a bad filter named, and a retrigger.
#[tokio::test]
async fn filtered_resend_dry_run_and_retrigger() {
    let db = TestDb::postgres().await;
    let store = db.store().await;
    let mut failed = Vec::new();
    for error in [
        "HTTP 503: down",
        "HTTP 422: company_not_found",
        "HTTP 503: down",
    ] {
        let id = store
            .insert("accounts.purchase_create", &json!({}))
            .await
            .unwrap();
        let row = store.get(id).await.unwrap().unwrap();
        register_failure(&store, &row, error, 1).await.unwrap();
        failed.push(id);
    }
    let pending = store
        .insert("accounts.installment_paid", &json!({}))
        .await
        .unwrap();
    let before = store.get(pending).await.unwrap().unwrap();
    let filter = [
        "events",
        "retry",
        "--all-failed",
        "--error-contains",
        "503",
        "--failed-since",
        "2000-01-01T00:00:00Z",
    ];
    let out = run(&db, &[&filter[..], &["--dry-run"]].concat());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with("2 failed event(s) would be resent; the newest:\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("HTTP 503: down") && !stdout.contains("company_not_found"),
        "{stdout}"
    );
    assert_eq!(
        store.stats().await.unwrap().failed,
        3,
        "a dry run changes nothing"
    );

    let out = run(&db, &filter);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "resent 2 failed event(s)\n");
    assert_eq!(
        store.get(failed[1]).await.unwrap().unwrap().status,
        Status::Failed
    );

    let out = run(
        &db,
        &["events", "retry", "--all-failed", "--failed-until", "noon"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).starts_with("error: failed_until: \"noon\" is not a time"));
    let out = run(
        &db,
        &["events", "retry", "--all-failed", "--dispatcher", "billing"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).starts_with("error: dispatcher: no dispatcher \"billing\""));

    let out = run(
        &db,
        &[
            "events",
            "retrigger",
            &pending.to_string(),
            &failed[1].to_string(),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "retriggered 1 pending event(s)\n");
    let after = store.get(pending).await.unwrap().unwrap();
    assert!(after.updated_at > before.updated_at);
    assert_eq!(
        (after.status, after.attempts),
        (before.status, before.attempts)
    );
    let out = run(
        &db,
        &[
            "events",
            "retrigger",
            "--pending-older-than",
            "1h",
            "--event-name",
            "accounts.installment_paid",
        ],
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "retriggered 0 pending event(s)\n");
    let out = run(&db, &["events", "retrigger"]);
    assert_eq!(out.status.code(), Some(2), "ids or an age is required");

    // Newest first, a page at a time.
    let out = run(
        &db,
        &["events", "list", "--status", "failed", "--limit", "1"],
    );
    let listing = text(&out.stdout);
    assert!(listing.contains(&format!("\n{}  ", failed[1])), "{listing}");
    assert!(
        listing.ends_with(&format!("(1 row)\n(more: --before {})\n", failed[1])),
        "{listing}"
    );
    let out = run(
        &db,
        &[
            "events",
            "list",
            "--status",
            "failed",
            "--before",
            &failed[1].to_string(),
        ],
    );
    assert!(
        text(&out.stdout).ends_with("(0 rows)\n"),
        "{}",
        text(&out.stdout)
    );
}

/// The application's table in the shapes Rails produces is accepted by
/// `migrate` (and `run`); a shape the sidecar cannot work with is refused
/// with one message naming the column, exit code 2, on PostgreSQL and
/// MariaDB alike.
async fn table_shapes(backend: crate::db::Backend) {
    use crate::db::Backend;
    let pg = backend == Backend::Postgres;
    let (id, ts, json) = if pg {
        ("id bigserial primary key", "timestamp(6)", "jsonb")
    } else {
        (
            "id bigint auto_increment primary key",
            "datetime(6)",
            "json",
        )
    };
    let table = |status: &str, id: &str, updated: &str, attempts: &str| {
        format!(
            "CREATE TABLE outbox_events ({id}, event_name varchar(255) not null, payload {json} not null, \
             status {status} not null, attempts {attempts} not null default 0, last_error varchar(255), \
             sent_at {ts}, created_at {ts} not null, updated_at {updated} not null)"
        )
    };
    let payload_as = |ddl: String, payload: &str| ddl.replace(&format!("payload {json}"), payload);
    let refused: Vec<(String, &str)> = {
        let mut v = vec![
            (
                table("integer", id, ts, "integer"),
                "column outbox_events.status is ",
            ),
            (
                table("varchar(255)", id, ts, "integer").replace(", last_error varchar(255)", ""),
                "column outbox_events.last_error is missing",
            ),
        ];
        if pg {
            v.push((
                table("varchar(255)", "id uuid primary key", ts, "integer"),
                "a uuid primary key is not supported",
            ));
            v.push((
                table("varchar(255)", id, "date", "integer"),
                "column outbox_events.updated_at is date: the sidecar needs a timestamp or timestamptz",
            ));
            v.push((
                payload_as(table("varchar(255)", id, ts, "integer"), "payload bytea not null"),
                "column outbox_events.payload is bytea: the sidecar needs the JSON as json, jsonb or text",
            ));
        } else {
            v.push((
                table("varchar(255)", id, "date", "integer"),
                "column outbox_events.updated_at is date: the sidecar needs a timestamp or timestamptz \
                 (PostgreSQL), datetime or timestamp (MySQL)",
            ));
        }
        v
    };
    for (ddl, message) in refused {
        let db = TestDb::new(backend).await;
        let conn = sea_orm::Database::connect(&db.url).await.unwrap();
        conn.execute_unprepared(&ddl).await.unwrap();
        let out = run(&db, &["migrate"]);
        assert_eq!(out.status.code(), Some(2), "{ddl}: {}", text(&out.stderr));
        let err = text(&out.stderr);
        assert!(
            err.starts_with("error: ") && err.contains(message),
            "{ddl}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "one message: {err}");
    }
    for ddl in [
        table("varchar(255)", id, ts, "integer"),
        table(
            "text",
            if pg {
                "id integer generated always as identity primary key"
            } else {
                "id int auto_increment primary key"
            },
            ts,
            "integer",
        ),
        // timestamptz (PostgreSQL) / timestamp (MySQL), a bigint attempts,
        // a text payload: read with casts (tests/it/shapes.rs runs events
        // through them).
        payload_as(
            table(
                "varchar(255)",
                id,
                if pg { "timestamptz" } else { "timestamp(6)" },
                "bigint",
            ),
            if pg {
                "payload text not null"
            } else {
                "payload longtext not null"
            },
        ),
    ] {
        let db = TestDb::new(backend).await;
        let conn = sea_orm::Database::connect(&db.url).await.unwrap();
        conn.execute_unprepared(&ddl).await.unwrap();
        let out = run(&db, &["migrate"]);
        assert_eq!(out.status.code(), Some(0), "{ddl}: {}", text(&out.stderr));
    }
}

#[tokio::test]
async fn table_shapes_postgres() {
    table_shapes(crate::db::Backend::Postgres).await
}

#[tokio::test]
async fn table_shapes_mariadb() {
    table_shapes(crate::db::Backend::MySql).await
}

/// `run` refuses a table it cannot work with before it consumes anything.
#[tokio::test]
async fn run_refuses_an_unworkable_table_naming_the_column() {
    let db = TestDb::postgres().await;
    let conn = sea_orm::Database::connect(&db.url).await.unwrap();
    conn.execute_unprepared(
        "CREATE TABLE outbox_events (id uuid primary key, event_name text not null, payload jsonb not null, \
         status text not null, attempts integer not null, last_error text, sent_at timestamp, \
         created_at timestamp not null, updated_at timestamp not null)",
    )
    .await
    .unwrap();
    let out = bin()
        .env("OUTBOX__DATABASE__URL", &db.url)
        .env("OUTBOX__KAFKA__BROKERS", "127.0.0.1:1")
        .env("OUTBOX__KAFKA__TOPIC", "outbox")
        .env("OUTBOX__KAFKA__GROUP_ID", "sidecar")
        .env("OUTBOX__ADMIN__LISTEN", "127.0.0.1:0")
        .env("OUTBOX__ADMIN__API_LISTEN", "127.0.0.1:0")
        .args(["run"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr)
            .contains("column outbox_events.id is uuid: a uuid primary key is not supported"),
        "{}",
        text(&out.stderr)
    );
}
