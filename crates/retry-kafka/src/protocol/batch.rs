//! Kafka's record batch (magic 2), read and written by us: records keep
//! their headers in order with duplicates and null values, header names
//! that are not UTF-8 are kept as bytes, control batches (transaction
//! markers) say where they end, every codec Kafka knows is decoded (gzip,
//! snappy, lz4, zstd) within a size cap, and a batch that cannot be read
//! says why instead of failing the whole fetch.
//!
//! Pure: bytes in, bytes out. The layout (KIP-98):
//!
//! ```text
//! baseOffset i64 | batchLength i32 | partitionLeaderEpoch i32 | magic i8 |
//! crc u32 (CRC-32C of what follows) | attributes i16 | lastOffsetDelta i32 |
//! baseTimestamp i64 | maxTimestamp i64 | producerId i64 | producerEpoch i16 |
//! baseSequence i32 | recordCount i32 | records (compressed as attributes say)
//! ```

use std::io::Read;

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Bytes before `batchLength`'s count begins (baseOffset, batchLength).
const LOG_OVERHEAD: usize = 12;
/// The whole batch header, records excluded.
pub(crate) const HEADER_BYTES: usize = 61;
/// Where the CRC-covered part begins (attributes).
const CRC_FROM: usize = 21;

const TIMESTAMP_TYPE: i16 = 0x08;
const TRANSACTIONAL: i16 = 0x10;
const CONTROL: i16 = 0x20;

/// How a batch's records are compressed (attributes' low three bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Codec {
    /// Not compressed.
    None,
    /// gzip.
    Gzip,
    /// snappy (raw, or in xerial's framing as Java writes it).
    Snappy,
    /// LZ4 frames.
    Lz4,
    /// Zstandard.
    Zstd,
}

impl Codec {
    fn of(attributes: i16) -> Option<Codec> {
        Some(match attributes & 0x07 {
            0 => Codec::None,
            1 => Codec::Gzip,
            2 => Codec::Snappy,
            3 => Codec::Lz4,
            4 => Codec::Zstd,
            _ => return None,
        })
    }

    fn bits(self) -> i16 {
        match self {
            Codec::None => 0,
            Codec::Gzip => 1,
            Codec::Snappy => 2,
            Codec::Lz4 => 3,
            Codec::Zstd => 4,
        }
    }

    /// Every codec.
    #[cfg(test)]
    pub(crate) const ALL: [Codec; 5] = [Codec::None, Codec::Gzip, Codec::Snappy, Codec::Lz4, Codec::Zstd];
}

/// A batch's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchHeader {
    pub(crate) base_offset: i64,
    /// The whole batch's size in bytes, from `baseOffset` on.
    pub(crate) size: usize,
    pub(crate) magic: i8,
    pub(crate) crc: u32,
    pub(crate) attributes: i16,
    pub(crate) last_offset_delta: i32,
    pub(crate) base_timestamp: i64,
    pub(crate) max_timestamp: i64,
    pub(crate) producer_id: i64,
    pub(crate) producer_epoch: i16,
    pub(crate) base_sequence: i32,
    pub(crate) record_count: i32,
}

impl BatchHeader {
    /// Reads the header at the start of `bytes`, and the batch's size;
    /// `None` when `bytes` does not hold a whole batch (a fetch may end in
    /// a partial one). Fields past `magic` are only meaningful for magic 2.
    pub(crate) fn peek(bytes: &[u8]) -> Option<BatchHeader> {
        if bytes.len() < LOG_OVERHEAD + 5 {
            return None;
        }
        let mut b = bytes;
        let base_offset = b.get_i64();
        let length = usize::try_from(b.get_i32()).ok()?;
        let size = LOG_OVERHEAD + length;
        if bytes.len() < size {
            return None;
        }
        let _leader_epoch = b.get_i32();
        let magic = b.get_i8();
        let mut header = BatchHeader {
            base_offset,
            size,
            magic,
            crc: 0,
            attributes: 0,
            last_offset_delta: 0,
            base_timestamp: -1,
            max_timestamp: -1,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            record_count: 0,
        };
        if magic != 2 || size < HEADER_BYTES {
            return Some(header);
        }
        header.crc = b.get_u32();
        header.attributes = b.get_i16();
        header.last_offset_delta = b.get_i32();
        header.base_timestamp = b.get_i64();
        header.max_timestamp = b.get_i64();
        header.producer_id = b.get_i64();
        header.producer_epoch = b.get_i16();
        header.base_sequence = b.get_i32();
        header.record_count = b.get_i32();
        Some(header)
    }

