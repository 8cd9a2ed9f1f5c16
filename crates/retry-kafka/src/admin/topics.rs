//! The ladder's topics: created explicitly, verified at start-up, never
//! auto-created.

use std::{collections::BTreeMap, time::Duration};

use retry_core::RetryTopology;

pub use crate::protocol::create_topics::{Created, CreatedTopic, TopicRole, TopicSpec};
use crate::{
    connection::cluster::Cluster, protocol::create_topics, ConnectionConfig, Error, Result, TopicProblem, TopicProblems,
};

/// The topics of one ladder and how to create them: every retry topic and
/// the dead-letter topic get at least the source's partition count (so a
/// record keeps its partition number along the ladder), retry topics keep
/// records comfortably longer than the longest delay, and the dead-letter
/// topic keeps them for 30 days, for operators to look at.
#[derive(Debug, Clone)]
pub struct TopicPlan {
    topology: RetryTopology,
    partitions: i32,
    replication_factor: i16,
    retry_retention: Duration,
    dead_letter_retention: Duration,
    /// Configs set by [`TopicPlan::with_config`], per role.
    configs: BTreeMap<(TopicRole, String), String>,
}

impl TopicPlan {
    /// A plan for `topology` with `partitions` partitions per topic and
    /// replication factor 1 (raise it for production clusters).
    pub fn new(topology: RetryTopology, partitions: i32) -> Self {
        let longest = topology.schedule().longest_delay();
        TopicPlan {
            topology,
            partitions: partitions.max(1),
            replication_factor: 1,
            retry_retention: (longest * 4).max(Duration::from_secs(7 * 24 * 3600)),
            dead_letter_retention: Duration::from_secs(30 * 24 * 3600),
            configs: BTreeMap::new(),
        }
    }

    /// Sets a topic config on every topic of `role` it creates, over the
    /// plan's own (`retention.ms`): say `max.message.bytes` on the
    /// dead-letter topic, above the retry topics' limit, so that a record
    /// a retry topic refuses as too large still fits there.
    ///
    /// ```
    /// use retry_kafka::{TopicPlan, TopicRole};
    /// use retry_core::RetryTopology;
    ///
    /// let topology = RetryTopology::new("orders", &"5s,30s".parse().unwrap()).unwrap();
    /// let plan = TopicPlan::new(topology, 3).with_config(TopicRole::DeadLetter, "max.message.bytes", "8388608");
    /// let dlq = plan.specs().into_iter().find(|s| s.role == TopicRole::DeadLetter).unwrap();
    /// assert_eq!(dlq.configs["max.message.bytes"], "8388608");
    /// assert!(dlq.configs.contains_key("retention.ms"));
    /// ```
    pub fn with_config(mut self, role: TopicRole, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.configs.insert((role, name.into()), value.into());
        self
    }

    /// Sets the replication factor of every topic.
    pub fn with_replication_factor(mut self, replication_factor: i16) -> Self {
        self.replication_factor = replication_factor;
        self
    }

    /// The topics, source first, with their settings.
    pub fn specs(&self) -> Vec<TopicSpec> {
        let retention = |d: Duration| BTreeMap::from([("retention.ms".to_owned(), d.as_millis().to_string())]);
        let spec = |name: &str, role, mut configs: BTreeMap<String, String>| {
            for ((r, key), value) in &self.configs {
                if *r == role {
                    configs.insert(key.clone(), value.clone());
                }
            }
            TopicSpec {
                name: name.to_owned(),
                role,
                partitions: self.partitions,
                replication_factor: self.replication_factor,
                configs,
            }
        };
        let mut specs = vec![spec(self.topology.source_topic().as_str(), TopicRole::Source, BTreeMap::new())];
        for (_, topic) in self.topology.retry_topics() {
            specs.push(spec(topic.as_str(), TopicRole::Retry, retention(self.retry_retention)));
        }
        specs.push(spec(
            self.topology.dead_letter_topic().as_str(),
            TopicRole::DeadLetter,
            retention(self.dead_letter_retention),
        ));
        specs
    }

