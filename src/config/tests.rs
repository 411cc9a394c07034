use std::collections::BTreeMap;

use super::*;

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn the_example_file_loads_and_is_complete_for_run() {
    let text = include_str!("../../config/example.toml");
    let s = Settings::from_toml(Some(text), BTreeMap::new()).expect("example.toml");
    s.validate_for_run()
        .expect("example.toml is enough for run");
    assert_eq!(s.dispatch.max_attempts, 3);
    assert_eq!(s.dispatch.retry_delay, Duration::from_secs(5));
    assert_eq!(s.dispatchers["accounts"].events.len(), 3);
}

#[test]
fn environment_overrides_the_file() {
    let s = Settings::from_toml(
        Some("[database]\nurl = \"sqlite::memory:\"\n[dispatch]\nretry_delay = \"5s\"\n"),
        env(&[
            ("OUTBOX__DISPATCH__RETRY_DELAY", "200ms"),
            ("OUTBOX__DISPATCH__MAX_IN_FLIGHT", "7"),
            ("OUTBOX__KAFKA__GROUP_ID", "g2"),
        ]),
    )
    .unwrap();
    assert_eq!(s.dispatch.retry_delay, Duration::from_millis(200));
    assert_eq!(s.dispatch.max_in_flight, 7);
    assert_eq!(s.kafka.group_id, "g2");
}

#[test]
fn defaults_are_the_requirement() {
    let s = Settings::from_toml(
        Some("[database]\nurl = \"sqlite::memory:\"\n"),
        BTreeMap::new(),
    )
    .unwrap();
    assert_eq!(s.dispatch.max_attempts, 3);
    assert_eq!(s.dispatch.retry_delay, Duration::from_secs(5));
    assert_eq!(s.admin.listen, "0.0.0.0:9464");
    assert_eq!(s.admin.api_listen, "127.0.0.1:9465");
    assert!(
        s.admin.token.is_none(),
        "no token by default: admin disabled"
    );
    assert_eq!(s.kafka.group_id, "outbox-sidecar");
    assert_eq!(s.shutdown.drain_timeout, Duration::from_secs(20));
}

#[test]
fn one_event_name_one_dispatcher() {
    let toml = "[database]\nurl = \"sqlite::memory:\"\n\
        [dispatchers.a]\nurl = \"http://a\"\nevents = [\"x\"]\n\
        [dispatchers.b]\nurl = \"http://b\"\nevents = [\"x\"]\n";
    let e = Settings::from_toml(Some(toml), BTreeMap::new()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid configuration: dispatchers.b.events: \"x\" is already served by dispatcher \"a\""
    );
}

#[test]
fn bad_listen_address() {
    let e = Settings::from_toml(
        Some("[database]\nurl = \"sqlite::memory:\"\n[admin]\nlisten = \"everywhere\"\n"),
        BTreeMap::new(),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid configuration: admin.listen: \"everywhere\" is not an address like \"0.0.0.0:9464\""
    );
}

#[test]
fn secrets_are_redacted_in_debug_and_toml() {
    let s = Settings::from_toml(
        Some(
            "[database]\nurl = \"postgres://u:pw-1@h/db\"\n[admin]\ntoken = \"tok-2-0123456789abcdef0123\"\n\
             [kafka.properties]\n\"sasl.password\" = \"sasl-3\"\n\"client.id\" = \"me\"\n\
             [dispatchers.a]\nurl = \"http://a\"\nevents = [\"x\"]\n[dispatchers.a.headers]\nAuthorization = \"Bearer hdr-4\"\n",
        ),
        BTreeMap::new(),
    )
    .unwrap();
    let shown = format!("{s:?}\n{}", s.redacted_toml());
    for secret in ["pw-1", "tok-2", "sasl-3", "hdr-4"] {
        assert!(!shown.contains(secret), "{secret} shown:\n{shown}");
    }
    assert!(
        shown.contains("\"client.id\" = \"me\""),
        "harmless properties stay visible"
    );
}

#[test]
fn durations_accept_humantime_and_seconds() {
    assert_eq!(duration::parse("200ms"), Ok(Duration::from_millis(200)));
    assert_eq!(duration::parse("1m 30s"), Ok(Duration::from_secs(90)));
    assert!(duration::parse("5 parsecs").is_err());
}

