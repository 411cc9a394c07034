//! A one-pass, borrowed view of a record's JSON: only the fields a decision needs.
//!
//! One visitor reads every accepted shape (the envelope, the flattened row,
//! either inside a JsonConverter `{schema, payload}` wrapper or not, and keys)
//! because the shape is only known once the object has been read: a
//! top-level `payload` is the wrapper's body when it is an object and the
//! row's `payload` column when it is a string. Everything else (`schema`,
//! the `payload` column, `transaction`, unknown columns) is skipped with
//! `IgnoredAny`, which scans without building anything.
//!
//! Leaves are kept as [`Scalar`] rather than typed, so a wrong type becomes
//! an error that names its field instead of a serde message without a path.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Implements every non-map `Visitor` method by building a [`Scalar`] and
/// mapping it, so each visitor above only spells out its object case.
macro_rules! forward_scalars {
    (|$s:pat_param| $map:expr) => {
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            let $s = Scalar::Null;
            Ok($map)
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            let $s = Scalar::Null;
            Ok($map)
        }
        fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Self::Value, E> {
            let $s = Scalar::Bool(v);
            Ok($map)
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
            let $s = Scalar::Int(v);
            Ok($map)
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
            let $s = match i64::try_from(v) {
                Ok(v) => Scalar::Int(v),
                Err(_) => Scalar::UInt(v),
            };
            Ok($map)
        }
        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
            let $s = Scalar::Float(v);
            Ok($map)
        }
        fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
            let $s = Scalar::Str(Cow::Borrowed(v));
            Ok($map)
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            let $s = Scalar::Str(Cow::Owned(v.to_owned()));
            Ok($map)
        }
        fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
            let $s = Scalar::Str(Cow::Owned(v));
            Ok($map)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            let $s = Scalar::Array;
            Ok($map)
        }
    };
}

/// A JSON leaf, typed only as far as JSON itself types it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Scalar<'a> {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(Cow<'a, str>),
    Array,
    Object,
}

impl Scalar<'_> {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Scalar::Null => "null",
            Scalar::Bool(_) => "a boolean",
            Scalar::Int(_) | Scalar::UInt(_) => "an integer",
            Scalar::Float(_) => "a float",
            Scalar::Str(_) => "a string",
            Scalar::Array => "an array",
            Scalar::Object => "an object",
        }
    }

    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Scalar::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// The columns of a row (or the flattened row's added `__` fields) that matter.
#[derive(Debug, Default)]
pub(crate) struct Row<'a> {
    pub(crate) id: Option<Scalar<'a>>,
    pub(crate) status: Option<Scalar<'a>>,
    pub(crate) attempts: Option<Scalar<'a>>,
    pub(crate) updated_at: Option<Scalar<'a>>,
    /// `__op` from ExtractNewRecordState's `add.fields=op`.
    pub(crate) op: Option<Scalar<'a>>,
    /// `__deleted` from `delete.handling.mode=rewrite`.
    pub(crate) deleted: Option<Scalar<'a>>,
    /// `__table`, or `__source_table` when the field came from `source.table`.
    pub(crate) table: Option<Scalar<'a>>,
    /// How many keys looked like a column or an added `__` field.
    pub(crate) columns: u32,
}

/// `before` / `after`: a row, null, or something that is not a row at all.
#[derive(Debug)]
pub(crate) enum Slot<'a> {
    Null,
    Row(Row<'a>),
    Wrong(&'static str),
}

/// The part of `source` that a decision needs.
#[derive(Debug, Default)]
pub(crate) struct Source<'a> {
    pub(crate) table: Option<Scalar<'a>>,
}

/// A top-level `payload` key, whose meaning depends on its type.
#[derive(Debug)]
pub(crate) enum Payload<'a> {
    /// An object: the JsonConverter wrapper's body.
    Body(Box<Body<'a>>),
    /// Null: a wrapped null value when `schema` is beside it, else a null column.
    Null,
    /// Anything else: the row's `payload` column, never looked into.
    Column,
}

