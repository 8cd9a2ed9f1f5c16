//! `billing-bin`: the billing service. It wires the `billing` domain (charge
//! the customer when an order is confirmed) to `retry-kafka`'s listener, and
//! configures both from flags and environment. It only wires and configures:
//! no Kafka protocol and no billing rule lives here.
//!
//! ```text
//! billing-bin [run]          consume orders.confirmed and its retry rungs, charge, serve /healthz and /readyz
//! billing-bin check          a preflight of run's settings: config, brokers, security, topics, groups, provider, token
//! billing-bin topics create  create the topics of the ladder (never auto-created)
//! billing-bin topics verify  check that they exist with enough partitions
//! billing-bin dlq list|show|replay|ack   the operators' API of a running service
//! billing-bin operators      serve the operators' API alone (a ladder another service consumes)
//! ```
//!
//! Exit codes: 0 after a clean shutdown (SIGTERM, SIGINT), 1 when the service
//! cannot run (broker unreachable, topics missing), 2 for invalid configuration.

mod admin;
mod check;
mod config;
mod dlq_cli;
mod failure;
mod telemetry;

use std::{process::ExitCode, sync::Arc, time::Duration};

use clap::Parser;
use retry_core::{RetryPolicy, RetryTopology};
use retry_kafka::{Created, CreatedTopic, Error as KafkaError, Listener, TopicPlan};
use retry_operators::{OperatorsConfig, OperatorsServer};
use tracing::{error, info};

use crate::{
    config::{Cli, Command, KafkaArgs, OffsetsAction, OperatorArgs, RunArgs, SkipArgs, TopicArgs, TopicsAction},
    failure::Failure,
    telemetry::Telemetry,
};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let log_format = cli.kafka.log_format;
    config::init_logging(log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            None => run(&cli.kafka, &cli.run).await,
            Some(Command::Run(args)) => run(&cli.kafka, &args).await,
            Some(Command::Check(args)) => check::check(&cli.kafka, &args).await,
            Some(Command::Topics { action: TopicsAction::Create(args) }) => create_topics(&cli.kafka, &args).await,
            Some(Command::Topics { action: TopicsAction::Verify }) => verify_topics(&cli.kafka).await,
            Some(Command::Dlq(args)) => dlq_cli::run(&cli.kafka, &args).await,
            Some(Command::Operators(args)) => serve_operators_alone(&cli.kafka, &args).await,
            Some(Command::Offsets { action: OffsetsAction::Skip(args) }) => skip_offset(&cli.kafka, &args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Config(message)) => {
            eprintln!("error: invalid configuration: {message}");
            ExitCode::from(2)
        }
        Err(Failure::Runtime(message)) => {
            // A log collector gets the reason as a record; a person reads
            // it once, on the last line.
            if matches!(log_format, config::LogFormat::Json) {
                error!("{message}");
            }
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
        Err(Failure::Reported) => ExitCode::FAILURE,
    }
}

fn topology(kafka: &KafkaArgs) -> Result<RetryTopology, Failure> {
    let topology = match kafka.header_style {
        retry_core::HeaderStyle::Spring => RetryTopology::spring(&kafka.topic, &kafka.retry_schedule),
        retry_core::HeaderStyle::Native | retry_core::HeaderStyle::Both => {
            RetryTopology::new(&kafka.topic, &kafka.retry_schedule)
        }
    };
    topology.map_err(|e| Failure::Config(e.to_string()))
}

/// The retry policy every command that reads or writes the ladder follows.
fn policy(kafka: &KafkaArgs, max_event_age: Option<Duration>) -> Result<RetryPolicy, Failure> {
    // An event older than the provider remembers its key is not charged.
    let config = retry_core::PolicyConfig { max_event_age, header_style: kafka.header_style, ..Default::default() };
    Ok(RetryPolicy::new(topology(kafka)?, config))
}