#[test]
fn drain_timeout_must_stay_below_max_poll_interval() {
    let base =
        "[database]\nurl = \"sqlite::memory:\"\n[kafka]\nbrokers = \"k:9092\"\ntopic = \"t\"\n";
    let run_check = |extra: &str| {
        Settings::from_toml(Some(&format!("{base}{extra}")), BTreeMap::new())
            .unwrap()
            .validate_for_run()
    };
    run_check("[shutdown]\ndrain_timeout = \"299s\"\n").expect("below librdkafka's 300 s");
    let e = run_check("[shutdown]\ndrain_timeout = \"5m\"\n").unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid configuration: shutdown.drain_timeout: 5m must be below the consumer's \
         max.poll.interval.ms (300000 ms): a rebalance waits up to the drain timeout for \
         requests in flight"
    );
    let e = run_check("[kafka.properties]\n\"max.poll.interval.ms\" = \"10000\"\n[shutdown]\ndrain_timeout = \"20s\"\n")
        .unwrap_err();
    assert!(e.to_string().contains("(10000 ms)"), "{e}");
    let e = run_check("[kafka.properties]\nmax_poll_interval_ms = \"ten\"\n").unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid configuration: kafka.properties.max_poll_interval_ms: \"ten\" is not a number of milliseconds"
    );
}

#[test]
fn the_assignment_strategy_is_one_protocol_of_librdkafka_s_assignors() {
    let base =
        "[database]\nurl = \"sqlite::memory:\"\n[kafka]\nbrokers = \"k:9092\"\ntopic = \"t\"\n";
    let run_check = |props: &str| {
        Settings::from_toml(
            Some(&format!("{base}[kafka.properties]\n{props}\n")),
            BTreeMap::new(),
        )
        .unwrap()
        .validate_for_run()
    };
    run_check("\"partition.assignment.strategy\" = \"cooperative-sticky\"").expect("cooperative");
    run_check("\"partition.assignment.strategy\" = \"range, roundrobin\"").expect("eager");
    let e = run_check("\"partition.assignment.strategy\" = \"sticky\"").unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid configuration: kafka.properties.partition.assignment.strategy: \"sticky\" is \
         not an assignment strategy (range, roundrobin or cooperative-sticky)"
    );
    // From the environment the key arrives with underscores.
    let e = run_check("partition_assignment_strategy = \"cooperative-sticky,range\"").unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid configuration: kafka.properties.partition_assignment_strategy: \
         \"cooperative-sticky,range\" mixes cooperative-sticky with eager strategies; librdkafka \
         takes one protocol only (see the README on switching a group to cooperative-sticky)"
    );
}

#[test]
fn short_or_placeholder_admin_tokens_are_refused_naming_the_key() {
    let with_token = |token: &str| {
        Settings::from_toml(
            Some(&format!(
                "[database]\nurl = \"sqlite::memory:\"\n[admin]\ntoken = \"{token}\"\n"
            )),
            BTreeMap::new(),
        )
    };
    let e = with_token("23-characters-long-abcd").unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid configuration: admin.token: is 23 characters long, fewer than 24; set a \
         random token, e.g. `openssl rand -hex 32`"
    );
    for placeholder in ADMIN_TOKEN_PLACEHOLDERS {
        let e = with_token(placeholder).unwrap_err().to_string();
        assert!(e.starts_with("invalid configuration: admin.token: "), "{e}");
        assert!(
            !e.contains(placeholder),
            "the message quotes the token: {e}"
        );
    }
    // The placeholder of config/example.toml is one of them.
    let example = include_str!("../../config/example.toml");
    assert!(
        ADMIN_TOKEN_PLACEHOLDERS
            .iter()
            .any(|p| example.contains(&format!("token = \"{p}\""))),
        "config/example.toml shows a placeholder the loader refuses"
    );
    // 24 characters (not bytes) are enough; empty disables the admin API.
    assert!(with_token("24-characters-long-abcde").is_ok());
    assert!(with_token("ééééééééééééééééééééééé€").is_ok());
    assert!(with_token("").unwrap().admin.token.is_some());
}

