use super::*;

fn breaker() -> Breaker {
    Breaker::new(BreakerSettings {
        failures: 3,
        within: Duration::from_secs(10),
        cool_down: Duration::from_secs(30),
    })
}

#[test]
fn opens_after_failures_in_a_row_and_holds_for_the_cool_down() {
    let t0 = Instant::now();
    let mut b = breaker();
    for i in 0..2 {
        b.report(t0 + Duration::from_secs(i), false, false);
        assert!(matches!(b.verdict(t0, 3), Verdict::Go));
    }
    b.report(t0 + Duration::from_secs(2), false, false);
    let until = t0 + Duration::from_secs(32);
    assert!(
        matches!(b.verdict(t0 + Duration::from_secs(3), 3), Verdict::WaitUntil(u) if u == until)
    );
    assert_eq!(b.state_name(), "open");
}

#[test]
fn a_success_or_a_gap_longer_than_within_resets_the_count() {
    let t0 = Instant::now();
    let mut b = breaker();
    b.report(t0, false, false);
    b.report(t0, false, false);
    b.report(t0, true, false);
    b.report(t0, false, false);
    b.report(t0, false, false);
    assert_eq!(b.state_name(), "closed");
    b.report(t0 + Duration::from_secs(11), false, false);
    assert_eq!(
        b.state_name(),
        "closed",
        "11 s after the last failure: a new run"
    );
}

#[test]
fn one_probe_after_the_cool_down_closes_or_reopens() {
    let t0 = Instant::now();
    let mut b = breaker();
    for _ in 0..3 {
        b.report(t0, false, false);
    }
    let after = t0 + Duration::from_secs(30);
    assert!(matches!(b.verdict(after, 3), Verdict::Probe));
    assert!(
        matches!(b.verdict(after, 3), Verdict::WaitUntil(_)),
        "one probe at a time"
    );
    b.report(after, false, true);
    assert_eq!(b.state_name(), "open");
    let later = after + Duration::from_secs(30);
    assert!(matches!(b.verdict(later, 2), Verdict::Probe));
    b.report(later, true, true);
    assert_eq!(b.state_name(), "closed");
    assert!(matches!(b.verdict(later, 1), Verdict::Go));
}

#[test]
fn a_row_on_its_last_attempt_probes_only_when_no_other_does() {
    let t0 = Instant::now();
    let mut b = breaker();
    for _ in 0..3 {
        b.report(t0, false, false);
    }
    let after = t0 + Duration::from_secs(30);
    assert!(matches!(b.verdict(after, 1), Verdict::WaitUntil(_)));
    assert!(matches!(b.verdict(after, 2), Verdict::Probe));
    let mut b = breaker();
    for _ in 0..3 {
        b.report(t0, false, false);
    }
    let late = after + LAST_ATTEMPT_PROBE_DELAY;
    assert!(matches!(b.verdict(late, 1), Verdict::Probe));
}

#[test]
fn a_probe_that_never_reports_is_replaced_after_a_cool_down() {
    let t0 = Instant::now();
    let mut b = breaker();
    for _ in 0..3 {
        b.report(t0, false, false);
    }
    let after = t0 + Duration::from_secs(30);
    assert!(matches!(b.verdict(after, 3), Verdict::Probe));
    assert!(matches!(
        b.verdict(after + Duration::from_secs(30), 3),
        Verdict::Probe
    ));
}

#[test]
fn a_cool_down_over_with_nothing_parked_closes() {
    let t0 = Instant::now();
    let mut b = breaker();
    for _ in 0..3 {
        b.report(t0, false, false);
    }
    assert_eq!(b.tick(t0 + Duration::from_secs(1)), Tick::Nothing);
    assert_eq!(b.state_name(), "open");
    assert_eq!(b.tick(t0 + Duration::from_secs(30)), Tick::Nothing);
    assert_eq!(b.state_name(), "closed");
}

#[test]
fn parked_rows_are_probed_after_the_cool_down_then_all_announced_on_close() {
    let t0 = Instant::now();
    let mut b = breaker();
    for _ in 0..3 {
        b.report(t0, false, false);
    }
    for id in [7, 8, 7] {
        b.park(id);
    }
    assert_eq!(b.tick(t0 + Duration::from_secs(29)), Tick::Nothing);
    let over = t0 + Duration::from_secs(30);
    assert_eq!(b.tick(over), Tick::AnnounceProbe(vec![7, 8]));
    assert_eq!(
        b.tick(over + Duration::from_secs(1)),
        Tick::Nothing,
        "one probe announced per cool-down"
    );
    assert_eq!(
        b.tick(over + Duration::from_secs(30)),
        Tick::AnnounceProbe(vec![7, 8]),
        "announced again when none came back"
    );
    // The probe arrives and fails: open again, still parked.
    assert!(matches!(
        b.verdict(over + Duration::from_secs(31), 3),
        Verdict::Probe
    ));
    b.report(over + Duration::from_secs(31), false, true);
    assert_eq!(b.state_name(), "open");
    let later = over + Duration::from_secs(61);
    assert!(matches!(b.tick(later), Tick::AnnounceProbe(_)));
    assert!(matches!(b.verdict(later, 3), Verdict::Probe));
    b.report(later, true, true);
    assert_eq!(b.state_name(), "closed");
    assert_eq!(b.tick(later), Tick::AnnounceAll);
    assert_eq!(b.tick(later), Tick::AnnounceAll, "until it is done");
    b.announced_all();
    assert_eq!(b.tick(later), Tick::Nothing);
}

#[test]
fn results_of_requests_sent_before_it_opened_change_nothing() {
    let t0 = Instant::now();
    let mut b = breaker();
    for _ in 0..3 {
        b.report(t0, false, false);
    }
    b.report(t0, true, false);
    assert_eq!(b.state_name(), "open");
}

#[test]
fn a_probe_granted_and_never_reported_is_announced_again_by_the_clock() {
    let t0 = Instant::now();
    let mut b = breaker();
    for _ in 0..3 {
        b.report(t0, false, false);
    }
    b.park(7);
    let over = t0 + Duration::from_secs(30);
    assert_eq!(b.tick(over), Tick::AnnounceProbe(vec![7]));
    // The announced row comes back and is granted the probe; its job is
    // then cancelled (a revoke): it never reports.
    assert!(matches!(b.verdict(over, 3), Verdict::Probe));
    assert_eq!(b.state_name(), "half-open");
    assert_eq!(b.tick(over + Duration::from_secs(29)), Tick::Nothing);
    // A cool-down later the clock alone (no other row asking) grants a
    // new probe: the breaker does not stay half-open for good.
    let later = over + Duration::from_secs(30);
    assert_eq!(b.tick(later), Tick::AnnounceProbe(vec![7]));
    assert!(matches!(b.verdict(later, 3), Verdict::Probe));
    b.report(later, true, true);
    assert_eq!(b.state_name(), "closed");
    assert_eq!(b.tick(later), Tick::AnnounceAll);
}
