//! `outbox-sidecar demo`, run as a stranger would after cloning.

#[test]
fn demo_plays_the_decision_table_and_exits_0() {
    let out = crate::cli::bin()
        .args(["demo", "--retry-delay", "300ms"])
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !stdout.contains("\x1b["),
        "no colour when not on a terminal"
    );
    let table: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.contains("final rows"))
        .skip(2)
        .take(4)
        .collect();
    let expect = [
        ("accounts.purchase_create", "sent", "0"),
        ("accounts.installment_paid", "sent", "2"),
        ("accounts.installment_overdue", "sent", "0"),
        ("billing.invoice_issued", "failed", "3"),
    ];
    for (line, (name, status, attempts)) in table.iter().zip(expect) {
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(&cols[1..4], &[name, status, attempts], "{line}");
        assert!(line.ends_with('✓'), "{line}");
    }
    assert_eq!(table.len(), 4, "{stdout}");
    assert!(stdout.contains("pending → failed"), "{stdout}");
    assert!(
        stdout.contains("failed  → pending"),
        "the resend is shown: {stdout}"
    );
    assert!(stdout.contains("every row ended as R-004's decision table says"));
    assert!(stdout.contains(r#"outbox_events_failed 0 → 1"#), "{stdout}");
}

#[tokio::test]
async fn demo_runs_on_postgresql_too() {
    let db = crate::db::TestDb::postgres().await;
    let out = crate::cli::bin()
        .args(["demo", "--retry-delay", "200ms", "--database-url", &db.url])
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("database: postgres://"), "{stdout}");
    // A second run finds rows and refuses rather than mixing its story with them.
    let again = crate::cli::bin()
        .args(["demo", "--retry-delay", "200ms", "--database-url", &db.url])
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&again.stderr),
        "demo: the demo needs an empty outbox_events table in --database-url\n"
    );
}
