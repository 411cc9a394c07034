//! CPU, memory and load figures read from /proc.

use super::*;

pub(crate) fn load1() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

pub(crate) fn loadavg_line() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "?".to_owned())
}

pub(crate) fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// utime + stime (ticks) of a `/proc/<pid>/stat` text, and its `comm`.
pub(crate) fn parse_stat(text: &str) -> Option<(String, u64)> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text[open + 1..close].to_owned();
    let fields: Vec<&str> = text[close + 1..].split_whitespace().collect();
    // fields[0] is field 3 (state): utime is field 14, stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((comm, utime + stime))
}

pub(crate) fn self_cpu_ticks() -> u64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|t| parse_stat(&t))
        .map(|(_, t)| t)
        .unwrap_or(0)
}

/// CPU ticks of every live `postgres` process, by pid.
pub(crate) fn postgres_cpu_ticks() -> HashMap<u32, u64> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some((comm, ticks)) = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .and_then(|t| parse_stat(&t))
        {
            if comm == "postgres" {
                out.insert(pid, ticks);
            }
        }
    }
    out
}

pub(crate) fn postgres_cpu_delta(before: &HashMap<u32, u64>) -> u64 {
    postgres_cpu_ticks()
        .iter()
        .map(|(pid, t)| t.saturating_sub(before.get(pid).copied().unwrap_or(0)))
        .sum()
}

/// A `VmRSS`/`VmHWM` line of /proc/<pid>/status, in bytes.
pub(crate) fn status_bytes(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with(field)).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
            })
        })
        .map(|kib| kib * 1024)
        .unwrap_or(0)
}

pub(crate) fn pid_cpu_ticks(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|t| parse_stat(&t))
        .map(|(_, t)| t)
        .unwrap_or(0)
}
