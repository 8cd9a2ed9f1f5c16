//! Where a topic's partitions lead: Metadata through `kafka-protocol`.

use std::collections::HashMap;

use kafka_protocol::messages::{metadata_request::MetadataRequestTopic, MetadataRequest, TopicName};

use crate::{
    protocol::wire::{str_bytes, Connection},
    ConnectionConfig, Error, Result,
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

/// The brokers of the cluster as `conn`'s broker advertises them
/// (`node id`, `host:port`): where clients go after bootstrapping.
pub(crate) async fn advertised(conn: &mut Connection) -> Result<Vec<(i32, String)>> {
    // No topics asked: an empty list, not null (null asks for every topic).
    let request = MetadataRequest::default().with_topics(Some(Vec::new())).with_allow_auto_topic_creation(false);
    let (response, _) = conn.send(&request).await?;
    Ok(response.brokers.iter().map(|b| (b.node_id.0, format!("{}:{}", b.host, b.port))).collect())
}