    /// The offset after the batch's last (even when compaction removed
    /// records from it).
    pub(crate) fn next_offset(&self) -> i64 {
        self.base_offset + i64::from(self.last_offset_delta.max(0)) + 1
    }

    /// The last offset the batch covers.
    pub(crate) fn last_offset(&self) -> i64 {
        self.next_offset() - 1
    }

    pub(crate) fn is_control(&self) -> bool {
        self.magic == 2 && self.attributes & CONTROL != 0
    }

    pub(crate) fn is_transactional(&self) -> bool {
        self.magic == 2 && self.attributes & TRANSACTIONAL != 0
    }

    /// The batch's codec; `None` for bits Kafka does not define.
    pub(crate) fn codec(&self) -> Option<Codec> {
        Codec::of(self.attributes)
    }
}

/// A header as written: a name that need not be UTF-8, a value that may be null.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawHeader {
    pub(crate) name: Bytes,
    pub(crate) value: Option<Bytes>,
}

/// A data record as decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawRecord {
    pub(crate) offset: i64,
    /// Milliseconds since the epoch; negative when the producer set none.
    pub(crate) timestamp: i64,
    pub(crate) key: Option<Bytes>,
    pub(crate) value: Option<Bytes>,
    pub(crate) headers: Vec<RawHeader>,
    /// The codec of its batch.
    pub(crate) codec: Codec,
}

impl RawRecord {
    /// The headers a handler sees (see [`valued_headers`]).
    pub(crate) fn valued_headers(&self) -> Result<(retry_core::Headers, usize), usize> {
        valued_headers(&self.headers)
    }
}

/// The headers a handler sees: those with a value, in order, and how many
/// had none; `Err(i)` when the name of header `i` is not UTF-8.
pub(crate) fn valued_headers(raw: &[RawHeader]) -> Result<(retry_core::Headers, usize), usize> {
    let mut headers = Vec::with_capacity(raw.len());
    let mut nulls = 0;
    for (i, h) in raw.iter().enumerate() {
        let name = std::str::from_utf8(&h.name).map_err(|_| i)?;
        match &h.value {
            Some(value) => headers.push((name.to_owned(), value.to_vec())),
            None => nulls += 1,
        }
    }
    Ok((headers.into_iter().collect(), nulls))
}

/// What a transaction marker says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Marker {
    Abort,
    Commit,
    /// Another control record type (future ones): skipped like a marker.
    Other,
}

/// What one batch of a fetch became.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Batch {
    /// Data records.
    Data { header: BatchHeader, records: Vec<RawRecord> },
    /// A control batch: no record for the handler.
    Control { header: BatchHeader, marker: Marker },
    /// A batch that cannot be read: its bytes as fetched, and why.
    Undecodable { header: BatchHeader, raw: Bytes, problem: String },
}

impl Batch {
    pub(crate) fn header(&self) -> &BatchHeader {
        match self {
            Batch::Data { header, .. } | Batch::Control { header, .. } | Batch::Undecodable { header, .. } => header,
        }
    }
}

/// Splits a fetch's record bytes into whole batches and decodes each; a
/// trailing partial batch (the fetch's size limit cut it) is left out.
/// `max_inflated` caps what one batch may decompress to.
pub(crate) fn decode_all(mut bytes: Bytes, max_inflated: usize) -> Vec<Batch> {
    let mut out = Vec::new();
    while let Some(header) = BatchHeader::peek(&bytes) {
        let raw = bytes.split_to(header.size);
        out.push(decode(header, raw, max_inflated));
    }
    out
}

