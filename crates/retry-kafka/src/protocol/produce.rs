//! Writing batches: an idempotent producer's identity (InitProducerId) and
//! Produce requests with acks=all, through `kafka-protocol`; the batches
//! themselves come from [`super::batch`].

use bytes::Bytes;
use kafka_protocol::{
    messages::{
        produce_request::{PartitionProduceData, TopicProduceData},
        InitProducerIdRequest, ProduceRequest, ProducerId, TopicName,
    },
    ResponseError,
};

use crate::{
    protocol::wire::{str_bytes, Connection},
    Error, Result,
};

/// Kafka's default `max.request.size` of producers.
pub(crate) const DEFAULT_MAX_REQUEST_BYTES: usize = 1 << 20;

/// An idempotent producer's identity, which the broker deduplicates by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) producer_id: i64,
    pub(crate) producer_epoch: i16,
}

/// Asks `conn`'s broker for a producer id (no transactional id: an
/// idempotent producer). `Ok(None)` when the broker does not offer
/// InitProducerId at all.
pub(crate) async fn init_producer_id(conn: &mut Connection) -> Result<Option<Identity>> {
    if conn.version_of::<InitProducerIdRequest>().is_err() {
        return Ok(None);
    }
    let request = InitProducerIdRequest::default()
        .with_transactional_id(None)
        .with_transaction_timeout_ms(-1)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    let (response, _) = conn.send(&request).await?;
    if let Some(error) = ResponseError::try_from_code(response.error_code) {
        return Err(Error::Broker { api: "InitProducerId", context: None, error: error.into() });
    }
    Ok(Some(Identity { producer_id: response.producer_id.0, producer_epoch: response.producer_epoch }))
}

/// How a broker answered one produce request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Written {
    /// Appended at this offset.
    At(i64),
    /// Already written by an earlier try of the same request (the broker
    /// recognised its sequence numbers).
    Duplicate,
}

/// Sends one batch to `topic`/`partition` on `conn` (its leader), acks=all,
/// and waits for the answer; the broker's error, if any, as
/// [`Error::Broker`].
pub(crate) async fn produce(
    conn: &mut Connection,
    topic: &str,
    partition: i32,
    batch: Bytes,
    timeout: std::time::Duration,
) -> Result<Written> {
    let request = ProduceRequest::default()
        .with_transactional_id(None)
        .with_acks(-1)
        .with_timeout_ms(i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX))
        .with_topic_data(vec![TopicProduceData::default().with_name(TopicName(str_bytes(topic))).with_partition_data(
            vec![PartitionProduceData::default().with_index(partition).with_records(Some(batch))],
        )]);
    let (response, _) = conn.send(&request).await?;
    let answer =
        response.responses.iter().flat_map(|t| &t.partition_responses).find(|p| p.index == partition).ok_or_else(
            || Error::Protocol {
                addr: conn.addr().to_owned(),
                api: "Produce",
                reason: format!("no answer for {topic}/{partition} in the response"),
            },
        )?;
    match ResponseError::try_from_code(answer.error_code) {
        None => Ok(Written::At(answer.base_offset)),
        Some(ResponseError::DuplicateSequenceNumber) => Ok(Written::Duplicate),
        Some(error) => {
            let mut context = format!("{topic}/{partition}");
            if let Some(message) = &answer.error_message {
                context.push_str(&format!(": {message}"));
            }
            Err(Error::Broker { api: "Produce", context: Some(context), error: error.into() })
        }
    }
}
