//! Where a topic's partitions lead: Metadata through `kafka-protocol`.

use std::collections::HashMap;

use kafka_protocol::messages::{metadata_request::MetadataRequestTopic, MetadataRequest, TopicName};

use crate::{
    protocol::wire::{str_bytes, Connection},
    BrokerError, ConnectionConfig, Error, Result,
};

/// The leaders of `topic`'s partitions, `host:port` each, asked of each
/// bootstrap broker in turn until one answers.
pub(crate) async fn leaders(config: &ConnectionConfig, topic: &str) -> Result<HashMap<i32, String>> {
    let mut last_error = None;
    for addr in &config.bootstrap {
        match leaders_from(config, addr, topic).await {
            Ok(leaders) => return Ok(leaders),
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error.expect("bootstrap brokers are never empty"))
}

async fn leaders_from(config: &ConnectionConfig, addr: &str, topic: &str) -> Result<HashMap<i32, String>> {
    let mut conn = Connection::connect(addr, config).await?;
    let request = MetadataRequest::default()
        .with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(TopicName(str_bytes(topic))))]))
        .with_allow_auto_topic_creation(false);
    let (response, _) = conn.send(&request).await?;
    let brokers: HashMap<_, _> =
        response.brokers.iter().map(|b| (b.node_id, format!("{}:{}", b.host, b.port))).collect();
    Ok(response
        .topics
        .iter()
        .filter(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))
        .flat_map(|t| &t.partitions)
        .filter_map(|p| brokers.get(&p.leader_id).map(|addr| (p.partition_index, addr.clone())))
        .collect())
}

/// The address of the partition's leader.
pub(crate) async fn leader_of(config: &ConnectionConfig, topic: &str, partition: i32) -> Result<String> {
    leaders(config, topic).await?.remove(&partition).ok_or_else(|| Error::Protocol {
        addr: config.bootstrap.join(","),
        api: "Metadata",
        reason: format!("no leader known for {topic}/{partition}"),
    })
}

/// The error a broker answers for each of `topics` asked by name (none
/// auto-created), asked of each bootstrap broker in turn until one
/// answers: the topics it names with an error, e.g. one the user may not
/// describe (TOPIC_AUTHORIZATION_FAILED), which a listing of every topic
/// leaves out without a word.
pub(crate) async fn topic_errors(config: &ConnectionConfig, topics: &[&str]) -> Result<HashMap<String, BrokerError>> {
    let mut last_error = None;
    for addr in &config.bootstrap {
        let asked = async {
            let mut conn = Connection::connect(addr, config).await?;
            let named = topics
                .iter()
                .map(|t| MetadataRequestTopic::default().with_name(Some(TopicName(str_bytes(t)))))
                .collect();
            let request = MetadataRequest::default().with_topics(Some(named)).with_allow_auto_topic_creation(false);
            let (response, _) = conn.send(&request).await?;
            Ok::<_, Error>(
                response
                    .topics
                    .iter()
                    .filter(|t| t.error_code != 0)
                    .filter_map(|t| Some((t.name.as_ref()?.0.to_string(), BrokerError::from_code(t.error_code))))
                    .collect(),
            )
        };
        match asked.await {
            Ok(errors) => return Ok(errors),
            Err(e) => last_error = Some(e),
        }
    }
    Err(last_error.expect("bootstrap brokers are never empty"))
}

/// The brokers of the cluster as `conn`'s broker advertises them
/// (`node id`, `host:port`): where clients go after bootstrapping.
pub(crate) async fn advertised(conn: &mut Connection) -> Result<Vec<(i32, String)>> {
    // No topics asked: an empty list, not null (null asks for every topic).
    let request = MetadataRequest::default().with_topics(Some(Vec::new())).with_allow_auto_topic_creation(false);
    let (response, _) = conn.send(&request).await?;
    Ok(response.brokers.iter().map(|b| (b.node_id.0, format!("{}:{}", b.host, b.port))).collect())
}
