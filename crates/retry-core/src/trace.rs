//! W3C trace context (`traceparent`, `tracestate`) carried in record
//! headers, so that one order is one trace: from the producer's span
//! through every attempt, rung, dead letter and replay.
//!
//! Reading is total: a record without `traceparent` starts no trace of its
//! own here, one whose `traceparent` is malformed (or present twice) is
//! [`Incoming::Malformed`] and handled as if it had none (the transport
//! counts it); a malformed `tracestate` is dropped and the `traceparent`
//! kept, as the W3C recommendation asks. Ids are the transport's to draw:
//! this module reads no clock and no randomness.
//!
//! ```
//! use retry_core::{trace::{Incoming, SpanId, TraceContext}, Headers};
//!
//! let mut headers = Headers::new();
//! headers.insert("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
//! headers.insert("tracestate", "vendor=opaque");
//! let Incoming::Valid(producer) = TraceContext::read(&headers) else { panic!() };
//! assert!(producer.is_sampled());
//!
//! // The attempt that handles the record: a span of the producer's trace.
//! let attempt = producer.child(SpanId::from_bytes([1, 2, 3, 4, 5, 6, 7, 8]).unwrap());
//! let mut republished = Headers::new();
//! attempt.write_into(&mut republished);
//! assert_eq!(
//!     republished.get("traceparent"),
//!     Some(&b"00-4bf92f3577b34da6a3ce929d0e0e4736-0102030405060708-01"[..])
//! );
//! assert_eq!(republished.get("tracestate"), Some(&b"vendor=opaque"[..]));
//! ```

use std::fmt;

use crate::Headers;

/// The header names of W3C trace context.
///
/// ```
/// use retry_core::trace::header_names;
///
/// assert_eq!((header_names::TRACEPARENT, header_names::TRACESTATE), ("traceparent", "tracestate"));
/// ```
pub mod header_names {
    /// `version-traceid-parentid-flags`, lowercase hex.
    pub const TRACEPARENT: &str = "traceparent";
    /// Vendors' `key=value` list, carried along unchanged.
    pub const TRACESTATE: &str = "tracestate";
}

/// The longest `tracestate` carried along (the W3C recommendation's limit
/// for what a platform must propagate); a longer one is dropped.
pub const MAX_TRACESTATE_BYTES: usize = 512;
/// The most list members a `tracestate` may have.
const MAX_TRACESTATE_MEMBERS: usize = 32;
/// The flags propagated: sampled (bit 0) and random trace id (bit 1).
const KNOWN_FLAGS: u8 = 0b11;
const SAMPLED: u8 = 0b01;

/// A trace's id: 16 bytes, not all zero.
///
/// ```
/// use retry_core::trace::TraceId;
///
/// let id = TraceId::from_bytes([0xab; 16]).unwrap();
/// assert_eq!(id.to_string(), "ab".repeat(16));
/// assert_eq!(TraceId::from_bytes([0; 16]), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TraceId([u8; 16]);

/// A span's id: 8 bytes, not all zero.
///
/// ```
/// use retry_core::trace::SpanId;
///
/// let id = SpanId::from_bytes([1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
/// assert_eq!((id.to_string().as_str(), id.to_bytes()), ("0102030405060708", [1, 2, 3, 4, 5, 6, 7, 8]));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpanId([u8; 8]);

impl TraceId {
    /// `bytes` as a trace id; `None` when they are all zero (invalid).
    pub fn from_bytes(bytes: [u8; 16]) -> Option<Self> {
        (bytes != [0; 16]).then_some(TraceId(bytes))
    }

    /// Its bytes.
    pub fn to_bytes(self) -> [u8; 16] {
        self.0
    }
}

impl SpanId {
    /// `bytes` as a span id; `None` when they are all zero (invalid).
    pub fn from_bytes(bytes: [u8; 8]) -> Option<Self> {
        (bytes != [0; 8]).then_some(SpanId(bytes))
    }

