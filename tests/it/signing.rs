//! Standard Webhooks signatures checked by an independent implementation:
//! Python's standard library (`hmac`, `hashlib`, `base64`) following the
//! specification's verification steps, not the sidecar's code.

use std::process::Command;
use std::time::Duration;

use entity::Status;
use serde_json::json;
use wiremock::ResponseTemplate;

use crate::harness::receiver::Received;
use crate::harness::{eventually, spawn_app_with, Options, Receiver, TestApp};

const A: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const B: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
const T: Duration = Duration::from_secs(30);

/// The specification's verification, in Python: the signed content is
/// `id.timestamp.body`; the header holds space-separated `v1,<base64>`;
/// one match with the secret is enough.
const VERIFY: &str = r#"
import base64, hashlib, hmac, sys
secret, msg_id, ts, sig_header, body_path = sys.argv[1:6]
key = base64.b64decode(secret.split("_", 1)[1])
body = open(body_path, "rb").read()
content = msg_id.encode() + b"." + ts.encode() + b"." + body
expected = base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()
ok = any(s.startswith("v1,") and hmac.compare_digest(s[3:], expected)
         for s in sig_header.split(" "))
sys.exit(0 if ok else 1)
"#;

/// Whether `secret` verifies request `r` (with `body` instead of its own).
fn verifies(secret: &str, r: &Received, body: &[u8]) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("body");
    std::fs::write(&path, body).unwrap();
    let h = |k: &str| r.headers.get(k).cloned().unwrap_or_default();
    Command::new("python3")
        .args(["-c", VERIFY, secret])
        .arg(h("webhook-id"))
        .arg(h("webhook-timestamp"))
        .arg(h("webhook-signature"))
        .arg(&path)
        .status()
        .expect("python3")
        .success()
}

async fn send_one(t: &TestApp, n: i64) -> Received {
    let id = t.insert("accounts.purchase_create", json!({"n": n})).await;
    t.wait_status(id, Status::Sent, T).await;
    t.receiver.for_id(id).pop().expect("received")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_verifies_and_a_rotation_never_fails_one() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secrets");
    std::fs::write(&file, format!("{A}\n")).unwrap();
    let receiver = Receiver::start(|_| ResponseTemplate::new(200)).await;
    let t = spawn_app_with(
        Options {
            accounts_toml: format!("signing_secret_file = {:?}", file.display().to_string()),
            ..Options::default()
        },
        receiver,
    )
    .await;
    let first = send_one(&t, 1).await;
    assert_eq!(first.headers["webhook-id"], first.id.to_string());
    assert!(verifies(A, &first, &first.body), "{:?}", first.headers);
    assert!(!verifies(B, &first, &first.body));
    // A body changed by one byte fails.
    let mut tampered = first.body.clone();
    tampered[0] ^= 1;
    assert!(!verifies(A, &first, &tampered));

    // Rotation, step 1: both secrets; receivers still on A switch to B.
    std::fs::write(&file, format!("{A}\n{B}\n")).unwrap();
    let mut n = 2;
    let both = eventually("requests signed with both secrets", T, || {
        n += 1;
        let t = &t;
        let n = n;
        async move {
            let r = send_one(t, n).await;
            assert!(
                verifies(A, &r, &r.body),
                "every request verifies with A until the switch"
            );
            verifies(B, &r, &r.body).then_some(r)
        }
    })
    .await;
    assert_eq!(both.headers["webhook-signature"].split(' ').count(), 2);
    // Step 2: the old secret removed.
    std::fs::write(&file, format!("{B}\n")).unwrap();
    let mut n = 100;
    eventually("requests signed with the new secret only", T, || {
        n += 1;
        let t = &t;
        let n = n;
        async move {
            let r = send_one(t, n).await;
            assert!(
                verifies(B, &r, &r.body),
                "every request verifies with B after the switch"
            );
            (!verifies(A, &r, &r.body)).then_some(())
        }
    })
    .await;
    // An unreadable file keeps the last good secrets, counted.
    std::fs::remove_file(&file).unwrap();
    let base = t.admin_url("");
    let mut n = 200;
    eventually("the failed reload to be counted", T, || {
        n += 1;
        let (t, base) = (&t, base.clone());
        let n = n;
        async move {
            let r = send_one(t, n).await;
            assert!(
                verifies(B, &r, &r.body),
                "still signed with the last good secret"
            );
            let failed = crate::harness::metric(
                &base,
                "outbox_signing_secret_reload_failures_total{dispatcher=\"accounts\"}",
            )
            .await?;
            (failed >= 1.0).then_some(())
        }
    })
    .await;
}

#[tokio::test]
async fn a_secret_that_does_not_decode_stops_start_up_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secrets");
    std::fs::write(&file, "whsec_not*base64\n").unwrap();
    let db = crate::db::TestDb::postgres().await;
    db.store().await;
    let out = crate::cli::bin()
        .env("OUTBOX__DATABASE__URL", &db.url)
        .env("OUTBOX__KAFKA__BROKERS", "127.0.0.1:1")
        .env("OUTBOX__KAFKA__TOPIC", "t")
        .env(
            "OUTBOX__DISPATCHERS__ACCOUNTS__URL",
            "http://127.0.0.1:1/api/v1/events",
        )
        .env(
            "OUTBOX__DISPATCHERS__ACCOUNTS__EVENTS",
            "accounts.purchase_create",
        )
        .env("OUTBOX__DISPATCHERS__ACCOUNTS__SIGNING_SECRET_FILE", &file)
        .args(["run"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("invalid configuration: dispatchers.accounts.signing_secret_file:")
            && err.contains("line 1: the part after whsec_ is not base64"),
        "{err}"
    );
}
