//! Per-aggregate ordering (`[ordering]`, issue #32): an aggregate's events
//! are POSTed in id order, one at a time; a failed one holds back only its
//! own aggregate, and only until it is resent and sent.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use entity::Status;
use outbox_sidecar::store::ListFilter;
use sea_orm::{ConnectionTrait, Statement};
use wiremock::ResponseTemplate;

use crate::harness::kafka::Kafka;
use crate::harness::receiver::Received;
use crate::harness::{eventually, metric, prepare_on, Options, Receiver, TestApp};

const T: Duration = Duration::from_secs(90);

pub const ORDERING: &str = "[ordering]\ncolumn = \"aggregate_key\"\n";

/// The column and index a Rails app adds for ordering.
pub async fn add_aggregate_column(t: &TestApp) {
    let table = t.store.table();
    for sql in [
        format!("ALTER TABLE {table} ADD COLUMN aggregate_key text"),
        format!("CREATE INDEX ON {table} (aggregate_key, id)"),
    ] {
        t.store.connection().execute_unprepared(&sql).await.unwrap();
    }
}

/// Inserts a pending event of `aggregate`, as the application would.
pub async fn insert_in(db: &sea_orm::DatabaseConnection, table: &str, aggregate: &str) -> i64 {
    let stmt = Statement::from_sql_and_values(
        sea_orm::DbBackend::Postgres,
        format!(
            "INSERT INTO {table} (event_name, payload, status, attempts, created_at, updated_at, \
             aggregate_key) VALUES ('accounts.installment_paid', '{{\"n\": 1}}', 'pending', 0, \
             now() AT TIME ZONE 'UTC', now() AT TIME ZONE 'UTC', $1) RETURNING id"
        ),
        [aggregate.into()],
    );
    let row = db.query_one_raw(stmt).await.unwrap().unwrap();
    row.try_get("", "id").unwrap()
}

/// A deterministic coin: true for about `percent` % of ids.
pub fn coin(id: i64, percent: u64) -> bool {
    let mut x = id as u64 ^ 0x9E37_79B9_7F4A_7C15;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x % 100 < percent
}

/// Checks the receiver's log against each aggregate's ids (in id order):
/// no POST of an event before the last POST of the one before it, and the
/// answered (2xx) POSTs in id order.
pub fn check_order(log: &[Received], aggregates: &BTreeMap<String, Vec<i64>>) {
    let aggregate_of: HashMap<i64, &str> = aggregates
        .iter()
        .flat_map(|(a, ids)| ids.iter().map(move |id| (*id, a.as_str())))
        .collect();
    let mut seen: HashMap<&str, i64> = HashMap::new();
    for r in log {
        let Some(a) = aggregate_of.get(&r.id) else {
            continue;
        };
        let last = seen.entry(a).or_insert(i64::MIN);
        assert!(
            r.id >= *last,
            "aggregate {a}: event {} POSTed after event {} (log order)",
            r.id,
            *last
        );
        *last = r.id;
    }
    for (a, ids) in aggregates {
        let answered: Vec<i64> = log
            .iter()
            .filter(|r| aggregate_of.get(&r.id) == Some(&a.as_str()) && r.status / 100 == 2)
            .map(|r| r.id)
            .collect();
        let mut sorted = answered.clone();
        sorted.sort_unstable();
        assert_eq!(
            answered, sorted,
            "aggregate {a}: answered POSTs in id order"
        );
        let mut unique = sorted.clone();
        unique.dedup();
        assert_eq!(&unique, ids, "aggregate {a}: every event answered");
    }
}

async fn ordered_app(receiver: Receiver, extra: &str) -> TestApp {
    let t = prepare_on(
        Kafka::start(),
        Options {
            extra_toml: format!("{ORDERING}{extra}"),
            max_in_flight: 16,
            ..Options::default()
        },
        receiver,
    )
    .await;
    add_aggregate_column(&t).await;
    t
}

/// `events list --held`'s ids, newest first.
async fn held_ids(store: &outbox_sidecar::store::Store) -> Vec<i64> {
    let filter = ListFilter {
        held: true,
        ..ListFilter::default()
    };
    store
        .list(&filter)
        .await
        .unwrap()
        .iter()
        .map(|r| r.id)
        .collect()
}

/// The test's store as the sidecar configured with `[ordering]` sees it.
fn ordered_store(t: &TestApp) -> outbox_sidecar::store::Store {
    t.store
        .clone()
        .with_ordering(Some(outbox_sidecar::store::OrderingColumns {
            column: "aggregate_key".into(),
            hold: true,
        }))
}

