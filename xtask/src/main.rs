//! `cargo xtask`: the project's automation, in Rust so it runs wherever cargo
//! does. It starts and stops the test broker, runs the integration tests
//! against it and runs everything CI checks.
//!
//! It never touches anything outside the clone except its cache of slow
//! installs (`~/.cache/kafka-retry/`, see [`paths::cache_dir`]) and the
//! broker's temporary data directory.

mod bench;
mod book;
mod broker;
mod browser;
mod children;
mod ci;
mod circles;
mod demo;
mod env;
mod integration;
mod interrupt;
mod kafka;
mod paths;
mod probe;
mod process;
mod python;
mod side_by_side;
mod spring;
mod stack;
mod tidy;
mod tls;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Project automation", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start, stop or inspect the test broker.
    Broker {
        #[command(subcommand)]
        action: broker::Action,
    },
    /// A local stack for trying the service by hand: a broker, the ladder's
    /// topics, the fake billing provider and an operators' token; prints
    /// how to run billing-bin against it.
    Up(stack::UpArgs),
    /// Stop what `up` started.
    Down,
    /// Produce sample OrderConfirmed events to the stack of `up`.
    Orders(stack::OrdersArgs),
    /// The README's quick start, rehearsed: up, check, run, orders, every
    /// order charged once, down (a part of `ci`).
    QuickStart,
    /// Start a broker, run the integration tests against it, stop it.
    ///
    /// With KAFKA_RETRY_BROKERS set, uses that broker instead and starts none
    /// (with KAFKA_RETRY_MOCK_CONTROL too, it is taken for the mock cluster).
    Integration {
        /// Which brokers to run the suite against.
        #[arg(long, value_enum, default_value = "tansu")]
        broker: integration::BrokerChoice,
        /// Extra arguments for the test binary (e.g. a test name filter).
        #[arg(trailing_var_arg = true)]
        test_args: Vec<String>,
    },
    /// Throughput of the pipeline beside the raw rskafka ceiling, against a broker.
    Bench(bench::BenchArgs),
    /// The billing service end to end: billing-bin against a broker and a
    /// faulty fake provider, accounting for every event.
    Demo(demo::DemoArgs),
    /// The fuzz targets: every decoder that reads bytes from outside, its
    /// corpus then random inputs (a part of `ci`, with fewer cases).
    Fuzz {
        /// Random inputs per target.
        #[arg(long, default_value_t = 1_000_000)]
        cases: u32,
    },
    /// The rules about dependencies and names between the crates (a part of `ci`).
    Tidy,
    /// The book under docs/: built with mdBook, warnings denied, its links
    /// and configuration reference checked (a part of `ci`).
    Book,
    /// Everything CI checks: formatting, lints, unit tests, docs, dependency
    /// rules, then the integration tests in lanes side by side (Apache
    /// Kafka's passes, the mock cluster's and the quick start, tansu's); each
    /// step's time at the end. `--full`: every test on every broker.
    Ci(ci::CiArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if let Err(e) = interrupt::install() {
        eprintln!("warning: cannot watch for interruptions ({e:#}); an interrupted run may leave a broker running");
    }
    let result = match cli.command {
        Command::Broker { action } => broker::run(action),
        Command::Up(args) => stack::up(&args),
        Command::Down => stack::down(),
        Command::Orders(args) => stack::orders(&args),
        Command::QuickStart => stack::rehearse(),
        Command::Integration { broker, test_args } => integration::integration(broker, &test_args),
        Command::Bench(args) => bench::bench(&args),
        Command::Demo(args) => demo::demo(&args),
        Command::Fuzz { cases } => ci::fuzz(cases),
        Command::Tidy => tidy::tidy(),
        Command::Book => stack::build_binaries().and_then(|debug| book::book(&debug.join("billing-bin"))),
        Command::Ci(args) => ci::ci(&args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // The chain of contexts says what failed; a backtrace of xtask would not help.
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
