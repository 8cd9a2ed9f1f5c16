use proptest::prelude::*;

use super::*;

type Headers = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// A record to encode: key, value, timestamp, headers.
#[derive(Debug, Clone)]
struct Written {
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    timestamp: i64,
    headers: Headers,
}

fn encode_written(records: &[Written], codec: Codec, producer: Option<Sequenced>) -> Bytes {
    let input: Vec<(NewRecord<'_>, HeaderSlices<'_>)> = records
        .iter()
        .map(|w| {
            let headers = w.headers.iter().map(|(n, v)| (n.as_slice(), v.as_deref())).collect();
            (NewRecord { key: w.key.as_deref(), value: w.value.as_deref(), timestamp: w.timestamp }, headers)
        })
        .collect();
    encode(&input, codec, producer)
}

/// Moves an encoded batch to `base` (the broker assigns offsets).
fn at_offset(batch: &Bytes, base: i64) -> Bytes {
    let mut b = BytesMut::from(&batch[..]);
    b[..8].copy_from_slice(&base.to_be_bytes());
    b.freeze()
}

fn record(key: &str, value: &str, headers: &[(&[u8], Option<&[u8]>)]) -> Written {
    Written {
        key: Some(key.as_bytes().to_vec()),
        value: Some(value.as_bytes().to_vec()),
        timestamp: 1_700_000_000_000,
        headers: headers.iter().map(|(n, v)| (n.to_vec(), v.map(<[u8]>::to_vec))).collect(),
    }
}

#[track_caller]
fn data(batch: &Batch) -> &[RawRecord] {
    match batch {
        Batch::Data { records, .. } => records,
        other => panic!("expected data, got {other:?}"),
    }
}

#[test]
fn headers_keep_their_order_duplicates_nulls_and_bytes() {
    let headers: &[(&[u8], Option<&[u8]>)] = &[
        (b"b", Some(b"1")),
        (b"a", Some(b"2")),
        (b"b", Some(b"3")), // a repeated name
        (b"empty", Some(b"")),
        (b"null", None),
        (b"\xff\xfe", Some(b"\x00\x9f")), // a name that is not UTF-8
    ];
    for codec in Codec::ALL {
        let bytes = at_offset(&encode_written(&[record("k", "v", headers)], codec, None), 40);
        let batches = decode_all(bytes, 1 << 20);
        let [batch] = &batches[..] else { panic!("{codec:?}: {batches:?}") };
        let [r] = data(batch) else { panic!("{codec:?}: one record expected") };
        assert_eq!(r.offset, 40, "{codec:?}");
        let got: Vec<(&[u8], Option<&[u8]>)> = r.headers.iter().map(|h| (&h.name[..], h.value.as_deref())).collect();
        assert_eq!(got, headers, "{codec:?}");
        assert_eq!((r.key.as_deref(), r.value.as_deref()), (Some(&b"k"[..]), Some(&b"v"[..])));
    }
}

#[test]
fn batches_in_a_fetch_are_split_and_a_cut_tail_is_left_out() {
    let one = at_offset(&encode_written(&[record("a", "1", &[])], Codec::None, None), 0);
    let two = at_offset(&encode_written(&[record("b", "2", &[]), record("c", "3", &[])], Codec::Lz4, None), 1);
    let mut fetched = BytesMut::new();
    fetched.extend_from_slice(&one);
    fetched.extend_from_slice(&two);
    fetched.extend_from_slice(&two[..two.len() - 1]); // cut by the fetch's size limit
    let batches = decode_all(fetched.freeze(), 1 << 20);
    let offsets: Vec<Vec<i64>> = batches.iter().map(|b| data(b).iter().map(|r| r.offset).collect()).collect();
    assert_eq!(offsets, [vec![0], vec![1, 2]]);
    assert_eq!(batches[1].header().next_offset(), 3);
}

/// A control batch as brokers write it at `offset`: one control record
/// whose key says abort (0) or commit (1); `crc` as given.
fn control(offset: i64, marker: i16, crc: Option<u32>) -> Bytes {
    let mut record = BytesMut::new();
    record.put_u8(0);
    put_varlong(&mut record, 0);
    put_varlong(&mut record, 0);
    put_varlong(&mut record, 4);
    record.put_i16(0);
    record.put_i16(marker);
    put_varlong(&mut record, 6);
    record.put_i16(0);
    record.put_i32(7);
    put_varlong(&mut record, 0);
    let mut body = BytesMut::new();
    put_varlong(&mut body, record.len() as i64);
    body.extend_from_slice(&record);
    let mut b = BytesMut::new();
    b.put_i64(offset);
    b.put_i32((HEADER_BYTES - LOG_OVERHEAD + body.len()) as i32);
    b.put_i32(0);
    b.put_i8(2);
    b.put_u32(0);
    b.put_i16(TRANSACTIONAL | CONTROL);
    b.put_i32(0);
    b.put_i64(0);
    b.put_i64(0);
    b.put_i64(77);
    b.put_i16(0);
    b.put_i32(-1);
    b.put_i32(1);
    b.extend_from_slice(&body);
    let crc = crc.unwrap_or_else(|| crc32c::crc32c(&b[CRC_FROM..]));
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b.freeze()
}