    /// Its bytes.
    pub fn to_bytes(self) -> [u8; 8] {
        self.0
    }
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// Why a `traceparent` was not taken.
///
/// ```
/// use retry_core::trace::{parse_traceparent, TraceProblem};
///
/// assert_eq!(parse_traceparent(b"00-xyz").unwrap_err(), TraceProblem::Syntax);
/// assert_eq!(TraceProblem::Version.to_string(), "version ff is invalid");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceProblem {
    /// Not `version-traceid-parentid-flags` with the lengths and lowercase
    /// hex digits each field must have.
    Syntax,
    /// Version `ff`, which is invalid.
    Version,
    /// A trace id or a parent id of zeros.
    ZeroId,
    /// The record has more than one `traceparent`.
    Duplicate,
}

impl fmt::Display for TraceProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TraceProblem::Syntax => "not version-traceid-parentid-flags in lowercase hex",
            TraceProblem::Version => "version ff is invalid",
            TraceProblem::ZeroId => "a trace id or parent id of zeros",
            TraceProblem::Duplicate => "more than one traceparent header",
        })
    }
}

/// What a record's headers say of its trace.
///
/// ```
/// use retry_core::{trace::{Incoming, TraceContext, TraceProblem}, Headers};
///
/// let mut headers = Headers::new();
/// assert_eq!(TraceContext::read(&headers), Incoming::Absent);
/// headers.insert("traceparent", "garbage");
/// assert_eq!(TraceContext::read(&headers), Incoming::Malformed(TraceProblem::Syntax));
/// assert_eq!(TraceContext::read(&headers).context(), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    /// No `traceparent`: the record starts a trace of its own.
    Absent,
    /// A context to continue.
    Valid(TraceContext),
    /// A `traceparent` that cannot be taken: ignored (and counted).
    Malformed(TraceProblem),
}

impl Incoming {
    /// The context to continue, if any.
    pub fn context(&self) -> Option<&TraceContext> {
        match self {
            Incoming::Valid(context) => Some(context),
            Incoming::Absent | Incoming::Malformed(_) => None,
        }
    }
}

/// A span's place in a trace, as `traceparent` and `tracestate` carry it.
///
/// ```
/// use retry_core::trace::{SpanId, TraceContext, TraceId};
///
/// let root = TraceContext::new(TraceId::from_bytes([1; 16]).unwrap(), SpanId::from_bytes([2; 8]).unwrap(), true);
/// let child = root.child(SpanId::from_bytes([3; 8]).unwrap());
/// assert_eq!(child.trace_id(), root.trace_id());
/// assert_eq!(child.traceparent(), format!("00-{}-{}-01", "01".repeat(16), "03".repeat(8)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    trace_id: TraceId,
    span_id: SpanId,
    flags: u8,
    state: Option<String>,
}

impl TraceContext {
    /// A context of its own: the first span of trace `trace_id`.
    pub fn new(trace_id: TraceId, span_id: SpanId, sampled: bool) -> Self {
        TraceContext { trace_id, span_id, flags: if sampled { SAMPLED } else { 0 }, state: None }
    }

    /// What `headers` say: their `traceparent` (and `tracestate`).
    pub fn read(headers: &Headers) -> Incoming {
        let mut parents = headers.iter().filter(|(k, _)| *k == header_names::TRACEPARENT);
        let Some((_, parent)) = parents.next() else { return Incoming::Absent };
        if parents.next().is_some() {
            return Incoming::Malformed(TraceProblem::Duplicate);
        }
        match parse_traceparent(parent) {
            Ok((trace_id, span_id, flags)) => {
                let mut states = headers.iter().filter(|(k, _)| *k == header_names::TRACESTATE);
                let state = match (states.next(), states.next()) {
                    (Some((_, state)), None) => valid_tracestate(state),
                    // Several tracestate headers would have to be joined in
                    // order; one is what producers write. More: drop them.
                    _ => None,
                };
                Incoming::Valid(TraceContext { trace_id, span_id, flags, state })
            }
            Err(problem) => Incoming::Malformed(problem),
        }
    }

    /// The trace this context belongs to.
    pub fn trace_id(&self) -> TraceId {
        self.trace_id
    }

    /// The span it names (the parent of whatever continues it).
    pub fn span_id(&self) -> SpanId {
        self.span_id
    }

    /// Whether the trace is sampled (recorded) upstream.
    pub fn is_sampled(&self) -> bool {
        self.flags & SAMPLED != 0
    }

