//! Fuzz targets: every decoder that reads bytes another program wrote,
//! driven by property tests at scale (the toolchain here has no libFuzzer).
//!
//! Each target first runs its committed corpus (`fuzz/corpus/<target>/`,
//! one input per file: valid inputs and the edge cases that once broke
//! something), then `FUZZ_CASES` random inputs (256 by default; `cargo
//! xtask fuzz` runs many more, within a time budget). A failing input is
//! shrunk and saved by proptest under `fuzz/main.proptest-regressions`,
//! which is committed: it runs first from then on, a regression test.
//!
//! What each target checks, beyond "never panics": what it promises of
//! its output (bounded decompression, a position that reads back the
//! same, amounts that pass the rules only when they are what they claim).

use std::path::PathBuf;

use proptest::prelude::*;

/// How many random inputs each target runs.
fn cases() -> u32 {
    std::env::var("FUZZ_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(256)
}

fn config() -> ProptestConfig {
    ProptestConfig { cases: cases(), max_shrink_iters: 4096, ..ProptestConfig::default() }
}

/// The committed inputs of `target`, in name order.
fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("the corpus of {target} ({}): {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "the corpus of {target} is empty");
    files
        .into_iter()
        .map(|f| (f.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&f).unwrap()))
        .collect()
}

/// Bytes: often a mutation of a corpus input (bytes flipped, cut,
/// spliced), else random.
fn mutated(target: &'static str) -> impl Strategy<Value = Vec<u8>> {
    let seeds: Vec<Vec<u8>> = corpus(target).into_iter().map(|(_, b)| b).collect();
    let random = proptest::collection::vec(any::<u8>(), 0..512);
    let edits = proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..4), 1..8);
    let mutation = (proptest::sample::select(seeds), edits).prop_map(|(mut bytes, edits)| {
        for (at, byte, kind) in edits {
            let i = if bytes.is_empty() { 0 } else { at.index(bytes.len()) };
            match kind {
                0 if !bytes.is_empty() => bytes[i] = byte,
                1 => bytes.insert(i, byte),
                2 if !bytes.is_empty() => {
                    bytes.remove(i);
                }
                _ => bytes.truncate(i),
            }
        }
        bytes
    });
    prop_oneof![1 => random, 3 => mutation]
}

// ---- the event JSON and its amounts (billing) ----

fn event_json(bytes: &[u8]) {
    let rules = billing::ChargeRules::new(
        vec![billing::Currency::EUR, "JPY".parse().unwrap()],
        "EUR=10000,JPY=1500000".parse().unwrap(),
    )
    .unwrap();
    if let Ok(event) = billing::OrderConfirmedEvent::from_json(bytes) {
        if let Ok(money) = rules.check(event.total_amount, event.currency) {
            // What is charged is what the event said, in the currency's decimals.
            let charged: rust_decimal::Decimal = money.amount.parse().expect("a charged amount is a number");
            assert_eq!(charged, event.total_amount, "{}", String::from_utf8_lossy(bytes));
            assert!(charged > rust_decimal::Decimal::ZERO, "{}", String::from_utf8_lossy(bytes));
        }
    }
}

