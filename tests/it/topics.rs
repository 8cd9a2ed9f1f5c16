//! Topics are created explicitly and verified at start-up, never auto-created.

use std::{collections::BTreeMap, sync::Arc};

use integration::{rskafka_client, unique_topic, within};
use retry_core::{PolicyConfig, RetryPolicy, RetryTopology};
use retry_kafka::{ConnectionConfig, Created, CreatedTopic, Error, Listener, ListenerConfig, TopicPlan, TopicProblem};

use crate::support::{committed, eventually, init_tracing, produce, Ladder, Scripted, SETTLE};

fn plan(partitions: i32) -> (ConnectionConfig, RetryTopology, TopicPlan) {
    init_tracing();
    let topology = RetryTopology::new(&unique_topic("topics"), &"5s,1m".parse().unwrap()).unwrap();
    let connection = integration::connection("kafka-retry-it");
    let plan = TopicPlan::new(topology.clone(), partitions).with_replication_factor(integration::replication_factor());
    (connection, topology, plan)
}

fn problems(result: retry_kafka::Result<impl std::fmt::Debug>) -> Vec<TopicProblem> {
    match result {
        Err(Error::Topics(problems)) => problems.0,
        other => panic!("expected topic problems, got {other:?}"),
    }
}

#[tokio::test]
async fn verification_names_every_missing_topic() {
    let (connection, topology, plan) = plan(2);
    let missing = problems(within("verify", plan.verify(&connection)).await);
    let names: Vec<String> = topology.all_topics().map(|t| t.to_string()).collect();
    let expected: Vec<TopicProblem> = names.iter().map(|t| TopicProblem::Missing { topic: t.clone() }).collect();
    assert_eq!(missing, expected);
    let message = within("verify", plan.verify(&connection)).await.unwrap_err().to_string();
    for name in &names {
        assert!(message.contains(&format!("topic {name} is missing")), "{message}");
    }
    assert!(message.contains("never auto-created"), "{message}");

    // A listener refuses to start, and creates nothing.
    let policy = RetryPolicy::new(topology.clone(), PolicyConfig::default());
    let config = ListenerConfig::new(connection.clone(), "never-starts", policy).unwrap();
    let refused = within("start", Listener::start(config, Scripted::new(&[]))).await;
    assert_eq!(problems(refused.map(|_| ())).len(), 4);
    assert_eq!(problems(within("verify", plan.verify(&connection)).await).len(), 4, "nothing was auto-created");
}

#[tokio::test]
async fn creation_is_explicit_and_idempotent() {
    let (connection, topology, plan) = plan(3);
    let created = within("create", plan.create(&connection, true)).await.unwrap();
    let names: Vec<String> = topology.all_topics().map(|t| t.to_string()).collect();
    let outcome = |created| names.iter().map(|n| CreatedTopic { topic: n.clone(), created }).collect::<Vec<_>>();
    assert_eq!(created, outcome(Created::Created));
    let again = within("create", plan.create(&connection, true)).await.unwrap();
    assert_eq!(again, outcome(Created::AlreadyExists));
    within("verify", plan.verify(&connection)).await.unwrap();

    let client = rskafka_client().await;
    let topics: BTreeMap<String, usize> =
        within("list", client.list_topics()).await.unwrap().into_iter().map(|t| (t.name, t.partitions.len())).collect();
    for name in &names {
        assert_eq!(topics.get(name), Some(&3), "{name}");
    }
    let specs = plan.specs();
    let retention = |i: usize| specs[i].configs.get("retention.ms").cloned();
    assert_eq!(retention(0), None, "the source topic keeps the cluster's defaults");
    assert_eq!(retention(1), Some((7 * 24 * 3600 * 1000u64).to_string()));
    assert_eq!(retention(3), Some((30 * 24 * 3600 * 1000u64).to_string()));
}

#[tokio::test]
async fn retry_topics_need_as_many_partitions_as_the_source() {
    let (connection, topology, plan) = plan(1);
    let client = rskafka_client().await;
    let controller = client.controller_client().unwrap();
    within(
        "create source",
        controller.create_topic(topology.source_topic().as_str(), 3, integration::replication_factor(), 10_000),
    )
    .await
    .unwrap();
    let result = within("create", plan.create(&connection, false)).await;
    let problems = problems(result);
    assert_eq!(problems.len(), 3, "{problems:?}");
    for problem in problems {
        match problem {
            TopicProblem::TooFewPartitions { has, needs, source, .. } => {
                assert_eq!((has, needs, source.as_str()), (1, 3, topology.source_topic().as_str()))
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_committed_offset_past_the_end_resets_loudly_instead_of_skipping() {
    let ladder = Ladder::create("reset", "100ms", 1).await;
    produce(ladder.source(), 0, "a", "v", &[]).await;
    produce(ladder.source(), 0, "b", "v", &[]).await;
    // As if retention had deleted what the group last committed.
    let mut offsets = retry_kafka::GroupOffsets::new(ladder.connection.clone(), &ladder.group_id);
    within("commit", offsets.commit(&BTreeMap::from([(retry_kafka::TopicPartition::new(ladder.source(), 0), 1_000)])))
        .await
        .unwrap();

    let handler = Scripted::new(&[]);
    let listener = Listener::start(ladder.config(), Arc::clone(&handler)).await.unwrap();
    eventually("both records from the earliest offset", SETTLE, || async {
        (handler.calls().len() == 2).then_some(())
    })
    .await;
    eventually("the new position committed", SETTLE, || async {
        (committed(&ladder.connection, &ladder.group_id, ladder.source(), 1).await[&0] == Some(2)).then_some(())
    })
    .await;
    let stats = listener.stats().snapshot();
    listener.shutdown().await;
    assert_eq!(stats.offset_resets, 1);
}
