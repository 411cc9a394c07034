//! Decodes one Debezium change event for the outbox table into a decision (pure: no I/O).
//!
//! A change event is only a wake-up call (CONTRACT §1, §4): the decoder says
//! "row N is pending, look at it", "skip this, and why", or "this record is
//! malformed, and where". It never reads the `payload` column (the job reads
//! the row from the database) and it never panics.
//!
//! Accepted, detected per record:
//!
//! - the Debezium envelope (`before`, `after`, `op`, `source`, …) and the
//!   flattened row of the `ExtractNewRecordState` transform (with or without
//!   `__op`, `__deleted`, `__table`, `__source_*`, …), each with or without
//!   the JsonConverter `{"schema": …, "payload": …}` wrapper;
//! - keys `{"id": N}`, wrapped or not, or a bare integer; without a key (or
//!   with a key that has no `id`) the row's `id` is used.
//!
//! Choices a reader could not guess from the code:
//!
//! - When the key's id and the row's id disagree, the key's wins: Debezium
//!   builds the message key from the primary key, and the key is what Kafka
//!   partitions (and compacts) by.
//! - A flattened row without `__op` is reported as [`Op::Update`]: the
//!   transform dropped the information, and the job only needs the row.
//! - A row is malformed only for what the sidecar needs of it: the id (key
//!   or row), the table and the op. A `c`/`r`/`u` row with an unknown,
//!   missing or mistyped `status`, `attempts` or `updated_at` is still a
//!   trigger (those fields become `None`): the job reads the row, and the
//!   database decides. Only a readable `sent` or `failed` skips it.
//! - `op` `m` (a logical decoding message), schema-change events and objects
//!   with nothing recognisable are [`Skip::NoRow`]; `c`/`r`/`u` without an
//!   `after` row is malformed, because Debezium never emits one.
//! - A value of the configured table is recognised by comparing the last
//!   dot-separated segment of `source.table` / `__table` / `__source_table`
//!   with the last segment of the configured name, case-sensitively.
//! - An empty (zero-byte) value is malformed; only a null value is a tombstone.
//! - Timestamps: `time.rs` documents how the unit of an epoch number is chosen.

mod time;
mod wire;

#[cfg(test)]
mod tests;

use std::borrow::Cow;

use entity::Status;

use wire::{Body, Document, Payload, Row, Scalar, Slot};

/// What Debezium writes into a column it could not read (an unchanged TOASTed
/// value under `REPLICA IDENTITY DEFAULT`).
pub const UNAVAILABLE_VALUE: &str = "__debezium_unavailable_value";

/// One Kafka record, borrowed from the consumer's message.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
}

/// Exactly one outcome per record.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Trigger(Trigger),
    Skip(Skip),
    Invalid(InvalidRecord),
}

impl Decision {
    /// Every [`Decision::result_label`].
    pub const RESULTS: [&'static str; 3] = ["triggered", "skipped", "invalid"];

    /// The bounded `result` label of `outbox_cdc_messages_total`.
    pub fn result_label(&self) -> &'static str {
        match self {
            Decision::Trigger(_) => "triggered",
            Decision::Skip(_) => "skipped",
            Decision::Invalid(_) => "invalid",
        }
    }

    /// The row id the record is about, when it names one.
    pub fn id(&self) -> Option<i64> {
        match self {
            Decision::Trigger(trigger) => Some(trigger.id),
            Decision::Skip(skip) => skip.id(),
            Decision::Invalid(_) => None,
        }
    }
}

/// A `pending` row as the event saw it (or a row whose status the event
/// did not say readably): the job must still read the row.
#[derive(Debug, Clone, PartialEq)]
pub struct Trigger {
    pub id: i64,
    pub op: Op,
    /// `None` when the event did not carry a readable int32.
    pub attempts: Option<i32>,
    /// In UTC; `None` when the event did not carry a readable timestamp.
    pub updated_at: Option<chrono::NaiveDateTime>,
}

/// The operations that can carry a row worth dispatching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Create,
    /// A snapshot read, initial or incremental.
    Read,
    Update,
}

impl Op {
    /// Debezium's one-letter code.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Create => "c",
            Op::Read => "r",
            Op::Update => "u",
        }
    }
}

/// Why a well-formed record leads to no dispatch.
#[derive(Debug, Clone, PartialEq)]
pub enum Skip {
    /// The row is already `sent` or `failed`.
    Terminal {
        id: i64,
        status: Status,
    },
    Delete {
        id: Option<i64>,
    },
    Tombstone,
    Truncate,
    Heartbeat,
    NoRow,
    OtherTable {
        table: String,
    },
}

impl Skip {
    /// Every [`Skip::reason`].
    pub const REASONS: [&'static str; 7] = [
        "terminal_status",
        "delete",
        "tombstone",
        "truncate",
        "heartbeat",
        "no_row",
        "other_table",
    ];

