//! Tests of the change-event decoder: fixtures from Debezium's documented formats, edge cases, properties.

use std::path::PathBuf;
use std::sync::LazyLock;

use chrono::{DateTime, NaiveDateTime};
use proptest::prelude::*;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::*;

const TOPIC: &str = "outbox.public.outbox_events";

/// Fewer files than this means fixtures were lost, not that cases were dropped on purpose.
const MIN_FIXTURES: usize = 40;

fn decoder() -> Decoder {
    Decoder::new("outbox_events")
}

fn decode(key: Option<&str>, value: Option<&str>) -> Decision {
    decoder().decode(&Record {
        topic: TOPIC,
        partition: 3,
        offset: 1234,
        key: key.map(str::as_bytes),
        value: value.map(str::as_bytes),
    })
}

fn at(text: &str) -> NaiveDateTime {
    NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S%.f").unwrap()
}

fn invalid_field(decision: &Decision) -> &str {
    match decision {
        Decision::Invalid(invalid) => &invalid.field,
        other => panic!("expected an invalid record, got {other:?}"),
    }
}

const ROW: &str = r#"{"id":42,"event_name":"e","payload":"{\"a\":1}","status":"pending","attempts":0,"updated_at":1796009787123456}"#;

fn envelope(op: &str, after: &str) -> String {
    format!(
        r#"{{"before":null,"after":{after},"source":{{"connector":"postgresql","schema":"public","table":"outbox_events"}},"op":"{op}","ts_ms":1}}"#
    )
}

// ---------------------------------------------------------------- fixtures

#[derive(Deserialize)]
struct Fixture {
    description: String,
    topic: String,
    #[serde(default)]
    key: Option<Box<RawValue>>,
    #[serde(default)]
    key_raw: Option<String>,
    #[serde(default)]
    value: Option<Box<RawValue>>,
    #[serde(default)]
    value_raw: Option<String>,
    #[serde(default)]
    value_hex: Option<String>,
    expect: Expect,
}

#[derive(Deserialize, Debug)]
#[serde(tag = "decision", rename_all = "lowercase")]
enum Expect {
    Trigger {
        id: i64,
        op: String,
        attempts: Option<i32>,
        updated_at: Option<String>,
    },
    Skip {
        reason: String,
        id: Option<i64>,
        status: Option<String>,
        table: Option<String>,
    },
    Invalid {
        field: String,
    },
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cdc")
}

fn load_fixtures() -> Vec<(String, Fixture)> {
    let mut files: Vec<_> = std::fs::read_dir(fixture_dir())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&path).unwrap();
            let fixture = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
            (name, fixture)
        })
        .collect()
}

fn fixture_bytes(fixture: &Fixture) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
    let key = match (&fixture.key, &fixture.key_raw) {
        (_, Some(raw)) => Some(raw.as_bytes().to_vec()),
        (Some(key), None) => Some(key.get().as_bytes().to_vec()),
        (None, None) => None,
    };
    let value = match (&fixture.value, &fixture.value_raw, &fixture.value_hex) {
        (_, Some(raw), _) => Some(raw.as_bytes().to_vec()),
        (_, _, Some(h)) => Some(hex(h)),
        (Some(value), _, _) => Some(value.get().as_bytes().to_vec()),
        (None, None, None) => None,
    };
    (key, value)
}

fn check(name: &str, fixture: &Fixture, decision: &Decision) -> Result<(), String> {
    let fail = |why: String| {
        Err(format!(
            "{name} ({}): {why}; got {decision:?}",
            fixture.description
        ))
    };
    match (&fixture.expect, decision) {
        (
            Expect::Trigger {
                id,
                op,
                attempts,
                updated_at,
            },
            Decision::Trigger(t),
        ) => {
            let want_at = updated_at.as_deref().map(at);
            if t.id != *id
                || t.op.as_str() != op
                || t.attempts != *attempts
                || t.updated_at != want_at
            {
                return fail(format!(
                    "expected trigger {id} {op} {attempts:?} {want_at:?}"
                ));
            }
        }
        (
            Expect::Skip {
                reason,
                id,
                status,
                table,
            },
            Decision::Skip(s),
        ) => {
            if s.reason() != reason {
                return fail(format!("expected skip {reason}"));
            }
            if id.is_some() && s.id() != *id {
                return fail(format!("expected id {id:?}"));
            }
            match (status, s) {
                (Some(want), Skip::Terminal { status, .. }) if status.as_str() != want => {
                    return fail(format!("expected status {want}"))
                }
                _ => {}
            }
            match (table, s) {
                (Some(want), Skip::OtherTable { table }) if table != want => {
                    return fail(format!("expected table {want}"))
                }
                _ => {}
            }
        }
        (Expect::Invalid { field }, Decision::Invalid(invalid)) => {
            if &invalid.field != field || invalid.topic != fixture.topic {
                return fail(format!("expected invalid {field}"));
            }
        }
        (expect, _) => return fail(format!("expected {expect:?}")),
    }
    Ok(())
}

