//! One row of the outbox: an event to deliver, its status and its attempts.

use sea_orm::entity::prelude::*;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel, Serialize, Deserialize)]
#[sea_orm(table_name = "outbox_events")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub event_name: String,
    /// The column's JSON text as the database returns it (see [`Payload`]).
    #[sea_orm(column_type = "JsonBinary")]
    pub payload: Payload,
    pub status: Status,
    pub attempts: i32,
    #[sea_orm(column_type = "Text", nullable)]
    pub last_error: Option<String>,
    pub sent_at: Option<DateTime>,
    pub created_at: DateTime,
    pub updated_at: DateTime,
    /// The W3C `traceparent` the application wrote with the event
    /// (`[tracing] column`), as written; not a column of its own here (the
    /// table's column is named by the configuration), read with the row
    /// only when tracing is on.
    #[sea_orm(ignore)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// Its `tracestate` (`[tracing] state_column`).
    #[sea_orm(ignore)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
    /// Where the row stands among its aggregate's events (`[ordering]`),
    /// read with the row for dispatch only when ordering is on.
    #[sea_orm(ignore)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<Sequence>,
}

/// A row's place among its aggregate's events (`[ordering] column`), as
/// read with the row.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sequence {
    /// The aggregate column's value as text; `None`: the row has none (not ordered).
    pub aggregate: Option<String>,
    /// The aggregate's event just before this one, when it holds this one
    /// back (`pending`, or `failed` under `on_failed = "hold"`).
    pub behind: Option<i64>,
}

/// The payload column as text, exactly as the database returns it: the
/// bytes sent as the request body. It is never parsed into a value and
/// serialised again, which would change what the application wrote
/// (`1.10` → `1.1`, a 30-digit integer → a float, keys re-sorted).
///
/// The sidecar reads it as text (`payload::text` on PostgreSQL: a `json`
/// or `text` column's text as inserted, a `jsonb` column's normalised
/// text); whether the text is JSON is checked only where it is sent or
/// shown.
#[derive(Clone, Debug, PartialEq, Eq, Default, DeriveValueType)]
pub struct Payload(pub String);

impl Payload {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The JSON indented for people (two spaces a level), its tokens
    /// unchanged: numbers and strings keep their exact text (parsing into
    /// a value would print `1.10` as `1.1`). Text that is not JSON is
    /// returned as it is.
    pub fn pretty(&self) -> String {
        if self.raw_json().is_err() {
            return self.0.clone();
        }
        let mut out = String::with_capacity(self.0.len() * 2);
        let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
        let newline = |out: &mut String, depth: usize| {
            out.push('\n');
            out.push_str(&"  ".repeat(depth));
        };
        let mut chars = self.0.chars().peekable();
        while let Some(c) = chars.next() {
            if in_string {
                out.push(c);
                match (escaped, c) {
                    (true, _) => escaped = false,
                    (false, '\\') => escaped = true,
                    (false, '"') => in_string = false,
                    _ => {}
                }
                continue;
            }
            match c {
                '"' => {
                    in_string = true;
                    out.push(c);
                }
                '{' | '[' => {
                    out.push(c);
                    // An empty object or array stays on one line.
                    while chars.peek().is_some_and(|n| n.is_whitespace()) {
                        chars.next();
                    }
                    if matches!(chars.peek(), Some('}' | ']')) {
                        out.push(chars.next().unwrap_or(' '));
                    } else {
                        depth += 1;
                        newline(&mut out, depth);
                    }
                }
                '}' | ']' => {
                    depth = depth.saturating_sub(1);
                    newline(&mut out, depth);
                    out.push(c);
                }
                ',' => {
                    out.push(c);
                    newline(&mut out, depth);
                }
                ':' => out.push_str(": "),
                c if c.is_whitespace() => {}
                c => out.push(c),
            }
        }
        out
    }

    /// The text as raw JSON, or why it is not JSON (a `text` column can
    /// hold anything).
    pub fn raw_json(&self) -> Result<&serde_json::value::RawValue, serde_json::Error> {
        serde_json::from_str(&self.0)
    }
}

