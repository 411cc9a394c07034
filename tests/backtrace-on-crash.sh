#!/usr/bin/env bash
# Runs a test command with core dumps on. When the test binary dies on a
# signal, prints the backtrace of the crashed thread (and the names of all
# threads: librdkafka's are `rdk:main`, `rdk:broker…`) from its core file,
# then fails as the command did. Never runs anything twice.
#
# Every test target of the Makefile runs through it (a CI log then names
# the crashed thread). The tansu tests run every sidecar that can meet
# librdkafka's crash on tansu (docs/brokers.md, finding 3) as a child
# process; a crash of the test binary itself is a finding to read, not to
# retry.
set -uo pipefail
ulimit -c unlimited 2>/dev/null || true
log=$(mktemp)
trap 'rm -f "$log"' EXIT
before=$(date +%s)
"$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ] && grep -q "process didn't exit successfully: .*(signal: " "$log"; then
  bin=$(grep -o "process didn't exit successfully: \`[^ \`]*" "$log" | tail -1 | sed 's/.*`//')
  pattern=$(cat /proc/sys/kernel/core_pattern 2>/dev/null)
  echo "backtrace-on-crash: the test binary $bin died on a signal (core_pattern: $pattern)" >&2
  # core_pattern `core` writes to the crashed process's directory: cargo
  # runs a test binary in its package's root, this directory.
  core=$(find . -maxdepth 1 -name 'core*' -type f -newermt "@$before" 2>/dev/null | head -1)
  if [ -n "$core" ] && [ -n "$bin" ] && command -v gdb >/dev/null; then
    gdb -batch -ex "info threads" -ex "bt 40" "$bin" "$core" 2>&1 | grep -v "^\[New LWP" >&2
    rm -f "$core"
  else
    echo "backtrace-on-crash: no core file to read (core=${core:-none}, gdb: $(command -v gdb || echo missing))" >&2
  fi
fi
exit "$rc"
