//! TLS to PostgreSQL with the certificate verified (issue 16, item 12):
//! `sslmode=verify-ca` and `verify-full` connect (rustls' crypto provider
//! is installed: it panicked before), and a certificate that fails
//! verification is one clear error naming what to change in
//! `database.url`.
//!
//! The local PostgreSQL (Debian: `ssl = on`, the self-signed "snakeoil"
//! certificate for `localhost`) is the server; its certificate is the
//! trusted root (`sslrootcert`), and a CA made here that did not sign it
//! is the wrong one. A server without TLS, or whose certificate file is
//! not on this machine, cannot run these checks: the test says so on
//! stderr and ends.

use std::io::Write;
use std::time::Duration;

use outbox_sidecar::store::{Store, StoreError};
use sea_orm::{ConnectionTrait, DbBackend, Statement};

use crate::db::{source, Backend, Source, TestDb, PG_URL_ENV};

/// The server's certificate file, when this test can use it.
async fn server_certificate(db: &TestDb) -> Result<String, String> {
    if source(PG_URL_ENV) != Source::Local {
        return Err("the PostgreSQL server is not the local one".into());
    }
    let store = db.store().await;
    let show = |name: &'static str| {
        let store = store.clone();
        async move {
            let row = store
                .connection()
                .query_one_raw(Statement::from_string(
                    DbBackend::Postgres,
                    format!("SELECT current_setting('{name}') AS v"),
                ))
                .await
                .map_err(|e| e.to_string())?
                .ok_or("no row")?;
            row.try_get::<String>("", "v").map_err(|e| e.to_string())
        }
    };
    if show("ssl").await? != "on" {
        return Err("the local PostgreSQL has ssl = off".into());
    }
    let path = show("ssl_cert_file").await?;
    std::fs::read(&path).map_err(|e| format!("cannot read {path}: {e}"))?;
    Ok(path)
}

fn with_tls(url: &str, host: &str, query: &str) -> String {
    let url = url.replacen("@127.0.0.1:", &format!("@{host}:"), 1);
    format!("{url}?{query}")
}

async fn connect(url: &str) -> Result<Store, StoreError> {
    Store::connect(url, "outbox_events", 1, Duration::from_secs(5)).await
}

async fn uses_tls(store: &Store) -> bool {
    store
        .connection()
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()".to_owned(),
        ))
        .await
        .unwrap()
        .unwrap()
        .try_get::<bool>("", "ssl")
        .unwrap()
}

fn message(r: Result<Store, StoreError>) -> String {
    match r {
        Ok(_) => panic!("connected though the certificate does not verify"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn verify_ca_and_verify_full_to_postgres() {
    let db = TestDb::new(Backend::Postgres).await;
    let cert = match server_certificate(&db).await {
        Ok(path) => path,
        Err(why) => {
            let line = format!("pg_tls: not run: {why}\n");
            let _ = std::io::stderr().write_all(line.as_bytes());
            return;
        }
    };
    let root = format!("sslrootcert={cert}");

    // The certificate names `localhost`: verify-full there, verify-ca by IP.
    let store = connect(&with_tls(
        &db.url,
        "localhost",
        &format!("sslmode=verify-full&{root}"),
    ))
    .await
    .expect("verify-full to localhost");
    assert!(uses_tls(&store).await);
    let store = connect(&with_tls(
        &db.url,
        "127.0.0.1",
        &format!("sslmode=verify-ca&{root}"),
    ))
    .await
    .expect("verify-ca to 127.0.0.1");
    assert!(uses_tls(&store).await);

    // verify-full to an address the certificate does not name.
    let err = message(
        connect(&with_tls(
            &db.url,
            "127.0.0.1",
            &format!("sslmode=verify-full&{root}"),
        ))
        .await,
    );
    assert!(
        err.contains("the server's certificate does not name the host \"127.0.0.1\"")
            && err.contains("sslmode=verify-ca"),
        "{err}"
    );

    // A root that did not sign the server's certificate.
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("other-ca.pem");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = params
        .self_signed(&rcgen::KeyPair::generate().unwrap())
        .unwrap();
    std::fs::write(&other, ca.pem()).unwrap();
    let other = other.display().to_string();
    for mode in ["verify-ca", "verify-full"] {
        let err = message(
            connect(&with_tls(
                &db.url,
                "localhost",
                &format!("sslmode={mode}&sslrootcert={other}"),
            ))
            .await,
        );
        assert!(
            err.contains(&format!(
                "the server's certificate is not signed by the CA in sslrootcert={other} (database.url)"
            )),
            "{mode}: {err}"
        );
    }

    // No root given: the system's roots do not include it.
    let err = message(connect(&with_tls(&db.url, "localhost", "sslmode=verify-full")).await);
    assert!(
        err.contains("set sslrootcert=/path/to/ca.pem in database.url"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// The binary too (`migrate` opens the store the way `run` does).
#[tokio::test]
async fn migrate_over_verify_ca_does_not_panic() {
    let db = TestDb::new(Backend::Postgres).await;
    let cert = match server_certificate(&db).await {
        Ok(path) => path,
        Err(why) => {
            let line = format!("pg_tls: not run: {why}\n");
            let _ = std::io::stderr().write_all(line.as_bytes());
            return;
        }
    };
    let url = with_tls(
        &db.url,
        "127.0.0.1",
        &format!("sslmode=verify-ca&sslrootcert={cert}"),
    );
    let out = crate::cli::bin()
        .env("OUTBOX__DATABASE__URL", &url)
        .args(["migrate"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bad = with_tls(
        &db.url,
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={cert}"),
    );
    let out = crate::cli::bin()
        .env("OUTBOX__DATABASE__URL", &bad)
        .args(["migrate"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains("does not name the host \"127.0.0.1\""),
        "{err}"
    );
}
