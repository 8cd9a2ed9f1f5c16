//! The environment that tells the integration tests (and people) where a
//! broker is and how to reach it: one place for the names that `broker`
//! prints, `ci` sets and the tests read.

/// Where the broker is (`host:port[,host:port...]`). Tests built with the
/// `broker` feature fail when it is missing.
pub(crate) const BROKERS_ENV: &str = "KAFKA_RETRY_BROKERS";

/// The mock cluster's control channel; set only when the broker is the mock.
pub(crate) const MOCK_CONTROL_ENV: &str = "KAFKA_RETRY_MOCK_CONTROL";

/// Which implementation the tests run against (`tansu`, `mock`, `kafka`,
/// `docker` or `external`, with `-sasl`, `-tls`, `-mtls` suffixes).
pub(crate) const BROKER_KIND_ENV: &str = "KAFKA_RETRY_BROKER_KIND";

/// An Apache Kafka cluster's directory (`cargo xtask broker up --kafka`),
/// whose `cluster` file lists its nodes and how to start each again: the
/// fault tests stop, kill and restart nodes through it.
pub(crate) const KAFKA_CLUSTER_ENV: &str = "KAFKA_RETRY_KAFKA_CLUSTER";

/// An Apache Kafka cluster's listener whose SASL sessions last a few
/// seconds (`connections.max.reauth.ms`), for the re-authentication tests.
pub(crate) const REAUTH_BROKERS_ENV: &str = "KAFKA_RETRY_REAUTH_BROKERS";

/// The SASL mechanism of the suite's clients (set only against a broker
/// that requires SASL).
pub(crate) const SASL_MECHANISM_ENV: &str = "KAFKA_RETRY_SASL_MECHANISM";
/// See [`SASL_MECHANISM_ENV`].
pub(crate) const SASL_USERNAME_ENV: &str = "KAFKA_RETRY_SASL_USERNAME";
/// See [`SASL_MECHANISM_ENV`].
pub(crate) const SASL_PASSWORD_ENV: &str = "KAFKA_RETRY_SASL_PASSWORD";
/// A SCRAM user of a SASL Apache Kafka cluster that no ACL names (the
/// cluster runs an authorizer; the suite's user is a super user): set
/// only against such a cluster.
pub(crate) const SASL_UNAUTHORIZED_USERNAME_ENV: &str = "KAFKA_RETRY_SASL_UNAUTHORIZED_USERNAME";
/// See [`SASL_UNAUTHORIZED_USERNAME_ENV`].
pub(crate) const SASL_UNAUTHORIZED_PASSWORD_ENV: &str = "KAFKA_RETRY_SASL_UNAUTHORIZED_PASSWORD";
/// The security protocol of the suite's clients (PLAINTEXT when unset).
pub(crate) const SECURITY_PROTOCOL_ENV: &str = "KAFKA_RETRY_SECURITY_PROTOCOL";
/// The CA file that signed a TLS broker's certificate.
pub(crate) const SSL_CA_ENV: &str = "KAFKA_RETRY_SSL_CA_LOCATION";
/// The client certificate for a broker that requires mutual TLS.
pub(crate) const SSL_CERTIFICATE_ENV: &str = "KAFKA_RETRY_SSL_CERTIFICATE_LOCATION";
/// Its private key.
pub(crate) const SSL_KEY_ENV: &str = "KAFKA_RETRY_SSL_KEY_LOCATION";

/// The TLS terminator's (stunnel's) configuration in front of tansu, for
/// tests that restart it to cut every connection, as a broker closing them
/// would.
pub(crate) const TLS_PROXY_CONFIG_ENV: &str = "KAFKA_RETRY_TLS_PROXY_CONFIG";

/// Every setting of the suite that depends on the broker, so none leaks
/// from the caller's environment into a pass against another broker.
pub(crate) const BROKER_SETTINGS: [&str; 13] = [
    SECURITY_PROTOCOL_ENV,
    SASL_UNAUTHORIZED_USERNAME_ENV,
    SASL_UNAUTHORIZED_PASSWORD_ENV,
    SASL_MECHANISM_ENV,
    SASL_USERNAME_ENV,
    SASL_PASSWORD_ENV,
    SSL_CA_ENV,
    SSL_CERTIFICATE_ENV,
    SSL_KEY_ENV,
    TLS_PROXY_CONFIG_ENV,
    KAFKA_CLUSTER_ENV,
    REAUTH_BROKERS_ENV,
    MOCK_CONTROL_ENV,
];

/// The SCRAM-SHA-512 user of `broker up --sasl`: a throwaway credential of a
/// throwaway local broker, printed for the tests and for people.
pub(crate) const SASL_USER: (&str, &str) = ("kafka-retry", "kafka-retry-test-password");

/// The user of a SASL Apache Kafka cluster that no ACL names.
pub(crate) const SASL_UNAUTHORIZED_USER: (&str, &str) = ("kafka-retry-no-acls", "kafka-retry-no-acls-password");
