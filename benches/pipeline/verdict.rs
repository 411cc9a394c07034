//! How a goal is judged: from pairs, never from one run.
//!
//! On a 2-core machine shared with the broker, the receiver and PostgreSQL,
//! one run's figure moves by more than most goals' margins (the sidecar's
//! cost per event read × 1.32 and × 1.58 of its parts in two runs of the
//! same commit). Each goal therefore compares figures measured next to each
//! other (a pair: the sidecar's run and the runs of the parts it is
//! compared with, back to back, their order alternating run by run), takes
//! the median of the per-pair figures over at least [`MIN_PAIRS`] pairs,
//! and prints their spread. The verdict comes from the spread: PASS when
//! every pair meets the bound, MISS when none does, UNSURE when the spread
//! crosses it (or there are too few pairs to say).

use std::fmt;

/// Fewer pairs than this give no PASS or MISS.
pub(crate) const MIN_PAIRS: usize = 5;

/// The bound a goal's figure must meet.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Bound {
    /// At most this (`≤`).
    AtMost(f64),
    /// Strictly below this (`<`).
    Below(f64),
    /// At least this (`≥`).
    AtLeast(f64),
    /// Between the two, both included.
    Within(f64, f64),
}

impl Bound {
    pub(crate) fn holds(self, v: f64) -> bool {
        match self {
            Bound::AtMost(b) => v <= b,
            Bound::Below(b) => v < b,
            Bound::AtLeast(b) => v >= b,
            Bound::Within(lo, hi) => (lo..=hi).contains(&v),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Pass,
    Miss,
    Unsure,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Pass => "PASS",
            Verdict::Miss => "MISS",
            Verdict::Unsure => "UNSURE",
        })
    }
}

/// PASS when every pair's figure meets `bound`, MISS when none does,
/// UNSURE when some do and some do not, when a figure is missing (NaN) or
/// when there are fewer than [`MIN_PAIRS`] pairs.
pub(crate) fn verdict(pairs: &[f64], bound: Bound) -> Verdict {
    if pairs.len() < MIN_PAIRS || pairs.iter().any(|v| !v.is_finite()) {
        return Verdict::Unsure;
    }
    let met = pairs.iter().filter(|v| bound.holds(**v)).count();
    if met == pairs.len() {
        Verdict::Pass
    } else if met == 0 {
        Verdict::Miss
    } else {
        Verdict::Unsure
    }
}

/// The smallest and the largest of the figures (NaN when there are none).
pub(crate) fn spread(pairs: &[f64]) -> (f64, f64) {
    let finite = pairs.iter().copied().filter(|v| v.is_finite());
    let lo = finite.clone().fold(f64::INFINITY, f64::min);
    let hi = finite.fold(f64::NEG_INFINITY, f64::max);
    if lo.is_finite() {
        (lo, hi)
    } else {
        (f64::NAN, f64::NAN)
    }
}

/// The median of `values` (NaN when there are none).
pub(crate) fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// `v` rounded, with thousands separated by commas (`n/a` when not finite).
pub(crate) fn thousands(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".to_owned();
    }
    let s = format!("{:.0}", v.round());
    let (sign, digits) = s.strip_prefix('-').map_or(("", s.as_str()), |d| ("-", d));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    format!("{sign}{out}")
}

/// How a goal's figures are written: the median with its unit, the
/// spread as bare numbers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Shown {
    /// A ratio, `× 1.32`, with this many decimals.
    Times(usize),
    /// Events or rows per second, `17,331/s`.
    Rate,
    /// A number with this many decimals and a unit after it.
    Unit(usize, &'static str),
}

impl Shown {
    fn number(self, v: f64) -> String {
        if !v.is_finite() {
            return "n/a".to_owned();
        }
        match self {
            Shown::Times(d) | Shown::Unit(d, _) if d > 0 => format!("{v:.d$}"),
            Shown::Times(_) | Shown::Unit(..) | Shown::Rate => thousands(v),
        }
    }

    fn with_unit(self, v: f64) -> String {
        let n = self.number(v);
        match self {
            Shown::Times(_) => format!("× {n}"),
            Shown::Rate => format!("{n}/s"),
            Shown::Unit(_, unit) => format!("{n}{unit}"),
        }
    }
}

/// One goal line: `VERDICT what: median (N pairs: min..max); detail`.
pub(crate) fn goal_line(
    what: &str,
    pairs: &[f64],
    bound: Bound,
    shown: Shown,
    detail: &str,
) -> String {
    let (lo, hi) = spread(pairs);
    let n = pairs.len();
    let few = if n < MIN_PAIRS {
        format!(", fewer than {MIN_PAIRS}")
    } else {
        String::new()
    };
    let detail = if detail.is_empty() {
        String::new()
    } else {
        format!("; {detail}")
    };
    format!(
        "{} {what}: {} ({n} pair{}{few}: {}..{}){detail}",
        verdict(pairs, bound),
        shown.with_unit(median(pairs)),
        if n == 1 { "" } else { "s" },
        shown.number(lo),
        shown.number(hi),
    )
}

