//! The Kafka wire protocol where rskafka does not speak it, through the
//! `kafka-protocol` crate: one framed connection with version negotiation
//! (`wire`), the classic consumer-group protocol (`group`) and its wire
//! formats and range assignor (`assignor`), topic creation with configs
//! (`create_topics`), partition leaders (`metadata`), and the data path:
//! record batches read and written by us (`batch`, pure), fetching with
//! transactions filtered (`fetch`), and idempotent produce (`produce`).
//!
//! This is the only module that names `kafka_protocol` (`cargo xtask ci`
//! checks): the rest of the crate speaks in our own types, and the broker's
//! error codes as [`BrokerError`](crate::BrokerError), whose constants and
//! names are defined here.

pub(crate) mod assignor;
pub(crate) mod batch;
pub(crate) mod create_topics;
pub(crate) mod fetch;
pub(crate) mod group;
pub(crate) mod metadata;
pub(crate) mod produce;
pub(crate) mod wire;

pub(crate) use create_topics::create_topics;
pub(crate) use kafka_protocol::ResponseError;

use crate::BrokerError;

/// The broker errors the crate reacts to, by Kafka's names.
impl BrokerError {
    /// Kafka's `CLUSTER_AUTHORIZATION_FAILED`.
    pub const CLUSTER_AUTHORIZATION_FAILED: BrokerError = BrokerError::of(ResponseError::ClusterAuthorizationFailed);
    /// Kafka's `COORDINATOR_NOT_AVAILABLE`.
    pub const COORDINATOR_NOT_AVAILABLE: BrokerError = BrokerError::of(ResponseError::CoordinatorNotAvailable);
    /// Kafka's `DUPLICATE_SEQUENCE_NUMBER`.
    pub const DUPLICATE_SEQUENCE_NUMBER: BrokerError = BrokerError::of(ResponseError::DuplicateSequenceNumber);
    /// Kafka's `FENCED_MEMBER_EPOCH`.
    pub const FENCED_MEMBER_EPOCH: BrokerError = BrokerError::of(ResponseError::FencedMemberEpoch);
    /// Kafka's `STALE_MEMBER_EPOCH`.
    pub const STALE_MEMBER_EPOCH: BrokerError = BrokerError::of(ResponseError::StaleMemberEpoch);
    /// Kafka's `UNRELEASED_INSTANCE_ID`.
    pub const UNRELEASED_INSTANCE_ID: BrokerError = BrokerError::of(ResponseError::UnreleasedInstanceId);
    /// Kafka's `UNSUPPORTED_VERSION`.
    pub const UNSUPPORTED_VERSION: BrokerError = BrokerError::of(ResponseError::UnsupportedVersion);
    /// Kafka's `GROUP_MAX_SIZE_REACHED`.
    pub const GROUP_MAX_SIZE_REACHED: BrokerError = BrokerError::of(ResponseError::GroupMaxSizeReached);
    /// Kafka's `FENCED_INSTANCE_ID`.
    pub const FENCED_INSTANCE_ID: BrokerError = BrokerError::of(ResponseError::FencedInstanceId);
    /// Kafka's `GROUP_AUTHORIZATION_FAILED`.
    pub const GROUP_AUTHORIZATION_FAILED: BrokerError = BrokerError::of(ResponseError::GroupAuthorizationFailed);
    /// Kafka's `ILLEGAL_GENERATION`.
    pub const ILLEGAL_GENERATION: BrokerError = BrokerError::of(ResponseError::IllegalGeneration);
    /// Kafka's `INVALID_PRODUCER_EPOCH`.
    pub const INVALID_PRODUCER_EPOCH: BrokerError = BrokerError::of(ResponseError::InvalidProducerEpoch);
    /// Kafka's `INVALID_RECORD`.
    pub const INVALID_RECORD: BrokerError = BrokerError::of(ResponseError::InvalidRecord);
    /// Kafka's `MEMBER_ID_REQUIRED`.
    pub const MEMBER_ID_REQUIRED: BrokerError = BrokerError::of(ResponseError::MemberIdRequired);
    /// Kafka's `MESSAGE_TOO_LARGE`.
    pub const MESSAGE_TOO_LARGE: BrokerError = BrokerError::of(ResponseError::MessageTooLarge);
    /// Kafka's `NOT_COORDINATOR`.
    pub const NOT_COORDINATOR: BrokerError = BrokerError::of(ResponseError::NotCoordinator);
    /// Kafka's `NOT_ENOUGH_REPLICAS`.
    pub const NOT_ENOUGH_REPLICAS: BrokerError = BrokerError::of(ResponseError::NotEnoughReplicas);
    /// Kafka's `NOT_ENOUGH_REPLICAS_AFTER_APPEND`.
    pub const NOT_ENOUGH_REPLICAS_AFTER_APPEND: BrokerError =
        BrokerError::of(ResponseError::NotEnoughReplicasAfterAppend);
    /// Kafka's `NOT_LEADER_OR_FOLLOWER`.
    pub const NOT_LEADER_OR_FOLLOWER: BrokerError = BrokerError::of(ResponseError::NotLeaderOrFollower);
    /// Kafka's `OFFSET_OUT_OF_RANGE`.
    pub const OFFSET_OUT_OF_RANGE: BrokerError = BrokerError::of(ResponseError::OffsetOutOfRange);
    /// Kafka's `OUT_OF_ORDER_SEQUENCE_NUMBER`.
    pub const OUT_OF_ORDER_SEQUENCE_NUMBER: BrokerError = BrokerError::of(ResponseError::OutOfOrderSequenceNumber);
    /// Kafka's `POLICY_VIOLATION`.
    pub const POLICY_VIOLATION: BrokerError = BrokerError::of(ResponseError::PolicyViolation);
    /// Kafka's `PRODUCER_FENCED`.
    pub const PRODUCER_FENCED: BrokerError = BrokerError::of(ResponseError::ProducerFenced);
    /// Kafka's `REBALANCE_IN_PROGRESS`.
    pub const REBALANCE_IN_PROGRESS: BrokerError = BrokerError::of(ResponseError::RebalanceInProgress);
    /// Kafka's `RECORD_LIST_TOO_LARGE`.
    pub const RECORD_LIST_TOO_LARGE: BrokerError = BrokerError::of(ResponseError::RecordListTooLarge);
    /// Kafka's `REQUEST_TIMED_OUT`.
    pub const REQUEST_TIMED_OUT: BrokerError = BrokerError::of(ResponseError::RequestTimedOut);
    /// Kafka's `SASL_AUTHENTICATION_FAILED`.
    pub const SASL_AUTHENTICATION_FAILED: BrokerError = BrokerError::of(ResponseError::SaslAuthenticationFailed);
    /// Kafka's `TOPIC_ALREADY_EXISTS`.
    pub const TOPIC_ALREADY_EXISTS: BrokerError = BrokerError::of(ResponseError::TopicAlreadyExists);
    /// Kafka's `TOPIC_AUTHORIZATION_FAILED`.
    pub const TOPIC_AUTHORIZATION_FAILED: BrokerError = BrokerError::of(ResponseError::TopicAuthorizationFailed);
    /// Kafka's `UNKNOWN_MEMBER_ID`.
    pub const UNKNOWN_MEMBER_ID: BrokerError = BrokerError::of(ResponseError::UnknownMemberId);
    /// Kafka's `UNKNOWN_PRODUCER_ID`.
    pub const UNKNOWN_PRODUCER_ID: BrokerError = BrokerError::of(ResponseError::UnknownProducerId);
    /// Kafka's `TRANSACTIONAL_ID_AUTHORIZATION_FAILED`.
    pub const TRANSACTIONAL_ID_AUTHORIZATION_FAILED: BrokerError =
        BrokerError::of(ResponseError::TransactionalIdAuthorizationFailed);
    /// Kafka's `CORRUPT_MESSAGE`.
    pub const CORRUPT_MESSAGE: BrokerError = BrokerError::of(ResponseError::CorruptMessage);
    /// Kafka's `INVALID_TOPIC_EXCEPTION`.
    pub const INVALID_TOPIC_EXCEPTION: BrokerError = BrokerError::of(ResponseError::InvalidTopicException);
    /// Kafka's `INVALID_REQUIRED_ACKS`.
    pub const INVALID_REQUIRED_ACKS: BrokerError = BrokerError::of(ResponseError::InvalidRequiredAcks);
    /// Kafka's `UNSUPPORTED_FOR_MESSAGE_FORMAT`.
    pub const UNSUPPORTED_FOR_MESSAGE_FORMAT: BrokerError = BrokerError::of(ResponseError::UnsupportedForMessageFormat);
    /// Kafka's `UNSUPPORTED_COMPRESSION_TYPE`.
    pub const UNSUPPORTED_COMPRESSION_TYPE: BrokerError = BrokerError::of(ResponseError::UnsupportedCompressionType);
    /// Kafka's `INVALID_TIMESTAMP`.
    pub const INVALID_TIMESTAMP: BrokerError = BrokerError::of(ResponseError::InvalidTimestamp);
    /// Kafka's `COORDINATOR_LOAD_IN_PROGRESS`.
    pub const COORDINATOR_LOAD_IN_PROGRESS: BrokerError = BrokerError::of(ResponseError::CoordinatorLoadInProgress);

