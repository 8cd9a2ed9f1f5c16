//! CreateTopics, with the ladder's topic configs: what to create
//! ([`TopicSpec`]) and what the broker did ([`CreatedTopic`]), the types
//! administration's `TopicPlan` speaks in.

use std::collections::BTreeMap;

use kafka_protocol::{
    messages::{
        create_topics_request::{CreatableTopic, CreatableTopicConfig},
        CreateTopicsRequest, TopicName,
    },
    ResponseError,
};

use super::wire::{str_bytes, Connection};
use crate::{ConnectionConfig, Error, Result};

/// A topic's part in the ladder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TopicRole {
    /// The topic producers write to.
    Source,
    /// A retry rung.
    Retry,
    /// The dead-letter topic.
    DeadLetter,
}

/// One topic to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSpec {
    /// Its name.
    pub name: String,
    /// Its part in the ladder.
    pub role: TopicRole,
    /// Its partition count.
    pub partitions: i32,
    /// Its replication factor.
    pub replication_factor: i16,
    /// Topic configs, e.g. `retention.ms`.
    pub configs: BTreeMap<String, String>,
}

/// What [`TopicPlan::create`](crate::TopicPlan::create) did for one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedTopic {
    /// The topic.
    pub topic: String,
    /// Whether it was created or existed already.
    pub created: Created,
}

/// Whether [`TopicPlan::create`](crate::TopicPlan::create) created a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    /// The topic was created.
    Created,
    /// It existed already, with enough partitions.
    AlreadyExists,
}

/// Asks the first bootstrap broker to create `specs`; a topic that exists
/// already is reported as such, any other refusal is an error naming it.
pub(crate) async fn create_topics(config: &ConnectionConfig, specs: &[TopicSpec]) -> Result<Vec<CreatedTopic>> {
    let addr = config.bootstrap.first().expect("bootstrap brokers are never empty");
    let mut conn = Connection::connect(addr, config).await?;
    let request = CreateTopicsRequest::default()
        .with_timeout_ms(i32::try_from(config.request_timeout.as_millis()).unwrap_or(i32::MAX))
        .with_topics(
            specs
                .iter()
                .map(|s| {
                    CreatableTopic::default()
                        .with_name(TopicName(str_bytes(&s.name)))
                        .with_num_partitions(s.partitions)
                        .with_replication_factor(s.replication_factor)
                        .with_configs(
                            s.configs
                                .iter()
                                .map(|(k, v)| {
                                    CreatableTopicConfig::default()
                                        .with_name(str_bytes(k))
                                        .with_value(Some(str_bytes(v)))
                                })
                                .collect(),
                        )
                })
                .collect(),
        );
    let (response, _) = conn.send(&request).await?;
    let mut outcome = Vec::new();
    for result in &response.topics {
        let name = result.name.0.to_string();
        match ResponseError::try_from_code(result.error_code) {
            None => outcome.push(CreatedTopic { topic: name, created: Created::Created }),
            Some(ResponseError::TopicAlreadyExists) => {
                outcome.push(CreatedTopic { topic: name, created: Created::AlreadyExists })
            }
            Some(error) => {
                let message = result.error_message.as_ref().map(|m| format!(" ({m})")).unwrap_or_default();
                return Err(Error::Broker {
                    api: "CreateTopics",
                    context: Some(format!("topic {name}{message}")),
                    error: error.into(),
                });
            }
        }
    }
    Ok(outcome)
}
