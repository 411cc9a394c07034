//! The console's chart: attempts per minute over the last hour, from the
//! attempt log. The log's `started_at` index (BRIN on PostgreSQL, a b-tree
//! elsewhere) bounds the read to the window, so the cost is set by the
//! attempts of the last hour, never by the log's history.

use chrono::NaiveDateTime;
use sea_orm::{ConnectionTrait, DbBackend, Statement, Value};

use super::{db_err, Store, StoreError};

/// Successes and failures of the attempts started in one minute.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Minute {
    pub ok: i64,
    pub failed: i64,
}

/// `minutes` buckets of one minute each, the first starting at `since`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chart {
    pub since: NaiveDateTime,
    pub minutes: Vec<Minute>,
}

impl Chart {
    pub fn total(&self) -> Minute {
        self.minutes.iter().fold(Minute::default(), |a, m| Minute {
            ok: a.ok + m.ok,
            failed: a.failed + m.failed,
        })
    }
}

impl Store {
    /// Attempts per minute from `since` for `minutes` minutes, of the given
    /// event names (all events when `None`). `None` when there is no log.
    pub async fn attempts_per_minute(
        &self,
        event_names: Option<&[String]>,
        since: NaiveDateTime,
        minutes: usize,
    ) -> Result<Option<Chart>, StoreError> {
        let Some(h) = self.history_table() else {
            return Ok(None);
        };
        let backend = self.backend();
        let mut n = 0;
        let mut param = || {
            n += 1;
            match backend {
                DbBackend::Postgres => format!("${n}"),
                _ => "?".to_owned(),
            }
        };
        // The minute an attempt started in, counted from `since`.
        let bucket = match backend {
            DbBackend::Postgres => {
                format!(
                    "floor(extract(epoch from (a.started_at - {}::timestamp)) / 60)::bigint",
                    param()
                )
            }
            DbBackend::MySql => format!("TIMESTAMPDIFF(MINUTE, {}, a.started_at)", param()),
            _ => format!(
                "(CAST(strftime('%s', a.started_at) AS INTEGER) \
                 - CAST(strftime('%s', {}) AS INTEGER)) / 60",
                param()
            ),
        };
        // Values in the order their placeholders appear in the text.
        let mut values: Vec<Value> = vec![since.into()];
        let mut sql = format!(
            "SELECT {bucket} AS m, a.outcome AS outcome, count(*) AS n FROM {log} a",
            log = h.table
        );
        if let Some(names) = event_names {
            if names.is_empty() {
                return Ok(Some(Chart {
                    since,
                    minutes: vec![Minute::default(); minutes],
                }));
            }
            let list: Vec<String> = names.iter().map(|_| param()).collect();
            sql.push_str(&format!(
                " JOIN {table} e ON e.id = a.event_id AND e.event_name IN ({})",
                list.join(", "),
                table = self.table()
            ));
            values.extend(names.iter().map(|s| Value::from(s.clone())));
        }
        sql.push_str(&format!(
            " WHERE a.kind = 'attempt' AND a.started_at >= {} GROUP BY 1, 2",
            param()
        ));
        values.push(since.into());
        let rows = self
            .connection()
            .query_all_raw(Statement::from_sql_and_values(backend, sql, values))
            .await
            .map_err(db_err("counting attempts per minute"))?;
        let mut chart = Chart {
            since,
            minutes: vec![Minute::default(); minutes],
        };
        let err = || db_err("counting attempts per minute");
        for r in rows {
            let m: i64 = r.try_get("", "m").map_err(err())?;
            let outcome: Option<String> = r.try_get("", "outcome").map_err(err())?;
            let n: i64 = r.try_get("", "n").map_err(err())?;
            let Some(slot) = usize::try_from(m)
                .ok()
                .and_then(|m| chart.minutes.get_mut(m))
            else {
                continue;
            };
            match outcome.as_deref() {
                Some("success") => slot.ok += n,
                Some("failure") => slot.failed += n,
                _ => {}
            }
        }
        Ok(Some(chart))
    }
}