async fn run(kafka: &KafkaArgs, args: &RunArgs) -> Result<(), Failure> {
    let provider = args.provider()?;
    let rules = args.charge_rules()?;
    let max_event_age = args.operators.max_event_age()?;
    let start_at = args.start_at(max_event_age)?;
    let window = args.window()?;
    let brake = args.brake()?;
    let limits = args.operators.http_limits()?;
    let token = args.operators.admin_token()?;
    let connection = kafka.connection()?;
    let policy = policy(kafka, max_event_age)?;
    let handler = billing::ChargeHandler::new(provider, rules).map_err(|e| Failure::Config(e.to_string()))?;
    let telemetry = Telemetry::start()?;

    // Health first, so an orchestrator sees the process while it connects.
    let admin = admin::serve(args.admin_listen, limits).await.map_err(|e| Failure::Runtime(e.to_string()))?;
    info!(admin = %admin.addr(), "admin endpoint listening (/healthz, /readyz, /metrics)");
    let operators_server = match token {
        Some(token) => Some(serve_operators(&args.operators, token, &connection, &policy, &telemetry).await?),
        None => {
            info!("ADMIN_TOKEN is not set: the operators' API (/admin) is off");
            None
        }
    };

    let mut config = retry_kafka::ListenerConfig::new(connection, &args.operators.group_id, policy)?;
    // A charge answered 409 makes a second call, its confirmation: the
    // handler's time covers both.
    config.handler_timeout = handler.time_needed();
    config.group_instance_id = args.group_instance_id.clone();
    config.group_protocol = args.group_protocol;
    config.assignment_strategy = args.assignment_strategy;
    config.session_timeout = args.session_timeout;
    // Kafka's advice: a third of the session, so two heartbeats may be late.
    config.heartbeat_interval = args.session_timeout / 3;
    // A rebalance lets each charge in flight run its timeout, then commits.
    config.rebalance_timeout = config.rebalance_timeout.max(config.handler_timeout * 2);
    config.dlq_poll_interval = args.dlq_poll_interval;
    config.isolation_level = args.isolation_level;
    config.publish_compression = args.publish_compression;
    config.window = window;
    config.brake = brake;
    config.offset_reset = start_at;
    config.tracing = telemetry.tracing();
    let groups: Vec<(String, String)> = config
        .groups()
        .consumed(config.policy().topology())
        .map(|c| (c.topic.to_owned(), c.group.to_owned()))
        .collect();
    let listener = Listener::start(config, Arc::new(handler)).await?;
    admin.set_running(listener.readiness(), listener.metrics());
    if let Some(operators) = &operators_server {
        operators.show_brake(listener.brake());
    }
    info!(topic = %kafka.topic, schedule = %kafka.retry_schedule, ?groups, "billing service started");

    wait_for_shutdown_signal().await;
    info!("shutting down: finishing records in flight, committing, leaving the groups");
    listener.shutdown().await;
    if let Some(server) = operators_server {
        server.stop().await;
    }
    admin.stop().await;
    telemetry.shutdown().await;
    info!("stopped");
    Ok(())
}

/// Starts the operators' API and console on `args.operator_listen`.
async fn serve_operators(
    args: &OperatorArgs,
    token: String,
    connection: &retry_kafka::ConnectionConfig,
    policy: &RetryPolicy,
    telemetry: &Telemetry,
) -> Result<OperatorsServer, Failure> {
    let limits = args.http_limits()?;
    let groups = retry_core::groups::LadderGroups::new(&args.group_id, policy.topology())
        .map_err(|e| Failure::Config(e.to_string()))?;
    let admin = retry_kafka::DeadLetterAdmin::connect(connection.clone(), policy.clone(), &groups)
        .await?
        .with_tracing(telemetry.tracing());
    let config = OperatorsConfig {
        token,
        policy: policy.clone(),
        group_id: args.group_id.clone(),
        idempotency_window: policy.config().max_event_age,
        max_auth_failures: args.operator_max_auth_failures,
        // Answer before the request's own deadline cuts the wait short.
        wait_limit: limits.request_timeout * 2 / 3,
    };
    let server = OperatorsServer::serve("OPERATOR_LISTEN", args.operator_listen, config, admin, limits)
        .await
        .map_err(|e| Failure::Runtime(e.to_string()))?;
    info!(operators = %server.addr(), "operators' API listening (/admin), and its console (/console)");
    if !server.addr().ip().is_loopback() {
        tracing::warn!(operators = %server.addr(), "the operators' API serves plain HTTP on an address other \
            hosts can reach: its token travels as it is; put a TLS-terminating proxy in front of it, or \
            listen on loopback (OPERATOR_LISTEN)");
    }
    Ok(server)
}

