//! The units a setting is written in: durations (`"5s"`, `"200ms"`,
//! `"1m 30s"` as humantime, or a bare integer of seconds) and sizes
//! (`65536`, `"512KiB"`, `"64MiB"`, `"1GiB"`; also `KB`/`MB`/`GB` as
//! powers of 1,000), for `#[serde(with = ...)]`.

pub mod byte_size {
    use serde::{Deserialize, Deserializer, Serializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Text(String),
        Bytes(u64),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
        match Raw::deserialize(d)? {
            Raw::Bytes(b) => usize::try_from(b).map_err(serde::de::Error::custom),
            Raw::Text(s) => parse(&s).map_err(serde::de::Error::custom),
        }
    }

    pub fn parse(s: &str) -> Result<usize, String> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (digits, unit) = t.split_at(split);
        let unit_factor: u64 = match unit.trim() {
            "" | "B" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            "KB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            _ => 0,
        };
        digits
            .parse::<u64>()
            .ok()
            .filter(|_| unit_factor > 0)
            .and_then(|n| n.checked_mul(unit_factor))
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| {
                format!("{s:?} is not a size (expected e.g. \"64MiB\" or a number of bytes)")
            })
    }

    pub fn serialize<S: Serializer>(b: &usize, s: S) -> Result<S::Ok, S::Error> {
        if b.is_multiple_of(1 << 20) {
            s.serialize_str(&format!("{}MiB", b >> 20))
        } else {
            s.serialize_str(&format!("{b}B"))
        }
    }
}

pub mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Text(String),
        Seconds(u64),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        match Raw::deserialize(d)? {
            Raw::Seconds(s) => Ok(Duration::from_secs(s)),
            Raw::Text(s) => parse(&s).map_err(serde::de::Error::custom),
        }
    }

    /// A bare integer (as an environment variable gives it) is seconds,
    /// like an integer in the TOML file.
    pub fn parse(s: &str) -> Result<Duration, String> {
        let t = s.trim();
        if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(seconds) = t.parse::<u64>() {
                return Ok(Duration::from_secs(seconds));
            }
        }
        humantime::parse_duration(t)
            .map_err(|_| format!("{s:?} is not a duration (expected e.g. \"5s\" or \"200ms\")"))
    }

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }
}