    const fn of(error: ResponseError) -> BrokerError {
        BrokerError::from_code(error.code())
    }

    /// Kafka's name for it (`NOT_COORDINATOR`), or `UNKNOWN_<code>` for a
    /// code this crate does not know.
    pub fn name(self) -> String {
        match ResponseError::try_from_code(self.code()) {
            None => "NONE".to_owned(),
            Some(ResponseError::Unknown(code)) => format!("UNKNOWN_{code}"),
            Some(known) => {
                let camel = known.to_string();
                let mut name = String::with_capacity(camel.len() + 8);
                for (i, c) in camel.chars().enumerate() {
                    if c.is_ascii_uppercase() && i > 0 {
                        name.push('_');
                    }
                    name.push(c.to_ascii_uppercase());
                }
                name
            }
        }
    }

    /// Whether Kafka's protocol deems it retriable (a later attempt of the
    /// same request may succeed).
    pub fn is_retriable(self) -> bool {
        ResponseError::try_from_code(self.code()).is_some_and(|e| e.is_retriable())
    }
}

impl From<ResponseError> for BrokerError {
    fn from(error: ResponseError) -> Self {
        BrokerError::of(error)
    }
}

impl std::fmt::Display for BrokerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (error {})", self.name(), self.code())
    }
}

impl std::fmt::Debug for BrokerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_errors_carry_kafkas_codes_and_names() {
        let table = [
            (BrokerError::OFFSET_OUT_OF_RANGE, 1, "OFFSET_OUT_OF_RANGE", false),
            (BrokerError::NOT_COORDINATOR, 16, "NOT_COORDINATOR", true),
            (BrokerError::REBALANCE_IN_PROGRESS, 27, "REBALANCE_IN_PROGRESS", false),
            (BrokerError::SASL_AUTHENTICATION_FAILED, 58, "SASL_AUTHENTICATION_FAILED", false),
            (BrokerError::FENCED_INSTANCE_ID, 82, "FENCED_INSTANCE_ID", false),
            (BrokerError::FENCED_MEMBER_EPOCH, 110, "FENCED_MEMBER_EPOCH", false),
            (BrokerError::UNRELEASED_INSTANCE_ID, 111, "UNRELEASED_INSTANCE_ID", false),
            (BrokerError::STALE_MEMBER_EPOCH, 113, "STALE_MEMBER_EPOCH", false),
            (BrokerError::from_code(9999), 9999, "UNKNOWN_9999", false),
        ];
        for (error, code, name, retriable) in table {
            assert_eq!((error.code(), error.name(), error.is_retriable()), (code, name.to_owned(), retriable));
        }
        assert_eq!(BrokerError::NOT_COORDINATOR.to_string(), "NOT_COORDINATOR (error 16)");
        assert_eq!(BrokerError::from(ResponseError::NotCoordinator), BrokerError::NOT_COORDINATOR);
    }
}
