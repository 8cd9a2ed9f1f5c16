//! `fake-provider`: the fake billing provider of
//! `integration::fake_provider` as a process of its own, for running
//! billing-bin by hand against it. It prints `listening on http://ADDR` and
//! serves until killed:
//!
//! ```sh
//! cargo run -p integration --features broker --bin fake-provider -- \
//!     --listen 127.0.0.1:8080 --transient-pct 20 --permanent-pct 5 --slow-pct 5 --slow 3s
//! curl -s localhost:8080/ledger
//! curl -s -X PUT localhost:8080/script/ORDER_ID -d '{"kind": "fail_times", "times": 2}'
//! ```

use std::{net::SocketAddr, time::Duration};

use clap::Parser;
use integration::fake_provider::{FakeProvider, Faults};

/// A fake billing provider: `POST /charges`, `GET /charges/{key}`,
/// `GET /ledger`, `GET /requests`, `GET /arrivals`, `PUT /script/{order_id}`.
#[derive(Parser)]
#[command(name = "fake-provider")]
struct Args {
    /// Where to listen; port 0 picks a free one.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Percent of orders whose first requests fail with 503, 502, 500 or 429.
    #[arg(long, default_value_t = 0)]
    transient_pct: u8,
    /// A transient order fails its first 1 to this many requests.
    #[arg(long, default_value_t = 2)]
    transient_max_failures: u32,
    /// Percent of orders always refused with 400.
    #[arg(long, default_value_t = 0)]
    permanent_pct: u8,
    /// Percent of orders whose first request is charged but answered late.
    #[arg(long, default_value_t = 0)]
    slow_pct: u8,
    /// How late a slow order's first request is answered (e.g. 3s, 2500ms).
    #[arg(long, default_value = "3s", value_parser = retry_core::parse_duration)]
    slow: Duration,
    /// How long every answer takes at least (e.g. 50ms), as a real provider's does.
    #[arg(long, default_value = "0s", value_parser = retry_core::parse_duration)]
    latency: Duration,
    /// How long an idempotency key is remembered after its charge (e.g.
    /// 24h); without it, keys are remembered for good.
    #[arg(long, value_parser = retry_core::parse_duration)]
    key_ttl: Option<Duration>,
    /// Seeds which order gets which fault.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let faults = Faults {
        transient_pct: args.transient_pct,
        transient_max_failures: args.transient_max_failures,
        permanent_pct: args.permanent_pct,
        slow_pct: args.slow_pct,
        slow: args.slow,
        seed: args.seed,
        latency: args.latency,
        key_ttl: args.key_ttl,
    };
    if let Err(e) = faults.validate() {
        eprintln!("error: {e}");
        return std::process::ExitCode::FAILURE;
    }
    let provider = match FakeProvider::start_on(args.listen, faults).await {
        Ok(provider) => provider,
        Err(e) => {
            eprintln!("error: cannot listen on {}: {e}", args.listen);
            return std::process::ExitCode::FAILURE;
        }
    };
    println!("listening on {}", provider.url());
    // Serves until killed; the provider keeps nothing worth a clean stop.
    std::future::pending::<()>().await;
    std::process::ExitCode::SUCCESS
}