/// One JSON object of a key or a value, with every shape's fields side by side.
#[derive(Debug, Default)]
pub(crate) struct Body<'a> {
    pub(crate) schema: bool,
    pub(crate) payload: Option<Payload<'a>>,
    pub(crate) op: Option<Scalar<'a>>,
    pub(crate) before: Option<Slot<'a>>,
    pub(crate) after: Option<Slot<'a>>,
    pub(crate) source: Option<Source<'a>>,
    pub(crate) ts_ms: bool,
    /// A heartbeat key's field (`io.debezium.connector.common.ServerNameKey`).
    pub(crate) server_name: bool,
    /// The flattened row's columns, or a key's `id`.
    pub(crate) row: Row<'a>,
    /// Keys that are neither envelope fields nor plausibly columns.
    pub(crate) unknown: u32,
}

/// A whole key or value document.
#[derive(Debug)]
pub(crate) enum Document<'a> {
    Object(Box<Body<'a>>),
    Other(Scalar<'a>),
}

impl<'de> Deserialize<'de> for Document<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(DocumentVisitor)
    }
}

struct DocumentVisitor;

impl<'de> Visitor<'de> for DocumentVisitor {
    type Value = Document<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON document")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        read_body(map, false).map(|b| Document::Object(Box::new(b)))
    }

    forward_scalars!(|s| Document::Other(s));
}

/// The names the decoder cares about, resolved once per key without allocating.
enum Field {
    Schema,
    Payload,
    Before,
    After,
    Op,
    Source,
    TsMs,
    ServerName,
    /// Envelope fields no decision needs, known so that they do not count as unknown.
    Skipped,
    Id,
    Status,
    Attempts,
    UpdatedAt,
    DunderOp,
    Deleted,
    Table,
    SourceTable,
    OtherColumn,
    Unknown,
}

impl Field {
    fn from_name(name: &str) -> Field {
        match name {
            "schema" => Field::Schema,
            "payload" => Field::Payload,
            "before" => Field::Before,
            "after" => Field::After,
            "op" => Field::Op,
            "source" => Field::Source,
            "ts_ms" => Field::TsMs,
            "serverName" => Field::ServerName,
            "ts_us" | "ts_ns" | "transaction" => Field::Skipped,
            "id" => Field::Id,
            "status" => Field::Status,
            "attempts" => Field::Attempts,
            "updated_at" => Field::UpdatedAt,
            "__op" => Field::DunderOp,
            "__deleted" => Field::Deleted,
            "__table" => Field::Table,
            "__source_table" => Field::SourceTable,
            "event_name" | "last_error" | "sent_at" | "created_at" => Field::OtherColumn,
            other if other.starts_with("__") => Field::OtherColumn,
            _ => Field::Unknown,
        }
    }
}

impl<'de> Deserialize<'de> for Field {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FieldVisitor;
        impl Visitor<'_> for FieldVisitor {
            type Value = Field;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<Field, E> {
                Ok(Field::from_name(name))
            }
        }
        deserializer.deserialize_identifier(FieldVisitor)
    }
}

/// Reads one object. `nested` is true inside a wrapper, where `payload` can
/// only be the column: a wrapper inside a wrapper is not a format anyone emits.
fn read_body<'de, A: MapAccess<'de>>(mut map: A, nested: bool) -> Result<Body<'de>, A::Error> {
    let mut body = Body::default();
    while let Some(field) = map.next_key::<Field>()? {
        match field {
            Field::Schema => {
                map.next_value::<IgnoredAny>()?;
                body.schema = true;
            }
            Field::Payload if !nested => body.payload = Some(map.next_value::<PayloadField>()?.0),
            Field::Before => body.before = Some(map.next_value()?),
            Field::After => body.after = Some(map.next_value()?),
            Field::Op => body.op = Some(map.next_value()?),
            Field::Source => body.source = map.next_value::<SourceField>()?.0,
            Field::TsMs => {
                map.next_value::<IgnoredAny>()?;
                body.ts_ms = true;
            }
            Field::ServerName => {
                map.next_value::<IgnoredAny>()?;
                body.server_name = true;
            }
            Field::Skipped => {
                map.next_value::<IgnoredAny>()?;
            }
            Field::Unknown => {
                map.next_value::<IgnoredAny>()?;
                body.unknown += 1;
            }
            Field::Payload => {
                map.next_value::<IgnoredAny>()?;
                body.row.columns += 1;
            }
            column => read_column(&mut map, &mut body.row, column)?,
        }
    }
    Ok(body)
}

