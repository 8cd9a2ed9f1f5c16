//! How a service reaches the cluster, from settings given as text: the
//! environment variables every service of this workspace reads, checked to
//! fit together, each problem named by its setting and never showing a secret.

use std::path::PathBuf;

use crate::{ConnectionConfig, Error, Result, SaslCredentials, Secret, Security, TlsFile, TlsSettings};

/// Connection settings as an operator writes them, one field per setting
/// (named after its environment variable). [`connection`](Self::connection)
/// checks them together.
///
/// ```
/// use retry_kafka::{ConnectionSettings, SecurityProtocol};
///
/// let vars = [("KAFKA_BROKERS", "kafka-1:9093"), ("KAFKA_SECURITY_PROTOCOL", "SSL")];
/// let settings = ConnectionSettings::from_lookup(|name| {
///     vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string())
/// });
/// let connection = settings.connection("stock").unwrap();
/// assert_eq!(connection.bootstrap(), ["kafka-1:9093"]);
/// assert_eq!(connection.security().protocol(), SecurityProtocol::Ssl);
///
/// let half = ConnectionSettings { sasl_mechanism: Some("PLAIN".into()), ..settings };
/// let problem = half.connection("stock").unwrap_err().to_string();
/// assert!(problem.contains("KAFKA_SASL_USERNAME: required"), "{problem}");
/// ```
#[derive(Debug, Clone, Default)]
pub struct ConnectionSettings {
    /// `KAFKA_BROKERS`: `host:port[,host:port...]` (default `127.0.0.1:9092`).
    pub brokers: Option<String>,
    /// `KAFKA_SECURITY_PROTOCOL`: PLAINTEXT (default), SSL, SASL_PLAINTEXT or SASL_SSL.
    pub security_protocol: Option<String>,
    /// `KAFKA_SASL_MECHANISM`: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
    pub sasl_mechanism: Option<String>,
    /// `KAFKA_SASL_USERNAME`.
    pub sasl_username: Option<String>,
    /// `KAFKA_SASL_PASSWORD` (prefer the file: environments leak more easily).
    pub sasl_password: Option<Secret>,
    /// `KAFKA_SASL_PASSWORD_FILE`: a file whose content, trailing newline
    /// removed, is the password.
    pub sasl_password_file: Option<PathBuf>,
    /// `KAFKA_SSL_CA_LOCATION`: the PEM file of the CAs to trust (default: the system's).
    pub ssl_ca_location: Option<PathBuf>,
    /// `KAFKA_SSL_CERTIFICATE_LOCATION`: the client certificate, for mutual TLS.
    pub ssl_certificate_location: Option<PathBuf>,
    /// `KAFKA_SSL_KEY_LOCATION`: its private key (PEM, unencrypted).
    pub ssl_key_location: Option<PathBuf>,
    /// `KAFKA_SSL_ENDPOINT_IDENTIFICATION`: `https` (default) checks broker
    /// certificates against host names, `none` does not.
    pub ssl_endpoint_identification: Option<String>,
}