impl From<String> for Payload {
    fn from(s: String) -> Self {
        Payload(s)
    }
}

impl From<&serde_json::Value> for Payload {
    fn from(v: &serde_json::Value) -> Self {
        Payload(v.to_string())
    }
}

impl std::fmt::Display for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Serialised as the JSON it holds, unchanged; text that is not JSON as a
/// JSON string (the output stays valid JSON).
impl Serialize for Payload {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.raw_json() {
            Ok(raw) => raw.serialize(s),
            Err(_) => s.serialize_str(&self.0),
        }
    }
}

/// Keeps the JSON text it is given, unchanged.
impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Box::<serde_json::value::RawValue>::deserialize(d)?;
        Ok(Payload(raw.get().to_owned()))
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}

/// `pending → sent | failed`, stored as the same strings Rails would write.
#[derive(
    Copy, Clone, Debug, PartialEq, Eq, Hash, EnumIter, DeriveActiveEnum, Serialize, Deserialize,
)]
#[sea_orm(rs_type = "String", db_type = "String(StringLen::N(16))")]
#[serde(rename_all = "lowercase")]
pub enum Status {
    #[sea_orm(string_value = "pending")]
    Pending,
    #[sea_orm(string_value = "sent")]
    Sent,
    #[sea_orm(string_value = "failed")]
    Failed,
}

impl Status {
    pub const ALL: [Status; 3] = [Status::Pending, Status::Sent, Status::Failed];

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Sent => "sent",
            Status::Failed => "failed",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error for a status string outside the three values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownStatus(pub String);

impl std::fmt::Display for UnknownStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unknown status {:?} (expected pending, sent or failed)",
            self.0
        )
    }
}

impl std::error::Error for UnknownStatus {}

impl std::str::FromStr for Status {
    type Err = UnknownStatus;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pending" => Ok(Status::Pending),
            "sent" => Ok(Status::Sent),
            "failed" => Ok(Status::Failed),
            other => Err(UnknownStatus(other.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Payload;

    const EXACT: &str = r#"{"b":1,"a":1.10,"n":123456789012345678901234567890}"#;

    #[test]
    fn pretty_indents_without_touching_a_token() {
        let p = Payload(r#"{"b": 1, "a": [1.10, {}, []], "s": "x, {y}: \"z\"", "n": 123456789012345678901234567890}"#.into());
        assert_eq!(
            p.pretty(),
            "{\n  \"b\": 1,\n  \"a\": [\n    1.10,\n    {},\n    []\n  ],\n  \"s\": \"x, {y}: \\\"z\\\"\",\n  \"n\": 123456789012345678901234567890\n}"
        );
        assert_eq!(Payload("not json {".into()).pretty(), "not json {");
    }

    #[test]
    fn payload_serialises_as_the_json_it_holds() {
        let p = Payload(EXACT.to_owned());
        assert_eq!(serde_json::to_string(&p).unwrap(), EXACT);
        #[derive(serde::Serialize)]
        struct View<'a> {
            id: i64,
            payload: &'a Payload,
        }
        let view = serde_json::to_string(&View { id: 7, payload: &p }).unwrap();
        assert_eq!(view, format!(r#"{{"id":7,"payload":{EXACT}}}"#));
    }

    #[test]
    fn text_that_is_not_json_serialises_as_a_string() {
        let p = Payload("{not json".to_owned());
        assert!(p.raw_json().is_err());
        assert_eq!(serde_json::to_string(&p).unwrap(), r#""{not json""#);
    }

    #[test]
    fn payload_deserialises_keeping_the_text() {
        let doc = format!(r#"{{"payload": {EXACT} }}"#);
        #[derive(serde::Deserialize)]
        struct View {
            payload: Payload,
        }
        let v: View = serde_json::from_str(&doc).unwrap();
        assert_eq!(v.payload.as_str(), EXACT);
    }
}
