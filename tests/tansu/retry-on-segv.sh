#!/usr/bin/env bash
# Runs a test command on tansu; when it fails because the test process
# died on SIGSEGV, says so and runs it once more. Only that: a test that
# fails is not run again.
#
# Seen once (2026-12-06, a fresh-clone `make test-broker`): the `it`
# binary died on signal 11 with two tests running and nothing printed;
# the same commit's other runs passed. librdkafka is known to crash on
# tansu (docs/brokers.md, finding 3); which client crashed here is not
# known.
set -uo pipefail
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
# cargo's own line for a test binary killed by the signal (a sidecar child
# that dies on it, as in broker::a_topic_deleted_…, is not this).
if [ "$rc" -ne 0 ] && grep -q "process didn't exit successfully: .*(signal: 11, SIGSEGV" "$log"; then
  echo "retry-on-segv: the test process died on SIGSEGV (docs/brokers.md, finding 3): running it once more" >&2
  "$@"
  rc=$?
fi
exit "$rc"
