//! `sample-orders`: produces OrderConfirmed events for trying the billing
//! service by hand, as `cargo xtask orders` runs it against the local stack
//! of `cargo xtask up`. It prints each order's id, and where to look.
//!
//! ```sh
//! cargo run -p integration --features broker --bin sample-orders -- --count 10
//! ```

use std::{collections::BTreeMap, process::ExitCode, time::Duration};

use chrono::{TimeZone, Utc};
use clap::Parser;
use rand::Rng;
use rskafka::{
    client::{
        partition::{Compression, UnknownTopicHandling},
        ClientBuilder,
    },
    record::Record,
};

/// Produces OrderConfirmed events to the billing service's source topic.
#[derive(Parser)]
#[command(name = "sample-orders")]
struct Args {
    /// How many events.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    count: u32,
    /// Bootstrap brokers (plaintext), `host:port[,host:port...]`.
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092")]
    brokers: String,
    /// The source topic.
    #[arg(long, env = "BILLING_TOPIC", default_value = "orders.confirmed")]
    topic: String,
    /// The events' currency (default: none named, so the service's default).
    #[arg(long)]
    currency: Option<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match produce(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn produce(args: &Args) -> Result<(), String> {
    let bootstrap: Vec<String> = args.brokers.split(',').map(|b| b.trim().to_owned()).collect();
    let backoff =
        rskafka::BackoffConfig { deadline: Some(Duration::from_secs(5)), ..rskafka::BackoffConfig::default() };
    let client = ClientBuilder::new(bootstrap)
        .client_id("sample-orders")
        .backoff_config(backoff)
        .build()
        .await
        .map_err(|e| format!("cannot reach the broker at {}: {e} (is `cargo xtask up` running?)", args.brokers))?;
    let topics = client.list_topics().await.map_err(|e| format!("cannot list the topics: {e}"))?;
    let partitions = topics.iter().find(|t| t.name == args.topic).map(|t| t.partitions.len()).ok_or_else(|| {
        format!("topic {} does not exist: create the ladder with `billing-bin topics create`", args.topic)
    })?;
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_err(|e| e.to_string())?;
    let timestamp = Utc.timestamp_millis_opt(now_ms.as_millis() as i64).single().ok_or("the clock is off")?;
    let mut rng = rand::thread_rng();
    let mut by_partition: BTreeMap<i32, Vec<Record>> = BTreeMap::new();
    for n in 0..args.count {
        let (event_id, order_id, customer_id) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
        let cents: u32 = rng.gen_range(500..20_000);
        let amount = format!("{}.{:02}", cents / 100, cents % 100);
        let currency = args.currency.as_ref().map(|c| format!(r#","currency":"{c}""#)).unwrap_or_default();
        let value = format!(
            r#"{{"event_id":"{event_id}","order_id":"{order_id}","customer_id":"{customer_id}","total_amount":"{amount}"{currency}}}"#
        );
        println!("order {order_id}: {amount} {}", args.currency.as_deref().unwrap_or("(the default currency)"));
        let record = Record {
            key: Some(order_id.to_string().into_bytes()),
            value: Some(value.into_bytes()),
            headers: BTreeMap::new(),
            timestamp,
        };
        by_partition.entry((n as usize % partitions) as i32).or_default().push(record);
    }
    for (partition, records) in by_partition {
        let pc = client
            .partition_client(&args.topic, partition, UnknownTopicHandling::Error)
            .await
            .map_err(|e| format!("cannot reach {}[{partition}]: {e}", args.topic))?;
        pc.produce(records, Compression::NoCompression)
            .await
            .map_err(|e| format!("cannot produce to {}[{partition}]: {e}", args.topic))?;
    }
    println!("produced {} OrderConfirmed events to {} ({partitions} partitions)", args.count, args.topic);
    Ok(())
}
