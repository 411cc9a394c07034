//! Turns the timestamp representations Debezium emits into UTC `NaiveDateTime`s.
//!
//! Which representation arrives depends on the connector (PostgreSQL, MySQL),
//! `time.precision.mode` and the column type, and reading the schema block to
//! find out would cost more than the rest of the decoding. So the unit of an
//! integer is decided by its magnitude, and strings are parsed by shape.
//!
//! Integer thresholds (on the absolute value):
//!
//! | range                 | unit         | why it is unambiguous                                   |
//! |-----------------------|--------------|---------------------------------------------------------|
//! | `< 10^14`             | milliseconds | `10^14` ms is year 5138; `10^14` µs is only 1973-03-03  |
//! | `10^14 ..< 10^17`     | microseconds | `10^17` µs is year 5138; `10^17` ns is only 1973-03-03  |
//! | `>= 10^17`            | nanoseconds  | `i64::MAX` ns is year 2262                              |
//!
//! So every instant between 1973-03-03 and 5138 is read right whatever the
//! unit; a microsecond value before 1973 would be misread as milliseconds,
//! which no outbox row has.

use chrono::{DateTime, NaiveDate, NaiveDateTime, NaiveTime, TimeDelta};

const MILLIS_BELOW: u64 = 100_000_000_000_000;
const MICROS_BELOW: u64 = 100_000_000_000_000_000;

/// An epoch offset whose unit is inferred from its magnitude (see the module docs).
pub(crate) fn from_epoch(value: i64) -> Result<NaiveDateTime, String> {
    let magnitude = value.unsigned_abs();
    let parsed = if magnitude < MILLIS_BELOW {
        DateTime::from_timestamp_millis(value)
    } else if magnitude < MICROS_BELOW {
        DateTime::from_timestamp_micros(value)
    } else {
        Some(DateTime::from_timestamp_nanos(value))
    };
    parsed
        .map(|t| t.naive_utc())
        .ok_or_else(|| format!("epoch value {value} is out of range"))
}

/// ISO-8601 / RFC 3339 (`T` or space, optional fraction up to nanoseconds,
/// `Z`, `±HH:MM`, `±HHMM`, `±HH` or no zone) and MySQL's `YYYY-MM-DD HH:MM:SS[.f]`.
/// A string without a zone is taken to be UTC already, as Debezium writes
/// `timestamp without time zone` columns.
pub(crate) fn from_text(text: &str) -> Result<NaiveDateTime, String> {
    parse_text(text.as_bytes())
        .ok_or_else(|| format!("{text:?} is not an ISO-8601 or MySQL date-time"))
}

fn parse_text(s: &[u8]) -> Option<NaiveDateTime> {
    let mut cur = Cursor { s, at: 0 };
    let year = cur.digits(4)?;
    cur.eat(b'-')?;
    let month = cur.digits(2)?;
    cur.eat(b'-')?;
    let day = cur.digits(2)?;
    match cur.next()? {
        b'T' | b't' | b' ' => {}
        _ => return None,
    }
    let hour = cur.digits(2)?;
    cur.eat(b':')?;
    let minute = cur.digits(2)?;
    cur.eat(b':')?;
    let second = cur.digits(2)?;
    let mut nanos = 0u32;
    if cur.peek() == Some(b'.') {
        cur.at += 1;
        let mut scale = 100_000_000u32;
        let mut count = 0;
        while let Some(d) = cur.peek().filter(u8::is_ascii_digit) {
            // Digits past nanoseconds carry no representable information.
            nanos += u32::from(d - b'0') * scale;
            scale /= 10;
            count += 1;
            cur.at += 1;
        }
        if count == 0 {
            return None;
        }
    }
    let offset_seconds = match cur.next() {
        None => 0,
        Some(b'Z' | b'z') => 0,
        Some(sign @ (b'+' | b'-')) => {
            let hours = cur.digits(2)?;
            let minutes = match cur.peek() {
                None => 0,
                Some(b':') => {
                    cur.at += 1;
                    cur.digits(2)?
                }
                Some(_) => cur.digits(2)?,
            };
            if hours > 23 || minutes > 59 {
                return None;
            }
            let total = i64::from(hours * 3600 + minutes * 60);
            if sign == b'-' {
                -total
            } else {
                total
            }
        }
        Some(_) => return None,
    };
    if cur.peek().is_some() {
        return None;
    }
    let date = NaiveDate::from_ymd_opt(i32::try_from(year).ok()?, month, day)?;
    let time = NaiveTime::from_hms_nano_opt(hour, minute, second, nanos)?;
    // A local time is ahead of UTC by its offset, so subtracting gives UTC.
    NaiveDateTime::new(date, time).checked_sub_signed(TimeDelta::seconds(offset_seconds))
}

struct Cursor<'a> {
    s: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.at += 1;
        Some(b)
    }

    fn eat(&mut self, want: u8) -> Option<()> {
        (self.next()? == want).then_some(())
    }

    fn digits(&mut self, count: usize) -> Option<u32> {
        let mut value = 0u32;
        for _ in 0..count {
            let d = self.next().filter(u8::is_ascii_digit)?;
            value = value * 10 + u32::from(d - b'0');
        }
        Some(value)
    }
}
