use proptest::prelude::*;

use super::*;

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// Reads headers `(name, value)` and checks what comes out: the
/// `traceparent` it would write again and the `tracestate` it keeps, or
/// why there is nothing to continue.
#[track_caller]
fn check(headers: &[(&str, &str)], expected: Result<(&str, Option<&str>), Option<TraceProblem>>) {
    let headers: Headers = headers.iter().map(|(k, v)| (k.to_string(), v.as_bytes().to_vec())).collect();
    let got = match TraceContext::read(&headers) {
        Incoming::Valid(c) => Ok((c.traceparent(), c.state().map(str::to_owned))),
        Incoming::Absent => Err(None),
        Incoming::Malformed(problem) => Err(Some(problem)),
    };
    let expected = expected.map(|(p, s)| (p.to_owned(), s.map(str::to_owned)));
    assert_eq!(got, expected, "{headers:?}");
}

#[test]
fn traceparents() {
    use TraceProblem::*;
    check(&[], Err(None));
    check(&[("other", "x")], Err(None));
    check(&[("traceparent", PARENT)], Ok((PARENT, None)));
    check(
        &[("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")],
        Ok(("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", None)),
    );
    // Unknown flags are not propagated; sampled and random are.
    check(
        &[("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff")],
        Ok(("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03", None)),
    );
    // A later version: its version-00 fields are read, the rest dropped,
    // and what continues it speaks version 00.
    check(&[("traceparent", "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-ever")], Ok((PARENT, None)));
    check(&[("traceparent", "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")], Ok((PARENT, None)));
    check(&[("traceparent", "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x")], Err(Some(Syntax)));
    check(&[("traceparent", "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")], Err(Some(Version)));
    // Version 00 has nothing after the flags.
    check(&[("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-")], Err(Some(Syntax)));
    check(&[("traceparent", "00-00000000000000000000000000000000-00f067aa0ba902b7-01")], Err(Some(ZeroId)));
    check(&[("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01")], Err(Some(ZeroId)));
    check(&[("traceparent", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01")], Err(Some(Syntax)));
    check(&[("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01")], Err(Some(Syntax)));
    check(&[("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7")], Err(Some(Syntax)));
    check(&[("traceparent", "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")], Err(Some(Syntax)));
    check(&[("traceparent", "")], Err(Some(Syntax)));
    check(&[("traceparent", PARENT), ("traceparent", PARENT)], Err(Some(Duplicate)));
}

#[test]
fn tracestates() {
    check(&[("traceparent", PARENT), ("tracestate", "a=1,b=2")], Ok((PARENT, Some("a=1,b=2"))));
    check(&[("tracestate", "a=1"), ("traceparent", PARENT)], Ok((PARENT, Some("a=1"))));
    check(
        &[("traceparent", PARENT), ("tracestate", "rojo=00f067aa0ba902b7, congo=t61rcWkgMzE")],
        Ok((PARENT, Some("rojo=00f067aa0ba902b7, congo=t61rcWkgMzE"))),
    );
    check(&[("traceparent", PARENT), ("tracestate", "a=1,,b=2")], Ok((PARENT, Some("a=1,,b=2"))));
    // Malformed: dropped, the traceparent kept.
    check(&[("traceparent", PARENT), ("tracestate", "")], Ok((PARENT, None)));
    check(&[("traceparent", PARENT), ("tracestate", "novalue")], Ok((PARENT, None)));
    check(&[("traceparent", PARENT), ("tracestate", "a=\u{e9}")], Ok((PARENT, None)));
    check(&[("traceparent", PARENT), ("tracestate", "a=1"), ("tracestate", "b=2")], Ok((PARENT, None)));
    let members = (0..33).map(|i| format!("k{i}=v")).collect::<Vec<_>>().join(",");
    check(&[("traceparent", PARENT), ("tracestate", &members)], Ok((PARENT, None)));
    let long = format!("k={}", "v".repeat(MAX_TRACESTATE_BYTES));
    check(&[("traceparent", PARENT), ("tracestate", &long)], Ok((PARENT, None)));
}

#[test]
fn writing_replaces_what_was_there() {
    let mut headers = Headers::new();
    headers.insert("traceparent", "garbage");
    headers.insert("tracestate", "old=1");
    headers.insert("x-other", "kept");
    let (trace, span, flags) = parse_traceparent(PARENT.as_bytes()).unwrap();
    let context = TraceContext { trace_id: trace, span_id: span, flags, state: None };
    context.write_into(&mut headers);
    assert_eq!(headers.get("traceparent"), Some(PARENT.as_bytes()));
    assert_eq!((headers.get("tracestate"), headers.get("x-other")), (None, Some(&b"kept"[..])));
    assert_eq!(TraceContext::read(&headers), Incoming::Valid(context));
}

#[test]
fn new_contexts() {
    let trace = TraceId::from_bytes([7; 16]).unwrap();
    let span = SpanId::from_bytes([9; 8]).unwrap();
    assert_eq!(
        TraceContext::new(trace, span, true).traceparent(),
        format!("00-{}-{}-01", "07".repeat(16), "09".repeat(8))
    );
    assert!(!TraceContext::new(trace, span, false).is_sampled());
    assert_eq!((TraceId::from_bytes([0; 16]), SpanId::from_bytes([0; 8])), (None, None));
}

proptest! {
    /// Whatever a context holds, what it writes reads back the same.
    #[test]
    fn written_contexts_read_back(
        trace in any::<[u8; 16]>(),
        span in any::<[u8; 8]>(),
        flags in 0u8..4,
        state in proptest::option::of("[a-z][a-z0-9_*/-]{0,20}=[!-+\\--<>-~]{1,30}"),
    ) {
        let (Some(trace_id), Some(span_id)) = (TraceId::from_bytes(trace), SpanId::from_bytes(span)) else {
            return Ok(());
        };
        let context = TraceContext { trace_id, span_id, flags, state };
        let mut headers = Headers::new();
        context.write_into(&mut headers);
        prop_assert_eq!(TraceContext::read(&headers), Incoming::Valid(context));
    }

    /// Any bytes at all: read without a panic, and what is taken is
    /// written back as a valid version-00 traceparent.
    #[test]
    fn any_bytes_are_read_totally(parent in proptest::collection::vec(any::<u8>(), 0..80), state in proptest::collection::vec(any::<u8>(), 0..80)) {
        let headers: Headers = [("traceparent".to_owned(), parent), ("tracestate".to_owned(), state)].into_iter().collect();
        if let Incoming::Valid(context) = TraceContext::read(&headers) {
            let written = context.traceparent();
            prop_assert_eq!(written.len(), 55);
            prop_assert!(parse_traceparent(written.as_bytes()).is_ok());
        }
    }
}