    /// A bounded metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Skip::Terminal { .. } => "terminal_status",
            Skip::Delete { .. } => "delete",
            Skip::Tombstone => "tombstone",
            Skip::Truncate => "truncate",
            Skip::Heartbeat => "heartbeat",
            Skip::NoRow => "no_row",
            Skip::OtherTable { .. } => "other_table",
        }
    }

    /// The row id, for the skips that know it.
    pub fn id(&self) -> Option<i64> {
        match self {
            Skip::Terminal { id, .. } => Some(*id),
            Skip::Delete { id } => *id,
            _ => None,
        }
    }
}

/// A malformed record, located well enough to find it again on the topic.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid change event at {topic}/{partition}@{offset}: {field}: {message}")]
pub struct InvalidRecord {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// A path such as `after.status`, `key.id`, `op`, or `value` for the whole document.
    pub field: String,
    pub message: String,
}

/// Decodes records of one configured table.
#[derive(Debug, Clone)]
pub struct Decoder {
    /// The last dot-separated segment of the configured name.
    table: String,
}

/// A malformed field, before the record's coordinates are attached.
struct Fault {
    field: Cow<'static, str>,
    message: String,
}

fn fault(field: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Fault {
    Fault {
        field: field.into(),
        message: message.into(),
    }
}

type Decided = Result<Decision, Fault>;

fn skip(skip: Skip) -> Decided {
    Ok(Decision::Skip(skip))
}

/// The key's contribution: an id, or a sign that the record is a heartbeat.
#[derive(Default)]
struct Key {
    id: Option<i64>,
    server_name: bool,
}

/// Where a row's fields live, for error paths: `after.` or `` (flattened).
#[derive(Clone, Copy)]
struct Path(&'static str);

impl Path {
    fn of(self, name: &str) -> String {
        format!("{}{name}", self.0)
    }
}

impl Decoder {
    /// `table` may be qualified (`public.outbox_events`); only its last segment is compared.
    pub fn new(table: &str) -> Self {
        Decoder {
            table: last_segment(table).to_owned(),
        }
    }

    pub fn decode(&self, record: &Record<'_>) -> Decision {
        match self.decide(record) {
            Ok(decision) => decision,
            Err(Fault { field, message }) => Decision::Invalid(InvalidRecord {
                topic: record.topic.to_owned(),
                partition: record.partition,
                offset: record.offset,
                field: field.into_owned(),
                message,
            }),
        }
    }

    fn decide(&self, record: &Record<'_>) -> Decided {
        let Some(value) = record.value else {
            return skip(Skip::Tombstone);
        };
        let body = match parse(value, "value")? {
            Document::Object(body) => *body,
            Document::Other(Scalar::Null) => return skip(Skip::Tombstone),
            Document::Other(other) => {
                return Err(fault(
                    "value",
                    format!("expected a JSON object, found {}", other.kind()),
                ))
            }
        };
        let body = match unwrap(body) {
            Some(body) => body,
            None => return skip(Skip::Tombstone),
        };
        let key = read_key(record.key)?;

        if let Some(table) = table_of(&body) {
            if last_segment(table) != self.table {
                return skip(Skip::OtherTable {
                    table: table.to_owned(),
                });
            }
        }

        if body.op.is_some() || body.before.is_some() || body.after.is_some() {
            return envelope(body, &key);
        }
        if body.row.columns > 0 {
            return flattened(body.row, &key);
        }
        let heartbeat_value = body.ts_ms && body.unknown == 0 && body.source.is_none();
        if heartbeat_value || key.server_name {
            return skip(Skip::Heartbeat);
        }
        skip(Skip::NoRow)
    }
}

fn last_segment(name: &str) -> &str {
    name.rsplit('.').next().unwrap_or(name)
}

/// Validates UTF-8 up front so that invalid bytes anywhere, including in the
/// skipped `payload` column, are reported rather than silently passed over.
fn parse<'a>(bytes: &'a [u8], what: &'static str) -> Result<Document<'a>, Fault> {
    if bytes.is_empty() {
        return Err(fault(what, "empty; a tombstone has a null value instead"));
    }
    let text =
        std::str::from_utf8(bytes).map_err(|e| fault(what, format!("not valid UTF-8: {e}")))?;
    serde_json::from_str(text).map_err(|e| fault(what, format!("not valid JSON: {e}")))
}

/// Steps into a JsonConverter wrapper. `None` is a wrapped null (a tombstone).
fn unwrap(body: Body<'_>) -> Option<Body<'_>> {
    match body.payload {
        // Without `schema` beside it, an object next to other columns is more
        // likely a flattened row whose `payload` column arrived as an object.
        Some(Payload::Body(_)) if !body.schema && body.row.columns > 0 => {
            let mut body = body;
            body.row.columns += 1;
            Some(body)
        }
        Some(Payload::Body(inner)) => Some(*inner),
        Some(Payload::Null) if body.schema => None,
        Some(Payload::Null) => {
            // A flattened delete (`rewrite`) can carry a null `payload` column.
            let mut body = body;
            body.row.columns += 1;
            Some(body)
        }
        Some(Payload::Column) => {
            let mut body = body;
            body.row.columns += 1;
            Some(body)
        }
        None => Some(body),
    }
}

/// An empty name counts as none: a PostgreSQL logical decoding message has
/// `source.table: ""` because it belongs to no table.
fn table_of<'b>(body: &'b Body<'_>) -> Option<&'b str> {
    let named = |table: Option<&'b Scalar<'_>>| {
        table
            .and_then(Scalar::as_str)
            .filter(|name| !name.is_empty())
    };
    named(body.source.as_ref().and_then(|s| s.table.as_ref()))
        .or_else(|| named(body.row.table.as_ref()))
}

fn read_key(bytes: Option<&[u8]>) -> Result<Key, Fault> {
    let Some(bytes) = bytes.filter(|b| !b.is_empty()) else {
        return Ok(Key::default());
    };
    let body = match parse(bytes, "key")? {
        Document::Object(body) => *body,
        Document::Other(Scalar::Null) => return Ok(Key::default()),
        // A key reduced to the bare id (e.g. by an ExtractField$Key transform).
        Document::Other(scalar) => {
            let id = integer(&scalar).map_err(|m| fault("key", m))?;
            return Ok(Key {
                id: Some(id),
                server_name: false,
            });
        }
    };
    let Some(body) = unwrap(body) else {
        return Ok(Key::default());
    };
    let id = match &body.row.id {
        None | Some(Scalar::Null) => None,
        Some(id) => Some(integer(id).map_err(|m| fault("key.id", m))?),
    };
    Ok(Key {
        id,
        server_name: body.server_name,
    })
}

fn envelope(body: Body<'_>, key: &Key) -> Decided {
    let op = match &body.op {
        None => return Err(fault("op", "missing")),
        Some(Scalar::Str(op)) => op,
        Some(other) => {
            return Err(fault(
                "op",
                format!("expected a string, found {}", other.kind()),
            ))
        }
    };
    let op = match op.as_ref() {
        "c" => Op::Create,
        "r" => Op::Read,
        "u" => Op::Update,
        "d" => {
            let before = match &body.before {
                Some(Slot::Row(row)) => Some(row),
                _ => None,
            };
            return skip(Skip::Delete {
                id: key.id.or_else(|| before.and_then(lenient_id)),
            });
        }
        "t" => return skip(Skip::Truncate),
        "m" => return skip(Skip::NoRow),
        other => return Err(fault("op", format!("unknown op {other:?}"))),
    };
    match body.after {
        Some(Slot::Row(row)) => decide_row(&row, op, key, Path("after.")),
        None => Err(fault("after", format!("missing for op {:?}", op.as_str()))),
        Some(Slot::Null) => Err(fault("after", format!("null for op {:?}", op.as_str()))),
        Some(Slot::Wrong(kind)) => Err(fault(
            "after",
            format!("expected an object or null, found {kind}"),
        )),
    }
}

fn flattened(row: Row<'_>, key: &Key) -> Decided {
    let deleted = match &row.deleted {
        None | Some(Scalar::Null) => false,
        Some(Scalar::Bool(b)) => *b,
        Some(Scalar::Str(s)) if s == "true" => true,
        Some(Scalar::Str(s)) if s == "false" => false,
        Some(other) => {
            return Err(fault(
                "__deleted",
                format!("expected \"true\" or \"false\", found {}", describe(other)),
            ))
        }
    };
    let op = match &row.op {
        None | Some(Scalar::Null) => Some(Op::Update),
        Some(Scalar::Str(op)) => match op.as_ref() {
            "c" => Some(Op::Create),
            "r" => Some(Op::Read),
            "u" => Some(Op::Update),
            "d" => None,
            "t" => return skip(Skip::Truncate),
            "m" => return skip(Skip::NoRow),
            other => return Err(fault("__op", format!("unknown op {other:?}"))),
        },
        Some(other) => {
            return Err(fault(
                "__op",
                format!("expected a string, found {}", other.kind()),
            ))
        }
    };
    match op {
        Some(op) if !deleted => decide_row(&row, op, key, Path("")),
        _ => skip(Skip::Delete {
            id: key.id.or_else(|| lenient_id(&row)),
        }),
    }
}

/// A delete is skipped whatever its row holds, so a bad id there only loses the id.
fn lenient_id(row: &Row<'_>) -> Option<i64> {
    row.id.as_ref().and_then(|id| integer(id).ok())
}

/// Only the id is required of a row: what else it says (status, attempts,
/// `updated_at`) only saves the job a read or tells it when to wake, and
/// the job reads the row anyway. A row whose other fields cannot be read is
/// a trigger; only a readable terminal status skips it.
fn decide_row(row: &Row<'_>, op: Op, key: &Key, path: Path) -> Decided {
    let row_id = match &row.id {
        None | Some(Scalar::Null) => return Err(fault(path.of("id"), "missing")),
        Some(id) => integer(id).map_err(|m| fault(path.of("id"), m))?,
    };
    let id = key.id.unwrap_or(row_id);

    let status = match &row.status {
        Some(Scalar::Str(s)) => s.parse::<Status>().ok(),
        _ => None,
    };
    if let Some(status @ (Status::Sent | Status::Failed)) = status {
        return skip(Skip::Terminal { id, status });
    }

    let attempts = row
        .attempts
        .as_ref()
        .and_then(|n| integer(n).ok())
        .and_then(|n| i32::try_from(n).ok());

    let updated_at = match &row.updated_at {
        Some(Scalar::Str(s)) if s != UNAVAILABLE_VALUE => time::from_text(s).ok(),
        Some(Scalar::Int(n)) => time::from_epoch(*n).ok(),
        _ => None,
    };

    Ok(Decision::Trigger(Trigger {
        id,
        op,
        attempts,
        updated_at,
    }))
}

/// An exact JSON integer in i64; never via a float, so ids above 2^53 survive.
fn integer(value: &Scalar<'_>) -> Result<i64, String> {
    match value {
        Scalar::Int(n) => Ok(*n),
        Scalar::UInt(n) => Err(format!("{n} is out of range for int64")),
        other => Err(format!("expected an integer, found {}", describe(other))),
    }
}

/// The value's type, and the value itself when it is short enough to quote.
fn describe(value: &Scalar<'_>) -> String {
    match value {
        Scalar::Str(s) if s.len() <= 64 => format!("the string {s:?}"),
        Scalar::Float(f) => format!("the float {f}"),
        Scalar::Bool(b) => format!("the boolean {b}"),
        other => other.kind().to_owned(),
    }
}

/// What a change event's key says of the row's aggregate (`[ordering]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyAggregate {
    /// The aggregate column's value, as text (a number as written).
    Value(String),
    /// The key carries the column, as null: the row has no aggregate.
    Null,
    /// No key, a key that is not JSON, or one without the column: the
    /// connector does not key the topic by it (`message.key.columns`).
    Missing,
}

/// Reads `column` from a change event's key: `{"col": v}`, or inside the
/// JsonConverter's `{"schema": …, "payload": {"col": v}}` wrapper.
pub fn key_aggregate(key: Option<&[u8]>, column: &str) -> KeyAggregate {
    let Some(key) = key else {
        return KeyAggregate::Missing;
    };
    let Ok(serde_json::Value::Object(mut doc)) = serde_json::from_slice::<serde_json::Value>(key)
    else {
        return KeyAggregate::Missing;
    };
    let value = match doc.remove(column) {
        Some(v) => v,
        None => match doc.remove("payload") {
            Some(serde_json::Value::Object(mut inner)) => match inner.remove(column) {
                Some(v) => v,
                None => return KeyAggregate::Missing,
            },
            _ => return KeyAggregate::Missing,
        },
    };
    match value {
        serde_json::Value::Null => KeyAggregate::Null,
        serde_json::Value::String(s) => KeyAggregate::Value(s),
        other => KeyAggregate::Value(other.to_string()),
    }
}

#[cfg(test)]
mod key_aggregate_tests {
    use super::{key_aggregate, KeyAggregate};

    #[test]
    fn reads_the_column_from_plain_and_wrapped_keys() {
        let col = "aggregate_key";
        assert_eq!(
            key_aggregate(Some(br#"{"aggregate_key":"acct-1"}"#), col),
            KeyAggregate::Value("acct-1".into())
        );
        assert_eq!(
            key_aggregate(
                Some(br#"{"schema":{"type":"struct"},"payload":{"aggregate_key":42}}"#),
                col
            ),
            KeyAggregate::Value("42".into())
        );
        assert_eq!(
            key_aggregate(Some(br#"{"aggregate_key":null}"#), col),
            KeyAggregate::Null
        );
        assert_eq!(
            key_aggregate(Some(br#"{"id":7}"#), col),
            KeyAggregate::Missing
        );
        assert_eq!(key_aggregate(Some(b"7"), col), KeyAggregate::Missing);
        assert_eq!(key_aggregate(None, col), KeyAggregate::Missing);
        assert_eq!(key_aggregate(Some(b"not json"), col), KeyAggregate::Missing);
    }
}