/// Events whose amount is any text or number JSON can hold.
fn events_with_odd_amounts() -> impl Strategy<Value = Vec<u8>> {
    let amount = prop_oneof![
        "-?[0-9]{0,30}(\\.[0-9]{0,30})?([eE][-+]?[0-9]{1,4})?".prop_map(|n| n.to_string()),
        "\\PC{0,40}".prop_map(|s| serde_json::to_string(&s).unwrap()),
        "-?[0-9]{1,20}(\\.[0-9]{1,20})?".prop_map(|n| format!("\"{n}\"")),
    ];
    let currency = prop_oneof![Just(String::new()), "[A-Za-z]{0,4}".prop_map(|c| format!(r#","currency":"{c}""#))];
    (amount, currency).prop_map(|(amount, currency)| {
        format!(
            r#"{{"event_id":"0b9f6c1e-8a52-4c0e-9a0b-6d2f3b1c4e5a","order_id":"5c1e2d3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f","customer_id":"d2a4b6c8-e0f2-4a4c-8e6a-8c0e2a4c6e8a","total_amount":{amount}{currency}}}"#
        )
        .into_bytes()
    })
}

// ---- retry headers, and the decisions taken over them (retry-core) ----

fn retry_headers(pairs: &[(String, Vec<u8>)]) {
    use retry_core::{
        replay::ReplayGuards, replay::ReplayTarget, HandlerError, RecordMeta, RetryHeaders, RetryPolicy, Timestamp,
    };
    let headers: retry_core::Headers = pairs.iter().cloned().collect();
    let _ = RetryHeaders::decode(&headers);
    let _ = RetryHeaders::decode_replay_count(&headers);
    let _ = RetryHeaders::decode_first_timestamp(&headers);
    let _ = RetryHeaders::decode_window_overridden_at(&headers);
    let config = retry_core::PolicyConfig {
        deadline: Some(std::time::Duration::from_secs(60)),
        max_event_age: Some(std::time::Duration::from_secs(3600)),
        ..Default::default()
    };
    let topology = retry_core::RetryTopology::new("o", &"5s,30s".parse().unwrap()).unwrap();
    let policy = RetryPolicy::new(topology, config);
    let now = Timestamp::from_millis(1_700_000_000_000);
    for topic in ["o", "o.retry-5s", "o.retry-30s"] {
        let stage = policy.stage_of(topic).unwrap();
        let record = RecordMeta { topic, partition: 0, offset: 1, timestamp: Some(now), headers: &headers };
        let _ = policy.admit(stage, &record, now);
        let _ = policy.due_at(stage, &record, now);
        for outcome in [Ok(()), Err(HandlerError::transient("t")), Err(HandlerError::permanent("p"))] {
            let decision = policy.decide(stage, &record, &outcome, now);
            // Whatever came in, what goes out decodes.
            if let retry_core::Decision::Retry { headers, .. } | retry_core::Decision::DeadLetter { headers, .. } =
                decision
            {
                RetryHeaders::decode(&headers).expect("our own headers decode");
            }
        }
    }
    for target in [ReplayTarget::Source, ReplayTarget::FirstRetry] {
        for max_age in [None, Some(std::time::Duration::from_secs(3600))] {
            let _ = policy.replay_headers(&headers, target, now, ReplayGuards { max_replays: Some(3), max_age });
        }
    }
}

/// Header lists: our names with any value, or the corpus's lines
/// (`name=value` per line) mutated.
fn header_lists() -> impl Strategy<Value = Vec<(String, Vec<u8>)>> {
    let ours = proptest::sample::select(retry_core::header_names::ALL.to_vec()).prop_map(str::to_owned);
    let name = prop_oneof![3 => ours, 1 => "[a-z-]{1,12}"];
    let value = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..24),
        "-?[0-9]{0,20}".prop_map(String::into_bytes),
        "[a-z-]{0,24}".prop_map(String::into_bytes),
    ];
    proptest::collection::vec((name, value), 0..16)
}

fn header_lines(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    bytes
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| {
            let at = l.iter().position(|b| *b == b'=').unwrap_or(l.len());
            (String::from_utf8_lossy(&l[..at]).into_owned(), l.get(at + 1..).unwrap_or_default().to_vec())
        })
        .collect()
}

// ---- the group protocol (retry-kafka) ----

fn group_protocol(bytes: &[u8]) {
    if let Ok(topics) = retry_kafka::fuzzing::group_subscription(bytes) {
        assert!(topics.len() <= bytes.len(), "more topics than bytes");
    }
    if let Ok(assignment) = retry_kafka::fuzzing::group_assignment(bytes) {
        let partitions: usize = assignment.iter().map(|(_, p)| p.len()).sum();
        assert!(partitions * 4 <= bytes.len(), "more partitions than bytes");
    }
}

// ---- the operators' position metadata (retry-core) ----

fn operators_position(committed: Option<i64>, metadata: &str, earliest: i64) {
    use retry_core::operators::OperatorsPosition;
    let position = OperatorsPosition::new(committed, Some(metadata), earliest);
    let written = position.metadata();
    // No longer than the cap, or than what it read (a foreign writer's).
    assert!(written.len() <= retry_core::operators::MAX_POSITION_METADATA_BYTES.max(metadata.len()), "{written}");
    // What it writes, it reads back as the same position.
    let again = OperatorsPosition::new(Some(position.next()), Some(&written), earliest);
    assert_eq!(again, position, "{metadata:?} wrote {written:?}");
    let _ = position.handled_above(i64::MAX);
    let _ = position.merge(&again);
}