#[test]
fn every_fixture_decodes_as_expected() {
    let fixtures = load_fixtures();
    assert!(
        fixtures.len() >= MIN_FIXTURES,
        "only {} fixtures in {}",
        fixtures.len(),
        fixture_dir().display()
    );
    let failures: Vec<String> = fixtures
        .iter()
        .filter_map(|(name, fixture)| {
            let (key, value) = fixture_bytes(fixture);
            let decision = decoder().decode(&Record {
                topic: &fixture.topic,
                partition: 0,
                offset: 7,
                key: key.as_deref(),
                value: value.as_deref(),
            });
            check(name, fixture, &decision).err()
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------- edge cases

#[test]
fn invalid_record_names_its_coordinates() {
    let decision = decode(
        None,
        Some(&envelope(
            "c",
            r#"{"id":"one","status":"pending","attempts":0}"#,
        )),
    );
    let Decision::Invalid(invalid) = decision else {
        panic!("expected invalid, got {decision:?}");
    };
    assert_eq!(
        invalid.to_string(),
        "invalid change event at outbox.public.outbox_events/3@1234: after.id: \
         expected an integer, found the string \"one\""
    );
}

#[test]
fn labels_are_bounded() {
    let skips = [
        (
            Skip::Terminal {
                id: 1,
                status: Status::Sent,
            },
            "terminal_status",
        ),
        (Skip::Delete { id: None }, "delete"),
        (Skip::Tombstone, "tombstone"),
        (Skip::Truncate, "truncate"),
        (Skip::Heartbeat, "heartbeat"),
        (Skip::NoRow, "no_row"),
        (Skip::OtherTable { table: "x".into() }, "other_table"),
    ];
    for (skip, label) in skips {
        assert_eq!(skip.reason(), label);
        assert_eq!(Decision::Skip(skip).result_label(), "skipped");
    }
    assert_eq!(decode(None, Some(ROW)).result_label(), "triggered");
    assert_eq!(decode(None, Some("{")).result_label(), "invalid");
}

#[test]
fn qualified_configured_table_matches_unqualified_source() {
    let record = envelope("c", ROW);
    let decision = Decoder::new("public.outbox_events").decode(&Record {
        topic: TOPIC,
        partition: 0,
        offset: 0,
        key: None,
        value: Some(record.as_bytes()),
    });
    assert_eq!(decision.id(), Some(42));
    let other = Decoder::new("outbox_events_v2").decode(&Record {
        topic: TOPIC,
        partition: 0,
        offset: 0,
        key: None,
        value: Some(record.as_bytes()),
    });
    assert_eq!(
        other,
        Decision::Skip(Skip::OtherTable {
            table: "outbox_events".into()
        })
    );
}

#[test]
fn key_forms() {
    let value = envelope("c", ROW);
    assert_eq!(decode(Some("7"), Some(&value)).id(), Some(7));
    assert_eq!(decode(Some("null"), Some(&value)).id(), Some(42));
    assert_eq!(decode(Some(""), Some(&value)).id(), Some(42));
    assert_eq!(decode(Some(r#"{"id":null}"#), Some(&value)).id(), Some(42));
    assert_eq!(
        decode(Some(r#"{"schema":null,"payload":null}"#), Some(&value)).id(),
        Some(42)
    );
    assert_eq!(invalid_field(&decode(Some("\"7\""), Some(&value))), "key");
    assert_eq!(invalid_field(&decode(Some("{"), Some(&value))), "key");
    assert_eq!(
        invalid_field(&decode(Some(r#"{"id":1.5}"#), Some(&value))),
        "key.id"
    );
    assert_eq!(
        invalid_field(&decode(
            Some(r#"{"id":18446744073709551615}"#),
            Some(&value)
        )),
        "key.id"
    );
}

#[test]
fn value_shapes_that_are_not_rows() {
    assert_eq!(decode(None, None), Decision::Skip(Skip::Tombstone));
    assert_eq!(decode(None, Some("null")), Decision::Skip(Skip::Tombstone));
    assert_eq!(
        decode(None, Some(r#"{"schema":{"type":"struct"},"payload":null}"#)),
        Decision::Skip(Skip::Tombstone)
    );
    assert_eq!(decode(None, Some("{}")), Decision::Skip(Skip::NoRow));
    // A MySQL schema-change event has a source and a ts_ms but is no heartbeat.
    assert_eq!(
        decode(
            Some(r#"{"databaseName":"app"}"#),
            Some(
                r#"{"source":{"connector":"mysql"},"ts_ms":1,"databaseName":"app","ddl":"CREATE TABLE t (i int)","tableChanges":[]}"#
            )
        ),
        Decision::Skip(Skip::NoRow)
    );
    assert_eq!(invalid_field(&decode(None, Some(""))), "value");
    assert_eq!(invalid_field(&decode(None, Some("[1,2]"))), "value");
    assert_eq!(invalid_field(&decode(None, Some("42"))), "value");
    assert_eq!(invalid_field(&decode(None, Some(r#"{"a":1} x"#))), "value");
}

#[test]
fn envelope_errors_name_the_field() {
    let no_op = format!(r#"{{"before":null,"after":{ROW}}}"#);
    assert_eq!(invalid_field(&decode(None, Some(&no_op))), "op");
    assert_eq!(
        invalid_field(&decode(None, Some(&envelope("c", "null")))),
        "after"
    );
    assert_eq!(
        invalid_field(&decode(None, Some(&envelope("u", "[1]")))),
        "after"
    );
    let numeric_op = format!(r#"{{"after":{ROW},"op":1}}"#);
    assert_eq!(invalid_field(&decode(None, Some(&numeric_op))), "op");
    let big = ROW.replace("\"id\":42", "\"id\":9223372036854775808");
    assert_eq!(
        invalid_field(&decode(None, Some(&envelope("c", &big)))),
        "after.id"
    );
    let float_id = ROW.replace("\"id\":42", "\"id\":42.0");
    assert_eq!(
        invalid_field(&decode(None, Some(&envelope("c", &float_id)))),
        "after.id"
    );
}

/// Issue 16 item 7: what the sidecar does not use never loses a pending
/// row. The job reads the row; the database decides.
#[test]
fn unreadable_fields_besides_id_table_and_op_still_trigger() {
    let trigger = |row: &str| match decode(None, Some(&envelope("u", row))) {
        Decision::Trigger(t) => t,
        other => panic!("{row}: expected a trigger, got {other:?}"),
    };
    for (from, to) in [
        (
            "\"updated_at\":1796009787123456",
            "\"updated_at\":\"yesterday\"",
        ),
        ("\"updated_at\":1796009787123456", "\"updated_at\":[1]"),
        ("\"updated_at\":1796009787123456", "\"updated_at\":1.5"),
        (
            "\"updated_at\":1796009787123456",
            "\"updated_at\":18446744073709551615",
        ),
    ] {
        let t = trigger(&ROW.replace(from, to));
        assert_eq!(
            (t.id, t.attempts, t.updated_at),
            (42, Some(0), None),
            "{to}"
        );
    }
    let when = Some(at("2026-11-30T03:36:27.123456"));
    for (from, to) in [
        (",\"attempts\":0", ""),
        ("\"attempts\":0", "\"attempts\":null"),
        ("\"attempts\":0", "\"attempts\":\"3\""),
        ("\"attempts\":0", "\"attempts\":2147483648"),
    ] {
        let t = trigger(&ROW.replace(from, to));
        assert_eq!((t.id, t.attempts, t.updated_at), (42, None, when), "{to}");
    }
    // A status the decoder cannot read: the row decides whether it is pending.
    for (from, to) in [
        (",\"status\":\"pending\"", ""),
        ("\"status\":\"pending\"", "\"status\":null"),
        ("\"status\":\"pending\"", "\"status\":\"queued\""),
        ("\"status\":\"pending\"", "\"status\":0"),
    ] {
        assert_eq!(trigger(&ROW.replace(from, to)).id, 42, "{to}");
    }
    // Flattened rows too, and everything unreadable at once.
    let flat = r#"{"id":7,"status":1,"attempts":"x","updated_at":"never","__op":"c"}"#;
    assert_eq!(
        decode(None, Some(flat)),
        Decision::Trigger(Trigger {
            id: 7,
            op: Op::Create,
            attempts: None,
            updated_at: None,
        })
    );
    // Only a readable terminal status skips; the id is still required.
    let sent = ROW
        .replace("\"pending\"", "\"sent\"")
        .replace("\"attempts\":0", "\"attempts\":\"x\"");
    assert_eq!(
        decode(None, Some(&envelope("u", &sent))).result_label(),
        "skipped"
    );
    let no_id = ROW.replace("\"id\":42,", "");
    assert_eq!(
        invalid_field(&decode(None, Some(&envelope("u", &no_id)))),
        "after.id"
    );
}

#[test]
fn deletes_never_fail_on_their_row() {
    let value = r#"{"before":{"id":"x"},"after":null,"op":"d"}"#;
    assert_eq!(
        decode(None, Some(value)),
        Decision::Skip(Skip::Delete { id: None })
    );
    assert_eq!(
        decode(Some(r#"{"id":5}"#), Some(value)),
        Decision::Skip(Skip::Delete { id: Some(5) })
    );
    let flat = r#"{"id":9,"status":null,"__deleted":true}"#;
    assert_eq!(
        decode(None, Some(flat)),
        Decision::Skip(Skip::Delete { id: Some(9) })
    );
    let bad_flag = r#"{"id":9,"status":"pending","attempts":0,"__deleted":"yes"}"#;
    assert_eq!(invalid_field(&decode(None, Some(bad_flag))), "__deleted");
    let bad_op = r#"{"id":9,"status":"pending","attempts":0,"__op":"z"}"#;
    assert_eq!(invalid_field(&decode(None, Some(bad_op))), "__op");
}

#[test]
fn updated_at_placeholder_and_escaped_strings() {
    let placeholder = ROW.replace("1796009787123456", "\"__debezium_unavailable_value\"");
    let Decision::Trigger(t) = decode(None, Some(&envelope("u", &placeholder))) else {
        panic!("expected a trigger");
    };
    assert_eq!(t.updated_at, None);
    // An escaped status still compares by its unescaped text.
    let escaped = ROW.replace("\"pending\"", "\"pend\\u0069ng\"");
    assert_eq!(
        decode(None, Some(&envelope("c", &escaped))).result_label(),
        "triggered"
    );
}

#[test]
fn payload_object_is_a_wrapper_only_when_alone_or_beside_schema() {
    let unwrapped = format!(r#"{{"payload":{}}}"#, envelope("c", ROW));
    assert_eq!(decode(None, Some(&unwrapped)).id(), Some(42));
    let column = r#"{"id":5,"payload":{"event_type":"x"},"status":"pending","attempts":1}"#;
    assert_eq!(decode(None, Some(column)).id(), Some(5));
}

#[test]
fn heartbeat_is_recognised_by_key_or_by_a_bare_ts_ms() {
    assert_eq!(
        decode(Some(r#"{"serverName":"s"}"#), Some("{}")),
        Decision::Skip(Skip::Heartbeat)
    );
    assert_eq!(
        decode(None, Some(r#"{"ts_ms":1}"#)),
        Decision::Skip(Skip::Heartbeat)
    );
    assert_eq!(
        decode(None, Some(r#"{"ts_ms":1,"ts_us":1000,"ts_ns":1000000}"#)),
        Decision::Skip(Skip::Heartbeat)
    );
    assert_eq!(
        decode(None, Some(r#"{"ts_ms":1,"x":2}"#)),
        Decision::Skip(Skip::NoRow)
    );
}

// ---------------------------------------------------------------- time

#[test]
fn epoch_units_by_magnitude() {
    let t = at("2026-11-30T03:36:27.123456");
    assert_eq!(time::from_epoch(1_796_009_787_123_456), Ok(t));
    assert_eq!(
        time::from_epoch(1_796_009_787_123),
        Ok(at("2026-11-30T03:36:27.123"))
    );
    assert_eq!(time::from_epoch(1_796_009_787_123_456_000), Ok(t));
    assert_eq!(time::from_epoch(0), Ok(at("1970-01-01T00:00:00")));
    assert_eq!(time::from_epoch(-1_000), Ok(at("1969-12-31T23:59:59")));
    // The boundaries: the first value of each larger unit.
    assert_eq!(
        time::from_epoch(99_999_999_999_999),
        Ok(at("5138-11-16T09:46:39.999"))
    );
    assert_eq!(
        time::from_epoch(100_000_000_000_000),
        Ok(at("1973-03-03T09:46:40"))
    );
    assert_eq!(
        time::from_epoch(100_000_000_000_000_000),
        Ok(at("1973-03-03T09:46:40"))
    );
    assert!(time::from_epoch(i64::MIN).is_ok());
    assert!(time::from_epoch(i64::MAX).is_ok());
}

#[test]
fn text_forms() {
    let t = at("2026-11-30T03:36:27.123456");
    for text in [
        "2026-11-30T03:36:27.123456Z",
        "2026-11-30t03:36:27.123456z",
        "2026-11-30 03:36:27.123456",
        "2026-11-30T03:36:27.123456",
        "2026-11-30T05:36:27.123456+02:00",
        "2026-11-30T05:36:27.123456+0200",
        "2026-11-30T05:36:27.123456+02",
        "2026-11-30T00:06:27.123456-03:30",
        "2026-11-30T03:36:27.1234560001Z",
    ] {
        assert_eq!(time::from_text(text), Ok(t), "{text}");
    }
    assert_eq!(
        time::from_text("2026-11-30 03:36:27"),
        Ok(at("2026-11-30T03:36:27"))
    );
    for bad in [
        "",
        "2026-02-30T00:00:00",
        "2026-11-30",
        "2026-11-30T03:36",
        "2026-11-30T03:36:27.",
        "2026-11-30T03:36:27Zx",
        "2026-11-30T03:36:27+2",
        "2026-11-30T03:36:27+24:00",
        "2026-11-30T25:00:00",
        "1796009787123456",
        "2026-11-30T03:36:27\u{e9}",
    ] {
        assert!(time::from_text(bad).is_err(), "{bad}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn every_epoch_unit_and_text_form_agrees(
        micros in 100_000_000_000_000i64..99_999_999_999_999_999i64,
    ) {
        let expected = DateTime::from_timestamp_micros(micros).unwrap().naive_utc();
        prop_assert_eq!(time::from_epoch(micros), Ok(expected));
        if micros % 1000 == 0 {
            prop_assert_eq!(time::from_epoch(micros / 1000), Ok(expected));
        }
        if micros <= i64::MAX / 1000 {
            prop_assert_eq!(time::from_epoch(micros * 1000), Ok(expected));
        }
        let text = expected.format("%Y-%m-%dT%H:%M:%S%.6f").to_string();
        prop_assert_eq!(time::from_text(&text), Ok(expected));
        prop_assert_eq!(time::from_text(&format!("{text}Z")), Ok(expected));
        prop_assert_eq!(time::from_text(&text.replacen('T', " ", 1)), Ok(expected));
    }
}

// ---------------------------------------------------------------- properties

/// Valid values to mutate: every fixture's value, which covers every shape.
static SEEDS: LazyLock<Vec<Vec<u8>>> = LazyLock::new(|| {
    load_fixtures()
        .iter()
        .filter_map(|(_, fixture)| fixture_bytes(fixture).1)
        .filter(|value| serde_json::from_slice::<serde_json::Value>(value).is_ok())
        .collect()
});

#[derive(Debug, Clone)]
enum Mutation {
    Flip(prop::sample::Index, u8),
    Insert(prop::sample::Index, u8),
    Delete(prop::sample::Index),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    // Structural bytes make it past the parser more often than random ones.
    let byte = prop_oneof![
        any::<u8>(),
        prop::sample::select(b"{}[]\":,0123456789-.eEtfnul\\ ".to_vec()),
    ];
    prop_oneof![
        (any::<prop::sample::Index>(), 1u8..=255).prop_map(|(i, m)| Mutation::Flip(i, m)),
        (any::<prop::sample::Index>(), byte).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<prop::sample::Index>().prop_map(Mutation::Delete),
    ]
}

fn apply(bytes: &mut Vec<u8>, mutation: &Mutation) {
    match mutation {
        Mutation::Flip(i, mask) if !bytes.is_empty() => {
            let at = i.index(bytes.len());
            bytes[at] ^= mask;
        }
        Mutation::Insert(i, b) => {
            let at = i.index(bytes.len() + 1);
            bytes.insert(at, *b);
        }
        Mutation::Delete(i) if !bytes.is_empty() => {
            let at = i.index(bytes.len());
            bytes.remove(at);
        }
        _ => {}
    }
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1e20f64..1e20).prop_map(Value::from),
        prop::sample::select(vec![
            "pending",
            "sent",
            "failed",
            "c",
            "r",
            "u",
            "d",
            "t",
            "m",
            "true",
            "false",
            "outbox_events",
            "public.outbox_events",
            "customers",
            "",
            "__debezium_unavailable_value",
            "2026-11-30T03:36:27Z",
            "2026-11-30 03:36:27.5",
        ])
        .prop_map(Value::from),
        "[a-z_.:0-9 -]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec(("[a-z_]{1,8}", inner), 0..4)
                .prop_map(|fields| Value::Object(fields.into_iter().collect())),
        ]
    })
}

/// Every object member of `value`, as a path of keys.
fn member_paths(value: &serde_json::Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    if let serde_json::Value::Object(map) = value {
        for (name, child) in map {
            prefix.push(name.clone());
            out.push(prefix.clone());
            member_paths(child, prefix, out);
            prefix.pop();
        }
    }
}

fn replace_member(bytes: &[u8], pick: prop::sample::Index, with: serde_json::Value) -> Vec<u8> {
    let mut doc: serde_json::Value = serde_json::from_slice(bytes).unwrap();
    let mut paths = Vec::new();
    member_paths(&doc, &mut Vec::new(), &mut paths);
    if paths.is_empty() {
        return bytes.to_vec();
    }
    let path = &paths[pick.index(paths.len())];
    let mut at = &mut doc;
    for name in path {
        at = at.get_mut(name.as_str()).unwrap();
    }
    *at = with;
    serde_json::to_vec(&doc).unwrap()
}

/// The invariants every decision keeps, whatever the input.
fn assert_well_formed(record: &Record<'_>, decision: &Decision) -> Result<(), TestCaseError> {
    let again = decoder().decode(record);
    prop_assert_eq!(&again, decision, "decoding is deterministic");
    match decision {
        Decision::Trigger(_) => prop_assert_eq!(decision.result_label(), "triggered"),
        Decision::Skip(skip) => {
            prop_assert_eq!(decision.result_label(), "skipped");
            prop_assert!(!skip.reason().is_empty());
        }
        Decision::Invalid(invalid) => {
            prop_assert_eq!(decision.result_label(), "invalid");
            prop_assert_eq!(invalid.topic.as_str(), record.topic);
            prop_assert_eq!(invalid.partition, record.partition);
            prop_assert_eq!(invalid.offset, record.offset);
            prop_assert!(!invalid.field.is_empty());
            prop_assert!(!invalid.to_string().is_empty());
        }
    }
    Ok(())
}

fn run(key: Option<&[u8]>, value: Option<&[u8]>) -> Result<(), TestCaseError> {
    let record = Record {
        topic: TOPIC,
        partition: 1,
        offset: 99,
        key,
        value,
    };
    let decision = decoder().decode(&record);
    assert_well_formed(&record, &decision)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10_000))]

    #[test]
    fn arbitrary_bytes_never_panic(
        key in prop::option::of(prop::collection::vec(any::<u8>(), 0..64)),
        value in prop::option::of(prop::collection::vec(any::<u8>(), 0..512)),
    ) {
        run(key.as_deref(), value.as_deref())?;
    }

    #[test]
    fn mutated_envelopes_never_panic(
        seed in any::<prop::sample::Index>(),
        mutations in prop::collection::vec(mutation(), 1..6),
        key in prop::option::of(prop::sample::select(vec![
            br#"{"id":42}"#.to_vec(),
            br#"{"schema":{"type":"struct"},"payload":{"id":42}}"#.to_vec(),
            br#"{"serverName":"outbox"}"#.to_vec(),
            b"42".to_vec(),
        ])),
    ) {
        let mut value = SEEDS[seed.index(SEEDS.len())].clone();
        for m in &mutations {
            apply(&mut value, m);
        }
        run(key.as_deref(), Some(&value))?;
    }

    #[test]
    fn replaced_fields_never_panic(
        seed in any::<prop::sample::Index>(),
        picks in prop::collection::vec((any::<prop::sample::Index>(), json_value()), 1..4),
    ) {
        let mut value = SEEDS[seed.index(SEEDS.len())].clone();
        for (pick, with) in picks {
            value = replace_member(&value, pick, with);
        }
        run(Some(br#"{"id":42}"#), Some(&value))?;
        run(None, Some(&value))?;
    }
}