    /// Creates every topic that does not exist yet (the source too when
    /// `include_source`). Idempotent: a topic that exists with enough
    /// partitions is fine; one with too few is reported, never altered.
    pub async fn create(&self, config: &ConnectionConfig, include_source: bool) -> Result<Vec<CreatedTopic>> {
        let specs: Vec<TopicSpec> =
            self.specs().into_iter().filter(|s| include_source || s.role != TopicRole::Source).collect();
        let outcome = create_topics(config, &specs).await?;
        // A cluster answers CreateTopics once its controller created them;
        // each broker learns of them a moment later, and the one a later
        // metadata request reaches (a listener's start-up check) may not
        // know them yet: wait until every bootstrap broker lists them.
        let created: Vec<&str> =
            outcome.iter().filter(|c| c.created == Created::Created).map(|c| c.topic.as_str()).collect();
        if !created.is_empty() {
            for broker in &config.bootstrap {
                let one = ConnectionConfig { bootstrap: vec![broker.clone()], ..config.clone() };
                match Cluster::connect(&one).await {
                    Ok(cluster) => wait_until_listed(&cluster, &created, config.request_timeout).await?,
                    // An unreachable bootstrap broker is not this call's to judge.
                    Err(e) => {
                        tracing::debug!(%broker, error = %e, "cannot ask this broker whether it lists the new topics")
                    }
                }
            }
        }
        let cluster = Cluster::connect(config).await?;
        // Existing topics must still have the right shape.
        self.verify_with(&cluster).await?;
        Ok(outcome)
    }

    /// Checks that every topic exists and that each retry and dead-letter
    /// topic has at least as many partitions as the source; the error lists
    /// every problem.
    pub async fn verify(&self, config: &ConnectionConfig) -> Result<()> {
        self.verify_with(&Cluster::connect(config).await?).await
    }

    pub(crate) async fn verify_with(&self, cluster: &Cluster) -> Result<()> {
        let topics = cluster.list_topics().await?;
        let count = |name: &str| topics.iter().find(|t| t.name == name).map(|t| t.partitions.len() as i32);
        let source = self.topology.source_topic().as_str();
        let mut problems = Vec::new();
        let source_partitions = count(source);
        if source_partitions.is_none() {
            problems.push(TopicProblem::Missing { topic: source.to_owned() });
        }
        let derived = self.topology.retry_topics().map(|(_, t)| t).chain([self.topology.dead_letter_topic()]);
        for topic in derived {
            match (count(topic.as_str()), source_partitions) {
                (None, _) => problems.push(TopicProblem::Missing { topic: topic.to_string() }),
                (Some(has), Some(needs)) if has < needs => problems.push(TopicProblem::TooFewPartitions {
                    topic: topic.to_string(),
                    has,
                    needs,
                    source: source.to_owned(),
                }),
                _ => {}
            }
        }
        if problems.is_empty() {
            return Ok(());
        }
        // A listing leaves out what the user may not describe: ask the
        // missing ones by name, and say which are refused rather than missing.
        let missing: Vec<&str> = problems
            .iter()
            .filter_map(|p| match p {
                TopicProblem::Missing { topic } => Some(topic.as_str()),
                _ => None,
            })
            .collect();
        if !missing.is_empty() {
            let refused: Vec<String> = match crate::protocol::metadata::topic_errors(cluster.config(), &missing).await {
                Ok(errors) => errors
                    .into_iter()
                    .filter(|(_, error)| *error == crate::BrokerError::TOPIC_AUTHORIZATION_FAILED)
                    .map(|(topic, _)| topic)
                    .collect(),
                Err(e) => {
                    tracing::debug!(error = %e, "cannot ask for the missing topics by name");
                    Vec::new()
                }
            };
            for problem in &mut problems {
                if let TopicProblem::Missing { topic } = problem {
                    if refused.contains(topic) {
                        *problem = TopicProblem::NotAuthorized { topic: std::mem::take(topic) };
                    }
                }
            }
        }
        Err(Error::Topics(TopicProblems(problems)))
    }
}

/// Waits until a metadata listing shows every topic of `topics`, for at
/// most `timeout`; then lets the caller's verification say what is missing.
async fn wait_until_listed(cluster: &Cluster, topics: &[&str], timeout: Duration) -> Result<()> {
    let mut pauses = crate::backoff::pauses(Duration::from_millis(20), Duration::from_millis(500));
    let give_up = tokio::time::Instant::now() + timeout;
    loop {
        let listed = cluster.list_topics().await?;
        let missing = topics.iter().filter(|t| !listed.iter().any(|l| l.name == **t)).count();
        if missing == 0 || tokio::time::Instant::now() >= give_up {
            return Ok(());
        }
        tokio::time::sleep(pauses.next()).await;
    }
}