#[tokio::test]
async fn each_aggregate_is_sent_in_order_while_aggregates_go_on_concurrently() {
    // 20 % of first attempts answered 503 at random: a retried event must
    // not be overtaken by the next one of its aggregate.
    let receiver = Receiver::start(|r| {
        ResponseTemplate::new(if r.nth == 0 && coin(r.id, 20) {
            503
        } else {
            200
        })
    })
    .await;
    let mut t = ordered_app(receiver, "").await;
    t.start().await;
    // 400 events over 20 aggregates by 4 concurrent writers, each writing
    // its own 5 aggregates.
    let mut writers = Vec::new();
    for w in 0..4 {
        let db = t.store.connection().clone();
        let table = t.store.table().to_owned();
        writers.push(tokio::spawn(async move {
            let mut mine: BTreeMap<String, Vec<i64>> = BTreeMap::new();
            for n in 0..100 {
                let a = format!("acct-{w}-{}", n % 5);
                let id = insert_in(&db, &table, &a).await;
                mine.entry(a).or_default().push(id);
            }
            mine
        }));
    }
    let mut aggregates = BTreeMap::new();
    for w in writers {
        aggregates.extend(w.await.unwrap());
    }
    let all: Vec<i64> = aggregates.values().flatten().copied().collect();
    eventually("every event sent", T, || async {
        let rows = t.store.get_many(&all).await.ok()?;
        rows.iter().all(|r| r.status == Status::Sent).then_some(())
    })
    .await;
    let log = t.receiver.requests();
    check_order(&log, &aggregates);
    let retried = log.iter().filter(|r| r.status == 503).count();
    assert!(
        retried > 40,
        "the receiver refused {retried} first attempts"
    );
    // Aggregates went on side by side: some aggregate's event was POSTed
    // between two POSTs of another's.
    let firsts: Vec<&str> = log
        .iter()
        .filter_map(|r| {
            aggregates
                .iter()
                .find(|(_, ids)| ids.contains(&r.id))
                .map(|(a, _)| a.as_str())
        })
        .collect();
    let switches = firsts.windows(2).filter(|w| w[0] != w[1]).count();
    assert!(
        switches > 40,
        "aggregates interleaved ({switches} switches)"
    );
    // One writer per aggregate: every event was decided on its insert, in
    // its aggregate's line, so nothing was parked and nothing announced
    // again (an announcement is a write and a change event more).
    let base = t.admin_url("");
    for name in [
        "outbox_ordering_parked_total",
        "outbox_ordering_announced_total",
    ] {
        assert_eq!(metric(&base, name).await, Some(0.0), "{name}");
    }
    t.stop().await;
}