/// Decodes one whole batch, `raw` from its `baseOffset` on.
pub(crate) fn decode(header: BatchHeader, raw: Bytes, max_inflated: usize) -> Batch {
    let undecodable = |problem: String| Batch::Undecodable { header, raw: raw.clone(), problem };
    if header.magic != 2 {
        return undecodable(format!(
            "message format v{} (magic {}) is not read: only v2 batches",
            header.magic, header.magic
        ));
    }
    if header.size < HEADER_BYTES {
        return undecodable(format!("a batch of {} bytes is shorter than its header", header.size));
    }
    if header.is_control() {
        // Markers are read from their header and first record alone; their
        // checksum is not checked (librdkafka's mock cluster writes zero).
        let marker = control_marker(&raw[HEADER_BYTES..]).unwrap_or(Marker::Other);
        return Batch::Control { header, marker };
    }
    let computed = crc32c::crc32c(&raw[CRC_FROM..]);
    if computed != header.crc {
        return undecodable(format!(
            "checksum mismatch: the batch says {:#010x}, its bytes {computed:#010x}",
            header.crc
        ));
    }
    let Some(codec) = header.codec() else {
        return undecodable(format!("unknown compression codec {}", header.attributes & 0x07));
    };
    let body = raw.slice(HEADER_BYTES..);
    let records = match decompress(codec, body, max_inflated) {
        Ok(records) => records,
        Err(problem) => return undecodable(problem),
    };
    match decode_records(&header, records) {
        Ok(records) => Batch::Data { header, records },
        Err(problem) => undecodable(problem),
    }
}

/// The marker a control batch's first record carries in its key
/// (version i16, type i16: 0 abort, 1 commit).
fn control_marker(mut records: &[u8]) -> Option<Marker> {
    let _length = read_varint(&mut records).ok()?;
    let _attributes = take(&mut records, 1).ok()?;
    let _timestamp_delta = read_varlong(&mut records).ok()?;
    let _offset_delta = read_varint(&mut records).ok()?;
    let key_len = read_varint(&mut records).ok()?;
    if key_len < 4 {
        return None;
    }
    let mut key = take(&mut records, 4).ok()?;
    let _version = key.get_i16();
    Some(match key.get_i16() {
        0 => Marker::Abort,
        1 => Marker::Commit,
        _ => Marker::Other,
    })
}

/// The records' bytes of a batch, decompressed; no more than `max` bytes
/// (a batch that inflates further is refused, not read into memory).
fn decompress(codec: Codec, body: Bytes, max: usize) -> Result<Bytes, String> {
    let limited = |reader: &mut dyn Read, what: &str| -> Result<Bytes, String> {
        let mut out = Vec::new();
        reader
            .take(max as u64 + 1)
            .read_to_end(&mut out)
            .map_err(|e| format!("cannot decompress the {what} batch: {e}"))?;
        if out.len() > max {
            return Err(format!("the {what} batch inflates beyond {max} bytes (the cap on one decompressed batch)"));
        }
        Ok(Bytes::from(out))
    };
    match codec {
        Codec::None => Ok(body),
        Codec::Gzip => limited(&mut flate2::read::GzDecoder::new(body.as_ref()), "gzip"),
        Codec::Lz4 => limited(&mut lz4_flex::frame::FrameDecoder::new(body.as_ref()), "lz4"),
        Codec::Zstd => {
            let mut decoder = ruzstd::decoding::StreamingDecoder::new(body.as_ref())
                .map_err(|e| format!("cannot decompress the zstd batch: {e}"))?;
            limited(&mut decoder, "zstd")
        }
        Codec::Snappy => snappy_decompress(&body, max),
    }
}

/// xerial's snappy framing, which Java's producers write: a magic header,
/// then blocks each prefixed with its compressed length.
const XERIAL_MAGIC: &[u8] = b"\x82SNAPPY\x00";

fn snappy_decompress(body: &[u8], max: usize) -> Result<Bytes, String> {
    let block = |compressed: &[u8], out: &mut Vec<u8>| -> Result<(), String> {
        let len =
            snap::raw::decompress_len(compressed).map_err(|e| format!("cannot decompress the snappy batch: {e}"))?;
        if out.len() + len > max {
            return Err(format!("the snappy batch inflates beyond {max} bytes (the cap on one decompressed batch)"));
        }
        let start = out.len();
        out.resize(start + len, 0);
        snap::raw::Decoder::new()
            .decompress(compressed, &mut out[start..])
            .map_err(|e| format!("cannot decompress the snappy batch: {e}"))?;
        Ok(())
    };
    let mut out = Vec::new();
    if body.len() >= 16 && body.starts_with(XERIAL_MAGIC) {
        let mut rest = &body[16..]; // magic, version, compatible version
        while !rest.is_empty() {
            if rest.len() < 4 {
                return Err("a truncated snappy block length".into());
            }
            let len = rest.get_i32();
            let len = usize::try_from(len).map_err(|_| format!("a snappy block of negative length {len}"))?;
            if rest.len() < len {
                return Err("a truncated snappy block".into());
            }
            block(&rest[..len], &mut out)?;
            rest = &rest[len..];
        }
    } else {
        block(body, &mut out)?;
    }
    Ok(Bytes::from(out))
}

