//! Spans of the records a listener handles and replays, through
//! OpenTelemetry's global tracer provider, following its messaging
//! semantic conventions; and the trace context they carry on.
//!
//! Each attempt is a consumer span `process <topic>` whose parent is the
//! record's `traceparent` (the producer's span on the source topic, the
//! previous attempt's on a rung, the replay's after a replay); a record
//! republished to a rung or the dead-letter topic carries the attempt's
//! context, so one order is one trace and each attempt the child of the
//! one before. A replay is a producer span `replay <topic>`, child of the
//! dead letter's last attempt.
//!
//! With [`Tracing::Off`] (the default) nothing is recorded and nothing is
//! drawn: the record's own `traceparent` is what the handler sees and what
//! republications keep, so the trace id still goes through.

use std::{borrow::Cow, str::FromStr};

use opentelemetry::{
    global::{self, BoxedSpan, BoxedTracer},
    trace::{Span as _, SpanContext, SpanKind, Status, TraceContextExt, TraceFlags, TraceState, Tracer as _},
    Context, InstrumentationScope, KeyValue,
};
use retry_core::{
    trace::{SpanId, TraceContext, TraceId},
    Decision, FailureKind, HandlerError,
};

/// Whether a listener records spans.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tracing {
    /// No spans: records keep the `traceparent` they came with.
    #[default]
    Off,
    /// Spans through OpenTelemetry's global tracer provider, as installed
    /// (with its exporter) before the listener starts.
    OpenTelemetry,
}

/// Where a listener's spans go.
pub(crate) struct Spans {
    tracer: Option<BoxedTracer>,
}

/// What an attempt's span says of its record.
pub(crate) struct Attempt<'a> {
    pub(crate) topic: &'a str,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) group: &'a str,
    pub(crate) attempt: u32,
    pub(crate) key: Option<&'a [u8]>,
}

/// One attempt's span (when spans are recorded) and the context it passes on.
pub(crate) struct AttemptSpan {
    span: Option<BoxedSpan>,
    context: Option<TraceContext>,
    /// Whether `context` is the span's own (then republications carry it).
    own: bool,
}

impl Spans {
    pub(crate) fn new(tracing: Tracing) -> Self {
        let tracer = match tracing {
            Tracing::Off => None,
            Tracing::OpenTelemetry => Some(global::tracer_with_scope(
                InstrumentationScope::builder("retry-kafka").with_version(env!("CARGO_PKG_VERSION")).build(),
            )),
        };
        Spans { tracer }
    }

    /// Starts the span of an attempt on a record whose headers carried
    /// `incoming` (if anything valid).
    pub(crate) fn attempt(&self, incoming: Option<&TraceContext>, a: Attempt<'_>) -> AttemptSpan {
        let Some(tracer) = &self.tracer else {
            return AttemptSpan { span: None, context: incoming.cloned(), own: false };
        };
        let mut attributes = vec![
            KeyValue::new("messaging.system", "kafka"),
            KeyValue::new("messaging.operation.type", "process"),
            KeyValue::new("messaging.operation.name", "process"),
            KeyValue::new("messaging.destination.name", a.topic.to_owned()),
            KeyValue::new("messaging.destination.partition.id", a.partition.to_string()),
            KeyValue::new("messaging.consumer.group.name", a.group.to_owned()),
            KeyValue::new("messaging.kafka.offset", a.offset),
            KeyValue::new("kafka_retry.attempt", i64::from(a.attempt)),
        ];
        if let Some(key) = a.key.and_then(|k| std::str::from_utf8(k).ok()) {
            attributes.push(KeyValue::new("messaging.kafka.message.key", key.to_owned()));
        }
        let span = tracer
            .span_builder(Cow::Owned(format!("process {}", a.topic)))
            .with_kind(SpanKind::Consumer)
            .with_attributes(attributes)
            .start_with_context(tracer, &parent(incoming));
        let context = own_context(incoming, span.span_context());
        let own = context.is_some();
        AttemptSpan { span: Some(span), context: context.or_else(|| incoming.cloned()), own }
    }

    /// Starts the span of a replay to `target` of a dead letter whose
    /// headers carried `incoming`.
    pub(crate) fn replay(&self, incoming: Option<&TraceContext>, target: &str) -> AttemptSpan {
        let Some(tracer) = &self.tracer else {
            return AttemptSpan { span: None, context: incoming.cloned(), own: false };
        };
        let attributes = vec![
            KeyValue::new("messaging.system", "kafka"),
            KeyValue::new("messaging.operation.type", "send"),
            KeyValue::new("messaging.operation.name", "replay"),
            KeyValue::new("messaging.destination.name", target.to_owned()),
        ];
        let span = tracer
            .span_builder(Cow::Owned(format!("replay {target}")))
            .with_kind(SpanKind::Producer)
            .with_attributes(attributes)
            .start_with_context(tracer, &parent(incoming));
        let context = own_context(incoming, span.span_context());
        let own = context.is_some();
        AttemptSpan { span: Some(span), context: context.or_else(|| incoming.cloned()), own }
    }
}

impl AttemptSpan {
    /// The context to hand the handler: the span's, or the record's own.
    pub(crate) fn context(&self) -> Option<&TraceContext> {
        self.context.as_ref()
    }

