//! Flags and environment, validated into the settings the service runs with.

use std::{net::SocketAddr, time::Duration};

use clap::{Args, Parser, Subcommand, ValueEnum};
use retry_core::RetrySchedule;
use retry_kafka::{ConnectionConfig, ConnectionSettings, Secret};

use crate::failure::Failure;

/// How long a single broker request may take, start-up included: an
/// unreachable broker is reported after this, not waited on forever.
const KAFKA_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Parser)]
#[command(
    name = "billing-bin",
    version,
    about = "Charges customers on OrderConfirmed events, with non-blocking retry topics"
)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) kafka: KafkaArgs,
    #[command(subcommand)]
    pub(crate) command: Option<Command>,
    /// Settings of `run`, the default command.
    #[command(flatten)]
    pub(crate) run: RunArgs,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Consume, charge, retry (the default).
    Run(Box<RunArgs>),
    /// Check the settings `run` reads before the first event: one line per
    /// check (configuration, each broker, TLS and SASL, the ladder's
    /// topics, the consumer groups, the provider, the operators' token),
    /// each failure with what to do. Exit 0 when all pass, 1 otherwise.
    Check(Box<CheckArgs>),
    /// Create or check the topics of the retry ladder.
    Topics {
        #[command(subcommand)]
        action: TopicsAction,
    },
    /// Look at, replay or acknowledge dead letters, through a running service's operators' API.
    Dlq(DlqArgs),
    /// Serve the operators' API alone, consuming nothing: for a ladder that
    /// another service consumes (a Spring Kafka @RetryableTopic listener,
    /// with RETRY_HEADER_STYLE=spring), or to keep the API apart from the
    /// instances that charge. Needs ADMIN_TOKEN or ADMIN_TOKEN_FILE.
    Operators(Box<OperatorArgs>),
    /// Move a consumer group of the ladder past one record, with every
    /// instance of the service stopped: the last resort for a partition
    /// stalled on a record that cannot even be dead-lettered.
    Offsets {
        #[command(subcommand)]
        action: OffsetsAction,
    },
}

/// Settings of `check`: those of `run`, which it checks.
#[derive(Args)]
pub(crate) struct CheckArgs {
    /// The settings `run` would run with.
    #[command(flatten)]
    pub(crate) run: RunArgs,
    /// Print the report as JSON (`{"passed": .., "checks": [{"name",
    /// "status": "pass|fail|skip", "detail", "next_step"}]}`).
    #[arg(long)]
    pub(crate) json: bool,
}

/// What `offsets` does.
#[derive(Subcommand)]
pub(crate) enum OffsetsAction {
    /// Skip exactly the record at `--offset`: only when the group's position
    /// on the partition is that offset; logs an audit line.
    Skip(SkipArgs),
}

/// Which record to skip, and why.
#[derive(Args)]
pub(crate) struct SkipArgs {
    /// The consumer group (the source's, or a rung's `<group>.retry-<label>`).
    #[arg(long)]
    pub(crate) group: String,
    /// The topic the group consumes (default: the source topic, BILLING_TOPIC).
    #[arg(long = "skip-topic")]
    pub(crate) skip_topic: Option<String>,
    /// The partition.
    #[arg(long)]
    pub(crate) partition: i32,
    /// The offset of the record to skip: the group's position must be it.
    #[arg(long)]
    pub(crate) offset: i64,
    /// Why, for the audit line (e.g. a ticket).
    #[arg(long)]
    pub(crate) reason: String,
}