/// Decodes the records of a batch (decompressed).
fn decode_records(header: &BatchHeader, records: Bytes) -> Result<Vec<RawRecord>, String> {
    let count =
        usize::try_from(header.record_count).map_err(|_| format!("a record count of {}", header.record_count))?;
    // Each record takes at least 7 bytes: the count cannot be trusted to size a vector.
    let mut out = Vec::with_capacity(count.min(records.len() / 7 + 1));
    let mut pos = 0;
    for i in 0..count {
        let record = decode_record(header, &records, &mut pos)
            .map_err(|e| format!("record {i} of {count} in the batch at offset {}: {e}", header.base_offset))?;
        out.push(record);
    }
    Ok(out)
}

/// Decodes the record at `*pos` of `all` and moves `*pos` past it.
fn decode_record(header: &BatchHeader, all: &Bytes, pos: &mut usize) -> Result<RawRecord, String> {
    let mut cursor = &all[*pos..];
    let length = read_varint(&mut cursor)?;
    let length = usize::try_from(length).map_err(|_| format!("a record of negative length {length}"))?;
    if cursor.len() < length {
        return Err(format!("a record of {length} bytes, with {} left", cursor.len()));
    }
    // The record's own bytes, as a slice of the batch (no copy).
    let start = all.len() - cursor.len();
    let body = all.slice(start..start + length);
    *pos = start + length;
    let mut r: &[u8] = body.as_ref();
    let _attributes = take(&mut r, 1)?;
    let timestamp_delta = read_varlong(&mut r)?;
    let offset_delta = read_varint(&mut r)?;
    let key = read_bytes(&body, &mut r)?;
    let value = read_bytes(&body, &mut r)?;
    let header_count = read_varint(&mut r)?;
    let header_count = usize::try_from(header_count).map_err(|_| format!("a header count of {header_count}"))?;
    let mut headers = Vec::with_capacity(header_count.min(r.len() / 2 + 1));
    for _ in 0..header_count {
        let name = read_bytes(&body, &mut r)?.ok_or("a header without a name")?;
        let value = read_bytes(&body, &mut r)?;
        headers.push(RawHeader { name, value });
    }
    if !r.is_empty() {
        return Err(format!("{} bytes left over after the record's headers", r.len()));
    }
    let timestamp = if header.attributes & TIMESTAMP_TYPE != 0 {
        header.max_timestamp // log append time: the broker's, for every record
    } else {
        header.base_timestamp.saturating_add(timestamp_delta)
    };
    Ok(RawRecord {
        offset: header.base_offset + i64::from(offset_delta),
        timestamp,
        key,
        value,
        headers,
        codec: header.codec().unwrap_or(Codec::None),
    })
}

/// A length-prefixed byte string (length -1: null), sliced out of `all`.
fn read_bytes(all: &Bytes, r: &mut &[u8]) -> Result<Option<Bytes>, String> {
    let len = read_varint(r)?;
    if len < 0 {
        return Ok(None);
    }
    let len = len as usize;
    if r.len() < len {
        return Err(format!("a field of {len} bytes, with {} left", r.len()));
    }
    let start = all.len() - r.len();
    *r = &r[len..];
    Ok(Some(all.slice(start..start + len)))
}

fn take<'a>(r: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
    if r.len() < n {
        return Err(format!("{n} bytes expected, {} left", r.len()));
    }
    let (head, tail) = r.split_at(n);
    *r = tail;
    Ok(head)
}

fn read_varlong(r: &mut &[u8]) -> Result<i64, String> {
    let mut value: u64 = 0;
    for shift in (0..70).step_by(7) {
        let Some((&byte, rest)) = r.split_first() else { return Err("a truncated varint".into()) };
        *r = rest;
        if shift == 63 && byte > 1 {
            return Err("a varint longer than 64 bits".into());
        }
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok((value >> 1) as i64 ^ -((value & 1) as i64));
        }
    }
    Err("a varint longer than 64 bits".into())
}

fn read_varint(r: &mut &[u8]) -> Result<i32, String> {
    let v = read_varlong(r)?;
    i32::try_from(v).map_err(|_| format!("a varint of {v} does not fit 32 bits"))
}