// ---- record batches (retry-kafka) ----

const MAX_INFLATED: usize = 1 << 16;

fn record_batches(bytes: &[u8]) {
    let decoded = retry_kafka::fuzzing::record_batches(bytes, MAX_INFLATED);
    assert!(decoded.record_bytes <= bytes.len().max(MAX_INFLATED), "{decoded:?}");
}

fn checksummed(codec: u8, compress_first: bool, count: i32, body: &[u8]) {
    let decoded = retry_kafka::fuzzing::checksummed_batch(codec, compress_first, count, body, MAX_INFLATED);
    assert_eq!(decoded.batches, 1, "{decoded:?}");
    // Decompression is bounded: a batch inflates to at most the cap.
    assert!(decoded.record_bytes <= body.len().max(MAX_INFLATED), "{decoded:?}");
}

#[test]
fn corpus_inputs_decode_without_panicking() {
    for (name, bytes) in corpus("event_json") {
        eprintln!("event_json/{name}");
        event_json(&bytes);
    }
    for (name, bytes) in corpus("retry_headers") {
        eprintln!("retry_headers/{name}");
        retry_headers(&header_lines(&bytes));
    }
    for (name, bytes) in corpus("group_protocol") {
        eprintln!("group_protocol/{name}");
        group_protocol(&bytes);
    }
    for (name, bytes) in corpus("operators_position") {
        eprintln!("operators_position/{name}");
        operators_position(Some(10), &String::from_utf8_lossy(&bytes), 0);
    }
    // The corpus holds what it says it holds: the targets reach past the
    // first check.
    let valid = corpus("event_json").into_iter().find(|(n, _)| n == "valid").unwrap().1;
    assert!(billing::OrderConfirmedEvent::from_json(&valid).is_ok(), "event_json/valid");
    let batches = |name: &str| {
        let (_, bytes) = corpus("record_batches").into_iter().find(|(n, _)| n == name).unwrap();
        let d = retry_kafka::fuzzing::record_batches(&bytes, MAX_INFLATED);
        (d.batches, d.records, d.control, d.undecodable)
    };
    assert_eq!(batches("one-record"), (1, 1, 0, 0));
    assert_eq!(batches("two-batches"), (2, 2, 0, 0));
    assert_eq!(batches("control-commit"), (1, 0, 1, 0));
    for (name, bytes) in corpus("record_batches") {
        eprintln!("record_batches/{name}");
        record_batches(&bytes);
        for codec in 0..=4 {
            checksummed(codec, true, 3, &bytes);
            checksummed(codec, false, 3, &bytes);
        }
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn fuzz_event_json(bytes in mutated("event_json")) {
        event_json(&bytes);
    }

    #[test]
    fn fuzz_event_amounts(bytes in events_with_odd_amounts()) {
        event_json(&bytes);
    }

    #[test]
    fn fuzz_retry_headers(pairs in header_lists()) {
        retry_headers(&pairs);
    }

    #[test]
    fn fuzz_retry_header_lines(bytes in mutated("retry_headers")) {
        retry_headers(&header_lines(&bytes));
    }

    #[test]
    fn fuzz_group_protocol(bytes in mutated("group_protocol")) {
        group_protocol(&bytes);
    }

    #[test]
    fn fuzz_operators_position(
        committed in proptest::option::of(-5i64..1 << 40),
        metadata in prop_oneof![
            "\\PC{0,64}",
            "handled-above:[0-9,-]{0,80}",
            proptest::collection::vec((0i64..1 << 40, 0i64..1000), 0..20).prop_map(|r| {
                let ranges: Vec<String> = r.iter().map(|(a, n)| format!("{a}-{}", a + n)).collect();
                format!("handled-above:{}", ranges.join(","))
            }),
            mutated("operators_position").prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        ],
        earliest in 0i64..1 << 40,
    ) {
        operators_position(committed, &metadata, earliest);
    }

    #[test]
    fn fuzz_record_batches(bytes in mutated("record_batches")) {
        record_batches(&bytes);
    }

    #[test]
    fn fuzz_checksummed_batches(
        codec in 0u8..8,
        compress_first in any::<bool>(),
        count in prop_oneof![Just(1), 0..10, Just(i32::MAX), Just(-1)],
        body in mutated("record_batches"),
    ) {
        checksummed(codec, compress_first, count, &body);
    }
}