    /// What a republication must carry instead of the record's own
    /// `traceparent`: the span's context, when there is a span.
    pub(crate) fn carried(&self) -> Option<&TraceContext> {
        self.context.as_ref().filter(|_| self.own)
    }

    /// The handler's outcome.
    pub(crate) fn handled(&mut self, outcome: &Result<(), HandlerError>) {
        let (Some(span), Err(error)) = (&mut self.span, outcome) else { return };
        let kind = match error.kind() {
            FailureKind::Transient => "transient",
            FailureKind::Permanent => "permanent",
        };
        span.set_attribute(KeyValue::new("error.type", kind));
        span.set_status(Status::error(error.message().to_owned()));
    }

    /// What became of the record; ends the span.
    pub(crate) fn decided(mut self, decision: &Decision) {
        let Some(span) = &mut self.span else { return };
        let (what, target) = match decision {
            Decision::Commit => ("commit", None),
            Decision::Retry { topic, .. } => ("retry", Some(topic.to_string())),
            Decision::DeadLetter { topic, reason, .. } => {
                span.set_attribute(KeyValue::new("kafka_retry.dead_letter.reason", reason.as_str()));
                ("dead_letter", Some(topic.to_string()))
            }
        };
        span.set_attribute(KeyValue::new("kafka_retry.decision", what));
        if let Some(target) = target {
            span.set_attribute(KeyValue::new("kafka_retry.destination", target));
        }
        span.end();
    }

    /// Ends the span of a replay, saying whether the broker took it.
    pub(crate) fn sent(mut self, failed: Option<&str>) {
        let Some(span) = &mut self.span else { return };
        if let Some(error) = failed {
            span.set_status(Status::error(error.to_owned()));
        }
        span.end();
    }
}

/// The OpenTelemetry context whose remote parent is `incoming`.
fn parent(incoming: Option<&TraceContext>) -> Context {
    let Some(incoming) = incoming else { return Context::new() };
    let state = incoming.state().and_then(|s| TraceState::from_str(s).ok()).unwrap_or_default();
    let flags = if incoming.is_sampled() { TraceFlags::SAMPLED } else { TraceFlags::default() };
    let span_context = SpanContext::new(
        opentelemetry::trace::TraceId::from_bytes(incoming.trace_id().to_bytes()),
        opentelemetry::trace::SpanId::from_bytes(incoming.span_id().to_bytes()),
        flags,
        true,
        state,
    );
    Context::new().with_remote_span_context(span_context)
}

/// The context a new span passes on, when it has one of its own (a
/// provider that records nothing hands back its parent's, or none).
fn own_context(incoming: Option<&TraceContext>, span: &SpanContext) -> Option<TraceContext> {
    if !span.is_valid() {
        return None;
    }
    let trace = TraceId::from_bytes(span.trace_id().to_bytes())?;
    let id = SpanId::from_bytes(span.span_id().to_bytes())?;
    match incoming {
        Some(parent) if parent.span_id() == id => None,
        Some(parent) if parent.trace_id() == trace => Some(parent.child(id)),
        _ => Some(TraceContext::new(trace, id, span.is_sampled())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_spans_the_records_context_goes_through() {
        let incoming =
            TraceContext::new(TraceId::from_bytes([1; 16]).unwrap(), SpanId::from_bytes([2; 8]).unwrap(), true);
        let attempt = Attempt { topic: "orders", partition: 0, offset: 1, group: "billing", attempt: 1, key: None };
        for spans in [Spans::new(Tracing::Off), Spans::new(Tracing::OpenTelemetry)] {
            // No provider installed here: the global one records nothing.
            let span = spans.attempt(Some(&incoming), attempt_of(&attempt));
            assert_eq!((span.context(), span.carried()), (Some(&incoming), None));
            let span = spans.attempt(None, attempt_of(&attempt));
            assert_eq!((span.context(), span.carried()), (None, None));
        }
    }

    fn attempt_of<'a>(a: &Attempt<'a>) -> Attempt<'a> {
        Attempt {
            topic: a.topic,
            partition: a.partition,
            offset: a.offset,
            group: a.group,
            attempt: a.attempt,
            key: a.key,
        }
    }

    #[test]
    fn a_span_of_its_own_continues_the_trace() {
        let parent_ctx =
            TraceContext::new(TraceId::from_bytes([1; 16]).unwrap(), SpanId::from_bytes([2; 8]).unwrap(), true);
        let own = SpanContext::new(
            opentelemetry::trace::TraceId::from_bytes([1; 16]),
            opentelemetry::trace::SpanId::from_bytes([3; 8]),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        );
        let got = own_context(Some(&parent_ctx), &own).unwrap();
        assert_eq!((got.trace_id(), got.span_id()), (parent_ctx.trace_id(), SpanId::from_bytes([3; 8]).unwrap()));
        // A noop span hands back its parent: nothing of its own.
        let same = SpanContext::new(
            opentelemetry::trace::TraceId::from_bytes([1; 16]),
            opentelemetry::trace::SpanId::from_bytes([2; 8]),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        );
        assert_eq!(own_context(Some(&parent_ctx), &same), None);
        assert_eq!(own_context(None, &SpanContext::empty_context()), None);
        let root = own_context(None, &own).unwrap();
        assert_eq!(root.traceparent(), format!("00-{}-{}-01", "01".repeat(16), "03".repeat(8)));
    }
}