/// The operators' token: `$ADMIN_TOKEN`, or the content of `file` (trailing
/// newline removed); at least 16 characters. Never shown in errors.
pub(crate) fn admin_token(file: Option<&std::path::Path>) -> Result<Option<String>, Failure> {
    let from_env = std::env::var("ADMIN_TOKEN").ok().filter(|t| !t.is_empty());
    let token = match (from_env, file) {
        (Some(_), Some(_)) => return Err(Failure::Config("give ADMIN_TOKEN or ADMIN_TOKEN_FILE, not both".into())),
        (Some(token), None) => token,
        (None, Some(path)) => std::fs::read_to_string(path)
            .map(|t| t.trim_end_matches(['\r', '\n']).to_owned())
            .map_err(|e| Failure::Config(format!("ADMIN_TOKEN_FILE {} cannot be read: {e}", path.display())))?,
        (None, None) => return Ok(None),
    };
    if token.len() < 16 {
        return Err(Failure::Config(
            "the admin token (ADMIN_TOKEN or ADMIN_TOKEN_FILE) must be at least 16 characters".into(),
        ));
    }
    Ok(Some(token))
}

/// Where the running service's operators' API is.
#[derive(Args)]
pub(crate) struct DlqArgs {
    /// The service's operators' API (its OPERATOR_LISTEN).
    #[arg(long, env = "OPERATOR_URL", default_value = "http://127.0.0.1:8081")]
    pub(crate) operator_url: String,
    /// A file holding the service's admin token (or set ADMIN_TOKEN in the
    /// environment; there is no flag for the token itself: command lines are
    /// visible to every user of the machine).
    #[arg(long, env = "ADMIN_TOKEN_FILE")]
    pub(crate) admin_token_file: Option<std::path::PathBuf>,
    #[command(subcommand)]
    pub(crate) action: DlqAction,
}

