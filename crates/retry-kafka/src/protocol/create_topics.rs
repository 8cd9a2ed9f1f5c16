//! CreateTopics, with the ladder's topic configs.

use kafka_protocol::{
    messages::{
        create_topics_request::{CreatableTopic, CreatableTopicConfig},
        CreateTopicsRequest, TopicName,
    },
    ResponseError,
};

use super::wire::{str_bytes, Connection};
use crate::{
    admin::topics::{Created, CreatedTopic, TopicSpec},
    ConnectionConfig, Error, Result,
};

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
                    error,
                });
            }
        }
    }
    Ok(outcome)
}
