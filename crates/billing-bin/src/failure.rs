//! Why the service stopped, and with which exit code.

use retry_kafka::Error as KafkaError;

/// Why the service stopped: bad settings (exit 2) or a world it cannot work in (exit 1).
pub(crate) enum Failure {
    Config(String),
    Runtime(String),
    /// Already reported on stdout (`check`): exit 1 without more words.
    Reported,
}

impl Failure {
    /// What went wrong, in a line.
    pub(crate) fn message(&self) -> String {
        match self {
            Failure::Config(message) | Failure::Runtime(message) => message.clone(),
            Failure::Reported => "reported above".into(),
        }
    }
}

impl From<KafkaError> for Failure {
    fn from(e: KafkaError) -> Self {
        match e {
            KafkaError::Topics(problems) => {
                Failure::Runtime(format!("{problems}\ncreate them with `billing-bin topics create`"))
            }
            e @ KafkaError::InvalidSetting { .. } => Failure::Config(e.to_string()),
            e if e.is_unreachable() => {
                tracing::debug!(error = %chain(&e), "no broker could be reached");
                Failure::Runtime(format!(
                    "no Kafka broker answers ({}): for a local one, run `cargo xtask up`; else set KAFKA_BROKERS to \
                     your cluster's bootstrap brokers (`billing-bin check` tests the settings)",
                    e.summary()
                ))
            }
            other => {
                tracing::debug!(error = %chain(&other), "the whole error");
                Failure::Runtime(other.summary())
            }
        }
    }
}

/// `error` and every cause beneath it, for the debug log.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        text.push_str(": caused by: ");
        text.push_str(&next.to_string());
        cause = next.source();
    }
    text
}