    /// The vendors' `tracestate`, if one came along.
    pub fn state(&self) -> Option<&str> {
        self.state.as_deref()
    }

    /// The context of a span continuing this one: the same trace, flags
    /// and `tracestate`, span `span_id`.
    pub fn child(&self, span_id: SpanId) -> TraceContext {
        TraceContext { span_id, ..self.clone() }
    }

    /// As a `traceparent` value (version 00).
    pub fn traceparent(&self) -> String {
        format!("00-{}-{}-{:02x}", self.trace_id, self.span_id, self.flags)
    }

    /// Sets `traceparent` (and `tracestate`, or removes it) in `headers`,
    /// replacing what they had: a record republished, dead-lettered or
    /// replayed continues from this context.
    pub fn write_into(&self, headers: &mut Headers) {
        headers.insert(header_names::TRACEPARENT, self.traceparent());
        match &self.state {
            Some(state) => headers.insert(header_names::TRACESTATE, state.as_bytes()),
            None => headers.remove(header_names::TRACESTATE),
        }
    }
}

/// Parses a `traceparent` value: the version-00 fields of any version but
/// `ff` (a later version may append fields after a `-`).
///
/// ```
/// use retry_core::trace::parse_traceparent;
///
/// let (trace, span, flags) = parse_traceparent(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
/// assert_eq!((trace.to_string().as_str(), span.to_string().as_str(), flags), ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", 1));
/// ```
pub fn parse_traceparent(value: &[u8]) -> Result<(TraceId, SpanId, u8), TraceProblem> {
    // version(2) - trace id(32) - parent id(16) - flags(2)
    const LEN: usize = 55;
    if value.len() < LEN || value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
        return Err(TraceProblem::Syntax);
    }
    let version = hex::<1>(&value[0..2]).ok_or(TraceProblem::Syntax)?[0];
    if version == 0xff {
        return Err(TraceProblem::Version);
    }
    // Version 00 is exactly 55 bytes; a later one may say more after a dash.
    if (version == 0 && value.len() != LEN) || (value.len() > LEN && value[LEN] != b'-') {
        return Err(TraceProblem::Syntax);
    }
    let trace = hex::<16>(&value[3..35]).ok_or(TraceProblem::Syntax)?;
    let span = hex::<8>(&value[36..52]).ok_or(TraceProblem::Syntax)?;
    let flags = hex::<1>(&value[53..55]).ok_or(TraceProblem::Syntax)?[0];
    let trace_id = TraceId::from_bytes(trace).ok_or(TraceProblem::ZeroId)?;
    let span_id = SpanId::from_bytes(span).ok_or(TraceProblem::ZeroId)?;
    Ok((trace_id, span_id, flags & KNOWN_FLAGS))
}

/// `digits` (lowercase hex, two per byte) as `N` bytes.
fn hex<const N: usize>(digits: &[u8]) -> Option<[u8; N]> {
    fn nibble(d: u8) -> Option<u8> {
        match d {
            b'0'..=b'9' => Some(d - b'0'),
            b'a'..=b'f' => Some(d - b'a' + 10),
            _ => None,
        }
    }
    if digits.len() != 2 * N {
        return None;
    }
    let mut out = [0; N];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        out[i] = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(out)
}

/// `value` as a `tracestate` to carry along, if it is one: printable
/// ASCII, at most [`MAX_TRACESTATE_BYTES`], at most 32 `key=value` members
/// (empty members between commas are allowed).
fn valid_tracestate(value: &[u8]) -> Option<String> {
    if value.len() > MAX_TRACESTATE_BYTES || !value.iter().all(|b| (0x20..=0x7e).contains(b)) {
        return None;
    }
    let text = std::str::from_utf8(value).ok()?;
    let members: Vec<&str> = text.split(',').map(|m| m.trim_matches([' ', '\t'])).filter(|m| !m.is_empty()).collect();
    let well_formed =
        |m: &&str| m.split_once('=').is_some_and(|(k, v)| !k.is_empty() && !v.is_empty() && !k.contains(' '));
    (!members.is_empty() && members.len() <= MAX_TRACESTATE_MEMBERS && members.iter().all(well_formed))
        .then(|| text.to_owned())
}

#[cfg(test)]
mod tests;