impl ConnectionSettings {
    /// The settings from the process environment (unset or empty variables are absent).
    pub fn from_env() -> Self {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// The settings from `lookup`, called with each variable's name.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        ConnectionSettings {
            brokers: get("KAFKA_BROKERS"),
            security_protocol: get("KAFKA_SECURITY_PROTOCOL"),
            sasl_mechanism: get("KAFKA_SASL_MECHANISM"),
            sasl_username: get("KAFKA_SASL_USERNAME"),
            sasl_password: get("KAFKA_SASL_PASSWORD").map(Secret::new),
            sasl_password_file: get("KAFKA_SASL_PASSWORD_FILE").map(PathBuf::from),
            ssl_ca_location: get("KAFKA_SSL_CA_LOCATION").map(PathBuf::from),
            ssl_certificate_location: get("KAFKA_SSL_CERTIFICATE_LOCATION").map(PathBuf::from),
            ssl_key_location: get("KAFKA_SSL_KEY_LOCATION").map(PathBuf::from),
            ssl_endpoint_identification: get("KAFKA_SSL_ENDPOINT_IDENTIFICATION"),
        }
    }

    /// A connection for `client_id`, or [`Error::InvalidSetting`] naming the
    /// setting at fault (never its value when it is a secret). Reads the
    /// password file, if one is given; certificate files are read here too.
    pub fn connection(&self, client_id: &str) -> Result<ConnectionConfig> {
        let brokers = self.brokers.as_deref().unwrap_or("127.0.0.1:9092");
        let protocol = self
            .security_protocol
            .as_deref()
            .unwrap_or("PLAINTEXT")
            .parse()
            .map_err(|e: Error| e.for_setting("KAFKA_SECURITY_PROTOCOL"))?;
        let security = Security::new(protocol, self.sasl()?, self.tls()?).map_err(|e| match e {
            Error::TlsFile { file, .. } => {
                let setting = match file {
                    TlsFile::Ca => "KAFKA_SSL_CA_LOCATION",
                    TlsFile::Certificate => "KAFKA_SSL_CERTIFICATE_LOCATION",
                    TlsFile::Key => "KAFKA_SSL_KEY_LOCATION",
                };
                Error::setting(setting, e.to_string())
            }
            Error::InvalidSetting { setting, problem } => {
                let setting = match setting {
                    "security protocol" => "KAFKA_SECURITY_PROTOCOL",
                    "SASL mechanism" => "KAFKA_SASL_MECHANISM",
                    "SASL user name" => "KAFKA_SASL_USERNAME",
                    "SASL password" => "KAFKA_SASL_PASSWORD",
                    "SASL credentials" => "KAFKA_SASL_*",
                    _ => "KAFKA_SSL_*",
                };
                Error::InvalidSetting { setting, problem }
            }
            other => other.for_setting("KAFKA_SECURITY_PROTOCOL, KAFKA_SASL_* and KAFKA_SSL_*"),
        })?;
        if security.tls().is_some_and(|t| !t.verify_hostname) {
            tracing::warn!(
                "KAFKA_SSL_ENDPOINT_IDENTIFICATION=none: broker certificates are not checked against host names; \
                 anyone holding a certificate from a trusted CA can pose as a broker"
            );
        }
        if security.sends_password_in_clear() {
            tracing::warn!(
                "KAFKA_SASL_MECHANISM=PLAIN over SASL_PLAINTEXT: the password travels as it is, readable by anyone \
                 on the network path to the brokers; use SASL_SSL, or SCRAM"
            );
        }
        ConnectionConfig::new(brokers, client_id)
            .map_err(|e| e.for_setting("KAFKA_BROKERS"))
            .map(|c| c.with_security(security))
    }

    /// The TLS settings; a certificate without its key (or the reverse) is refused here, by name.
    fn tls(&self) -> Result<TlsSettings> {
        let identification = self.ssl_endpoint_identification.as_deref().unwrap_or("https");
        let verify_hostname = match identification.trim().to_ascii_lowercase().as_str() {
            "https" => true,
            "none" => false,
            other => {
                return Err(Error::setting(
                    "KAFKA_SSL_ENDPOINT_IDENTIFICATION",
                    format!("{other:?}: expected https (check host names) or none"),
                ))
            }
        };
        match (&self.ssl_certificate_location, &self.ssl_key_location) {
            (Some(_), None) => {
                return Err(Error::setting("KAFKA_SSL_KEY_LOCATION", "required with KAFKA_SSL_CERTIFICATE_LOCATION"))
            }
            (None, Some(_)) => {
                return Err(Error::setting("KAFKA_SSL_CERTIFICATE_LOCATION", "required with KAFKA_SSL_KEY_LOCATION"))
            }
            _ => {}
        }
        Ok(TlsSettings {
            ca_location: self.ssl_ca_location.clone(),
            certificate_location: self.ssl_certificate_location.clone(),
            key_location: self.ssl_key_location.clone(),
            verify_hostname,
        })
    }

    /// The SASL credentials, if any setting of them is given.
    fn sasl(&self) -> Result<Option<SaslCredentials>> {
        let given = self.sasl_mechanism.is_some()
            || self.sasl_username.is_some()
            || self.sasl_password.is_some()
            || self.sasl_password_file.is_some();
        if !given {
            return Ok(None);
        }
        let mechanism = self
            .sasl_mechanism
            .as_deref()
            .ok_or_else(|| Error::setting("KAFKA_SASL_MECHANISM", "required with SASL credentials"))?
            .parse()
            .map_err(|e: Error| e.for_setting("KAFKA_SASL_MECHANISM"))?;
        let username = self
            .sasl_username
            .clone()
            .ok_or_else(|| Error::setting("KAFKA_SASL_USERNAME", "required with a SASL mechanism"))?;
        let password = match (&self.sasl_password, &self.sasl_password_file) {
            (Some(_), Some(_)) => {
                return Err(Error::setting("KAFKA_SASL_PASSWORD", "give it or KAFKA_SASL_PASSWORD_FILE, not both"))
            }
            (Some(p), None) => p.clone(),
            (None, Some(path)) => {
                std::fs::read_to_string(path).map(|p| Secret::new(p.trim_end_matches(['\r', '\n']))).map_err(|e| {
                    Error::setting("KAFKA_SASL_PASSWORD_FILE", format!("{} cannot be read: {e}", path.display()))
                })?
            }
            (None, None) => {
                return Err(Error::setting(
                    "KAFKA_SASL_PASSWORD",
                    "it or KAFKA_SASL_PASSWORD_FILE is required with a SASL mechanism",
                ))
            }
        };
        Ok(Some(SaslCredentials { mechanism, username, password }))
    }
}