#[test]
fn the_admin_api_listens_apart_from_metrics_and_health() {
    let with = |admin: &str| {
        Settings::from_toml(
            Some(&format!(
                "[database]\nurl = \"sqlite::memory:\"\n[admin]\n{admin}\n"
            )),
            BTreeMap::new(),
        )
    };
    let s = with("").unwrap();
    assert_eq!(
        s.admin_api_listen().unwrap(),
        "127.0.0.1:9465".parse().unwrap()
    );
    let s = with("api_listen = \"10.0.0.7:9500\"").unwrap();
    assert_eq!(
        s.admin_api_listen().unwrap(),
        "10.0.0.7:9500".parse().unwrap()
    );
    assert_eq!(
        with("api_listen = \"loopback\"").unwrap_err().to_string(),
        "invalid configuration: admin.api_listen: \"loopback\" is not an address like \"127.0.0.1:9465\""
    );
    assert_eq!(
        with("listen = \"0.0.0.0:9464\"\napi_listen = \"0.0.0.0:9464\"")
            .unwrap_err()
            .to_string(),
        "invalid configuration: admin.api_listen: 0.0.0.0:9464 is admin.listen's address too; \
         the admin API needs its own"
    );
    // Port 0 (tests) picks two different ports.
    with("listen = \"127.0.0.1:0\"\napi_listen = \"127.0.0.1:0\"").unwrap();
}

/// Issue 16 item 10: an environment value is the string it was set to;
/// only a field that is a number or a duration parses it, by its own rules.
#[test]
fn environment_values_are_never_coerced() {
    let s = Settings::from_toml(
        Some(
            "[database]\nurl = \"sqlite::memory:\"\n\
             [dispatchers.a]\nurl = \"http://a\"\nevents = [\"x\"]\n",
        ),
        env(&[
            ("OUTBOX__ADMIN__TOKEN", "000000000000000000000123456"),
            ("OUTBOX__DISPATCHERS__A__HEADERS__AUTHORIZATION", "12e34"),
            ("OUTBOX__KAFKA__PROPERTIES__ENABLE_IDEMPOTENCE", "TRUE"),
            ("OUTBOX__KAFKA__PROPERTIES__CLIENT_ID", "0700"),
            ("OUTBOX__KAFKA__GROUP_ID", "1e3"),
            ("OUTBOX__KAFKA__TOPIC", "007"),
            ("OUTBOX__DISPATCH__MAX_IN_FLIGHT", "7"),
            ("OUTBOX__DISPATCH__MAX_ATTEMPTS", "05"),
            ("OUTBOX__DISPATCH__RETRY_DELAY", "2"),
            ("OUTBOX__SHUTDOWN__DRAIN_TIMEOUT", "1500ms"),
        ]),
    )
    .unwrap();
    assert_eq!(
        s.admin.token.as_ref().map(Secret::expose),
        Some("000000000000000000000123456")
    );
    assert_eq!(
        s.dispatchers["a"].headers["authorization"].expose(),
        "12e34"
    );
    assert_eq!(s.kafka.properties["enable_idempotence"], "TRUE");
    assert_eq!(s.kafka.properties["client_id"], "0700");
    assert_eq!(s.kafka.group_id, "1e3");
    assert_eq!(s.kafka.topic, "007");
    assert_eq!(s.dispatch.max_in_flight, 7);
    assert_eq!(s.dispatch.max_attempts, 5);
    assert_eq!(s.dispatch.retry_delay, Duration::from_secs(2));
    assert_eq!(s.shutdown.drain_timeout, Duration::from_millis(1500));
    // A number field still refuses what is not its number, naming the key.
    let e = Settings::from_toml(
        Some("[database]\nurl = \"sqlite::memory:\"\n"),
        env(&[("OUTBOX__DISPATCH__MAX_IN_FLIGHT", "1e3")]),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("dispatch.max_in_flight"), "{e}");
}

const ONE_DISPATCHER: &str = "[dispatchers.a]\nurl = \"http://a\"\nevents = [\"x\"]\n";

