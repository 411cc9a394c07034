//! W3C trace context (`traceparent`, `tracestate`) carried from the
//! application's request to the receiver: the application writes the
//! request's `traceparent` into the row (`[tracing] column`), and every
//! attempt is a child span of it, sent on the POST as the receiver's
//! parent. The ids are made here whether or not spans are exported, so an
//! operator can go from an event to its trace with no collector at all.

use std::fmt;

/// A 16-byte trace id, never all zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId(pub [u8; 16]);

/// An 8-byte span id, never all zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanId(pub [u8; 8]);

/// Lower-case hex of `bytes` written through a stack buffer (no
/// allocation: ids are written on every attempt).
fn write_hex<const N: usize, const H: usize>(
    bytes: &[u8; N],
    f: &mut fmt::Formatter<'_>,
) -> fmt::Result {
    let mut buf = [0u8; H];
    hex::encode_to_slice(bytes, &mut buf).map_err(|_| fmt::Error)?;
    f.write_str(std::str::from_utf8(&buf).map_err(|_| fmt::Error)?)
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex::<16, 32>(&self.0, f)
    }
}

impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex::<8, 16>(&self.0, f)
    }
}

impl SpanId {
    /// A fresh random span id: SplitMix64 per thread, seeded once from the
    /// OS (a system call per attempt cost the hot path more than the rest
    /// of the trace context together); ids only need to be unique, not
    /// secret.
    pub fn random() -> SpanId {
        thread_local! {
            static STATE: std::cell::Cell<u64> = std::cell::Cell::new(seed());
        }
        loop {
            let n = STATE.with(|s| {
                let x = s.get().wrapping_add(0x9E37_79B9_7F4A_7C15);
                s.set(x);
                let mut z = x;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^ (z >> 31)
            });
            if n != 0 {
                return SpanId(n.to_be_bytes());
            }
        }
    }
}

/// A per-thread seed from the OS, or from the time and the thread when
/// the OS has no randomness to give.
fn seed() -> u64 {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_ok() {
        return u64::from_ne_bytes(b);
    }
    use std::hash::{BuildHasher, Hash, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    std::thread::current().id().hash(&mut h);
    std::time::SystemTime::now().hash(&mut h);
    h.finish()
}

/// A parsed `traceparent` (version 00), with the `tracestate` that came
/// with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: TraceId,
    pub parent_id: SpanId,
    /// Trace flags; bit 0 is `sampled`.
    pub flags: u8,
    pub state: Option<String>,
}

/// Why a `traceparent` value was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a W3C traceparent ({0}); the event is sent without one")]
pub struct Invalid(&'static str);

/// `s` as `N` bytes of lower-case hex, checked and decoded in one pass
/// (every event's `traceparent` goes through here).
fn lower_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    fn nibble(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        }
    }
    let s = s.as_bytes();
    if s.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (o, pair) in out.iter_mut().zip(s.chunks_exact(2)) {
        *o = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some(out)
}

impl TraceParent {
    /// Parses a `traceparent` header value as the W3C Trace Context
    /// specification reads it: `version-traceid-parentid-flags`, lower-case
    /// hex; version `ff` and all-zero ids are invalid; a later version is
    /// read by its first four fields. `state`: the row's `tracestate`, kept
    /// as written (trimmed, empty dropped, at most 512 bytes).
    pub fn parse(value: &str, state: Option<&str>) -> Result<TraceParent, Invalid> {
        let value = value.trim();
        let mut parts = value.split('-');
        let (Some(version), Some(trace), Some(parent), Some(flags)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(Invalid("expected version-traceid-parentid-flags"));
        };
        let version = lower_hex::<1>(version).ok_or(Invalid("version is not 2 hex digits"))?[0];
        if version == 0xff {
            return Err(Invalid("version ff is invalid"));
        }
        if version == 0 && (value.len() != 55 || parts.next().is_some()) {
            return Err(Invalid("version 00 has exactly four fields"));
        }
        let trace_id =
            lower_hex::<16>(trace).ok_or(Invalid("trace id is not 32 lower-case hex digits"))?;
        if trace_id == [0; 16] {
            return Err(Invalid("trace id is all zeros"));
        }
        let parent_id =
            lower_hex::<8>(parent).ok_or(Invalid("parent id is not 16 lower-case hex digits"))?;
        if parent_id == [0; 8] {
            return Err(Invalid("parent id is all zeros"));
        }
        let flags = lower_hex::<1>(flags).ok_or(Invalid("flags are not 2 hex digits"))?[0];
        let state = state
            .map(str::trim)
            .filter(|s| {
                !s.is_empty()
                    && s.len() <= 512
                    && s.chars().all(|c| c.is_ascii() && !c.is_ascii_control())
            })
            .map(str::to_owned);
        Ok(TraceParent {
            trace_id: TraceId(trace_id),
            parent_id: SpanId(parent_id),
            flags,
            state,
        })
    }

    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// The `traceparent` of a child span `span` of this context (version
    /// 00, this trace, the parent's flags but only the sampled bit).
    pub fn child_header(&self, span: SpanId) -> String {
        format!("00-{}-{}-{:02x}", self.trace_id, span, self.flags & 1)
    }
}

impl TraceId {
    /// A fresh random trace id (a new trace).
    /// The trace id of an event that brings none: drawn from the event's
    /// id with a key of this process, so every attempt of the event (each
    /// its own job) is in one trace, with nothing kept between them. (A
    /// restart starts another trace, as it always did.)
    pub fn of_event(id: i64) -> TraceId {
        static KEY: std::sync::OnceLock<(u64, u64)> = std::sync::OnceLock::new();
        let (k1, k2) = *KEY.get_or_init(|| (seed(), seed()));
        let mix = |x: u64| {
            let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        let (a, b) = (mix(k1 ^ id as u64), mix(k2 ^ mix(id as u64)));
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&a.to_be_bytes());
        out[8..].copy_from_slice(&b.to_be_bytes());
        if out == [0; 16] {
            out[15] = 1;
        }
        TraceId(out)
    }

