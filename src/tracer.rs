//! `[tracing]` at work: each event's trace context decided once per job
//! ([`Tracer::event`]), and each attempt's span exported over OTLP/HTTP
//! when `otlp_endpoint` is set ([`Tracer::export`]).
//!
//! With tracing off nothing here runs. With a column and no endpoint, the
//! ids are made (a random span id per attempt) and sent, and no span is
//! kept. With an endpoint, the OpenTelemetry SDK's batch processor
//! exports from a thread of its own: an attempt only hands its finished
//! span over (a bounded queue; spans beyond it are dropped, never waited
//! for), so a slow or absent collector costs the deliveries nothing.

use std::sync::Arc;
use std::time::Duration;

use entity::OutboxEventRow;
use opentelemetry::trace::{
    Span as _, SpanContext, SpanKind, Status, TraceContextExt, TraceFlags, TraceState, Tracer as _,
    TracerProvider as _,
};
use opentelemetry::KeyValue;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use prometheus::IntCounter;
use tracing::warn;

use crate::config::TracingSettings;
use crate::trace_context::{AttemptSpan, EventTrace, Origin};

/// How long the exporter waits for the collector per batch.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the batch processor sends what it holds.
const EXPORT_DELAY: Duration = Duration::from_secs(2);

/// The trace context of the sidecar's attempts (`[tracing]`).
#[derive(Clone, Default)]
pub struct Tracer {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    /// Rows carry a `traceparent` column.
    column: bool,
    provider: Option<SdkTracerProvider>,
    tracer: Option<opentelemetry_sdk::trace::SdkTracer>,
    invalid: Option<IntCounter>,
}

/// The exporter could not be built.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: tracing.otlp_endpoint: {0}")]
pub struct ExporterError(String);

impl Tracer {
    /// Tracing off: no trace context, nothing exported.
    pub fn off() -> Tracer {
        Tracer::default()
    }

    /// From the settings; `invalid` counts rows whose `traceparent` was
    /// not valid. Builds the exporter on a thread of its own (its blocking
    /// HTTP client must not be made or dropped on the async runtime).
    pub fn new(settings: &TracingSettings, invalid: IntCounter) -> Result<Tracer, ExporterError> {
        if !settings.enabled() {
            return Ok(Tracer::off());
        }
        let provider = match &settings.otlp_endpoint {
            None => None,
            Some(endpoint) => {
                let endpoint = endpoint.clone();
                let service = settings.service_name.clone();
                let built = std::thread::spawn(move || build_provider(&endpoint, &service))
                    .join()
                    .map_err(|_| ExporterError("building the exporter panicked".into()))?;
                Some(built?)
            }
        };
        let tracer = provider.as_ref().map(|p| p.tracer("outbox-sidecar"));
        Ok(Tracer {
            inner: Some(Arc::new(Inner {
                column: settings.column.is_some(),
                provider,
                tracer,
                invalid: Some(invalid),
            })),
        })
    }

    pub fn enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// Spans are exported (`[tracing] otlp_endpoint`): without an
    /// exporter an attempt's span is not even built.
    pub fn exports(&self) -> bool {
        self.inner.as_ref().is_some_and(|i| i.tracer.is_some())
    }

    /// The event's trace context: the row's `traceparent`, or a new trace
    /// (a value that is not valid is counted and WARNed). `None` with
    /// tracing off.
    pub fn event(&self, row: &OutboxEventRow) -> Option<EventTrace> {
        let inner = self.inner.as_ref()?;
        let own = || EventTrace {
            trace_id: crate::trace_context::TraceId::of_event(row.id),
            ..EventTrace::new_trace()
        };
        if !inner.column {
            return Some(own());
        }
        let (mut trace, origin) =
            EventTrace::of_row(row.traceparent.as_deref(), row.tracestate.as_deref());
        if !matches!(origin, Origin::Row) {
            trace.trace_id = own().trace_id;
        }
        // Counted and said once per event, at its first attempt (each
        // attempt is a job of its own that decides the context again).
        if let Origin::Invalid(e) = origin {
            if row.attempts > 0 {
                return Some(trace);
            }
            if let Some(c) = &inner.invalid {
                c.inc();
            }
            warn!(
                id = row.id,
                traceparent = %row.traceparent.as_deref().unwrap_or_default().chars().take(64).collect::<String>(),
                trace_id = %trace.trace_id,
                "{e}: a new trace starts"
            );
        }
        Some(trace)
    }