/// Issue 16 item 11: secrets from files, as Kubernetes mounts a Secret.
#[test]
fn secrets_are_read_from_files() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let url = write("database-url", "postgres://u:pw-9@h:5432/db\n");
    let token = write("admin-token", "0123456789abcdef0123456789abcdef\r\n");
    let auth = write("authorization", "Bearer hdr-file-1");
    let key = write("api-key", "key-file-2\n");
    let s = Settings::from_toml(
        Some(&format!(
            "[database]\nurl_file = \"{url}\"\n{ONE_DISPATCHER}\
             [dispatchers.a.header_files]\nAuthorization = \"{auth}\"\n"
        )),
        env(&[
            ("OUTBOX__ADMIN__TOKEN_FILE", token.as_str()),
            (
                "OUTBOX__DISPATCHERS__A__HEADER_FILES__X_API_KEY",
                key.as_str(),
            ),
        ]),
    )
    .unwrap();
    // One trailing line break is dropped, nothing else.
    assert_eq!(s.database_url(), "postgres://u:pw-9@h:5432/db");
    assert_eq!(
        s.admin.token.as_ref().map(Secret::expose),
        Some("0123456789abcdef0123456789abcdef")
    );
    let headers = &s.dispatchers["a"].headers;
    assert_eq!(headers["Authorization"].expose(), "Bearer hdr-file-1");
    assert_eq!(headers["x-api-key"].expose(), "key-file-2");
    // The paths are printed, the contents are not.
    let shown = format!("{s:?}\n{}", s.redacted_toml());
    for secret in ["pw-9", "0123456789abcdef", "hdr-file-1", "key-file-2"] {
        assert!(!shown.contains(secret), "{secret} shown:\n{shown}");
    }
    assert!(shown.contains(&auth), "{shown}");
}

#[test]
fn secret_file_errors_name_the_key_and_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nothing-here");
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let load = |toml: String, pairs: &[(&str, &str)]| {
        Settings::from_toml(Some(&toml), env(pairs))
            .unwrap_err()
            .to_string()
    };
    let e = load(
        format!("[database]\nurl_file = \"{}\"\n", missing.display()),
        &[],
    );
    assert!(
        e.starts_with(&format!(
            "invalid configuration: database.url_file: cannot read {}: ",
            missing.display()
        )),
        "{e}"
    );
    let e = load(
        "[database]\nurl = \"sqlite::memory:\"\n".to_owned(),
        &[("OUTBOX__ADMIN__TOKEN_FILE", empty.to_str().unwrap())],
    );
    assert_eq!(
        e,
        format!(
            "invalid configuration: admin.token_file: {} is empty",
            empty.display()
        )
    );
    let e = load(
        "[database]\nurl = \"sqlite::memory:\"\n".to_owned(),
        &[("OUTBOX__DATABASE__URL_FILE", empty.to_str().unwrap())],
    );
    assert_eq!(
        e,
        "invalid configuration: database.url_file: set database.url or database.url_file, not both"
    );
    let e = load(
        format!(
            "[database]\nurl = \"sqlite::memory:\"\n{ONE_DISPATCHER}\
             [dispatchers.a.headers]\nAuthorization = \"x\"\n"
        ),
        &[(
            "OUTBOX__DISPATCHERS__A__HEADER_FILES__AUTHORIZATION",
            missing.to_str().unwrap(),
        )],
    );
    assert_eq!(
        e,
        "invalid configuration: dispatchers.a.header_files.authorization: set \
         dispatchers.a.headers.Authorization or dispatchers.a.header_files.authorization, not both"
    );
}

/// Issue 16 item 11: `X-Api-Key` from the environment, and the environment
/// overriding the file's spelling of a header name.
#[test]
fn header_names_with_dashes_from_the_environment() {
    let s = Settings::from_toml(
        Some(&format!(
            "[database]\nurl = \"sqlite::memory:\"\n{ONE_DISPATCHER}\
             [dispatchers.a.headers]\nAuthorization = \"from-file\"\nX-Tenant = \"t1\"\n"
        )),
        env(&[
            ("OUTBOX__DISPATCHERS__A__HEADERS__X_API_KEY", "k-1"),
            ("OUTBOX__DISPATCHERS__A__HEADERS__AUTHORIZATION", "from-env"),
        ]),
    )
    .unwrap();
    let headers: BTreeMap<&str, &str> = s.dispatchers["a"]
        .headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.expose()))
        .collect();
    assert_eq!(
        headers,
        BTreeMap::from([
            ("X-Tenant", "t1"),
            ("authorization", "from-env"),
            ("x-api-key", "k-1"),
        ])
    );
    // Twice in the file is a mistake, named.
    let e = Settings::from_toml(
        Some(&format!(
            "[database]\nurl = \"sqlite::memory:\"\n{ONE_DISPATCHER}\
             [dispatchers.a.headers]\nAuthorization = \"a\"\nauthorization = \"b\"\n"
        )),
        BTreeMap::new(),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid configuration: dispatchers.a.headers.authorization: \"Authorization\" is set \
         too; header names are case-insensitive"
    );
}

