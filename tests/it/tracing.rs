//! W3C trace context from the row to the receiver (`[tracing]`), and one
//! span per attempt over OTLP/HTTP, decoded here with `opentelemetry-proto`
//! (the specification's own protobuf types, not the sidecar's code).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use entity::Status;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use sea_orm::{ConnectionTrait, Statement};
use wiremock::ResponseTemplate;

use crate::harness::kafka::Kafka;
use crate::harness::{eventually, metric, prepare_on, Options, Receiver, TestApp};

const T: Duration = Duration::from_secs(60);
const APP_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const APP_PARENT: &str = "00f067aa0ba902b7";

/// An OTLP/HTTP traces endpoint that keeps every span it is sent.
struct Collector {
    url: String,
    spans: Arc<Mutex<Vec<Span>>>,
}

impl Collector {
    async fn start() -> Collector {
        let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
        let kept = spans.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let kept = kept.clone();
                async move {
                    let request =
                        ExportTraceServiceRequest::decode(body.as_ref()).expect("OTLP protobuf");
                    for resource in request.resource_spans {
                        for scope in resource.scope_spans {
                            kept.lock().unwrap().extend(scope.spans);
                        }
                    }
                    axum::http::StatusCode::OK
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1/traces", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Collector { url, spans }
    }

    fn spans_of(&self, id: i64) -> Vec<Span> {
        self.spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| attribute(s, "outbox.event_id") == Some(AnyValue::IntValue(id)))
            .cloned()
            .collect()
    }
}

fn attribute(span: &Span, key: &str) -> Option<AnyValue> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.clone())
        .and_then(|v| v.value)
}

/// Adds the trace context columns a Rails app would add.
async fn add_columns(t: &TestApp) {
    let sql = format!(
        "ALTER TABLE {} ADD COLUMN traceparent varchar(55), ADD COLUMN tracestate text",
        t.store.table()
    );
    t.store.connection().execute_unprepared(&sql).await.unwrap();
}

async fn insert(t: &TestApp, traceparent: Option<&str>, tracestate: Option<&str>) -> i64 {
    let stmt = Statement::from_sql_and_values(
        sea_orm::DbBackend::Postgres,
        format!(
            "INSERT INTO {} (event_name, payload, status, attempts, created_at, updated_at, \
             traceparent, tracestate) VALUES ('accounts.purchase_create', '{{\"n\": 1}}', \
             'pending', 0, now() AT TIME ZONE 'UTC', now() AT TIME ZONE 'UTC', $1, $2) \
             RETURNING id",
            t.store.table()
        ),
        [traceparent.into(), tracestate.into()],
    );
    let row = t
        .store
        .connection()
        .query_one_raw(stmt)
        .await
        .unwrap()
        .unwrap();
    row.try_get("", "id").unwrap()
}

