use std::time::Duration;

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong talking to Kafka.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No TCP connection to a broker could be made.
    #[error("cannot connect to the Kafka broker at {addr}: {source}")]
    Connect {
        /// The `host:port` tried.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// An established connection failed mid-request.
    #[error("connection to {addr} failed during {api}: {source}")]
    Io {
        /// The broker.
        addr: String,
        /// The request under way, e.g. `JoinGroup`.
        api: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A broker took longer than allowed to answer.
    #[error("{api} to {addr} got no answer within {timeout:?}")]
    Timeout {
        /// The broker.
        addr: String,
        /// The request.
        api: &'static str,
        /// The limit.
        timeout: Duration,
    },
    /// An rskafka call got no answer in time; its connection is replaced.
    #[error("{what} got no answer within {timeout:?}; its connection is replaced")]
    Deadline {
        /// The call.
        what: String,
        /// The limit.
        timeout: Duration,
    },
    /// The broker refused our credentials.
    #[error("authentication to {addr} as {username} with {mechanism} failed: {reason}")]
    Authentication {
        /// The broker.
        addr: String,
        /// The SASL mechanism.
        mechanism: &'static str,
        /// The user name (never the password).
        username: String,
        /// Why, as the broker said it.
        reason: String,
    },
    /// A TLS handshake failed, or the broker ended TLS: an untrusted
    /// certificate, a host name it does not hold, a refused client certificate.
    #[error("TLS with {addr} failed: {reason}")]
    Tls {
        /// The broker.
        addr: String,
        /// What it means and what to do.
        reason: String,
    },
    /// A TLS file (CA bundle, client certificate or key) is unusable.
    #[error("{} {}: {reason}", file.property(), path.display())]
    TlsFile {
        /// Which setting names it.
        file: TlsFile,
        /// The file.
        path: std::path::PathBuf,
        /// Why it cannot be used.
        reason: String,
    },
    /// A request or response could not be encoded or decoded.
    #[error("{api} with {addr}: malformed message: {reason}")]
    Protocol {
        /// The broker.
        addr: String,
        /// The request.
        api: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// The broker supports no version of a request that we implement.
    #[error("the broker at {addr} does not support {api}{}", describe_support(*ours_min, *ours_max, theirs))]
    UnsupportedVersion {
        /// The broker.
        addr: String,
        /// The request.
        api: &'static str,
        /// The lowest version we implement.
        ours_min: i16,
        /// The highest version we implement.
        ours_max: i16,
        /// The broker's range, if it supports the API at all.
        theirs: Option<(i16, i16)>,
    },
    /// The broker answered with an error code.
    #[error("{api} failed{}: {error}", context.as_deref().map(|c| format!(" for {c}")).unwrap_or_default())]
    Broker {
        /// The request.
        api: &'static str,
        /// What it was about (a group, a topic-partition), when known.
        context: Option<String>,
        /// The broker's error.
        error: BrokerError,
    },
    /// Another instance replays this dead-letter topic.
    #[error("a replay is running on another instance ({holder}, operators' group {group}): wait for it to end")]
    ReplayElsewhere {
        /// The operators' group.
        group: String,
        /// The instance that holds the replay lock.
        holder: String,
    },
    /// The replay lock was lost midway (the group's session expired): what
    /// was committed before stays, a repeat goes on from there.
    #[error("the replay lock of operators' group {group} was lost: repeat the replay to go on")]
    ReplayLockLost {
        /// The operators' group.
        group: String,
    },
    /// Records cannot be handled out of order here (see the reason).
    #[error("{0}")]
    NotRecordable(String),
    /// The client library beneath (topic listings, partition offsets) failed.
    #[error("{what}: {source}")]
    Client {
        /// What was being done, e.g. `produce to orders.retry-5s/0`.
        what: String,
        /// The client library's error.
        #[source]
        source: ClientError,
    },
    /// The ladder's topics are missing or have too few partitions.
    #[error(transparent)]
    Topics(#[from] TopicProblems),
    /// A setting is invalid, or does not fit with another (checked before
    /// anything connects, or when the broker turns out unable to serve it).
    #[error("{setting}: {problem}")]
    InvalidSetting {
        /// Which setting: the environment variable where
        /// [`ConnectionSettings`](crate::ConnectionSettings) reads one
        /// (`KAFKA_SASL_MECHANISM`), else the field of the config
        /// (`ListenerConfig::session_timeout`).
        setting: &'static str,
        /// What is wrong with it, and what to do.
        problem: String,
    },
    /// A topic the call needs does not exist.
    #[error("topic {topic} does not exist: {remedy}")]
    MissingTopic {
        /// The topic.
        topic: String,
        /// What to do.
        remedy: &'static str,
    },
    /// Invalid configuration or names, from retry-core.
    #[error(transparent)]
    Core(#[from] retry_core::Error),
}

impl Error {
    /// An invalid `setting`: `problem` says what is wrong and what to do.
    pub(crate) fn setting(setting: &'static str, problem: impl Into<String>) -> Error {
        Error::InvalidSetting { setting, problem: problem.into() }
    }

    /// The same error, an invalid setting renamed `setting` (as the
    /// environment variable it was read from).
    pub(crate) fn for_setting(self, setting: &'static str) -> Error {
        match self {
            Error::InvalidSetting { problem, .. } => Error::InvalidSetting { setting, problem },
            other => Error::InvalidSetting { setting, problem: other.to_string() },
        }
    }

    /// The innermost cause, for a summary that comes to the point: beneath
    /// the client library's retries, `Connection refused (os error 111)`.
    /// The whole chain is the error's `Display` and its sources.
    ///
    /// ```
    /// use retry_kafka::Error;
    ///
    /// let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
    /// let error = Error::Connect { addr: "127.0.0.1:9092".into(), source: refused };
    /// assert_eq!(error.root_cause(), "connection refused");
    /// ```
    pub fn root_cause(&self) -> String {
        let mut cause: &dyn std::error::Error = self;
        while let Some(next) = cause.source() {
            cause = next;
        }
        let text = cause.to_string();
        match self {
            // rskafka's chain of errors ends in its retry error, which
            // writes its cause into its message ("Retry exceeded deadline.
            // Source: error connecting to broker ...: IO Error: Connection
            // refused"): the root is the last part of it.
            Error::Client { .. } => {
                let inner = text.rsplit("Source: ").next().unwrap_or(&text);
                inner.rsplit(": ").next().unwrap_or(inner).to_owned()
            }
            _ => text,
        }
    }

    /// The error in a line that comes to the point: the client library's
    /// chain of retries and wrappers replaced by its root cause
    /// (`connecting to 127.0.0.1:9092: Connection refused (os error
    /// 111)`); other errors as they display.
    pub fn summary(&self) -> String {
        match self {
            Error::Client { what, .. } => format!("{what}: {}", self.root_cause()),
            other => other.to_string(),
        }
    }

    /// Whether no broker could be reached at all: refused or timed-out
    /// connections, names that do not resolve. Not a refusal by a broker
    /// that answered (credentials, TLS, versions).
    pub fn is_unreachable(&self) -> bool {
        match self {
            Error::Connect { .. } | Error::Timeout { api: "connect", .. } => true,
            // rskafka's chain of errors is broken where it retried: its
            // message says whether the connection itself failed.
            Error::Client { source, .. } => {
                let text = source.to_string();
                text.contains("error connecting to broker")
                    && [
                        "Connection refused",
                        "failed to lookup address",
                        "No route to host",
                        "Network is unreachable",
                        "timed out",
                    ]
                    .iter()
                    .any(|cause| text.contains(cause))
            }
            _ => false,
        }
    }

    /// The broker error code, if the broker answered with one.
    pub fn broker_error(&self) -> Option<BrokerError> {
        match self {
            Error::Broker { error, .. } => Some(*error),
            _ => None,
        }
    }

    /// Whether it may pass by itself, so the call is worth trying again:
    /// no answer in time, a broken connection, the client library's
    /// failures, and the broker errors Kafka deems retriable (a leader or
    /// coordinator that moved or is loading, too few replicas in sync).
    /// Refusals (authorization, sizes, configs) do not pass.
    pub(crate) fn passes(&self) -> bool {
        match self {
            Error::Connect { .. } | Error::Io { .. } | Error::Timeout { .. } | Error::Deadline { .. } => true,
            Error::Client { .. } => true,
            Error::Broker { error, .. } => error.is_retriable(),
            _ => false,
        }
    }

    /// Whether the connection this came from must be dropped and re-made:
    /// transport failures, timeouts, and a coordinator that moved.
    pub(crate) fn needs_reconnect(&self) -> bool {
        match self {
            Error::Connect { .. }
            | Error::Io { .. }
            | Error::Tls { .. }
            | Error::Timeout { .. }
            | Error::Protocol { .. } => true,
            Error::Broker { error, .. } => {
                matches!(
                    *error,
                    BrokerError::NOT_COORDINATOR
                        | BrokerError::COORDINATOR_NOT_AVAILABLE
                        | BrokerError::COORDINATOR_LOAD_IN_PROGRESS
                )
            }
            _ => false,
        }
    }
}

/// An error code a broker answered with. Compare it with the constants
/// (`BrokerError::NOT_COORDINATOR`...); it shows as Kafka names it
/// (`NOT_COORDINATOR (error 16)`), and says whether Kafka deems it
/// retriable.
///
/// ```
/// use retry_kafka::BrokerError;
///
/// let error = BrokerError::from_code(16);
/// assert_eq!(error, BrokerError::NOT_COORDINATOR);
/// assert_eq!((error.name(), error.is_retriable()), ("NOT_COORDINATOR".to_owned(), true));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct BrokerError(i16);

impl BrokerError {
    /// The error of `code`, as a broker answered it.
    pub const fn from_code(code: i16) -> BrokerError {
        BrokerError(code)
    }

    /// Its code in the Kafka protocol.
    pub const fn code(self) -> i16 {
        self.0
    }
}

/// What the client library beneath (which lists topics and reads
/// partition offsets) said went wrong: its message and its chain of causes.
pub struct ClientError(Box<dyn std::error::Error + Send + Sync>);

impl ClientError {
    pub(crate) fn new(error: impl std::error::Error + Send + Sync + 'static) -> ClientError {
        ClientError(Box::new(error))
    }
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::fmt::Debug for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// How a broker's support of a request falls short, for messages.
fn describe_support(ours_min: i16, ours_max: i16, theirs: &Option<(i16, i16)>) -> String {
    match theirs {
        None => " at all (it is not among the requests the broker lists)".to_owned(),
        Some((min, max)) => format!(" versions {ours_min}..={ours_max} (it has {min}..={max})"),
    }
}

/// One way the ladder's topics are not ready.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TopicProblem {
    /// The topic does not exist.
    Missing {
        /// Its name.
        topic: String,
    },
    /// The broker would not describe the topic to this user (it may exist):
    /// the user lacks the Describe ACL on it.
    NotAuthorized {
        /// Its name.
        topic: String,
    },
    /// A retry or dead-letter topic has fewer partitions than the source.
    TooFewPartitions {
        /// Its name.
        topic: String,
        /// Its partition count.
        has: i32,
        /// The source's partition count.
        needs: i32,
        /// The source topic.
        source: String,
    },
}

/// Every problem found with the ladder's topics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicProblems(pub Vec<TopicProblem>);

impl std::fmt::Display for TopicProblems {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the retry ladder's topics are not ready:")?;
        for problem in &self.0 {
            match problem {
                TopicProblem::Missing { topic } => write!(f, "\n  - topic {topic} is missing")?,
                TopicProblem::NotAuthorized { topic } => {
                    write!(f, "\n  - topic {topic} is not described to this user (TOPIC_AUTHORIZATION_FAILED)")?
                }
                TopicProblem::TooFewPartitions { topic, has, needs, source } => {
                    write!(f, "\n  - topic {topic} has {has} partitions, needs at least {needs} (as many as {source})")?
                }
            }
        }
        if self.0.iter().any(|p| matches!(p, TopicProblem::Missing { .. })) {
            f.write_str(
                "\ntopics are never auto-created: create them explicitly (the service's `topics create` command)",
            )?;
        }
        if self.0.iter().any(|p| matches!(p, TopicProblem::NotAuthorized { .. })) {
            f.write_str(
                "\nthe user needs the ACLs the service works with: Describe, Read and Write on the ladder's topics",
            )?;
        }
        if self.0.iter().any(|p| matches!(p, TopicProblem::TooFewPartitions { .. })) {
            f.write_str(
                "\na record keeps its partition on every rung: add partitions to the short topics (e.g. \
                 `kafka-topics.sh --alter --topic <topic> --partitions <count>`)",
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for TopicProblems {}

/// Which of the TLS files a problem is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsFile {
    /// The CA bundle.
    Ca,
    /// The client certificate.
    Certificate,
    /// The client key.
    Key,
}

impl TlsFile {
    /// The setting's name as Kafka clients write it.
    pub fn property(self) -> &'static str {
        match self {
            TlsFile::Ca => "ssl.ca.location",
            TlsFile::Certificate => "ssl.certificate.location",
            TlsFile::Key => "ssl.key.location",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_errors_pass_by_themselves_and_which_drop_the_connection() {
        let broker = |error| Error::Broker { api: "Produce", context: None, error };
        let io = || std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let timeout = Duration::from_secs(1);
        // (error, passes, needs a new connection)
        let table = [
            (Error::Connect { addr: "b:9092".into(), source: io() }, true, true),
            (Error::Io { addr: "b:9092".into(), api: "Fetch", source: io() }, true, true),
            (Error::Timeout { addr: "b:9092".into(), api: "Fetch", timeout }, true, true),
            (Error::Deadline { what: "listing topics".into(), timeout }, true, false),
            (broker(BrokerError::NOT_COORDINATOR), true, true),
            (broker(BrokerError::COORDINATOR_LOAD_IN_PROGRESS), true, true),
            (broker(BrokerError::NOT_ENOUGH_REPLICAS), true, false),
            (broker(BrokerError::NOT_LEADER_OR_FOLLOWER), true, false),
            (broker(BrokerError::TOPIC_AUTHORIZATION_FAILED), false, false),
            (broker(BrokerError::MESSAGE_TOO_LARGE), false, false),
            (broker(BrokerError::REBALANCE_IN_PROGRESS), false, false),
            (Error::Tls { addr: "b:9093".into(), reason: "untrusted".into() }, false, true),
            (Error::setting("KAFKA_BROKERS", "none given"), false, false),
            (Error::MissingTopic { topic: "t".into(), remedy: "create it" }, false, false),
        ];
        for (error, passes, reconnect) in table {
            assert_eq!((error.passes(), error.needs_reconnect()), (passes, reconnect), "{error}");
        }
    }

    #[test]
    fn summaries_come_to_the_root_cause_and_tell_an_unreachable_cluster() {
        let client = |what: &str, text: &str| Error::Client {
            what: what.into(),
            source: ClientError::new(std::io::Error::other(text.to_owned())),
        };
        let refused =
            "all retries failed: Retry exceeded deadline. Source: error connecting to broker \"127.0.0.1:9092\": \
                       IO Error: Connection refused (os error 111)";
        let unknown =
            "all retries failed: Retry exceeded deadline. Source: error connecting to broker \"kafka-9:9092\": \
                       IO Error: failed to lookup address information: Name or service not known";
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused (os error 111)");
        // (error, its summary, unreachable)
        let table = [
            (
                client("connecting to 127.0.0.1:9092", refused),
                "connecting to 127.0.0.1:9092: Connection refused (os error 111)",
                true,
            ),
            (
                client("connecting to kafka-9:9092", unknown),
                "connecting to kafka-9:9092: Name or service not known",
                true,
            ),
            (
                client("listing topics", "Server error: LEADER_NOT_AVAILABLE"),
                "listing topics: LEADER_NOT_AVAILABLE",
                false,
            ),
            (
                Error::Connect { addr: "b:9092".into(), source: io },
                "cannot connect to the Kafka broker at b:9092: Connection refused (os error 111)",
                true,
            ),
            (
                Error::Timeout { addr: "b:9092".into(), api: "connect", timeout: Duration::from_secs(1) },
                "connect to b:9092 got no answer within 1s",
                true,
            ),
            (
                Error::Tls { addr: "b:9093".into(), reason: "untrusted".into() },
                "TLS with b:9093 failed: untrusted",
                false,
            ),
        ];
        for (error, summary, unreachable) in table {
            assert_eq!((error.summary().as_str(), error.is_unreachable()), (summary, unreachable), "{error}");
        }
    }
}