/// Issue 17 item 8: the gaps in redaction, each shown nowhere.
#[test]
fn redaction_covers_env_property_names_oauth_query_passwords_and_dispatcher_urls() {
    let s = Settings::from_toml(
        Some(
            "[database]\nurl = \"postgres://app@db:5432/app?sslmode=require&password=qpw-1\"\n\
             [kafka.properties]\n\"sasl.oauthbearer.config\" = \"principal=svc clientSecret=oauth-2\"\n\
             [dispatchers.a]\nurl = \"https://user:upw-3@a.example/hook?tenant=t1&token=utok-4\"\n\
             events = [\"x\"]\n",
        ),
        env(&[("OUTBOX__KAFKA__PROPERTIES__SSL_KEY_PEM", "-----BEGIN pem-5")]),
    )
    .unwrap();
    let shown = format!("{s:?}\n{}", s.redacted_toml());
    for secret in ["qpw-1", "oauth-2", "upw-3", "utok-4", "pem-5"] {
        assert!(!shown.contains(secret), "{secret} shown:\n{shown}");
    }
    // What is not a credential stays readable.
    for visible in ["sslmode=require", "tenant=t1", "a.example/hook", "user:"] {
        assert!(shown.contains(visible), "{visible} hidden:\n{shown}");
    }
    let url = url::Url::parse(&s.dispatchers["a"].url).unwrap();
    assert_eq!(url_secrets(&url), ["upw-3", "utok-4"]);
}

