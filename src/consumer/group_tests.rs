//! The partition-lease protocol driven by hand: no broker, no database.
//! The test body plays the job (it holds a POST under way as a [`Busy`]
//! guard, which it drops when the POST's status is written) and the
//! rebalance callback, the loop and the drain (the group calls, the waits
//! on blocking threads as the driver runs them).

use std::sync::atomic::{AtomicBool, Ordering};

use super::*;
use crate::lease::Busy;

/// The hold limit when a wait is to end by its POSTs, not by its limit.
const LIMIT: Duration = Duration::from_secs(30);

/// How long a simulated POST takes before its status is written.
const POST: Duration = Duration::from_millis(200);

/// How long a test waits for a wait that should end (far beyond need).
const DEADLINE: Duration = Duration::from_secs(10);

fn counted(metrics: &Metrics) -> (u64, u64) {
    let held = &metrics.revoke_held_requests_total;
    (
        held.with_label_values(&["written"]).get(),
        held.with_label_values(&["given_up"]).get(),
    )
}

/// Runs `revocation`'s wait on a blocking thread, as the driver does, and
/// reports whether `written` was set by the time it ended.
fn wait_off(
    revocation: Revocation,
    written: &Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(Held, bool)> {
    let written = written.clone();
    tokio::task::spawn_blocking(move || {
        let held = revocation.wait();
        (held, written.load(Ordering::SeqCst))
    })
}

/// The job's side: the POST's status is written after [`POST`].
async fn write_status(busy: Busy<'_>, written: &AtomicBool) {
    tokio::time::sleep(POST).await;
    written.store(true, Ordering::SeqCst);
    drop(busy);
}

async fn ended<T>(what: &str, wait: tokio::task::JoinHandle<T>) -> T {
    tokio::time::timeout(DEADLINE, wait)
        .await
        .unwrap_or_else(|_| panic!("{what} did not end within {DEADLINE:?}"))
        .expect("the wait panicked")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eager_revoke_waits_for_a_post_under_way() {
    let metrics = Metrics::new();
    let group = Group::new(LIMIT);
    group.assigned(&[0, 1]);
    let lease = group.lease(0).expect("assigned");
    let busy = lease.enter().expect("a live lease");
    let revocation = group.revoke(&[0, 1], Revoke::Eager);
    assert!(revocation.waits() && !revocation.hands_off());
    assert_eq!(revocation.busy(), 1);
    assert!(lease.is_cancelled(), "the revoked partition's jobs stop");
    assert!(lease.enter().is_none(), "no POST starts after the revoke");
    assert!(group.lease(0).is_none() && group.lease(1).is_none());
    let written = Arc::new(AtomicBool::new(false));
    let wait = wait_off(revocation, &written);
    write_status(busy, &written).await;
    let (held, after_write) = ended("the revoke's wait", wait).await;
    assert!(
        after_write,
        "the revoke ended before the POST's status write"
    );
    assert_eq!((held.busy, held.left), (1, 0));
    assert!(held.parts.is_empty(), "librdkafka gives eager revokes up");
    held.count(&metrics);
    assert_eq!(counted(&metrics), (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoke_gives_up_at_its_hold_limit() {
    let metrics = Metrics::new();
    let group = Group::new(Duration::from_millis(50));
    group.assigned(&[0]);
    let lease = group.lease(0).expect("assigned");
    let _busy = lease.enter().expect("a live lease");
    let revocation = group.revoke(&[0], Revoke::Eager);
    let written = Arc::new(AtomicBool::new(false));
    let (held, _) = ended("the revoke's wait", wait_off(revocation, &written)).await;
    assert_eq!((held.busy, held.left), (1, 1));
    held.count(&metrics);
    assert_eq!(counted(&metrics), (0, 1), "counted as given up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_assignment_does_not_wait() {
    let metrics = Metrics::new();
    let group = Group::new(LIMIT);
    group.assigned(&[0]);
    let lease = group.lease(0).expect("assigned");
    let _busy = lease.enter().expect("a live lease");
    let revocation = group.revoke(&[0], Revoke::Lost);
    assert!(!revocation.waits() && !revocation.hands_off());
    assert!(lease.is_cancelled(), "the lost partition's jobs stop");
    let written = Arc::new(AtomicBool::new(false));
    let (held, _) = ended("the lost revoke", wait_off(revocation, &written)).await;
    assert_eq!(held.left, 1, "the POST is still under way");
    held.count(&metrics);
    assert_eq!(counted(&metrics), (0, 0), "a revoke that did not wait");
    // Not draining: the drain does not wait for a lost partition's POSTs.
    assert_eq!(group.close().busy(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_a_waiting_revoke_and_the_drain_waits_instead() {
    let metrics = Metrics::new();
    let group = Group::new(LIMIT);
    group.assigned(&[0, 1]);
    let (revoked, kept) = (group.lease(0).unwrap(), group.lease(1).unwrap());
    let busy_revoked = revoked.enter().expect("a live lease");
    let busy_kept = kept.enter().expect("a live lease");
    let written = Arc::new(AtomicBool::new(false));
    let revoke = wait_off(group.revoke(&[0], Revoke::Eager), &written);
    let closing = group.close();
    assert_eq!(group.phase(), Phase::Closing);
    let (held, _) = ended("the revoke's wait, at shutdown", revoke).await;
    assert_eq!(held.left, 1, "the shutdown ended the wait");
    held.count(&metrics);
    assert_eq!(counted(&metrics), (0, 0), "the drain waits, not the revoke");
    assert!(kept.is_cancelled(), "the close cancels every lease");
    // The drain waits for both POSTs: the revoked partition's too.
    assert!(closing.waits());
    assert_eq!(closing.busy(), 2);
    let drain = wait_off(closing, &written);
    drop(busy_kept);
    write_status(busy_revoked, &written).await;
    let (held, after_write) = ended("the drain's wait", drain).await;
    assert!(
        after_write,
        "the drain ended before the POST's status write"
    );
    assert_eq!((held.busy, held.left), (2, 0));
    held.count(&metrics);
    assert_eq!(
        counted(&metrics),
        (0, 0),
        "the drain's wait is not a revoke's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cooperative_hand_off_gives_partitions_up_only_after_their_posts_wrote() {
    let metrics = Metrics::new();
    let group = Group::new(LIMIT);
    group.assigned(&[0, 1]);
    let (revoked, kept) = (group.lease(0).unwrap(), group.lease(1).unwrap());
    let busy = revoked.enter().expect("a live lease");
    let revocation = group.revoke(&[0], Revoke::Cooperative);
    assert!(revocation.hands_off() && revocation.waits());
    assert!(revoked.is_cancelled());
    assert!(!kept.is_cancelled(), "the kept partition's jobs go on");
    assert!(Arc::ptr_eq(&group.lease(1).unwrap(), &kept));
    let written = Arc::new(AtomicBool::new(false));
    let wait = wait_off(revocation, &written);
    write_status(busy, &written).await;
    let (held, after_write) = ended("the hand-off's wait", wait).await;
    assert!(after_write, "handed off before the POST's status write");
    assert_eq!(held.parts, [0], "the driver gives the partition up");
    assert_eq!((held.busy, held.left), (1, 0));
    held.count(&metrics);
    assert_eq!(counted(&metrics), (1, 0));
    // Until the driver gave it up, the close would give it up.
    group.handed_off(&held.parts);
    assert!(group.close().wait().parts.is_empty(), "given up once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_the_shutdown_ends_is_given_up_by_the_drain() {
    let group = Group::new(LIMIT);
    group.assigned(&[0, 1]);
    // No POST under way: handed off at once, not yet given up.
    let idle = group.revoke(&[1], Revoke::Cooperative);
    assert!(idle.hands_off() && !idle.waits());
    assert_eq!(idle.wait().parts, [1]);
    let lease = group.lease(0).unwrap();
    let busy = lease.enter().expect("a live lease");
    let written = Arc::new(AtomicBool::new(false));
    let hand_off = wait_off(group.revoke(&[0], Revoke::Cooperative), &written);
    let closing = group.close();
    let (held, _) = ended("the hand-off's wait, at shutdown", hand_off).await;
    assert_eq!(held.left, 1, "the shutdown ended the wait");
    // The loop is gone: the drain gives both partitions up, after its wait.
    assert_eq!(closing.busy(), 1);
    let drain = wait_off(closing, &written);
    write_status(busy, &written).await;
    let (held, after_write) = ended("the drain's wait", drain).await;
    assert!(after_write);
    assert_eq!(held.parts, [0, 1]);
}

#[test]
fn a_re_assign_after_a_revoke_gets_a_fresh_lease() {
    let group = Group::new(LIMIT);
    group.assigned(&[0]);
    let old = group.lease(0).unwrap();
    // An incremental assign keeps the partitions already held.
    group.assigned(&[0, 1]);
    assert!(Arc::ptr_eq(&group.lease(0).unwrap(), &old));
    group.revoke(&[0, 1], Revoke::Eager).wait();
    assert!(old.is_cancelled());
    group.assigned(&[0]);
    let fresh = group.lease(0).unwrap();
    assert!(!Arc::ptr_eq(&fresh, &old));
    assert!(!fresh.is_cancelled());
    assert!(fresh.enter().is_some(), "the new assignment's jobs POST");
    assert!(group.lease(1).is_none(), "not assigned again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoke_during_close_does_not_wait_twice() {
    let metrics = Metrics::new();
    let group = Group::new(LIMIT);
    group.assigned(&[0, 1]);
    let lease = group.lease(0).unwrap();
    let busy = lease.enter().expect("a live lease");
    let closing = group.close();
    // The consumer's close revokes what it holds: the drain waits.
    for (parts, how) in [(&[0][..], Revoke::Cooperative), (&[1][..], Revoke::Eager)] {
        let revocation = group.revoke(parts, how);
        assert!(!revocation.waits() && !revocation.hands_off(), "{how:?}");
        revocation.wait().count(&metrics);
    }
    assert_eq!(counted(&metrics), (0, 0));
    assert!(closing.waits());
    assert_eq!(closing.busy(), 1);
    let written = Arc::new(AtomicBool::new(false));
    let drain = wait_off(closing, &written);
    write_status(busy, &written).await;
    let (held, after_write) = ended("the drain's wait", drain).await;
    assert!(after_write);
    assert_eq!(held.left, 0);
    // Assigned while closing: no lease, so no job starts.
    group.assigned(&[2]);
    assert!(group.lease(2).is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_closed_nothing_waits() {
    let group = Group::new(LIMIT);
    group.assigned(&[0]);
    let lease = group.lease(0).unwrap();
    let _busy = lease.enter().expect("a live lease");
    let written = Arc::new(AtomicBool::new(false));
    let drain = wait_off(group.close(), &written);
    // The driver dropped mid-drain: its wait ends, and a later one is none.
    group.closed();
    let (held, _) = ended("the drain's wait, once closed", drain).await;
    assert_eq!(held.left, 1);
    assert!(!group.close().waits());
    assert_eq!(group.phase(), Phase::Closed);
}