    /// Hands one attempt's span to the exporter (nothing without one).
    pub fn export(&self, span: AttemptSpan) {
        let Some(tracer) = self.inner.as_ref().and_then(|i| i.tracer.as_ref()) else {
            return;
        };
        let t = &span.trace;
        let trace_id = opentelemetry::TraceId::from_bytes(t.trace_id.0);
        let flags = if t.sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        let parent = match t.parent {
            Some(parent) => {
                let state = t
                    .state
                    .as_deref()
                    .and_then(|s| s.parse::<TraceState>().ok())
                    .unwrap_or_default();
                opentelemetry::Context::new().with_remote_span_context(SpanContext::new(
                    trace_id,
                    opentelemetry::SpanId::from_bytes(parent.0),
                    flags,
                    true,
                    state,
                ))
            }
            None => opentelemetry::Context::new(),
        };
        if !t.sampled {
            return;
        }
        let mut attributes = vec![
            KeyValue::new("outbox.event_id", span.event_id),
            KeyValue::new("outbox.event_name", span.event_name.clone()),
            KeyValue::new("outbox.attempt", i64::from(span.attempt)),
            KeyValue::new("outbox.outcome", span.outcome),
        ];
        if let Some(d) = &span.dispatcher {
            attributes.push(KeyValue::new("outbox.dispatcher", d.clone()));
        }
        if let Some(code) = span.http_status {
            attributes.push(KeyValue::new("http.response.status_code", i64::from(code)));
        }
        let name = match &span.dispatcher {
            Some(d) => format!("POST {d}"),
            None => "POST".to_owned(),
        };
        let builder = tracer
            .span_builder(name)
            .with_kind(SpanKind::Client)
            .with_start_time(span.started)
            .with_attributes(attributes);
        // The ids the POST carried: the SDK takes them from the id
        // generator, which hands out these on this thread (a root span
        // takes the new trace's id, a child its parent's).
        NEXT_IDS.with(|n| {
            n.set(Some((
                trace_id,
                opentelemetry::SpanId::from_bytes(span.span.0),
            )))
        });
        let mut s = builder.start_with_context(tracer, &parent);
        NEXT_IDS.with(|n| n.set(None));
        if let Some(error) = span.error {
            s.set_status(Status::error(error));
        } else {
            s.set_status(Status::Ok);
        }
        s.end_with_timestamp(span.ended);
    }

    /// Sends what the exporter still holds (at shutdown); blocking, so
    /// run off the async runtime.
    pub fn shutdown(&self) {
        if let Some(p) = self.inner.as_ref().and_then(|i| i.provider.as_ref()) {
            if let Err(e) = p.shutdown() {
                warn!(error = %e, "the OTLP exporter did not shut down cleanly");
            }
        }
    }
}

thread_local! {
    /// The ids of the span being started on this thread ([`Tracer::export`]).
    static NEXT_IDS: std::cell::Cell<Option<(opentelemetry::TraceId, opentelemetry::SpanId)>> =
        const { std::cell::Cell::new(None) };
}

/// Gives the SDK the ids the attempt already sent (the SDK makes its own
/// otherwise); random ones for anything else.
#[derive(Debug)]
struct AttemptIds;

impl opentelemetry_sdk::trace::IdGenerator for AttemptIds {
    fn new_trace_id(&self) -> opentelemetry::TraceId {
        NEXT_IDS
            .with(|n| n.get())
            .map(|(t, _)| t)
            .unwrap_or_else(|| {
                opentelemetry::TraceId::from_bytes(crate::trace_context::TraceId::random().0)
            })
    }

    fn new_span_id(&self) -> opentelemetry::SpanId {
        NEXT_IDS
            .with(|n| n.get())
            .map(|(_, s)| s)
            .unwrap_or_else(|| {
                opentelemetry::SpanId::from_bytes(crate::trace_context::SpanId::random().0)
            })
    }
}

fn build_provider(endpoint: &str, service: &str) -> Result<SdkTracerProvider, ExporterError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(endpoint)
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| ExporterError(e.to_string()))?;
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_scheduled_delay(EXPORT_DELAY)
                .build(),
        )
        .build();
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_id_generator(AttemptIds)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(service.to_owned())
                .build(),
        )
        .build())
}
