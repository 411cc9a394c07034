use std::time::Duration;

use chrono::Timelike;
use entity::outbox_event::Column;
use entity::{OutboxEventRow, Status};
use sea_orm::sea_query::{Expr, ExprTrait, Order};
use sea_orm::ConnectionTrait;

use super::*;

#[test]
fn last_error_is_cut_on_a_character_boundary() {
    assert_eq!(truncate_error("HTTP 503"), "HTTP 503");
    let long = "€".repeat(600); // 1800 bytes of 3-byte characters
    let cut = truncate_error(&long);
    assert!(cut.len() <= MAX_LAST_ERROR_BYTES);
    assert!(cut.ends_with('…'));
    assert!(cut.trim_end_matches('…').chars().all(|c| c == '€'));
    let exact = "a".repeat(MAX_LAST_ERROR_BYTES);
    assert_eq!(
        truncate_error(&exact),
        exact,
        "exactly at the limit is kept whole"
    );
}

#[test]
fn now_has_microsecond_precision() {
    assert_eq!(now().nanosecond() % 1000, 0);
}

#[test]
fn only_columns_the_database_checks_skip_the_payload_parse() {
    use sea_orm::DatabaseBackend::{MySql, Postgres, Sqlite};
    for (backend, t, json) in [
        (Postgres, "jsonb", true),
        (Postgres, "json", true),
        (Postgres, "text", false),
        (Postgres, "character varying", false),
        (MySql, "json", true),
        (MySql, "JSON", true),
        (MySql, "longtext", false),
        (Sqlite, "json", false),
    ] {
        assert_eq!(
            super::payload_type_is_json(backend, t),
            json,
            "{backend:?} {t}"
        );
    }
}

#[tokio::test]
async fn rows_read_by_position_are_the_rows_read_by_name() {
    use sea_orm::FromQueryResult;
    let store = Store::connect(
        "sqlite::memory:",
        "outbox_events",
        1,
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    store.migrate().await.unwrap();
    let a = store
        .insert("a", &serde_json::json!({"x": 1}))
        .await
        .unwrap();
    let b = store
        .insert("b", &serde_json::json!({"y": "z"}))
        .await
        .unwrap();
    // One row with every nullable column set, one with none.
    store
        .db
        .execute_unprepared(&format!(
            "UPDATE outbox_events SET status = 'sent', attempts = 2, \
             last_error = 'HTTP 503', sent_at = updated_at WHERE id = {b}"
        ))
        .await
        .unwrap();
    let stmt = store
        .select_rows()
        .and_where(Expr::col(Column::Id).is_in([a, b]))
        .order_by(Column::Id, Order::Asc)
        .to_owned();
    let by_position = store.fetch(&stmt).await.unwrap();
    let by_name: Vec<OutboxEventRow> = store
        .db
        .query_all(&stmt)
        .await
        .unwrap()
        .iter()
        .map(|r| OutboxEventRow::from_query_result(r, "").unwrap())
        .collect();
    assert_eq!(by_position.len(), 2);
    assert_eq!(by_position, by_name);
    assert_eq!(by_position[1].status, Status::Sent);
    assert_eq!(by_position[1].attempts, 2);
    assert_eq!(by_position[1].last_error.as_deref(), Some("HTTP 503"));
    assert!(by_position[1].sent_at.is_some());
}
