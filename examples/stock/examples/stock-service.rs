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

use std::{error::Error, process::ExitCode, sync::Arc, time::Duration};

use retry_core::{RetryPolicy, RetrySchedule, RetryTopology};
use retry_kafka::{ConnectionSettings, Listener, ListenerConfig, TopicPlan};
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
    let mut config = ListenerConfig::new(connection, &setting("STOCK_GROUP", "stock"), policy)?;
    config.handler_timeout = Duration::from_secs(10);
    let listener = Listener::start(config, Arc::new(handler)).await?;
    tracing::info!("stock service started");
    let (mut term, mut int) = (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?);
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    listener.shutdown().await;
    Ok(())
}