/// The verdict rule's checks. The bench is a `harness = false` target, so
/// `#[test]` functions would not be compiled; `cargo test --bench pipeline`
/// runs the binary without `--bench`, and `main` runs these instead of the
/// bench (as criterion does in that mode).
pub(crate) const CHECKS: &[(&str, fn())] = &[
    (
        "every pair under the bound passes",
        every_pair_under_the_bound_passes,
    ),
    (
        "every pair over the bound misses",
        every_pair_over_the_bound_misses,
    ),
    (
        "a spread crossing the bound is unsure",
        a_spread_crossing_the_bound_is_unsure,
    ),
    (
        "fewer than five pairs are unsure",
        fewer_than_five_pairs_are_unsure,
    ),
    ("a missing figure is unsure", a_missing_figure_is_unsure),
    (
        "a two-sided bound misses on both sides",
        a_two_sided_bound_misses_on_both_sides,
    ),
    (
        "the goal line shows median and spread",
        the_goal_line_shows_median_and_spread,
    ),
];

fn every_pair_under_the_bound_passes() {
    let pairs = [1.31, 1.29, 1.45, 1.38, 1.5];
    assert_eq!(verdict(&pairs, Bound::AtMost(1.5)), Verdict::Pass);
    assert_eq!(
        verdict(&[0.95, 0.97, 0.91, 0.9, 0.99], Bound::AtLeast(0.9)),
        Verdict::Pass
    );
}

fn every_pair_over_the_bound_misses() {
    let pairs = [1.52, 1.6, 2.19, 1.73, 1.56];
    assert_eq!(verdict(&pairs, Bound::AtMost(1.5)), Verdict::Miss);
    assert_eq!(
        verdict(&[0.84, 0.8, 0.89, 0.7, 0.85], Bound::AtLeast(0.9)),
        Verdict::Miss
    );
    assert_eq!(verdict(&[2_000.0; 5], Bound::Below(2_000.0)), Verdict::Miss);
}

fn a_spread_crossing_the_bound_is_unsure() {
    // The median (1.36) meets the bound; one pair does not.
    let pairs = [1.36, 1.29, 1.58, 1.31, 1.4];
    assert_eq!(verdict(&pairs, Bound::AtMost(1.5)), Verdict::Unsure);
    // The median (0.87) misses it; one pair meets it.
    let pairs = [0.87, 0.84, 0.95, 0.8, 0.88];
    assert_eq!(verdict(&pairs, Bound::AtLeast(0.9)), Verdict::Unsure);
}

fn fewer_than_five_pairs_are_unsure() {
    assert_eq!(
        verdict(&[1.0, 1.0, 1.0, 1.0], Bound::AtMost(1.5)),
        Verdict::Unsure
    );
    assert_eq!(verdict(&[], Bound::AtMost(1.5)), Verdict::Unsure);
    assert_eq!(
        verdict(&[9.0, 9.0, 9.0, 9.0], Bound::AtMost(1.5)),
        Verdict::Unsure
    );
}

fn a_missing_figure_is_unsure() {
    let pairs = [1.0, 1.0, f64::NAN, 1.0, 1.0];
    assert_eq!(verdict(&pairs, Bound::AtMost(1.5)), Verdict::Unsure);
}

fn a_two_sided_bound_misses_on_both_sides() {
    let within = Bound::Within(0.9, 1.1);
    assert_eq!(verdict(&[0.95, 1.0, 1.05, 1.1, 0.9], within), Verdict::Pass);
    assert_eq!(verdict(&[0.8, 1.2, 0.85, 1.3, 0.7], within), Verdict::Miss);
    assert_eq!(verdict(&[0.8, 1.0, 1.0, 1.0, 1.0], within), Verdict::Unsure);
}

fn the_goal_line_shows_median_and_spread() {
    let line = goal_line(
        "cost",
        &[1.36, 1.29, 1.58, 1.31, 1.4],
        Bound::AtMost(1.5),
        Shown::Times(2),
        "",
    );
    assert_eq!(line, "UNSURE cost: × 1.36 (5 pairs: 1.29..1.58)");
    let line = goal_line(
        "rate",
        &[17_331.0, 16_733.0, 18_249.0, 17_000.0, 17_500.0],
        Bound::AtLeast(10_000.0),
        Shown::Rate,
        "why",
    );
    assert_eq!(line, "PASS rate: 17,331/s (5 pairs: 16,733..18,249); why");
    let line = goal_line("x", &[1.0], Bound::AtMost(1.5), Shown::Unit(1, " ms"), "");
    assert_eq!(line, "UNSURE x: 1.0 ms (1 pair, fewer than 5: 1.0..1.0)");
}

/// Runs [`CHECKS`], printing each as libtest does; false when one failed.
pub(crate) fn run_checks() -> bool {
    let mut failed = 0;
    println!("running {} checks", CHECKS.len());
    for (name, check) in CHECKS {
        let ok = std::panic::catch_unwind(check).is_ok();
        println!(
            "check verdict::{name} ... {}",
            if ok { "ok" } else { "FAILED" }
        );
        if !ok {
            failed += 1;
        }
    }
    println!(
        "\ncheck result: {}. {} passed; {failed} failed",
        if failed == 0 { "ok" } else { "FAILED" },
        CHECKS.len() - failed
    );
    failed == 0
}