#[derive(Subcommand)]
pub(crate) enum DlqAction {
    /// The dead-letter topics with their backlog.
    List,
    /// One page of dead-lettered records.
    Show {
        /// One partition (default: every partition, from the operators' position).
        #[arg(long)]
        partition: Option<i32>,
        /// With a partition, the first offset (default: the oldest kept).
        #[arg(long, requires = "partition")]
        offset: Option<i64>,
        /// How many records (at most 100).
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Replay records into the source topic or its first retry topic.
    Replay {
        /// The source topic or the first retry topic (default: the source topic).
        #[arg(long)]
        target_topic: Option<String>,
        /// Report what would be replayed, change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Replay at most this many records.
        #[arg(long)]
        limit: Option<usize>,
        /// Only this partition.
        #[arg(long)]
        partition: Option<i32>,
        /// Only these offsets (repeatable).
        #[arg(long = "offset")]
        offsets: Vec<i64>,
        /// Only records with these keys (repeatable).
        #[arg(long = "key")]
        keys: Vec<String>,
        /// Replay records even if replayed too often already.
        #[arg(long)]
        override_loop_guard: bool,
        /// Replay records older than the provider's idempotency window, which
        /// the provider may charge again.
        #[arg(long)]
        override_idempotency_window: bool,
    },
    /// Acknowledge records without replaying them.
    Ack {
        /// The partition.
        #[arg(long)]
        partition: i32,
        /// The last offset to acknowledge (inclusive).
        #[arg(long, conflicts_with = "offsets", required_unless_present = "offsets")]
        up_to_offset: Option<i64>,
        /// Only these offsets (repeatable).
        #[arg(long = "offset")]
        offsets: Vec<i64>,
    },
    /// Show the listener: its brake on the instance that answers, the
    /// operators' pause, and each consumed topic's lag.
    Listener,
    /// Pause the listener on every instance for a while: events wait,
    /// keeping their place, and run again when the pause ends or is resumed.
    Pause {
        /// How long: `30s`, `10m`, `2h` (1s to 168h).
        #[arg(long = "for")]
        duration: String,
        /// Why, for the other operators and the audit log.
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// End the operators' pause on every instance.
    Resume,
}

#[derive(Subcommand)]
pub(crate) enum TopicsAction {
    /// Create the source, retry and dead-letter topics (existing ones are kept).
    Create(TopicArgs),
    /// Check that every topic exists with enough partitions.
    Verify,
}

/// Where Kafka is and what the ladder looks like; every command needs these.
#[derive(Args, Clone)]
pub(crate) struct KafkaArgs {
    /// Bootstrap brokers, `host:port[,host:port...]`.
    #[arg(long, env = "KAFKA_BROKERS", default_value = "127.0.0.1:9092", global = true)]
    pub(crate) brokers: String,
    /// The topic of OrderConfirmed events.
    #[arg(long, env = "BILLING_TOPIC", default_value = "orders.confirmed", global = true)]
    pub(crate) topic: String,
    /// The retry ladder's delays, e.g. `5s,30s,5m` (units ms, s, m, h).
    #[arg(long, env = "RETRY_SCHEDULE", default_value = "5s,30s,5m", value_parser = parse_schedule, global = true)]
    pub(crate) retry_schedule: RetrySchedule,
    /// Which retry headers hops write, and how the ladder's topics are
    /// named: `native` (ours, `<topic>.retry-5s`, `<topic>.dlq`), `spring`
    /// (Spring Kafka's @RetryableTopic headers and names,
    /// `<topic>-retry-5000`, `<topic>-dlt`) or `both` (both headers, our
    /// names). Both kinds of headers are always read.
    #[arg(long, env = "RETRY_HEADER_STYLE", default_value = "native", value_parser = parse_header_style, global = true)]
    pub(crate) header_style: retry_core::HeaderStyle,
    /// `pretty` for people, `json` for log collectors.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Pretty, global = true)]
    pub(crate) log_format: LogFormat,
    /// How connections to Kafka are secured: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.
    #[arg(long, env = "KAFKA_SECURITY_PROTOCOL", default_value = "PLAINTEXT", global = true)]
    pub(crate) security_protocol: String,
    /// The SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
    #[arg(long, env = "KAFKA_SASL_MECHANISM", global = true)]
    pub(crate) sasl_mechanism: Option<String>,
    /// The SASL user name.
    #[arg(long, env = "KAFKA_SASL_USERNAME", global = true)]
    pub(crate) sasl_username: Option<String>,
    /// The SASL password (prefer --sasl-password-file: command lines are visible to other users).
    #[arg(long, env = "KAFKA_SASL_PASSWORD", hide_env_values = true, global = true)]
    pub(crate) sasl_password: Option<String>,
    /// A file whose content (trailing newline removed) is the SASL password.
    #[arg(long, env = "KAFKA_SASL_PASSWORD_FILE", global = true)]
    pub(crate) sasl_password_file: Option<std::path::PathBuf>,
    /// With SSL and SASL_SSL: a PEM file of the CAs to trust (default: the system's).
    #[arg(long, env = "KAFKA_SSL_CA_LOCATION", global = true)]
    pub(crate) ssl_ca_location: Option<std::path::PathBuf>,
    /// The client certificate (PEM), for brokers that require mutual TLS.
    #[arg(long, env = "KAFKA_SSL_CERTIFICATE_LOCATION", global = true)]
    pub(crate) ssl_certificate_location: Option<std::path::PathBuf>,
    /// The client certificate's private key (PEM, unencrypted).
    #[arg(long, env = "KAFKA_SSL_KEY_LOCATION", global = true)]
    pub(crate) ssl_key_location: Option<std::path::PathBuf>,
    /// `https` checks that the broker's certificate names the host connected to;
    /// `none` does not (a warning is logged at start).
    #[arg(long, env = "KAFKA_SSL_ENDPOINT_IDENTIFICATION", default_value = "https", global = true)]
    pub(crate) ssl_endpoint_identification: String,
}

impl KafkaArgs {
    pub(crate) fn connection(&self) -> Result<ConnectionConfig, Failure> {
        let settings = ConnectionSettings {
            brokers: Some(self.brokers.clone()),
            security_protocol: Some(self.security_protocol.clone()),
            sasl_mechanism: self.sasl_mechanism.clone(),
            sasl_username: self.sasl_username.clone(),
            sasl_password: self.sasl_password.clone().map(Secret::new),
            sasl_password_file: self.sasl_password_file.clone(),
            ssl_ca_location: self.ssl_ca_location.clone(),
            ssl_certificate_location: self.ssl_certificate_location.clone(),
            ssl_key_location: self.ssl_key_location.clone(),
            ssl_endpoint_identification: Some(self.ssl_endpoint_identification.clone()),
        };
        // Every error here is a setting's (it names the KAFKA_* variable).
        let config = |e: retry_kafka::Error| Failure::Config(e.to_string());
        settings.connection("billing-bin").and_then(|c| c.with_request_timeout(KAFKA_REQUEST_TIMEOUT)).map_err(config)
    }
}

/// The consumer groups, the idempotency window and the operators' API:
/// what `run` and `operators` share.
#[derive(Args, Clone)]
pub(crate) struct OperatorArgs {
    /// The consumer group of the source topic; each rung's is named after
    /// it: `<group>.retry-5s`, or `<group>-retry-5000` in the Spring style.
    #[arg(long, env = "BILLING_GROUP_ID", default_value = "billing-order-confirmed")]
    pub(crate) group_id: String,
    /// How long the provider remembers an idempotency key (e.g. 24h): an
    /// event first produced longer ago, less the margin, is dead-lettered
    /// (idempotency-window-passed) instead of charged, and replayed only
    /// when the operator overrides the idempotency window, since the
    /// provider might charge it again. `off` when the provider never forgets.
    #[arg(long, env = "BILLING_PROVIDER_IDEMPOTENCY_WINDOW", default_value = "24h")]
    pub(crate) provider_idempotency_window: String,
    /// How much of the idempotency window is kept as a margin: for the
    /// clocks of the producer and the provider, and a charge's own time.
    #[arg(long, env = "BILLING_PROVIDER_IDEMPOTENCY_MARGIN", default_value = "1h", value_parser = parse_duration)]
    pub(crate) provider_idempotency_margin: Duration,
    /// Where the operators' API (/admin) is served, when it is on: apart
    /// from the probes, so exposing one does not expose the other.
    #[arg(long, env = "OPERATOR_LISTEN", default_value = "127.0.0.1:8081")]
    pub(crate) operator_listen: SocketAddr,
    /// How long a client of either listener may take to send a request's
    /// headers, waiting on a kept-alive connection included.
    #[arg(long, env = "HTTP_HEADER_READ_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub(crate) http_header_read_timeout: Duration,
    /// How long a request to either listener may take, its body included.
    #[arg(long, env = "HTTP_REQUEST_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub(crate) http_request_timeout: Duration,
    /// Connections each listener serves at once; more are closed on arrival.
    #[arg(long, env = "HTTP_MAX_CONNECTIONS", default_value_t = 128)]
    pub(crate) http_max_connections: usize,
    /// Failed authentications to the operators' API a client address may
    /// make per minute; beyond, it is answered 429 until the minute ends.
    #[arg(long, env = "OPERATOR_MAX_AUTH_FAILURES", default_value_t = 10)]
    pub(crate) operator_max_auth_failures: u32,
    /// A file holding the token that enables the operators' API under /admin
    /// (at least 16 characters); ADMIN_TOKEN in the environment works too.
    /// Off when neither is set. There is no flag for the token itself:
    /// command lines are visible to every user of the machine.
    #[arg(long, env = "ADMIN_TOKEN_FILE")]
    pub(crate) admin_token_file: Option<std::path::PathBuf>,
}

impl OperatorArgs {
    pub(crate) fn admin_token(&self) -> Result<Option<String>, Failure> {
        admin_token(self.admin_token_file.as_deref())
    }

    /// The limits of both HTTP listeners.
    pub(crate) fn http_limits(&self) -> Result<retry_operators::http::HttpLimits, Failure> {
        if self.http_header_read_timeout.is_zero() || self.http_request_timeout.is_zero() {
            return Err(Failure::Config(
                "HTTP_HEADER_READ_TIMEOUT and HTTP_REQUEST_TIMEOUT must be longer than zero".into(),
            ));
        }
        if self.http_max_connections == 0 {
            return Err(Failure::Config("HTTP_MAX_CONNECTIONS must be at least 1".into()));
        }
        if self.operator_max_auth_failures == 0 {
            return Err(Failure::Config("OPERATOR_MAX_AUTH_FAILURES must be at least 1".into()));
        }
        Ok(retry_operators::http::HttpLimits {
            header_read_timeout: self.http_header_read_timeout,
            request_timeout: self.http_request_timeout,
            max_connections: self.http_max_connections,
        })
    }

    /// The oldest an event may be and still be charged or replayed: the
    /// provider's idempotency window less its margin; `None` when the
    /// window is `off`.
    pub(crate) fn max_event_age(&self) -> Result<Option<Duration>, Failure> {
        let window = match self.provider_idempotency_window.trim() {
            "off" => return Ok(None),
            text => parse_duration(text)
                .map_err(|e| Failure::Config(format!("BILLING_PROVIDER_IDEMPOTENCY_WINDOW: {e}")))?,
        };
        let margin = self.provider_idempotency_margin;
        match window.checked_sub(margin) {
            Some(age) if !age.is_zero() => Ok(Some(age)),
            _ => Err(Failure::Config(format!(
                "BILLING_PROVIDER_IDEMPOTENCY_WINDOW ({}) must be longer than BILLING_PROVIDER_IDEMPOTENCY_MARGIN \
                 ({margin:?}), or `off`",
                self.provider_idempotency_window.trim(),
            ))),
        }
    }
}

/// Settings of the running service.
#[derive(Args, Clone)]
pub(crate) struct RunArgs {
    /// What `run` shares with `operators`.
    #[command(flatten)]
    pub(crate) operators: OperatorArgs,
    /// Base URL of the billing provider; charges go to `<url>/charges`. Required.
    #[arg(long, env = "BILLING_PROVIDER_URL")]
    pub(crate) provider_url: Option<String>,
    /// How long one call to the provider may take; longer is a transient failure.
    #[arg(long, env = "BILLING_PROVIDER_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub(crate) provider_timeout: Duration,
    /// Where the source topic's group starts when it has no committed
    /// offsets (a new or renamed BILLING_GROUP_ID, offsets expired):
    /// `window` (events inside the idempotency window; the earliest when
    /// the window is off), `earliest`, `latest`, `by_duration:<duration>`,
    /// or a time (2026-12-01T00:00:00Z, or ms since the epoch).
    #[arg(long, env = "BILLING_START_AT", default_value = "window")]
    pub(crate) start_at: String,
    /// The ISO 4217 currencies charged in, comma-separated; the first is
    /// the currency of events that name none.
    #[arg(long, env = "BILLING_CURRENCIES", default_value = "EUR")]
    pub(crate) currencies: String,
    /// The most one charge may be: one amount for every currency (10000),
    /// or one per currency (EUR=10000,JPY=1500000). Above it, the event is
    /// dead-lettered, not charged.
    #[arg(long, env = "BILLING_MAX_AMOUNT", default_value = "10000")]
    pub(crate) max_amount: String,
    /// Where /healthz, /readyz and /metrics are served.
    #[arg(long, env = "ADMIN_LISTEN", default_value = "127.0.0.1:8080")]
    pub(crate) admin_listen: SocketAddr,
    /// A stable identity of this instance in its consumer groups (Kafka's
    /// group.instance.id), e.g. its StatefulSet pod name: a restart within
    /// the session timeout gets its partitions back without a rebalance,
    /// and the instance does not leave its groups when it stops. Every
    /// running instance needs its own. Unset: a member that leaves on stop.
    #[arg(long, env = "KAFKA_GROUP_INSTANCE_ID")]
    pub(crate) group_instance_id: Option<String>,
    /// The consumer group protocol: classic (every broker), or consumer
    /// (KIP-848, Apache Kafka 4.0 and later: a rebalance moves only the
    /// partitions it must, and the others go on; the session and heartbeat
    /// interval are then the broker's group.consumer.* settings).
    #[arg(long, env = "KAFKA_GROUP_PROTOCOL", default_value = "classic", value_parser = parse_group_protocol)]
    pub(crate) group_protocol: retry_kafka::GroupProtocol,
    /// Under the classic group protocol, how rebalances move partitions:
    /// range (eager: every rebalance stops every partition) or
    /// cooperative-sticky (only the partitions that move stop). Every
    /// instance of a group must use the same.
    #[arg(long, env = "KAFKA_ASSIGNMENT_STRATEGY", default_value = "range", value_parser = parse_assignment_strategy)]
    pub(crate) assignment_strategy: retry_kafka::AssignmentStrategy,
    /// How long the consumer groups wait for a silent member (no heartbeat)
    /// before they move its partitions; with KAFKA_GROUP_INSTANCE_ID, how
    /// long a restart may take without a rebalance.
    #[arg(long, env = "KAFKA_SESSION_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub(crate) session_timeout: Duration,
    /// Which events of transactional producers are charged: read_committed
    /// (only those of committed transactions) or read_uncommitted.
    #[arg(long, env = "KAFKA_ISOLATION_LEVEL", default_value = "read_committed", value_parser = parse_isolation)]
    pub(crate) isolation_level: retry_kafka::IsolationLevel,
    /// How events republished to retry and dead-letter topics are
    /// compressed: as-source (as their batch was, lz4 when it was not
    /// compressed), none, gzip, snappy, lz4 or zstd.
    #[arg(long, env = "KAFKA_PUBLISH_COMPRESSION", default_value = "as-source", value_parser = parse_compression)]
    pub(crate) publish_compression: retry_kafka::Compression,
    /// How many events of one partition are charged at once (events of one
    /// key, one after another); 1 charges one event at a time.
    #[arg(long, env = "BILLING_MAX_IN_FLIGHT", default_value_t = 64)]
    pub(crate) max_in_flight: usize,
    /// How many events of one partition are held at most past its commit
    /// position: charged (or awaiting their republication's
    /// acknowledgement) above an event still being charged. A crash charges
    /// these again (the provider's idempotency key absorbs it).
    #[arg(long, env = "BILLING_MAX_UNCOMMITTED", default_value_t = retry_core::window::WindowConfig::DEFAULT_MAX_UNCOMMITTED)]
    pub(crate) max_uncommitted: usize,
    /// How often the dead-letter backlog gauge is measured.
    #[arg(long, env = "DLQ_POLL_INTERVAL", default_value = "15s", value_parser = parse_duration)]
    pub(crate) dlq_poll_interval: Duration,
    /// The outage brake: `on` or `off`. When most charges fail transiently,
    /// events wait instead of moving down the ladder, and the provider is
    /// probed one event at a time until it answers again.
    #[arg(long, env = "BILLING_BRAKE", default_value = "on")]
    pub(crate) brake: String,
    /// The brake's sliding window of charge outcomes.
    #[arg(long, env = "BILLING_BRAKE_WINDOW", default_value = "30s", value_parser = parse_duration)]
    pub(crate) brake_window: Duration,
    /// The share of transient failures in the window that engages the brake, in percent.
    #[arg(long, env = "BILLING_BRAKE_FAILURE_RATE", default_value_t = 50)]
    pub(crate) brake_failure_rate: u8,
    /// The fewest charges in the window that may engage the brake; as many
    /// transient failures in a row engage it at once.
    #[arg(long, env = "BILLING_BRAKE_MIN_CALLS", default_value_t = 20)]
    pub(crate) brake_min_calls: u32,
    /// The pause before the first probe; it doubles after each failed probe...
    #[arg(long, env = "BILLING_BRAKE_PROBE_PAUSE", default_value = "5s", value_parser = parse_duration)]
    pub(crate) brake_probe_pause: Duration,
    /// ...up to this.
    #[arg(long, env = "BILLING_BRAKE_PROBE_PAUSE_MAX", default_value = "1m", value_parser = parse_duration)]
    pub(crate) brake_probe_pause_max: Duration,
    /// Successful probes in a row that release the brake.
    #[arg(long, env = "BILLING_BRAKE_RESUME_AFTER", default_value_t = 3)]
    pub(crate) brake_resume_after: u32,
    /// How long, at most, events whose retries ran out wait for the brake
    /// instead of being dead-lettered (after it, they are, and the alert fires).
    #[arg(long, env = "BILLING_BRAKE_MAX", default_value = "30m", value_parser = parse_duration)]
    pub(crate) brake_max: Duration,
}

impl RunArgs {
    pub(crate) fn window(&self) -> Result<retry_core::window::WindowConfig, Failure> {
        let window = retry_core::window::WindowConfig::new(self.max_in_flight, retry_core::window::NullKeys::Ordered)
            .map_err(|e| Failure::Config(format!("BILLING_MAX_IN_FLIGHT: {e}")))?;
        window
            .with_max_uncommitted(self.max_uncommitted)
            .map_err(|e| Failure::Config(format!("BILLING_MAX_UNCOMMITTED: {e}")))
    }

    /// The outage brake's settings; `None` when it is off.
    pub(crate) fn brake(&self) -> Result<Option<retry_core::brake::BrakeConfig>, Failure> {
        match self.brake.trim() {
            "off" => return Ok(None),
            "on" => {}
            other => return Err(Failure::Config(format!("BILLING_BRAKE is {other:?}: expected on or off"))),
        }
        fn config(setting: &'static str) -> impl Fn(retry_core::Error) -> Failure {
            move |e| Failure::Config(format!("{setting}: {e}"))
        }
        let pauses = retry_core::backoff::BackoffConfig::new(self.brake_probe_pause, self.brake_probe_pause_max)
            .map_err(config("BILLING_BRAKE_PROBE_PAUSE and BILLING_BRAKE_PROBE_PAUSE_MAX"))?;
        let brake = retry_core::brake::BrakeConfig::default()
            .with_window(self.brake_window)
            .map_err(config("BILLING_BRAKE_WINDOW"))?
            .with_threshold(self.brake_failure_rate, self.brake_min_calls)
            .map_err(config("BILLING_BRAKE_FAILURE_RATE and BILLING_BRAKE_MIN_CALLS"))?
            .with_probe_pauses(pauses)
            .with_resume_after(self.brake_resume_after)
            .map_err(config("BILLING_BRAKE_RESUME_AFTER"))?
            .with_max_engaged(self.brake_max)
            .map_err(config("BILLING_BRAKE_MAX"))?;
        Ok(Some(brake))
    }

    /// The business rules of a charge.
    pub(crate) fn charge_rules(&self) -> Result<billing::ChargeRules, Failure> {
        let currencies = self
            .currencies
            .split(',')
            .map(|code| code.trim().parse::<billing::Currency>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Failure::Config(format!("BILLING_CURRENCIES: {e}")))?;
        let max_amount: billing::MaxAmount =
            self.max_amount.parse().map_err(|e| Failure::Config(format!("BILLING_MAX_AMOUNT: {e}")))?;
        billing::ChargeRules::new(currencies, max_amount)
            .map_err(|e| Failure::Config(format!("BILLING_CURRENCIES and BILLING_MAX_AMOUNT: {e}")))
    }

    /// Where the source topic's group starts without committed offsets.
    pub(crate) fn start_at(&self, max_event_age: Option<Duration>) -> Result<retry_kafka::OffsetReset, Failure> {
        match (self.start_at.trim(), max_event_age) {
            ("window", Some(age)) => Ok(retry_kafka::OffsetReset::ByDuration(age)),
            ("window", None) => Ok(retry_kafka::OffsetReset::Earliest),
            (other, _) => other.parse().map_err(|e: retry_kafka::Error| match e {
                retry_kafka::Error::InvalidSetting { problem, .. } => {
                    Failure::Config(format!("BILLING_START_AT: {problem}"))
                }
                other => Failure::Config(format!("BILLING_START_AT: {other}")),
            }),
        }
    }

    pub(crate) fn provider(&self) -> Result<billing::ProviderConfig, Failure> {
        let url = self.provider_url.as_deref().filter(|u| !u.trim().is_empty()).ok_or_else(|| {
            Failure::Config(
                "BILLING_PROVIDER_URL (or --provider-url) is required, e.g. http://127.0.0.1:9000; to try the \
                 service with a fake provider and a local broker, run `cargo xtask up`, which prints the settings"
                    .into(),
            )
        })?;
        Ok(billing::ProviderConfig {
            base_url: url.to_owned(),
            timeout: self.provider_timeout,
            // Each partition charges up to max_in_flight at once; a few
            // partitions per instance is the common case.
            idle_connections: self.max_in_flight.saturating_mul(4),
        })
    }
}

/// Settings of `topics create`.
#[derive(Args, Clone)]
pub(crate) struct TopicArgs {
    /// Partitions of every topic (retry and dead-letter topics need at least the source's).
    #[arg(long, env = "TOPIC_PARTITIONS", default_value_t = 3, value_parser = clap::value_parser!(i32).range(1..=10_000))]
    pub(crate) partitions: i32,
    /// Replication factor of every topic.
    #[arg(long, env = "TOPIC_REPLICATION_FACTOR", default_value_t = 1, value_parser = clap::value_parser!(i16).range(1..=16))]
    pub(crate) replication_factor: i16,
    /// Leave the source topic alone (it is managed elsewhere).
    #[arg(long)]
    pub(crate) skip_source: bool,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum LogFormat {
    Pretty,
    Json,
}

fn parse_group_protocol(s: &str) -> Result<retry_kafka::GroupProtocol, String> {
    s.parse().map_err(problem)
}

/// What is wrong with a setting, without the library's name for it (clap
/// names the flag and its variable).
fn problem(e: retry_kafka::Error) -> String {
    match e {
        retry_kafka::Error::InvalidSetting { problem, .. } => problem,
        other => other.to_string(),
    }
}

fn parse_assignment_strategy(s: &str) -> Result<retry_kafka::AssignmentStrategy, String> {
    s.parse().map_err(problem)
}

fn parse_header_style(s: &str) -> Result<retry_core::HeaderStyle, String> {
    s.parse()
}

fn parse_schedule(s: &str) -> Result<RetrySchedule, String> {
    s.parse().map_err(|e: retry_core::Error| e.to_string())
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    match retry_core::parse_duration(s).map_err(|e| e.to_string())? {
        d if d.is_zero() => Err("must be longer than zero".into()),
        d => Ok(d),
    }
}

/// Logs to stderr, `info` and up unless `RUST_LOG` says otherwise; the
/// client library beneath only from `error`: its connection attempts are
/// retried and reported by the service, in one line with what to do
/// (`RUST_LOG=debug` shows every step).
pub(crate) fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rskafka=error"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Pretty => builder.init(),
        LogFormat::Json => builder.json().with_current_span(true).init(),
    }
}

fn parse_isolation(s: &str) -> Result<retry_kafka::IsolationLevel, String> {
    s.parse().map_err(|e: retry_kafka::Error| e.to_string())
}

fn parse_compression(s: &str) -> Result<retry_kafka::Compression, String> {
    s.parse().map_err(|e: retry_kafka::Error| e.to_string())
}
