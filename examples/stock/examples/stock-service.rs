//! The stock service: `stock`'s handler on Kafka, with its own retry ladder.
//!
//! ```text
//! cargo run -p stock --example stock-service -- create-topics   # once
//! cargo run -p stock --example stock-service                    # until SIGTERM or Ctrl-C
//! ```
//!
//! Settings, from the environment: `INVENTORY_URL` (required), `STOCK_TOPIC`
//! (`orders.confirmed`), `STOCK_GROUP` (`stock`), `STOCK_RETRY_SCHEDULE`
//! (`1m,10m,1h`), `STOCK_PARTITIONS` (3) and `STOCK_REPLICATION_FACTOR` (3)
//! for `create-topics`, and the
//! `KAFKA_*` connection settings of [`retry_kafka::ConnectionSettings`].
//! With `ADMIN_TOKEN` set, the operators' API and console
//! ([`retry_operators`]) listen on `OPERATOR_LISTEN` (`127.0.0.1:8081`):
//! `http://127.0.0.1:8081/console`.

use std::{error::Error, process::ExitCode, sync::Arc, time::Duration};

use retry_core::groups::LadderGroups;
use retry_core::{RetryPolicy, RetrySchedule, RetryTopology};
use retry_kafka::{ConnectionSettings, DeadLetterAdmin, Listener, ListenerConfig, TopicPlan};
use retry_operators::{http::HttpLimits, OperatorsConfig, OperatorsServer};
use stock::ReserveStock;
use tokio::signal::unix::{signal, SignalKind};

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt().with_env_filter(std::env::var("RUST_LOG").unwrap_or("info".into())).init();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stock-service: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn Error>> {
    let setting = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_owned());
    let connection = ConnectionSettings::from_env().connection("stock-service")?;
    let schedule: RetrySchedule = setting("STOCK_RETRY_SCHEDULE", "1m,10m,1h").parse()?;
    let topology = RetryTopology::new(&setting("STOCK_TOPIC", "orders.confirmed"), &schedule)?;
    if std::env::args().nth(1).as_deref() == Some("create-topics") {
        let partitions = setting("STOCK_PARTITIONS", "3").parse().map_err(|e| format!("STOCK_PARTITIONS: {e}"))?;
        let replication =
            setting("STOCK_REPLICATION_FACTOR", "3").parse().map_err(|e| format!("STOCK_REPLICATION_FACTOR: {e}"))?;
        let plan = TopicPlan::new(topology, partitions).with_replication_factor(replication);
        for created in plan.create(&connection, true).await? {
            println!("{}: {:?}", created.topic, created.created);
        }
        return Ok(());
    }
    let inventory = std::env::var("INVENTORY_URL").map_err(|_| "INVENTORY_URL is required")?;
    let handler = ReserveStock::new(&inventory, Duration::from_secs(5))?;
    let policy = RetryPolicy::new(topology, Default::default());
    let group = setting("STOCK_GROUP", "stock");
    // The operators' API and console, when a token is given.
    let operators = match std::env::var("ADMIN_TOKEN") {
        Ok(token) if !token.is_empty() => {
            let groups = LadderGroups::new(&group, policy.topology())?;
            let admin = DeadLetterAdmin::connect(connection.clone(), policy.clone(), &groups).await?;
            let config = OperatorsConfig {
                token,
                policy: policy.clone(),
                group_id: group.clone(),
                idempotency_window: None,
                max_auth_failures: 10,
                wait_limit: Duration::from_secs(20),
            };
            let limits = HttpLimits {
                header_read_timeout: Duration::from_secs(10),
                request_timeout: Duration::from_secs(30),
                max_connections: 64,
            };
            let addr =
                setting("OPERATOR_LISTEN", "127.0.0.1:8081").parse().map_err(|e| format!("OPERATOR_LISTEN: {e}"))?;
            let server = OperatorsServer::serve("OPERATOR_LISTEN", addr, config, admin, limits).await?;
            tracing::info!(console = %format!("http://{}/console", server.addr()), "operators' API and console listening");
            Some(server)
        }
        _ => None,
    };
    let mut config = ListenerConfig::new(connection, &group, policy)?;
    config.handler_timeout = Duration::from_secs(10);
    let listener = Listener::start(config, Arc::new(handler)).await?;
    if let Some(operators) = &operators {
        operators.show_brake(listener.brake());
    }
    tracing::info!("stock service started");
    let (mut term, mut int) = (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?);
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    listener.shutdown().await;
    if let Some(operators) = operators {
        operators.stop().await;
    }
    Ok(())
}