#[test]
fn a_schema_qualified_table_is_refused_naming_the_key() {
    let e = Settings::from_toml(
        Some("[database]\nurl = \"sqlite::memory:\"\ntable = \"public.outbox_events\"\n"),
        BTreeMap::new(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with(
            "invalid configuration: database.table: \"public.outbox_events\": a schema-qualified name is not supported yet"
        ),
        "{e}"
    );
    let ok = Settings::from_toml(
        Some("[database]\nurl = \"sqlite::memory:\"\ntable = \"app_outbox\"\n"),
        BTreeMap::new(),
    );
    assert!(ok.is_ok());
}

#[test]
fn listener_limits_default_and_refuse_zero_naming_the_key() {
    let with = |admin: &str, env_pairs: &[(&str, &str)]| {
        Settings::from_toml(
            Some(&format!(
                "[database]\nurl = \"sqlite::memory:\"\n[admin]\n{admin}\n"
            )),
            env(env_pairs),
        )
    };
    let s = with("", &[]).unwrap();
    assert_eq!(s.admin.header_read_timeout, Duration::from_secs(5));
    assert_eq!(s.admin.request_timeout, Duration::from_secs(30));
    assert_eq!(s.admin.max_connections, 256);
    let s = with(
        "header_read_timeout = \"2s\"",
        &[
            ("OUTBOX__ADMIN__REQUEST_TIMEOUT", "10"),
            ("OUTBOX__ADMIN__MAX_CONNECTIONS", "32"),
        ],
    )
    .unwrap();
    assert_eq!(s.admin.header_read_timeout, Duration::from_secs(2));
    assert_eq!(s.admin.request_timeout, Duration::from_secs(10));
    assert_eq!(s.admin.max_connections, 32);
    for (admin, expected) in [
        (
            "header_read_timeout = \"0s\"",
            "invalid configuration: admin.header_read_timeout: must be above zero",
        ),
        (
            "request_timeout = 0",
            "invalid configuration: admin.request_timeout: must be above zero",
        ),
        (
            "max_connections = 0",
            "invalid configuration: admin.max_connections: must be at least 1",
        ),
    ] {
        assert_eq!(with(admin, &[]).unwrap_err().to_string(), expected);
    }
    let e = with("max_connections = -1", &[]).unwrap_err().to_string();
    assert!(e.contains("admin.max_connections"), "{e}");
    let e = with("request_timeout = \"soon\"", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("admin.request_timeout"), "{e}");
}

#[test]
fn console_session_settings_default_and_refuse_zero_naming_the_key() {
    let with = |admin: &str, env_pairs: &[(&str, &str)]| {
        Settings::from_toml(
            Some(&format!(
                "[database]\nurl = \"sqlite::memory:\"\n[admin]\n{admin}\n"
            )),
            env(env_pairs),
        )
    };
    let s = with("", &[]).unwrap();
    assert_eq!(s.admin.console_session_ttl, Duration::from_secs(8 * 3600));
    assert!(!s.admin.console_secure_cookie);
    let s = with(
        "console_session_ttl = \"30m\"",
        &[("OUTBOX__ADMIN__CONSOLE_SECURE_COOKIE", "true")],
    )
    .unwrap();
    assert_eq!(s.admin.console_session_ttl, Duration::from_secs(1800));
    assert!(s.admin.console_secure_cookie);
    assert_eq!(
        with("console_session_ttl = \"0s\"", &[])
            .unwrap_err()
            .to_string(),
        "invalid configuration: admin.console_session_ttl: must be above zero"
    );
    let e = with("console_secure_cookie = \"maybe\"", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("admin.console_secure_cookie"), "{e}");
}

#[test]
fn dispatcher_tls_versions_are_read_naming_the_key() {
    let with = |extra: &str| {
        Settings::from_toml(
            Some(&format!(
                "[database]\nurl = \"sqlite::memory:\"\n[dispatchers.accounts]\n\
                 url = \"https://accounts\"\nevents = [\"a\"]\n{extra}\n"
            )),
            BTreeMap::new(),
        )
    };
    let s = with("min_tls_version = \"1.3\"").unwrap();
    assert_eq!(
        s.dispatchers["accounts"].min_tls_version,
        Some(TlsVersion::V1_3)
    );
    assert_eq!(
        with("").unwrap().dispatchers["accounts"].min_tls_version,
        None
    );
    let e = with("min_tls_version = \"1.0\"").unwrap_err().to_string();
    assert!(e.contains("dispatchers.accounts.min_tls_version"), "{e}");
}

#[test]
fn permanent_statuses_are_error_statuses_or_refused_naming_the_key() {
    let with = |extra: &str| {
        Settings::from_toml(
            Some(&format!(
                "[database]\nurl = \"sqlite::memory:\"\n[dispatchers.accounts]\n\
                 url = \"https://accounts\"\nevents = [\"a\"]\n{extra}\n"
            )),
            BTreeMap::new(),
        )
    };
    assert!(with("").unwrap().dispatchers["accounts"]
        .permanent_statuses
        .is_empty());
    assert_eq!(
        with("permanent_statuses = [404, 422]").unwrap().dispatchers["accounts"].permanent_statuses,
        vec![404, 422]
    );
    for bad in ["[200]", "[422, 302]", "[600]"] {
        let e = with(&format!("permanent_statuses = {bad}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("dispatchers.accounts.permanent_statuses"), "{e}");
        assert!(e.contains("is not an HTTP error status"), "{e}");
    }
}

#[test]
fn buffered_bytes_take_sizes_with_units_and_refuse_the_unusable() {
    let with = |v: &str| {
        Settings::from_toml(
            Some(&format!(
                "[database]\nurl = \"sqlite::memory:\"\n[dispatch]\nmax_buffered_bytes = {v}\n"
            )),
            BTreeMap::new(),
        )
    };
    assert_eq!(
        with("\"64MiB\"").unwrap().dispatch.max_buffered_bytes,
        64 << 20
    );
    assert_eq!(
        with("2097152").unwrap().dispatch.max_buffered_bytes,
        2 << 20
    );
    let from_env = Settings::from_toml(
        Some("[database]\nurl = \"sqlite::memory:\"\n"),
        env(&[("OUTBOX__DISPATCH__MAX_BUFFERED_BYTES", "128MiB")]),
    )
    .unwrap();
    assert_eq!(from_env.dispatch.max_buffered_bytes, 128 << 20);
    let e = with("\"lots\"").unwrap_err().to_string();
    assert!(
        e.contains("dispatch.max_buffered_bytes") && e.contains("is not a size"),
        "{e}"
    );
    let e = with("\"512KiB\"").unwrap_err().to_string();
    assert!(
        e.contains("dispatch.max_buffered_bytes: must be at least 1MiB"),
        "{e}"
    );
}

#[test]
fn history_pause_and_breaker_keys() {
    let base = "[database]\nurl = \"sqlite::memory:\"\n\
        [dispatchers.a]\nurl = \"http://a\"\nevents = [\"x\"]\n";
    let s = Settings::from_toml(Some(base), BTreeMap::new()).unwrap();
    assert!(s.history.enabled, "the attempt log is on by default");
    assert_eq!(s.history.table, "outbox_event_attempts");
    assert_eq!(s.history.retention, Duration::from_secs(30 * 24 * 3600));
    assert_eq!(s.dispatch.pause_table, "outbox_dispatcher_pauses");
    assert_eq!(s.dispatch.pause_refresh, Duration::from_secs(1));
    assert!(
        s.dispatchers["a"].breaker.is_none(),
        "no breaker unless set"
    );

    let s = Settings::from_toml(
        Some(&format!("{base}[dispatchers.a.breaker]\nfailures = 2\n")),
        env(&[
            ("OUTBOX__HISTORY__ENABLED", "false"),
            ("OUTBOX__HISTORY__RETENTION", "7d"),
            ("OUTBOX__DISPATCHERS__A__BREAKER__COOL_DOWN", "10s"),
        ]),
    )
    .unwrap();
    assert!(!s.history.enabled);
    assert_eq!(s.history.retention, Duration::from_secs(7 * 24 * 3600));
    let b = s.dispatchers["a"].breaker.as_ref().unwrap();
    assert_eq!(
        (b.failures, b.within, b.cool_down),
        (2, Duration::from_secs(30), Duration::from_secs(10))
    );

    for (extra, message) in [
        (
            "[history]\ntable = \"outbox_events\"\n",
            "history.table: \"outbox_events\" is database.table; the sidecar's own tables need their own names",
        ),
        (
            "[history]\ntable = \"log.attempts\"\n",
            "history.table: \"log.attempts\" is not a plain table name (letters, digits and _)",
        ),
        (
            "[dispatch]\npause_table = \"outbox_event_attempts\"\n",
            "dispatch.pause_table: is history.table too; each needs its own name",
        ),
        ("[history]\nretention = \"0s\"\n", "history.retention: must be above zero"),
        (
            "[dispatchers.a.breaker]\nfailures = 0\n",
            "dispatchers.a.breaker.failures: must be at least 1",
        ),
        (
            "[dispatchers.a.breaker]\ncool_down = \"0s\"\n",
            "dispatchers.a.breaker.cool_down: must be above zero",
        ),
        (
            "[dispatchers.a.breaker]\nfailure = 3\n",
            "unknown field `failure`",
        ),
    ] {
        let e = Settings::from_toml(Some(&format!("{base}{extra}")), BTreeMap::new()).unwrap_err();
        assert!(e.to_string().contains(message), "{extra}: {e}");
    }
}

#[test]
fn ordering_is_off_by_default_and_its_keys_are_checked_by_name() {
    let text = include_str!("../../config/example.toml");
    let s = Settings::from_toml(Some(text), BTreeMap::new()).unwrap();
    assert!(!s.ordering.enabled(), "R-004: no order unless asked for");
    assert_eq!(s.ordering.on_failed, OnFailed::Hold);
    let on = Settings::from_toml(
        Some(text),
        env(&[
            ("OUTBOX__ORDERING__COLUMN", "company_id"),
            ("OUTBOX__ORDERING__ON_FAILED", "skip"),
        ]),
    )
    .unwrap();
    on.validate().unwrap();
    assert_eq!(on.ordering.column.as_deref(), Some("company_id"));
    assert_eq!(on.ordering.on_failed, OnFailed::Skip);
    for (key, value, named) in [
        (
            "OUTBOX__ORDERING__COLUMN",
            "payload->>'x'",
            "ordering.column",
        ),
        (
            "OUTBOX__ORDERING__STRANDED_AFTER",
            "100ms",
            "ordering.stranded_after",
        ),
    ] {
        let e = match Settings::from_toml(Some(text), env(&[(key, value)])) {
            Ok(s) => s.validate().unwrap_err().to_string(),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(named), "{e}");
    }
    let e = Settings::from_toml(Some(text), env(&[("OUTBOX__ORDERING__ON_FAILED", "drop")]))
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("on_failed"), "{e}");
}