fn put_varlong(out: &mut impl BufMut, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.put_u8((z as u8) | 0x80);
        z >>= 7;
    }
    out.put_u8(z as u8);
}

fn varlong_len(v: i64) -> usize {
    let z = ((v << 1) ^ (v >> 63)) as u64;
    (64 - z.max(1).leading_zeros() as usize).div_ceil(7).max(1)
}

/// A record's headers to write: names as bytes, values (`None`: null).
pub(crate) type HeaderSlices<'a> = Vec<(&'a [u8], Option<&'a [u8]>)>;

/// A record to write.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewRecord<'a> {
    pub(crate) key: Option<&'a [u8]>,
    pub(crate) value: Option<&'a [u8]>,
    /// Milliseconds since the epoch.
    pub(crate) timestamp: i64,
}

/// Who writes a batch, for the broker to deduplicate retried produce
/// requests (an idempotent producer), and its first sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sequenced {
    pub(crate) producer_id: i64,
    pub(crate) producer_epoch: i16,
    pub(crate) base_sequence: i32,
}

/// Encodes `records` (each with its headers, names as bytes) as one batch
/// at offset 0 compressed with `codec`.
pub(crate) fn encode<'a, H>(records: &[(NewRecord<'a>, H)], codec: Codec, producer: Option<Sequenced>) -> Bytes
where
    H: Clone + IntoIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
{
    let base_timestamp = records.iter().map(|(r, _)| r.timestamp).min().unwrap_or(0);
    let max_timestamp = records.iter().map(|(r, _)| r.timestamp).max().unwrap_or(0);
    let mut body = BytesMut::new();
    for (i, (record, headers)) in records.iter().enumerate() {
        let mut inner = BytesMut::new();
        inner.put_u8(0);
        put_varlong(&mut inner, record.timestamp - base_timestamp);
        put_varlong(&mut inner, i as i64);
        put_field(&mut inner, record.key);
        put_field(&mut inner, record.value);
        let headers: Vec<_> = headers.clone().into_iter().collect();
        put_varlong(&mut inner, headers.len() as i64);
        for (name, value) in headers {
            put_field(&mut inner, Some(name));
            put_field(&mut inner, value);
        }
        put_varlong(&mut body, inner.len() as i64);
        body.extend_from_slice(&inner);
    }
    let body = compress(codec, &body);
    let mut out = BytesMut::with_capacity(HEADER_BYTES + body.len());
    let (producer_id, producer_epoch, base_sequence) =
        producer.map_or((-1, -1, -1), |p| (p.producer_id, p.producer_epoch, p.base_sequence));
    out.put_i64(0);
    out.put_i32((HEADER_BYTES - LOG_OVERHEAD + body.len()) as i32);
    out.put_i32(-1); // partition leader epoch: the broker's to set
    out.put_i8(2);
    out.put_u32(0); // crc, below
    out.put_i16(codec.bits());
    out.put_i32(records.len().saturating_sub(1) as i32);
    out.put_i64(base_timestamp);
    out.put_i64(max_timestamp);
    out.put_i64(producer_id);
    out.put_i16(producer_epoch);
    out.put_i32(base_sequence);
    out.put_i32(records.len() as i32);
    out.extend_from_slice(&body);
    let crc = crc32c::crc32c(&out[CRC_FROM..]);
    out[17..21].copy_from_slice(&crc.to_be_bytes());
    out.freeze()
}

/// How many bytes a record adds to a batch before compression.
pub(crate) fn record_size<'a>(
    record: NewRecord<'a>,
    headers: impl IntoIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
) -> usize {
    let field = |f: Option<&[u8]>| f.map_or(1, |b| varlong_len(b.len() as i64) + b.len());
    let mut n = 1 + 10 + 5 + field(record.key) + field(record.value) + 5;
    for (name, value) in headers {
        n += field(Some(name)) + field(value);
    }
    n + varlong_len(n as i64)
}

fn put_field(out: &mut BytesMut, field: Option<&[u8]>) {
    match field {
        None => put_varlong(out, -1),
        Some(b) => {
            put_varlong(out, b.len() as i64);
            out.extend_from_slice(b);
        }
    }
}

