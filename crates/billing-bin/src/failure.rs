//! Why the service stopped, and with which exit code.

use retry_kafka::Error as KafkaError;

/// Why the service stopped: bad settings (exit 2) or a world it cannot work in (exit 1).
pub(crate) enum Failure {
    Config(String),
    Runtime(String),
}

impl From<KafkaError> for Failure {
    fn from(e: KafkaError) -> Self {
        match e {
            KafkaError::Topics(problems) => {
                Failure::Runtime(format!("{problems}\ncreate them with `billing-bin topics create`"))
            }
            e @ KafkaError::InvalidSetting { .. } => Failure::Config(e.to_string()),
            other => Failure::Runtime(other.to_string()),
        }
    }
}