#[tokio::test]
async fn a_failed_head_holds_only_its_aggregate_until_it_is_resent_and_sent() {
    let healed = Arc::new(AtomicBool::new(false));
    let stuck_head = Arc::new(std::sync::atomic::AtomicI64::new(-1));
    let receiver = {
        let healed = healed.clone();
        let stuck_head = stuck_head.clone();
        Receiver::start(move |r| {
            let refuse =
                r.id == stuck_head.load(Ordering::SeqCst) && !healed.load(Ordering::SeqCst);
            ResponseTemplate::new(if refuse { 500 } else { 200 })
        })
        .await
    };
    let mut t = ordered_app(receiver, "").await;
    let db = t.store.connection().clone();
    let table = t.store.table().to_owned();
    let head = insert_in(&db, &table, "stuck").await;
    stuck_head.store(head, Ordering::SeqCst);
    t.start().await;
    let mut held = Vec::new();
    let mut others: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for n in 0..60 {
        if n % 10 == 0 {
            held.push(insert_in(&db, &table, "stuck").await);
        }
        let a = format!("other-{}", n % 6);
        others
            .entry(a.clone())
            .or_default()
            .push(insert_in(&db, &table, &a).await);
    }
    t.wait_status(head, Status::Failed, T).await;
    let rest: Vec<i64> = others.values().flatten().copied().collect();
    eventually("every other aggregate sent", T, || async {
        let rows = t.store.get_many(&rest).await.ok()?;
        rows.iter().all(|r| r.status == Status::Sent).then_some(())
    })
    .await;
    // The held events: pending, no attempt used, never POSTed; visible.
    let base = t.admin_url("");
    eventually("the held gauges", T, || async {
        let events = metric(&base, "outbox_ordering_held_events").await?;
        let aggregates = metric(&base, "outbox_ordering_held_aggregates").await?;
        (events == held.len() as f64 && aggregates == 1.0).then_some(())
    })
    .await;
    let ordered = ordered_store(&t);
    for &id in &held {
        let row = t.row(id).await;
        assert_eq!((row.status, row.attempts), (Status::Pending, 0), "{id}");
        assert!(t.receiver.for_id(id).is_empty(), "{id} was POSTed");
        assert_eq!(
            ordered.waits_behind(id).await.unwrap(),
            Some((head, Status::Failed)),
            "{id}"
        );
    }
    assert_eq!(
        t.receiver.for_id(head).len(),
        3,
        "the head used its 3 attempts"
    );
    let listed: Vec<i64> = held_ids(&ordered).await.into_iter().rev().collect();
    assert_eq!(listed, held, "events list --held");
    // Why each waits: held behind the failed head, and what to do.
    let why: serde_json::Value = reqwest::Client::new()
        .get(t.api_url(&format!("/admin/events/{}/why", held[0])))
        .bearer_auth("test-admin-token-0123456789")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(why["reason"], "held", "{why}");
    assert_eq!(
        why["action"],
        format!("resend the failed one (`events retry {head}`); this one follows it in order")
    );
    // The operator's views: the command line and the console.
    let cli = |args: &[&str]| {
        let out = crate::cli::bin()
            .env("OUTBOX__DATABASE__URL", &t.db.url)
            .env("OUTBOX__ORDERING__COLUMN", "aggregate_key")
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let shown = cli(&["events", "show", &held[2].to_string()]);
    assert!(
        shown.contains(&format!("held behind event {head} (failed)")),
        "{shown}"
    );
    let listed = cli(&["events", "list", "--held"]);
    let mut first_cells: Vec<i64> = listed
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    first_cells.sort_unstable();
    assert_eq!(first_cells, held, "{listed}");
    // The admin API's list, and its refusal of a flag it cannot honour.
    let api = reqwest::Client::new();
    let token = t.opts.admin_token.unwrap();
    let got: Vec<serde_json::Value> = api
        .get(t.api_url("/admin/events?held=true"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut api_ids: Vec<i64> = got.iter().map(|e| e["id"].as_i64().unwrap()).collect();
    api_ids.sort_unstable();
    assert_eq!(api_ids, held, "GET /admin/events?held=true");
    let http = crate::console::no_redirects();
    let (cookie, _) = crate::console::signed_in(&t, &http).await;
    let page = http
        .get(t.api_url(&format!("/admin/console/events/{}", held[0])))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("held behind event"), "{page}");
    assert!(
        page.contains(&format!("/admin/console/events/{head}")),
        "{page}"
    );
    // The console's events list, filtered to the held events.
    let list = http
        .get(t.api_url("/admin/console/events?status=held"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(list.status(), 200);
    let list = list.text().await.unwrap();
    let mut linked: Vec<i64> = list
        .split("href=\"/admin/console/events/")
        .skip(1)
        .filter_map(|rest| rest.split('"').next()?.parse().ok())
        .collect();
    linked.sort_unstable();
    linked.dedup();
    assert_eq!(linked, held, "the console's held events: {list}");
    // Their messages were committed: nothing holds the partitions.
    t.wait_all_committed(&t.group, T).await;
    // The receiver heals and the operator resends the head.
    healed.store(true, Ordering::SeqCst);
    let caller =
        outbox_sidecar::store::history::Caller::new(outbox_sidecar::store::history::Via::Cli, None);
    t.store.retry(head, &caller).await.unwrap().unwrap();
    for &id in &held {
        t.wait_status(id, Status::Sent, T).await;
    }
    let mut stuck = vec![head];
    stuck.extend(&held);
    let mut aggregates = others.clone();
    aggregates.insert("stuck".into(), stuck);
    let log = t.receiver.requests();
    // The head's three refused attempts come first: check from its resend on.
    let after: Vec<Received> = log
        .iter()
        .filter(|r| !(r.id == head && r.status == 500))
        .cloned()
        .collect();
    check_order(&after, &aggregates);
    for &id in &held {
        assert_eq!(t.receiver.for_id(id).len(), 1, "held event {id} sent once");
    }
    assert!(metric(&base, "outbox_ordering_parked_total").await.unwrap() >= held.len() as f64);
    // The resent head announced the first held event, each held one the next.
    assert!(
        metric(&base, "outbox_ordering_announced_total")
            .await
            .unwrap()
            >= held.len() as f64
    );
    t.stop().await;
}

#[tokio::test]
async fn a_column_the_table_lacks_is_refused_at_start_up() {
    let t = prepare_on(
        Kafka::start(),
        Options {
            extra_toml: ORDERING.into(),
            ..Options::default()
        },
        Receiver::accepting().await,
    )
    .await;
    let settings = t.settings(&t.group);
    let e = match outbox_sidecar::app::App::start(settings).await {
        Ok(_) => panic!("started without the ordering column"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("aggregate_key") && e.contains("ordering.column"),
        "{e}"
    );
}

/// The ordering's reads and announcements, the same on each backend: what a
/// row waits behind, its aggregate's next pending event, the held list and
/// counts, and the sweep that touches only what nothing holds.
#[tokio::test]
async fn the_ordering_queries_agree_on_postgresql_mariadb_and_sqlite() {
    use crate::db::{Backend, TestDb};
    use outbox_sidecar::store::{OrderingColumns, RowRead};
    for backend in [Backend::Postgres, Backend::MySql, Backend::Sqlite] {
        let db = TestDb::new(backend).await;
        let plain = db.store().await;
        let conn = plain.connection().clone();
        let column_type = if backend == Backend::MySql {
            "varchar(64)"
        } else {
            "text"
        };
        for sql in [
            format!("ALTER TABLE outbox_events ADD COLUMN aggregate_key {column_type} NULL"),
            "CREATE INDEX ix_aggregate ON outbox_events (aggregate_key, id)".to_owned(),
        ] {
            conn.execute_unprepared(&sql).await.unwrap();
        }
        let store = |hold| {
            plain.clone().with_ordering(Some(OrderingColumns {
                column: "aggregate_key".into(),
                hold,
            }))
        };
        let hold = store(true);
        let mut ids = Vec::new();
        for (aggregate, status) in [
            (Some("a"), "sent"),
            (Some("a"), "failed"),
            (Some("a"), "pending"),
            (Some("a"), "pending"),
            (Some("b"), "pending"),
            (None, "pending"),
        ] {
            let id = plain
                .insert("accounts.installment_paid", &serde_json::json!({"n": 1}))
                .await
                .unwrap();
            let value = aggregate.map_or("NULL".to_owned(), |a| format!("'{a}'"));
            conn.execute_unprepared(&format!(
                "UPDATE outbox_events SET aggregate_key = {value}, status = '{status}', \
                 updated_at = '2020-01-01 00:00:00' WHERE id = {id}"
            ))
            .await
            .unwrap();
            ids.push(id);
        }
        let [_a1, a2, a3, a4, b1, n] = ids[..] else {
            unreachable!()
        };
        let sequences = |rows: Vec<RowRead>| -> Vec<(i64, entity::Sequence)> {
            rows.into_iter()
                .map(|r| match r {
                    RowRead::Row(row) => (row.id, row.sequence.expect("read with the row")),
                    RowRead::Undecodable { id, error } => panic!("{id}: {error}"),
                })
                .collect()
        };
        let mut read = sequences(hold.read_rows(&[a3, a4, b1, n]).await.unwrap());
        read.sort_by_key(|(id, _)| *id);
        let seq = |aggregate: Option<&str>, behind| entity::Sequence {
            aggregate: aggregate.map(str::to_owned),
            behind,
        };
        assert_eq!(
            read,
            vec![
                (a3, seq(Some("a"), Some(a2))),
                (a4, seq(Some("a"), Some(a3))),
                (b1, seq(Some("b"), None)),
                (n, seq(None, None)),
            ],
            "{backend:?}"
        );
        // Under "skip" a failed event holds nothing.
        let skip = sequences(store(false).read_rows(&[a3]).await.unwrap());
        assert_eq!(skip[0].1.behind, None, "{backend:?}");
        assert_eq!(
            hold.waits_behind(a4).await.unwrap(),
            Some((a2, Status::Failed)),
            "{backend:?}: the failed event is named, not the pending one between"
        );
        assert_eq!(hold.waits_behind(b1).await.unwrap(), None);
        assert_eq!(
            hold.held_counts().await.unwrap(),
            Some((1, 2)),
            "{backend:?}"
        );
        let held = held_ids(&hold).await;
        assert_eq!(held, vec![a4, a3], "{backend:?}");
        // The sweep touches what nothing holds (b1), not a3/a4 (behind the
        // failed a2) nor the unordered row.
        let touched = hold
            .announce_stranded(Duration::from_secs(1), 100, 0, &[])
            .await
            .unwrap()
            .touched;
        assert_eq!(touched, 1, "{backend:?}");
        let old = chrono::NaiveDate::from_ymd_opt(2020, 1, 1)
            .unwrap()
            .and_hms_opt(0, 0, 0)
            .unwrap();
        let updated = |id| {
            let plain = plain.clone();
            async move { plain.get(id).await.unwrap().unwrap().updated_at }
        };
        assert!(updated(b1).await > old, "{backend:?}: b1 touched");
        for id in [a3, a4, n] {
            assert_eq!(updated(id).await, old, "{backend:?}: {id} left alone");
        }
        // After a2 is sent, its aggregate's next pending event is announced.
        assert_eq!(
            hold.announce_next(a2).await.unwrap(),
            Some(a3),
            "{backend:?}"
        );
        assert!(updated(a3).await > old);
        assert_eq!(updated(a4).await, old, "only the next one");
    }
}

#[tokio::test]
async fn an_unkeyed_event_still_waits_its_turn_and_a_lost_announcement_is_repaired() {
    let mut t = ordered_app(Receiver::accepting().await, "stranded_after = \"1s\"\n").await;
    t.start().await;
    let db = t.store.connection().clone();
    let table = t.store.table().to_owned();
    // Two pending events of one aggregate whose change events never came
    // (as if their announcements were lost with a killed replica).
    db.execute_unprepared(&format!("ALTER TABLE {table} DISABLE TRIGGER outbox_cdc"))
        .await
        .unwrap();
    let first = insert_in(&db, &table, "u").await;
    let second = insert_in(&db, &table, "u").await;
    db.execute_unprepared(&format!("ALTER TABLE {table} ENABLE TRIGGER outbox_cdc"))
        .await
        .unwrap();
    // The second one's change event arrives keyed by id, not by the
    // aggregate (a connector without message.key.columns): counted, and
    // still not sent before the first.
    let value = crate::harness::feed::envelope(
        "c",
        &serde_json::Value::Null,
        &serde_json::json!({"id": second, "status": "pending", "attempts": 0}),
        "outbox_events",
    );
    let key = format!("{{\"id\": {second}}}");
    t.feed
        .publish_raw(Some(key.as_bytes()), Some(value.to_string().as_bytes()))
        .await;
    let base = t.admin_url("");
    eventually("the unkeyed event counted", T, || async {
        (metric(&base, "outbox_ordering_unkeyed_total").await? >= 1.0).then_some(())
    })
    .await;
    // The sweep announces the first (nothing before it, unchanged for
    // stranded_after); once it is sent, the second is announced and sent.
    t.wait_status(second, Status::Sent, T).await;
    let ids: Vec<i64> = t.receiver.requests().iter().map(|r| r.id).collect();
    assert_eq!(ids, vec![first, second]);
    t.stop().await;
}

/// Inserts a pending event named `name` of `aggregate`.
async fn insert_named(t: &TestApp, name: &str, aggregate: &str) -> i64 {
    let stmt = Statement::from_sql_and_values(
        sea_orm::DbBackend::Postgres,
        format!(
            "INSERT INTO {} (event_name, payload, status, attempts, created_at, updated_at, \
             aggregate_key) VALUES ($1, '{{\"n\": 1}}', 'pending', 0, \
             now() AT TIME ZONE 'UTC', now() AT TIME ZONE 'UTC', $2) RETURNING id",
            t.store.table()
        ),
        [name.into(), aggregate.into()],
    );
    let row = t
        .store
        .connection()
        .query_one_raw(stmt)
        .await
        .unwrap()
        .unwrap();
    row.try_get("", "id").unwrap()
}

#[tokio::test]
async fn under_skip_a_failed_event_lets_its_aggregate_go_on_in_order() {
    let head = Arc::new(std::sync::atomic::AtomicI64::new(-1));
    let receiver = {
        let head = head.clone();
        Receiver::start(move |r| {
            ResponseTemplate::new(if r.id == head.load(Ordering::SeqCst) {
                500
            } else {
                200
            })
        })
        .await
    };
    let mut t = ordered_app(receiver, "on_failed = \"skip\"\n").await;
    let db = t.store.connection().clone();
    let table = t.store.table().to_owned();
    let first = insert_in(&db, &table, "a").await;
    head.store(first, Ordering::SeqCst);
    let mut later = Vec::new();
    for _ in 0..5 {
        later.push(insert_in(&db, &table, "a").await);
    }
    t.start().await;
    for &id in &later {
        t.wait_status(id, Status::Sent, T).await;
    }
    assert_eq!(t.row(first).await.status, Status::Failed);
    // Each later event went only after the failed one had ended, in order.
    let mut all = vec![first];
    all.extend(&later);
    let ids: Vec<i64> = t.receiver.requests().iter().map(|r| r.id).collect();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    assert_eq!(ids, sorted, "POSTs in id order: {ids:?}");
    assert_eq!(ids.iter().filter(|&&id| id == first).count(), 3);
    t.stop().await;
}

#[tokio::test]
async fn an_event_behind_a_paused_dispatcher_s_event_waits_for_its_resume() {
    // Two dispatchers; the aggregate's first event is the paused one's.
    let receiver = Receiver::accepting().await;
    let url = receiver.url();
    let extra = format!(
        "[dispatchers.billing]\nurl = \"{url}\"\nevents = [\"billing.invoice_issued\"]\n\
         timeout = \"2s\"\n"
    );
    let mut t = prepare_on(
        Kafka::start(),
        Options {
            extra_toml: format!("{ORDERING}{extra}"),
            dispatch_toml: "pause_refresh = \"200ms\"".into(),
            ..Options::default()
        },
        receiver,
    )
    .await;
    add_aggregate_column(&t).await;
    let caller =
        outbox_sidecar::store::history::Caller::new(outbox_sidecar::store::history::Via::Cli, None);
    t.store.pause("billing", &caller).await.unwrap();
    t.start().await;
    let billed = insert_named(&t, "billing.invoice_issued", "a").await;
    let after = insert_in(t.store.connection(), t.store.table(), "a").await;
    let other = insert_in(t.store.connection(), t.store.table(), "b").await;
    t.wait_status(other, Status::Sent, T).await;
    let base = t.admin_url("");
    eventually("both events of a parked", T, || async {
        (metric(&base, "outbox_ordering_parked_total").await? >= 1.0).then_some(())
    })
    .await;
    assert!(t.receiver.for_id(billed).is_empty());
    assert!(
        t.receiver.for_id(after).is_empty(),
        "sent behind a paused event"
    );
    assert_eq!(t.row(after).await.attempts, 0);
    let dispatchers = t.settings(&t.group).dispatcher_events();
    outbox_sidecar::operator::resume(&t.store, &dispatchers, "billing")
        .await
        .unwrap();
    t.wait_status(after, Status::Sent, T).await;
    let ids: Vec<i64> = t
        .receiver
        .requests()
        .iter()
        .map(|r| r.id)
        .filter(|id| *id != other)
        .collect();
    assert_eq!(ids, vec![billed, after]);
    t.stop().await;
}

/// The stranded-event sweep walks with a cursor and skips what a pause
/// explains: 3,000 parked events of a paused dispatcher (their change
/// events gone) do not keep it from two stranded events of another. At
/// e0190ec each sweep took the lowest 1,000 pending ids, the paused rows,
/// and re-announced them for nothing; the two were not sent in 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_reaches_stranded_events_past_a_paused_dispatchers_backlog() {
    let receiver = Receiver::accepting().await;
    let extra = format!(
        "stranded_after = \"2s\"\n[dispatchers.billing]\nurl = \"{}\"\nevents = [\"billing.charge\"]\n",
        receiver.url()
    );
    let mut t = ordered_app(receiver, &extra).await;
    t.start().await;
    let caller = outbox_sidecar::store::history::Caller::new(
        outbox_sidecar::store::history::Via::Cli,
        Some("test".into()),
    );
    assert!(t.store.pause("billing", &caller).await.unwrap());
    let db = t.store.connection().clone();
    let table = t.store.table().to_owned();
    db.execute_unprepared(&format!(
        "ALTER TABLE {table} DISABLE TRIGGER outbox_cdc; \
         INSERT INTO {table} (event_name, payload, status, attempts, created_at, updated_at, aggregate_key) \
         SELECT 'billing.charge', '{{}}', 'pending', 0, now() AT TIME ZONE 'UTC', now() AT TIME ZONE 'UTC', 'b-' || g \
         FROM generate_series(1, 3000) g"
    ))
    .await
    .unwrap();
    let first = insert_in(&db, &table, "u").await;
    let second = insert_in(&db, &table, "u").await;
    db.execute_unprepared(&format!("ALTER TABLE {table} ENABLE TRIGGER outbox_cdc"))
        .await
        .unwrap();
    t.wait_status(second, Status::Sent, T).await;
    let ids: Vec<i64> = t.receiver.requests().iter().map(|r| r.id).collect();
    assert_eq!(ids, vec![first, second], "only the two, in order");
    assert_eq!(t.store.stats().await.unwrap().pending, 3000);
    t.stop().await;
}

/// A row whose status write the database refuses for good is given up
/// after one POST, and the sweep never announces it again: its attempt is
/// logged alone, newer than the row's last change. At e0190ec the sweep
/// re-announced it every `stranded_after`, a POST each time. Two canaries
/// (stranded events inserted after it, higher ids) prove two sweeps went
/// past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_whose_write_is_refused_for_good_is_not_announced_again_by_the_sweep() {
    let mut t = ordered_app(Receiver::accepting().await, "stranded_after = \"2s\"\n").await;
    let db = t.store.connection().clone();
    let table = t.store.table().to_owned();
    db.execute_unprepared(&format!(
        "CREATE FUNCTION refuse_overdue_sent() RETURNS trigger AS $$ BEGIN \
           IF NEW.status = 'sent' AND NEW.event_name = 'accounts.installment_overdue' THEN \
             RAISE EXCEPTION 'overdue rows may not be sent' USING ERRCODE = '23514'; \
           END IF; RETURN NEW; END $$ LANGUAGE plpgsql; \
         CREATE TRIGGER refuse_overdue_sent BEFORE UPDATE ON {table} \
           FOR EACH ROW EXECUTE FUNCTION refuse_overdue_sent();"
    ))
    .await
    .unwrap();
    t.start().await;
    let refused = insert_named(&t, "accounts.installment_overdue", "r").await;
    let base = t.admin_url("");
    eventually("the row given up", T, || async {
        (metric(&base, r#"outbox_status_writes_given_up_total{to="sent"}"#).await? >= 1.0)
            .then_some(())
    })
    .await;
    assert_eq!(t.receiver.for_id(refused).len(), 1);
    let history = t.store.history(refused).await.unwrap();
    assert_eq!(history.len(), 1, "its attempt is logged: {history:?}");
    for canary in ["c1", "c2"] {
        db.execute_unprepared(&format!("ALTER TABLE {table} DISABLE TRIGGER outbox_cdc"))
            .await
            .unwrap();
        let id = insert_in(&db, &table, canary).await;
        db.execute_unprepared(&format!("ALTER TABLE {table} ENABLE TRIGGER outbox_cdc"))
            .await
            .unwrap();
        t.wait_status(id, Status::Sent, T).await;
    }
    assert_eq!(
        t.receiver.for_id(refused).len(),
        1,
        "no POST beyond its attempt"
    );
    let row = t.row(refused).await;
    assert_eq!((row.status, row.attempts), (Status::Pending, 0));
    t.stop().await;
}

/// `outbox_pending_unexplained` counts a pending event nothing explains (a
/// change event that never came) once it is older than
/// `metrics.pending_unexplained_after`, and the shipped alert's expression
/// fires on it; a paused dispatcher's event and one held behind a failed
/// event of its aggregate, as old, are not counted. Announced again, the
/// event is sent and the gauge goes back to 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unexplained_gauge_counts_what_nothing_explains_and_the_alert_fires() {
    let receiver = Receiver::start(|r| {
        if r.event_name == "accounts.installment_overdue" {
            ResponseTemplate::new(503)
        } else {
            ResponseTemplate::new(204)
        }
    })
    .await;
    let billing = format!(
        "{ORDERING}[dispatchers.billing]\nurl = \"{}\"\nevents = [\"billing.charge\"]\n",
        receiver.url()
    );
    let mut t = prepare_on(
        Kafka::start(),
        Options {
            extra_toml: billing,
            metrics_toml: "pending_unexplained_after = \"2s\"".into(),
            ..Options::default()
        },
        receiver,
    )
    .await;
    add_aggregate_column(&t).await;
    t.start().await;
    let base = t.admin_url("");
    let gauge = || async { metric(&base, "outbox_pending_unexplained").await };
    let db = t.store.connection().clone();
    let table = t.store.table().to_owned();
    // A failed head: the events of its aggregate after it are held.
    let head = insert_named(&t, "accounts.installment_overdue", "h").await;
    t.wait_status(head, Status::Failed, T).await;
    let caller =
        outbox_sidecar::store::history::Caller::new(outbox_sidecar::store::history::Via::Cli, None);
    t.store.pause("billing", &caller).await.unwrap();
    let silently = |name: &'static str, aggregate: &'static str| {
        let db = db.clone();
        let table = table.clone();
        async move {
            db.execute_unprepared(&format!("ALTER TABLE {table} DISABLE TRIGGER outbox_cdc"))
                .await
                .unwrap();
            let row = db
                .query_one_raw(Statement::from_sql_and_values(
                    sea_orm::DbBackend::Postgres,
                    format!(
                        "INSERT INTO {table} (event_name, payload, status, attempts, created_at, \
                         updated_at, aggregate_key) VALUES ($1, '{{}}', 'pending', 0, \
                         now() AT TIME ZONE 'UTC', now() AT TIME ZONE 'UTC', $2) RETURNING id"
                    ),
                    [name.into(), aggregate.into()],
                ))
                .await
                .unwrap()
                .unwrap();
            db.execute_unprepared(&format!("ALTER TABLE {table} ENABLE TRIGGER outbox_cdc"))
                .await
                .unwrap();
            row.try_get::<i64>("", "id").unwrap()
        }
    };
    let held = silently("accounts.installment_paid", "h").await;
    let paused = silently("billing.charge", "p").await;
    let lost = silently("accounts.purchase_create", "l").await;
    // Counted once older than the setting; the held and the paused ones
    // (inserted before it) never are.
    eventually("the lost event counted", T, || async {
        (gauge().await? == 1.0).then_some(())
    })
    .await;
    let rules = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("deploy/kubernetes/prometheusrule.yaml"),
    )
    .unwrap();
    let alert = rules
        .split("- alert: ")
        .find(|a| a.starts_with("OutboxPendingUnexplained"))
        .expect("the shipped alert");
    assert!(
        alert.contains("expr: max by (namespace) (outbox_pending_unexplained) > 0"),
        "{alert}"
    );
    assert!(alert.contains("events why ID"), "{alert}");
    // Its expression over this replica's series: 1 > 0, it fires.
    assert!(gauge().await.unwrap() > 0.0);
    for id in [held, paused] {
        assert_eq!(t.row(id).await.status, Status::Pending, "{id}");
    }
    // Announced again, it is sent; nothing unexplained is left.
    t.store
        .retrigger(&outbox_sidecar::store::RetriggerFilter {
            ids: vec![lost],
            older_than: None,
            event_name: None,
        })
        .await
        .unwrap();
    t.wait_status(lost, Status::Sent, T).await;
    eventually("the gauge back to 0", T, || async {
        (gauge().await? == 0.0).then_some(())
    })
    .await;
    t.stop().await;
}

/// The held-events gauge reads the pending rows, one backward probe of
/// each one's aggregate: 20,000 old failed events (of aggregates with
/// nothing after them) do not change what its statement touches. At
/// e0190ec it started from the failed rows, so its cost grew with every
/// failed event ever left in the table. Measured in buffers (EXPLAIN
/// ANALYZE), not time.
#[tokio::test]
async fn the_held_gauge_costs_the_pending_rows_not_the_old_failed_ones() {
    use crate::db::TestDb;
    use outbox_sidecar::store::OrderingColumns;
    let db = TestDb::postgres().await;
    let plain = db.store().await;
    let conn = plain.connection().clone();
    for sql in [
        "ALTER TABLE outbox_events ADD COLUMN aggregate_key text NULL",
        "CREATE INDEX ix_aggregate ON outbox_events (aggregate_key, id)",
        "ALTER TABLE outbox_events DISABLE TRIGGER ALL",
    ] {
        let _ = conn.execute_unprepared(sql).await;
    }
    let store = plain.with_ordering(Some(OrderingColumns {
        column: "aggregate_key".into(),
        hold: true,
    }));
    let insert = |aggregate: &str, status: &str, n: i64| {
        format!(
            "INSERT INTO outbox_events (event_name, payload, status, attempts, created_at, updated_at, aggregate_key) \
             SELECT 'accounts.installment_paid', '{{}}', '{status}', 0, now(), now(), '{aggregate}' || g \
             FROM generate_series(1, {n}) g"
        )
    };
    // A held aggregate: a failed head and two pending events after it.
    for (status, n) in [("failed", 1), ("pending", 1), ("pending", 1)] {
        conn.execute_unprepared(&insert("h", status, n))
            .await
            .unwrap();
    }
    let touched = || {
        let conn = conn.clone();
        let sql = store.held_counts_sql().unwrap();
        async move {
            let plan = conn
                .query_one_raw(Statement::from_string(
                    sea_orm::DbBackend::Postgres,
                    format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}"),
                ))
                .await
                .unwrap()
                .unwrap();
            let plan: serde_json::Value = plan.try_get_by_index(0).unwrap();
            let top = &plan[0]["Plan"];
            top["Shared Hit Blocks"].as_i64().unwrap() + top["Shared Read Blocks"].as_i64().unwrap()
        }
    };
    // Statistics as of now; the 20,000 rows below come in faster than
    // autovacuum would see them.
    conn.execute_unprepared("ANALYZE outbox_events")
        .await
        .unwrap();
    assert_eq!(store.held_counts().await.unwrap(), Some((1, 2)));
    let before = touched().await;
    // 20,000 failed events of old aggregates: nothing pending after them.
    conn.execute_unprepared(&insert("old-", "failed", 20_000))
        .await
        .unwrap();
    assert_eq!(store.held_counts().await.unwrap(), Some((1, 2)));
    let after = touched().await;
    assert!(
        after <= before + 10,
        "the held gauge touched {before} buffers, then {after} with 20,000 old failed rows"
    );
}

/// A backlog: 40 events of distinct aggregates behind a receiver that
/// takes 300 ms an answer and 2 jobs at a time (~6 s to drain), with
/// `stranded_after = "1s"` and `pending_unexplained_after = "1s"`. Rows
/// whose change events are still in the group's backlog (not committed
/// past) are explained by it: the sweep announces none of them again (one
/// change event each, the insert's) and `outbox_pending_unexplained` stays
/// 0 throughout. Before the backlog was read, the sweep touched every row
/// waiting over 1 s and the gauge counted them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_is_neither_swept_nor_counted_unexplained() {
    let receiver =
        Receiver::start(|_| ResponseTemplate::new(204).set_delay(Duration::from_millis(300))).await;
    let mut t = prepare_on(
        Kafka::start(),
        Options {
            extra_toml: format!("{ORDERING}stranded_after = \"1s\"\n"),
            metrics_toml: "pending_unexplained_after = \"1s\"".into(),
            max_in_flight: 1,
            ..Options::default()
        },
        receiver,
    )
    .await;
    add_aggregate_column(&t).await;
    t.start().await;
    let base = t.admin_url("");
    let db = t.store.connection().clone();
    let table = t.store.table().to_owned();
    let mut ids = Vec::new();
    for i in 0..40 {
        ids.push(insert_in(&db, &table, &format!("a{i}")).await);
    }
    let last = *ids.last().unwrap();
    let mut highest = 0.0f64;
    let deadline = std::time::Instant::now() + T;
    loop {
        if let Some(v) = metric(&base, "outbox_pending_unexplained").await {
            highest = highest.max(v);
        }
        if t.row(last).await.status == Status::Sent
            && ids.iter().all(|id| !t.receiver.for_id(*id).is_empty())
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the backlog did not drain within {T:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for id in &ids {
        t.wait_status(*id, Status::Sent, T).await;
    }
    // The backlog lasted: some row waited well past both settings.
    let waited = ids
        .iter()
        .map(|id| t.receiver.for_id(*id)[0].at)
        .max()
        .unwrap()
        - ids
            .iter()
            .map(|id| t.receiver.for_id(*id)[0].at)
            .min()
            .unwrap();
    assert!(
        waited > chrono::Duration::seconds(3),
        "the backlog drained in {waited:?}"
    );
    assert_eq!(highest, 0.0, "a backlog's rows are not unexplained");
    let published = t.feed.published();
    for id in &ids {
        let announced = published
            .iter()
            .filter(|p| p.id == *id && p.status.as_deref() == Some("pending"))
            .count();
        assert_eq!(announced, 1, "event {id}: announced by its insert only");
        assert_eq!(t.receiver.for_id(*id).len(), 1, "event {id} POSTed once");
    }
    t.stop().await;
}