#[test]
fn control_batches_say_their_marker_and_where_they_end() {
    let check = |bytes: Bytes, expected: Marker| {
        let batches = decode_all(bytes, 1 << 20);
        let [Batch::Control { header, marker }] = &batches[..] else { panic!("{batches:?}") };
        assert_eq!((*marker, header.next_offset(), header.producer_id), (expected, 8, 77));
        assert!(header.is_transactional());
    };
    check(control(7, 0, None), Marker::Abort);
    check(control(7, 1, None), Marker::Commit);
    check(control(7, 5, None), Marker::Other);
    // librdkafka's mock cluster writes markers with a zero checksum.
    check(control(7, 1, Some(0)), Marker::Commit);
}

#[track_caller]
fn undecodable(bytes: Bytes, max: usize, problem: &str) {
    let batches = decode_all(bytes.clone(), max);
    let [Batch::Undecodable { raw, problem: said, header }] = &batches[..] else { panic!("{batches:?}") };
    assert_eq!(raw, &bytes, "the batch is kept as fetched");
    assert_eq!(header.size, bytes.len());
    assert!(said.contains(problem), "{said:?} should say {problem:?}");
}

#[test]
fn batches_that_cannot_be_read_say_why_and_keep_their_bytes() {
    let good = at_offset(&encode_written(&[record("k", "v", &[])], Codec::None, None), 3);
    // A flipped bit in a value.
    let mut corrupt = BytesMut::from(&good[..]);
    let last = corrupt.len() - 2;
    corrupt[last] ^= 1;
    undecodable(corrupt.freeze(), 1 << 20, "checksum mismatch");
    // A codec Kafka does not define: attributes bits 0-2 = 7.
    let mut unknown = BytesMut::from(&good[..]);
    unknown[22] |= 7;
    let crc = crc32c::crc32c(&unknown[CRC_FROM..]);
    unknown[17..21].copy_from_slice(&crc.to_be_bytes());
    undecodable(unknown.freeze(), 1 << 20, "unknown compression codec 7");
    // The old message formats.
    let mut old = BytesMut::from(&good[..]);
    old[16] = 1;
    undecodable(old.freeze(), 1 << 20, "only v2 batches");
    // A record count larger than what the batch holds.
    let mut count = BytesMut::from(&good[..]);
    count[57..61].copy_from_slice(&5i32.to_be_bytes());
    let crc = crc32c::crc32c(&count[CRC_FROM..]);
    count[17..21].copy_from_slice(&crc.to_be_bytes());
    undecodable(count.freeze(), 1 << 20, "record 1 of 5");
}

#[test]
fn decompression_is_capped() {
    // A megabyte of zeros compresses to almost nothing.
    let zeros = Written { key: None, value: Some(vec![0; 1 << 20]), timestamp: 0, headers: vec![] };
    for codec in [Codec::Gzip, Codec::Snappy, Codec::Lz4, Codec::Zstd] {
        let bytes = encode_written(std::slice::from_ref(&zeros), codec, None);
        assert!(bytes.len() < 64 << 10, "{codec:?} compressed to {}", bytes.len());
        undecodable(bytes.clone(), 512 << 10, "inflates beyond 524288 bytes");
        let batches = decode_all(bytes, 2 << 20);
        assert_eq!(data(&batches[0])[0].value.as_ref().map(Bytes::len), Some(1 << 20), "{codec:?}");
    }
}

#[test]
fn producer_fields_and_timestamps_are_written() {
    let producer = Sequenced { producer_id: 9, producer_epoch: 2, base_sequence: 41 };
    let mut early = record("a", "1", &[]);
    early.timestamp = 1000;
    let mut late = record("b", "2", &[]);
    late.timestamp = 1500;
    let bytes = encode_written(&[late, early], Codec::Zstd, Some(producer));
    let header = BatchHeader::peek(&bytes).unwrap();
    assert_eq!((header.producer_id, header.producer_epoch, header.base_sequence), (9, 2, 41));
    assert_eq!((header.base_timestamp, header.max_timestamp, header.record_count), (1000, 1500, 2));
    assert_eq!(header.codec(), Some(Codec::Zstd));
    let stamps: Vec<i64> = data(&decode_all(bytes, 1 << 20)[0]).iter().map(|r| r.timestamp).collect();
    assert_eq!(stamps, [1500, 1000]);
}

#[test]
fn xerial_and_raw_snappy_both_read() {
    let records = b"some records, some records, some records";
    let raw = snap::raw::Encoder::new().compress_vec(records).unwrap();
    assert_eq!(&snappy_decompress(&raw, 1 << 10).unwrap()[..], records);
    let framed = compress(Codec::Snappy, records);
    assert!(framed.starts_with(XERIAL_MAGIC));
    assert_eq!(&snappy_decompress(&framed, 1 << 10).unwrap()[..], records);
}