/// `billing-bin operators`: the operators' API over the ladder of
/// BILLING_TOPIC, consuming nothing, until SIGTERM or SIGINT.
async fn serve_operators_alone(kafka: &KafkaArgs, args: &OperatorArgs) -> Result<(), Failure> {
    let token = args.admin_token()?.ok_or_else(|| {
        Failure::Config(
            "ADMIN_TOKEN or ADMIN_TOKEN_FILE is required: `operators` serves only the operators' API".into(),
        )
    })?;
    let policy = policy(kafka, args.max_event_age()?)?;
    let telemetry = Telemetry::start()?;
    let server = serve_operators(args, token, &kafka.connection()?, &policy, &telemetry).await?;
    info!(topic = %kafka.topic, dead_letters = %policy.topology().dead_letter_topic(), "serving the operators' API \
        alone: nothing is consumed");
    wait_for_shutdown_signal().await;
    server.stop().await;
    telemetry.shutdown().await;
    info!("stopped");
    Ok(())
}

async fn wait_for_shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => {
            error!(error = %e, "cannot listen for SIGTERM; only SIGINT stops the service");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => info!("SIGINT received"),
    }
}

async fn create_topics(kafka: &KafkaArgs, args: &TopicArgs) -> Result<(), Failure> {
    let plan = TopicPlan::new(topology(kafka)?, args.partitions).with_replication_factor(args.replication_factor);
    let outcome = plan.create(&kafka.connection()?, !args.skip_source).await.map_err(|e| match e {
        KafkaError::UnsupportedVersion { .. } => Failure::Runtime(format!(
            "{e}\ncreate the topics with the cluster's own tooling (`billing-bin topics verify` lists them), \
             or run `billing-bin topics create` against a broker that accepts CreateTopics"
        )),
        other => Failure::from(other),
    })?;
    for CreatedTopic { topic, created } in outcome {
        match created {
            Created::Created => println!("created {topic}"),
            Created::AlreadyExists => println!("exists  {topic}"),
        }
    }
    Ok(())
}

/// Moves `args.group` past the record at `args.offset`, only when that is
/// where the group stands, and says so in an audit line.
async fn skip_offset(kafka: &KafkaArgs, args: &SkipArgs) -> Result<(), Failure> {
    let topic = args.skip_topic.as_deref().unwrap_or(&kafka.topic);
    let tp = retry_kafka::TopicPartition::new(topic, args.partition);
    let mut offsets = retry_kafka::GroupOffsets::new(kafka.connection()?, &args.group);
    let committed = offsets.committed(std::slice::from_ref(&tp)).await?.get(&tp).copied().flatten();
    if committed != Some(args.offset) {
        let at = committed.map_or("nothing committed".to_owned(), |o| format!("offset {o}"));
        return Err(Failure::Runtime(format!(
            "group {} stands at {at} on {tp}, not at {}: nothing skipped",
            args.group, args.offset
        )));
    }
    let next = std::collections::BTreeMap::from([(tp.clone(), args.offset + 1)]);
    offsets.commit(&next).await.map_err(|e| {
        Failure::Runtime(format!(
            "cannot move group {} (stop every instance of the service first: the broker refuses while the \
             group has members): {e}",
            args.group
        ))
    })?;
    tracing::warn!(
        audit = true,
        group = %args.group,
        %topic,
        partition = args.partition,
        offset = args.offset,
        reason = %args.reason,
        "an operator skipped a record: the group goes on after it"
    );
    println!("skipped {tp} offset {} for group {}: it now stands at {}", args.offset, args.group, args.offset + 1);
    Ok(())
}

async fn verify_topics(kafka: &KafkaArgs) -> Result<(), Failure> {
    let topology = topology(kafka)?;
    TopicPlan::new(topology.clone(), 1).verify(&kafka.connection()?).await?;
    for topic in topology.all_topics() {
        println!("ok {topic}");
    }
    Ok(())
}
