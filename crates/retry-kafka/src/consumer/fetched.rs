//! A fetched record as the worker handles it: what the handler sees, what a
//! republication writes back (every header as it was read), or why it
//! cannot be handled at all and goes to the dead-letter topic as it is.

use std::collections::VecDeque;

use bytes::Bytes;
use retry_core::{Headers, Timestamp};

use crate::protocol::{
    batch::{Codec, RawHeader},
    fetch::Item,
};

/// One record of a partition, or one batch that cannot be read.
#[derive(Debug, Clone)]
pub(crate) struct Fetched {
    /// Its offset (a batch's first).
    pub(crate) offset: i64,
    /// The offset after it (after a batch's last).
    pub(crate) next_offset: i64,
    pub(crate) key: Option<Bytes>,
    pub(crate) value: Option<Bytes>,
    /// The headers the handler sees: those with a value, in order.
    pub(crate) headers: Headers,
    /// Every header as written, for republications.
    pub(crate) raw_headers: Vec<RawHeader>,
    pub(crate) timestamp: Option<Timestamp>,
    /// The codec of the batch it came in.
    pub(crate) codec: Codec,
    /// Headers whose value is null: written back, not shown to the handler.
    pub(crate) null_headers: usize,
    /// Why it cannot be handled, if it cannot: it goes to the dead-letter
    /// topic as it is, with this as its error.
    pub(crate) poison: Option<String>,
}

impl Fetched {
    /// What the worker makes of an item of a fetch of `topic`/`partition`.
    pub(crate) fn of(item: Item, topic: &str, partition: i32) -> Fetched {
        match item {
            Item::Record(r) => {
                let (headers, null_headers, poison) = match r.valued_headers() {
                    Ok((headers, nulls)) => (headers, nulls, None),
                    Err(i) => {
                        let name = &r.headers[i].name;
                        let problem = format!(
                            "undecodable record at {topic}/{partition}@{}: the name of header {i} is not UTF-8 ({} bytes: {})",
                            r.offset,
                            name.len(),
                            hex(&name[..name.len().min(32)])
                        );
                        (Headers::new(), 0, Some(problem))
                    }
                };
                Fetched {
                    offset: r.offset,
                    next_offset: r.offset + 1,
                    key: r.key,
                    value: r.value,
                    headers,
                    raw_headers: r.headers,
                    timestamp: (r.timestamp >= 0).then(|| Timestamp::from_millis(r.timestamp)),
                    codec: r.codec,
                    null_headers,
                    poison,
                }
            }
            Item::Undecodable { header, raw, problem } => Fetched {
                offset: header.base_offset,
                next_offset: header.next_offset().max(header.base_offset + 1),
                key: None,
                value: Some(raw.clone()),
                headers: Headers::new(),
                raw_headers: Vec::new(),
                timestamp: (header.max_timestamp >= 0).then(|| Timestamp::from_millis(header.max_timestamp)),
                codec: Codec::Lz4,
                null_headers: 0,
                poison: Some(format!(
                    "undecodable batch at {topic}/{partition}, offsets {} to {} ({} bytes, the value of this record): {problem}",
                    header.base_offset,
                    header.last_offset(),
                    raw.len()
                )),
            },
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The records admitted to the window and not started yet, in offset
/// order (they start in about that order: the ring stays short and
/// allocates nothing once it has grown to the window).
#[derive(Default)]
pub(crate) struct Waiting(VecDeque<(i64, Option<Fetched>)>);

impl Waiting {
    /// Adds a record above every record in it.
    pub(crate) fn push(&mut self, record: Fetched) {
        debug_assert!(self.0.back().is_none_or(|(last, _)| *last < record.offset));
        self.0.push_back((record.offset, Some(record)));
    }

    /// Takes out the record at `offset` (found by halves: a taken slot
    /// keeps its offset until the ones below it are taken too).
    pub(crate) fn take(&mut self, offset: i64) -> Option<Fetched> {
        let index = self.0.binary_search_by_key(&offset, |(at, _)| *at).ok()?;
        let record = self.0[index].1.take();
        while self.0.front().is_some_and(|(_, slot)| slot.is_none()) {
            self.0.pop_front();
        }
        record
    }

    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::batch::{BatchHeader, RawRecord};

    fn raw(name: &[u8], value: Option<&[u8]>) -> RawHeader {
        RawHeader { name: Bytes::copy_from_slice(name), value: value.map(Bytes::copy_from_slice) }
    }

    fn raw_record() -> RawRecord {
        RawRecord {
            offset: 7,
            timestamp: 1000,
            key: Some(Bytes::from_static(b"k")),
            value: None,
            headers: Vec::new(),
            codec: Codec::Zstd,
        }
    }

    fn record(headers: Vec<RawHeader>) -> Item {
        Item::Record(RawRecord { headers, ..raw_record() })
    }

    #[test]
    fn the_handler_sees_valued_headers_and_republications_keep_all() {
        let headers = vec![raw(b"a", Some(b"1")), raw(b"n", None), raw(b"a", Some(b"2"))];
        let f = Fetched::of(record(headers.clone()), "t", 0);
        assert_eq!(f.headers.iter().collect::<Vec<_>>(), [("a", &b"1"[..]), ("a", &b"2"[..])]);
        assert_eq!((f.raw_headers, f.null_headers, f.poison), (headers, 1, None));
        assert_eq!((f.offset, f.next_offset, f.codec), (7, 8, Codec::Zstd));
        assert_eq!(f.timestamp, Some(Timestamp::from_millis(1000)));
    }

    #[test]
    fn a_header_name_that_is_not_utf8_makes_the_record_poison() {
        let f = Fetched::of(record(vec![raw(b"ok", Some(b"1")), raw(b"\xff\xfe", Some(b"x"))]), "t", 3);
        let poison = f.poison.expect("poison");
        assert!(
            poison.contains("t/3@7") && poison.contains("header 1 is not UTF-8") && poison.contains("fffe"),
            "{poison}"
        );
        assert_eq!(f.raw_headers.len(), 2, "kept as written");
    }

    #[test]
    fn an_undecodable_batch_is_one_poison_record_for_all_its_offsets() {
        let header = BatchHeader {
            base_offset: 10,
            size: 80,
            magic: 2,
            crc: 0,
            attributes: 0,
            last_offset_delta: 4,
            base_timestamp: 0,
            max_timestamp: 99,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            record_count: 5,
        };
        let item = Item::Undecodable { header, raw: Bytes::from_static(b"batch"), problem: "checksum mismatch".into() };
        let f = Fetched::of(item, "t", 1);
        assert_eq!((f.offset, f.next_offset, f.value.as_deref()), (10, 15, Some(&b"batch"[..])));
        let poison = f.poison.expect("poison");
        assert!(poison.contains("offsets 10 to 14 (5 bytes") && poison.contains("checksum mismatch"), "{poison}");
    }

    #[test]
    fn waiting_records_are_taken_in_any_order_and_the_ring_shrinks_from_below() {
        let at = |offset| Fetched::of(Item::Record(RawRecord { offset, ..raw_record() }), "t", 0);
        let mut waiting = Waiting::default();
        for offset in [3, 4, 6, 9] {
            waiting.push(at(offset));
        }
        for (take, found, left) in
            [(4, true, 4), (5, false, 4), (3, true, 2), (9, true, 2), (6, true, 0), (6, false, 0)]
        {
            assert_eq!(waiting.take(take).map(|f| f.offset), found.then_some(take), "take {take}");
            assert_eq!(waiting.0.len(), left, "after taking {take}");
        }
    }
}