    pub fn random() -> TraceId {
        let (a, b) = (SpanId::random(), SpanId::random());
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&a.0);
        id[8..].copy_from_slice(&b.0);
        TraceId(id)
    }
}

/// An event's trace context, decided once per job: the application's
/// (`[tracing] column`), or a new trace when the row has none or one that
/// is not valid. Every attempt is a span of its own in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventTrace {
    pub trace_id: TraceId,
    /// The application's span the attempts are children of; none: each
    /// attempt is a root span of a new trace.
    pub parent: Option<SpanId>,
    /// Whether the attempts are sampled (the application's decision; a
    /// new trace is).
    pub sampled: bool,
    /// The application's `tracestate`, passed on as written.
    pub state: Option<String>,
}

/// Where an event's trace context came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The row's valid `traceparent`.
    Row,
    /// The row had none: a new trace.
    None,
    /// The row's value was not a `traceparent`: a new trace.
    Invalid(Invalid),
}

impl EventTrace {
    /// The context of an event whose row holds `traceparent` and
    /// `tracestate` (as read from the table's columns).
    pub fn of_row(traceparent: Option<&str>, tracestate: Option<&str>) -> (EventTrace, Origin) {
        let value = traceparent.map(str::trim).filter(|v| !v.is_empty());
        match value.map(|v| TraceParent::parse(v, tracestate)) {
            Some(Ok(p)) => (
                EventTrace {
                    trace_id: p.trace_id,
                    parent: Some(p.parent_id),
                    sampled: p.sampled(),
                    state: p.state,
                },
                Origin::Row,
            ),
            Some(Err(e)) => (EventTrace::new_trace(), Origin::Invalid(e)),
            None => (EventTrace::new_trace(), Origin::None),
        }
    }

    /// A new trace, sampled.
    pub fn new_trace() -> EventTrace {
        EventTrace {
            trace_id: TraceId::random(),
            parent: None,
            sampled: true,
            state: None,
        }
    }

    /// The `traceparent` header of the attempt whose span is `span`.
    pub fn header(&self, span: SpanId) -> String {
        use std::fmt::Write as _;
        let mut out = String::with_capacity(55);
        let _ = write!(
            out,
            "00-{}-{}-{:02x}",
            self.trace_id,
            span,
            u8::from(self.sampled)
        );
        out
    }
}

/// One attempt's span, as exported: what the headers carried and how it
/// went.
#[derive(Debug, Clone)]
pub struct AttemptSpan {
    pub trace: EventTrace,
    pub span: SpanId,
    pub event_id: i64,
    pub event_name: String,
    pub dispatcher: Option<String>,
    pub attempt: i32,
    pub started: std::time::SystemTime,
    pub ended: std::time::SystemTime,
    pub http_status: Option<u16>,
    /// `success` or `failure`.
    pub outcome: &'static str,
    pub error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_the_specification_example_and_makes_a_child() {
        let p = TraceParent::parse(GOOD, Some(" congo=t61rcWkgMzE ")).unwrap();
        assert_eq!(p.trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(p.parent_id.to_string(), "00f067aa0ba902b7");
        assert!(p.sampled());
        assert_eq!(p.state.as_deref(), Some("congo=t61rcWkgMzE"));
        let span = SpanId([1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(
            p.child_header(span),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0102030405060708-01"
        );
        let unsampled = TraceParent::parse(&GOOD.replace("-01", "-00"), None).unwrap();
        assert!(unsampled.child_header(span).ends_with("-00"));
        // A later version is read by its first four fields.
        let later = format!("{}-extra", GOOD.replacen("00", "cc", 1));
        assert!(TraceParent::parse(&later, None).is_ok());
    }

    #[test]
    fn refuses_what_the_specification_calls_invalid() {
        for bad in [
            "",
            "garbage",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
        ] {
            let e = TraceParent::parse(bad, None).unwrap_err();
            assert!(
                e.to_string().starts_with("not a W3C traceparent"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn random_span_ids_are_never_zero_and_differ() {
        let (a, b) = (SpanId::random(), SpanId::random());
        assert_ne!(a.0, [0; 8]);
        assert_ne!(a, b);
    }

    #[test]
    fn an_event_trace_is_the_rows_or_a_new_one() {
        let (t, origin) = EventTrace::of_row(Some(GOOD), Some("k=v"));
        assert_eq!(origin, Origin::Row);
        assert_eq!(t.trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.parent.unwrap().to_string(), "00f067aa0ba902b7");
        assert_eq!(t.state.as_deref(), Some("k=v"));
        let span = SpanId([9; 8]);
        assert_eq!(
            t.header(span),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0909090909090909-01"
        );
        let (a, origin) = EventTrace::of_row(None, None);
        assert_eq!(origin, Origin::None);
        assert!(a.parent.is_none() && a.sampled);
        let (b, origin) = EventTrace::of_row(Some("  "), None);
        assert_eq!(origin, Origin::None);
        assert_ne!(a.trace_id, b.trace_id, "each new trace is its own");
        let (_, origin) = EventTrace::of_row(Some("00-xyz"), None);
        assert!(matches!(origin, Origin::Invalid(_)));
        // An unsampled parent: the attempts are not sampled either.
        let unsampled = GOOD.replace("-01", "-00");
        let (u, _) = EventTrace::of_row(Some(&unsampled), None);
        assert!(u.header(span).ends_with("-00"));
    }
}