fn read_column<'de, A: MapAccess<'de>>(
    map: &mut A,
    row: &mut Row<'de>,
    field: Field,
) -> Result<(), A::Error> {
    let slot = match field {
        Field::Id => &mut row.id,
        Field::Status => &mut row.status,
        Field::Attempts => &mut row.attempts,
        Field::UpdatedAt => &mut row.updated_at,
        Field::DunderOp => &mut row.op,
        Field::Deleted => &mut row.deleted,
        // `__table` wins over `__source_table` when both are configured.
        Field::Table => &mut row.table,
        Field::SourceTable if row.table.is_some() => {
            map.next_value::<IgnoredAny>()?;
            row.columns += 1;
            return Ok(());
        }
        Field::SourceTable => &mut row.table,
        _ => {
            map.next_value::<IgnoredAny>()?;
            row.columns += 1;
            return Ok(());
        }
    };
    *slot = Some(map.next_value()?);
    row.columns += 1;
    Ok(())
}

/// Inside `before`/`after` every key is a column, envelope names included.
fn read_row<'de, A: MapAccess<'de>>(mut map: A) -> Result<Row<'de>, A::Error> {
    let mut row = Row::default();
    while let Some(field) = map.next_key::<Field>()? {
        read_column(&mut map, &mut row, field)?;
    }
    Ok(row)
}

struct PayloadField<'a>(Payload<'a>);

impl<'de> Deserialize<'de> for PayloadField<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PayloadVisitor;
        impl<'de> Visitor<'de> for PayloadVisitor {
            type Value = Payload<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a wrapper body or a payload column")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                read_body(map, true).map(|b| Payload::Body(Box::new(b)))
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
                Ok(Payload::Null)
            }
            // The column is usually a ~1 KiB escaped string: accept it without
            // copying it into a Scalar, which is all the shared macro could do.
            fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Self::Value, E> {
                Ok(Payload::Column)
            }
            fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Payload::Column)
            }
            fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Payload::Column)
            }
            fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Payload::Column)
            }
            fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Payload::Column)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Payload::Column)
            }
        }
        deserializer
            .deserialize_any(PayloadVisitor)
            .map(PayloadField)
    }
}

impl<'de> Deserialize<'de> for Slot<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SlotVisitor;
        impl<'de> Visitor<'de> for SlotVisitor {
            type Value = Slot<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a row or null")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                read_row(map).map(Slot::Row)
            }
            forward_scalars!(|s| match s {
                Scalar::Null => Slot::Null,
                other => Slot::Wrong(other.kind()),
            });
        }
        deserializer.deserialize_any(SlotVisitor)
    }
}

enum SourceKey {
    Table,
    Other,
}

impl<'de> Deserialize<'de> for SourceKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = SourceKey;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<SourceKey, E> {
                Ok(match name {
                    "table" => SourceKey::Table,
                    _ => SourceKey::Other,
                })
            }
        }
        deserializer.deserialize_identifier(KeyVisitor)
    }
}

/// `source` is only consulted for its table, so a malformed one counts as absent.
struct SourceField<'a>(Option<Source<'a>>);

impl<'de> Deserialize<'de> for SourceField<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SourceVisitor;
        impl<'de> Visitor<'de> for SourceVisitor {
            type Value = Option<Source<'de>>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a source block")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut source = Source::default();
                while let Some(key) = map.next_key::<SourceKey>()? {
                    match key {
                        SourceKey::Table => source.table = Some(map.next_value()?),
                        SourceKey::Other => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(Some(source))
            }
            forward_scalars!(|_s| None);
        }
        deserializer.deserialize_any(SourceVisitor).map(SourceField)
    }
}

impl<'de> Deserialize<'de> for Scalar<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ScalarVisitor;
        impl<'de> Visitor<'de> for ScalarVisitor {
            type Value = Scalar<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Scalar::Object)
            }
            forward_scalars!(|s| s);
        }
        deserializer.deserialize_any(ScalarVisitor)
    }
}