fn compress(codec: Codec, records: &[u8]) -> Vec<u8> {
    use std::io::Write;
    match codec {
        Codec::None => records.to_vec(),
        Codec::Gzip => {
            let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            encoder.write_all(records).expect("writing to memory");
            encoder.finish().expect("writing to memory")
        }
        Codec::Snappy => {
            // xerial's framing, which every Kafka client reads.
            let mut out = Vec::with_capacity(records.len() / 2 + 32);
            out.extend_from_slice(XERIAL_MAGIC);
            out.put_i32(1);
            out.put_i32(1);
            let mut encoder = snap::raw::Encoder::new();
            for block in records.chunks(32 * 1024) {
                let compressed = encoder.compress_vec(block).expect("snappy compresses any input");
                out.put_i32(compressed.len() as i32);
                out.extend_from_slice(&compressed);
            }
            out
        }
        Codec::Lz4 => {
            // Independent blocks: the only kind Kafka's Java reader accepts.
            let info = lz4_flex::frame::FrameInfo::new().block_mode(lz4_flex::frame::BlockMode::Independent);
            let mut encoder = lz4_flex::frame::FrameEncoder::with_frame_info(info, Vec::new());
            encoder.write_all(records).expect("writing to memory");
            encoder.finish().expect("writing to memory")
        }
        Codec::Zstd => ruzstd::encoding::compress_to_vec(records, ruzstd::encoding::CompressionLevel::Fastest),
    }
}

#[cfg(test)]
mod tests;

/// Entry points for fuzzing the batch decoder from outside the crate (the
/// `fuzzing` feature, tests only).
#[cfg(feature = "fuzzing")]
pub(crate) mod fuzzing {
    use super::*;

    /// What decoding gave: batches, their data records, control batches,
    /// undecodable batches, and the bytes of every record's key, value and
    /// headers (what a decompression bomb would inflate).
    #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
    pub struct Decoded {
        /// Whole batches found.
        pub batches: usize,
        /// Data records decoded.
        pub records: usize,
        /// Control batches.
        pub control: usize,
        /// Batches that could not be decoded.
        pub undecodable: usize,
        /// The bytes of the records' keys, values and headers.
        pub record_bytes: usize,
    }

    fn summary(batches: Vec<Batch>) -> Decoded {
        let mut out = Decoded { batches: batches.len(), ..Decoded::default() };
        for batch in batches {
            match batch {
                Batch::Data { records, .. } => {
                    out.records += records.len();
                    for r in records {
                        let field = |b: &Option<Bytes>| b.as_ref().map_or(0, |b| b.len());
                        out.record_bytes += field(&r.key) + field(&r.value);
                        out.record_bytes += r.headers.iter().map(|h| h.name.len() + field(&h.value)).sum::<usize>();
                    }
                }
                Batch::Control { .. } => out.control += 1,
                Batch::Undecodable { .. } => out.undecodable += 1,
            }
        }
        out
    }

    /// Decodes a fetch's record bytes as they came.
    pub fn record_batches(bytes: &[u8], max_inflated: usize) -> Decoded {
        summary(decode_all(Bytes::copy_from_slice(bytes), max_inflated))
    }

    /// Decodes one v2 batch built around `records` (compressed with
    /// codec `codec`, 0 to 4, first when `compress`), claiming `count`
    /// records, with a valid length and checksum: random bytes would
    /// otherwise nearly always stop at the checksum, before the decoder
    /// of records and the decompressors.
    pub fn checksummed_batch(
        codec: u8,
        compress_first: bool,
        count: i32,
        records: &[u8],
        max_inflated: usize,
    ) -> Decoded {
        let codec_of = Codec::of(i16::from(codec)).unwrap_or(Codec::None);
        let body = if compress_first { compress(codec_of, records) } else { records.to_vec() };
        let mut b = BytesMut::with_capacity(HEADER_BYTES + body.len());
        b.put_i64(0); // base offset
        b.put_i32((HEADER_BYTES - LOG_OVERHEAD + body.len()) as i32);
        b.put_i32(0); // partition leader epoch
        b.put_i8(2); // magic
        b.put_u32(0); // crc, below
        b.put_i16(i16::from(codec & 0x07));
        b.put_i32(count.max(1) - 1); // last offset delta
        b.put_i64(1_700_000_000_000);
        b.put_i64(1_700_000_000_000);
        b.put_i64(-1); // producer id
        b.put_i16(-1);
        b.put_i32(-1);
        b.put_i32(count);
        b.put_slice(&body);
        let crc = crc32c::crc32c(&b[CRC_FROM..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        summary(decode_all(b.freeze(), max_inflated))
    }
}