/// `00-trace-span-flags` → (trace, span, flags).
fn split(traceparent: &str) -> (String, String, String) {
    let p: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(p.len(), 4, "{traceparent}");
    assert_eq!(p[0], "00", "{traceparent}");
    (p[1].to_owned(), p[2].to_owned(), p[3].to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rows_trace_reaches_the_receiver_the_log_and_the_collector() {
    let collector = Collector::start().await;
    // The first attempt of every event fails: two spans each.
    let receiver =
        Receiver::start(|r| ResponseTemplate::new(if r.attempt == 1 { 503 } else { 200 })).await;
    let mut t = prepare_on(
        Kafka::start(),
        Options {
            extra_toml: format!(
                "[tracing]\ncolumn = \"traceparent\"\nstate_column = \"tracestate\"\n\
                 otlp_endpoint = {:?}\n",
                collector.url
            ),
            ..Options::default()
        },
        receiver,
    )
    .await;
    add_columns(&t).await;
    t.start().await;
    let traceparent = format!("00-{APP_TRACE}-{APP_PARENT}-01");
    let traced = insert(&t, Some(&traceparent), Some("congo=t61rcWkgMzE")).await;
    let malformed = insert(&t, Some("00-NOT-A-TRACE-01"), None).await;
    let untraced = insert(&t, None, None).await;
    for id in [traced, malformed, untraced] {
        t.wait_status(id, Status::Sent, T).await;
    }

    // The receiver: the application's trace id, a new parent id per attempt.
    let requests = t.receiver.for_id(traced);
    assert_eq!(requests.len(), 2);
    let mut spans_sent = Vec::new();
    for r in &requests {
        let (trace, span, flags) = split(&r.headers["traceparent"]);
        assert_eq!(trace, APP_TRACE);
        assert_ne!(
            span, APP_PARENT,
            "the receiver's parent is the attempt's span"
        );
        assert_eq!(flags, "01");
        assert_eq!(r.headers["tracestate"], "congo=t61rcWkgMzE");
        spans_sent.push(span);
    }
    assert_ne!(spans_sent[0], spans_sent[1], "a span per attempt");
    // A malformed value starts a new trace, counted; no value: a new trace.
    let mut new_traces = Vec::new();
    for id in [malformed, untraced] {
        let r = t.receiver.for_id(id);
        let (trace, _, _) = split(&r[0].headers["traceparent"]);
        assert_ne!(trace, APP_TRACE);
        assert!(!r[0].headers.contains_key("tracestate"));
        let (again, _, _) = split(&r[1].headers["traceparent"]);
        assert_eq!(trace, again, "one trace per event, across its attempts");
        new_traces.push(trace);
    }
    assert_ne!(new_traces[0], new_traces[1]);
    assert_eq!(
        metric(&t.admin_url(""), "outbox_trace_context_invalid_total").await,
        Some(1.0)
    );

    // The attempt log, and `events show`, hold the trace id.
    let store = t.store.clone().with_tracing(None, true);
    let log = store.history(traced).await.unwrap();
    let attempts: Vec<_> = log.iter().filter(|r| r.kind == "attempt").collect();
    assert_eq!(attempts.len(), 2);
    for r in &attempts {
        assert_eq!(r.trace_id.as_deref(), Some(APP_TRACE));
    }
    let shown = outbox_sidecar::cli::render_event(&t.row(traced).await, &log, true);
    assert!(shown.contains(&format!("trace {APP_TRACE}")), "{shown}");
    let log = store.history(malformed).await.unwrap();
    assert_eq!(log[0].trace_id.as_deref(), Some(new_traces[0].as_str()));

    // The collector: one span per attempt, the ids the receiver saw, the
    // application's span as parent, the outcome as attributes.
    let spans = eventually("both attempts' spans exported", T, || {
        let spans = collector.spans_of(traced);
        async move { (spans.len() >= 2).then_some(spans) }
    })
    .await;
    assert_eq!(spans.len(), 2, "one span per attempt");
    for span in &spans {
        assert_eq!(hex::encode(&span.trace_id), APP_TRACE);
        assert_eq!(hex::encode(&span.parent_span_id), APP_PARENT);
        let id = hex::encode(&span.span_id);
        let sent = requests
            .iter()
            .position(|r| split(&r.headers["traceparent"]).1 == id)
            .expect("the span the POST carried");
        let (outcome, code) = if requests[sent].attempt == 1 {
            ("failure", 503)
        } else {
            ("success", 200)
        };
        assert_eq!(
            attribute(span, "outbox.outcome"),
            Some(AnyValue::StringValue(outcome.into()))
        );
        assert_eq!(
            attribute(span, "http.response.status_code"),
            Some(AnyValue::IntValue(code))
        );
        assert_eq!(
            attribute(span, "outbox.attempt"),
            Some(AnyValue::IntValue(i64::from(requests[sent].attempt)))
        );
    }
    // A new trace's spans are roots of it.
    let spans = eventually("the untraced event's spans exported", T, || {
        let spans = collector.spans_of(untraced);
        async move { (spans.len() >= 2).then_some(spans) }
    })
    .await;
    for span in spans {
        assert_eq!(hex::encode(&span.trace_id), new_traces[1]);
        assert!(span.parent_span_id.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracing_off_sends_no_trace_headers() {
    let receiver = Receiver::accepting().await;
    let mut t = prepare_on(Kafka::start(), Options::default(), receiver).await;
    add_columns(&t).await;
    t.start().await;
    let id = insert(&t, Some(&format!("00-{APP_TRACE}-{APP_PARENT}-01")), None).await;
    t.wait_status(id, Status::Sent, T).await;
    let r = t.receiver.for_id(id);
    assert!(
        !r[0].headers.contains_key("traceparent"),
        "{:?}",
        r[0].headers
    );
    let log = t.store.history(id).await.unwrap();
    assert!(log.iter().all(|r| r.trace_id.is_none()));
}

#[tokio::test]
async fn a_trace_column_the_table_lacks_or_a_log_without_trace_id_is_refused_at_start_up() {
    let t = prepare_on(
        Kafka::start(),
        Options::default(),
        Receiver::accepting().await,
    )
    .await;
    let mut settings = t.settings(&t.group);
    settings.tracing.column = Some("traceparent".into());
    let e = match outbox_sidecar::app::App::start(settings.clone()).await {
        Ok(_) => panic!("started without the column"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("traceparent") && e.contains("tracing.column") && e.contains("does not exist"),
        "{e}"
    );
    // The column added; a log made before trace context: `migrate` named.
    add_columns(&t).await;
    let log = settings.history.table.clone();
    t.store
        .connection()
        .execute_unprepared(&format!("ALTER TABLE {log} DROP COLUMN trace_id"))
        .await
        .unwrap();
    let e = match outbox_sidecar::app::App::start(settings.clone()).await {
        Ok(_) => panic!("started without the log's trace_id"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("trace_id") && e.contains("migrate"), "{e}");
    // `migrate` adds it back, and the sidecar starts.
    t.store.migrate().await.unwrap();
    let app = outbox_sidecar::app::App::start(settings)
        .await
        .expect("starts");
    app.stop().await;
}