/// kafka-protocol's encoder writes batches our decoder reads the same
/// (a second, independent implementation of the format).
#[test]
fn batches_written_by_kafka_protocol_decode() {
    use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
    for (compression, codec) in
        [(Compression::None, Codec::None), (Compression::Gzip, Codec::Gzip), (Compression::Snappy, Codec::Snappy)]
    {
        let records: Vec<Record> = (0..3)
            .map(|i| Record {
                transactional: false,
                delete_horizon: false,
                control: false,
                partition_leader_epoch: 0,
                producer_id: 5,
                producer_epoch: 1,
                timestamp_type: TimestampType::Creation,
                offset: 100 + i,
                sequence: i as i32,
                timestamp: 1_700_000_000_000 + i,
                key: Some(Bytes::from(format!("key-{i}"))),
                value: (i != 1).then(|| Bytes::from(format!("value-{i}"))),
                headers: [(kafka_protocol::protocol::StrBytes::from_static_str("h"), Some(Bytes::from_static(b"x")))]
                    .into_iter()
                    .collect(),
            })
            .collect();
        let mut buf = BytesMut::new();
        let options = RecordEncodeOptions { version: 2, compression };
        RecordBatchEncoder::encode(&mut buf, &records, &options).unwrap();
        let batches = decode_all(buf.freeze(), 1 << 20);
        let [batch] = &batches[..] else { panic!("{codec:?}: {batches:?}") };
        assert_eq!(batch.header().codec(), Some(codec));
        let got: Vec<(i64, i64, Option<Bytes>, Option<Bytes>)> =
            data(batch).iter().map(|r| (r.offset, r.timestamp, r.key.clone(), r.value.clone())).collect();
        let expected: Vec<_> =
            records.iter().map(|r| (r.offset, r.timestamp, r.key.clone(), r.value.clone())).collect();
        assert_eq!(got, expected, "{codec:?}");
    }
}

fn written() -> impl Strategy<Value = Written> {
    let bytes = || proptest::collection::vec(any::<u8>(), 0..40);
    (
        proptest::option::of(bytes()),
        proptest::option::of(bytes()),
        0i64..4_000_000_000_000,
        proptest::collection::vec((bytes(), proptest::option::of(bytes())), 0..5),
    )
        .prop_map(|(key, value, timestamp, headers)| Written { key, value, timestamp, headers })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn every_codec_round_trips(records in proptest::collection::vec(written(), 1..20), codec in proptest::sample::select(Codec::ALL.to_vec()), base in 0i64..1 << 40) {
        let bytes = at_offset(&encode_written(&records, codec, None), base);
        let batches = decode_all(bytes, 1 << 20);
        prop_assert_eq!(batches.len(), 1);
        let decoded = data(&batches[0]);
        prop_assert_eq!(decoded.len(), records.len());
        for (i, (got, want)) in decoded.iter().zip(&records).enumerate() {
            prop_assert_eq!(got.offset, base + i as i64);
            prop_assert_eq!(got.timestamp, want.timestamp);
            prop_assert_eq!(got.key.as_deref(), want.key.as_deref());
            prop_assert_eq!(got.value.as_deref(), want.value.as_deref());
            let headers: Headers = got.headers.iter().map(|h| (h.name.to_vec(), h.value.as_ref().map(|v| v.to_vec()))).collect();
            prop_assert_eq!(&headers, &want.headers);
        }
        prop_assert_eq!(batches[0].header().next_offset(), base + records.len() as i64);
    }

    #[test]
    fn sizes_are_not_underestimated(records in proptest::collection::vec(written(), 1..20)) {
        let estimate: usize = records.iter().map(|w| record_size(
            NewRecord { key: w.key.as_deref(), value: w.value.as_deref(), timestamp: 0 },
            w.headers.iter().map(|(n, v)| (n.as_slice(), v.as_deref())),
        )).sum();
        let encoded = encode_written(&records, Codec::None, None);
        prop_assert!(HEADER_BYTES + estimate >= encoded.len(), "estimated {} for {}", HEADER_BYTES + estimate, encoded.len());
    }

    #[test]
    fn any_bytes_decode_without_panicking(garbage in proptest::collection::vec(any::<u8>(), 0..300), cut in 0usize..300) {
        // Any batch header over random bytes, with a valid checksum, so the records are read.
        let good = at_offset(&encode_written(&[record("k", "v", &[(b"h", Some(b"x"))])], Codec::None, None), 0);
        let mut b = BytesMut::from(&good[..HEADER_BYTES]);
        b.extend_from_slice(&garbage);
        let len = (b.len() - LOG_OVERHEAD) as i32;
        b[8..12].copy_from_slice(&len.to_be_bytes());
        let crc = crc32c::crc32c(&b[CRC_FROM..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        let _ = decode_all(b.freeze(), 1 << 16);
        let _ = decode_all(Bytes::from(garbage[..cut.min(garbage.len())].to_vec()), 1 << 16);
    }

    #[test]
    fn varints_round_trip(v in any::<i64>()) {
        let mut out = BytesMut::new();
        put_varlong(&mut out, v);
        prop_assert_eq!(out.len(), varlong_len(v));
        let mut r = &out[..];
        prop_assert_eq!(read_varlong(&mut r), Ok(v));
        prop_assert!(r.is_empty());
    }
}
