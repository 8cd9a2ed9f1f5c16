//! How connections to the cluster are secured: the security protocol, with
//! SASL the mechanism and credentials, with TLS the trust and identity
//! ([`tls`]). One configuration, used by every connection the crate opens
//! (rskafka's and our own).
//!
//! Secrets never leave this module in clear: [`Secret`]'s `Debug` and
//! `Display` print a placeholder, and errors name the user and the
//! mechanism, never the password.

pub(crate) mod settings;
pub(crate) mod tls;

use std::{fmt, str::FromStr, sync::Arc};

pub use settings::ConnectionSettings;
pub use tls::TlsSettings;

use crate::{Error, Result};

/// A password or token: its `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret itself, for the one place that must send it.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Kafka's `security.protocol`, as far as this crate speaks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SecurityProtocol {
    /// No authentication, no encryption.
    #[default]
    Plaintext,
    /// TLS, no SASL (a client certificate may authenticate the client).
    Ssl,
    /// SASL authentication, no encryption.
    SaslPlaintext,
    /// SASL authentication inside TLS.
    SaslSsl,
}

impl SecurityProtocol {
    /// Its name as Kafka clients write it.
    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }

    /// Whether connections are wrapped in TLS.
    pub fn uses_tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    /// Whether connections authenticate with SASL.
    pub fn uses_sasl(self) -> bool {
        matches!(self, SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl)
    }
}

impl FromStr for SecurityProtocol {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_uppercase().as_str() {
            "PLAINTEXT" => Ok(SecurityProtocol::Plaintext),
            "SSL" => Ok(SecurityProtocol::Ssl),
            "SASL_PLAINTEXT" => Ok(SecurityProtocol::SaslPlaintext),
            "SASL_SSL" => Ok(SecurityProtocol::SaslSsl),
            _ => Err(Error::setting(
                "security protocol",
                format!("unknown security protocol {s:?}: expected PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"),
            )),
        }
    }
}

/// A SASL mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaslMechanism {
    /// PLAIN: the password travels as is (use it only over TLS).
    Plain,
    /// SCRAM-SHA-256.
    ScramSha256,
    /// SCRAM-SHA-512.
    ScramSha512,
}

impl SaslMechanism {
    /// Its name as Kafka writes it.
    pub fn name(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

impl FromStr for SaslMechanism {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_uppercase().as_str() {
            "PLAIN" => Ok(SaslMechanism::Plain),
            "SCRAM-SHA-256" => Ok(SaslMechanism::ScramSha256),
            "SCRAM-SHA-512" => Ok(SaslMechanism::ScramSha512),
            _ => Err(Error::setting(
                "SASL mechanism",
                format!("unknown SASL mechanism {s:?}: expected PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"),
            )),
        }
    }
}

/// SASL credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaslCredentials {
    /// The mechanism.
    pub mechanism: SaslMechanism,
    /// The user name.
    pub username: String,
    /// The password.
    pub password: Secret,
}

/// How every connection is secured; [`Security::default`] is PLAINTEXT.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Security {
    protocol: SecurityProtocol,
    sasl: Option<SaslCredentials>,
    tls: Option<tls::Tls>,
}

impl Security {
    /// `protocol` with `sasl` credentials and, for SSL and SASL_SSL, `tls`
    /// (whose files are read now). Fails when they do not fit together
    /// (SASL without credentials, credentials without SASL, an empty user
    /// name or password, TLS files without TLS) or a file is unusable.
    pub fn new(protocol: SecurityProtocol, sasl: Option<SaslCredentials>, tls: TlsSettings) -> Result<Self> {
        match (protocol.uses_sasl(), &sasl) {
            (true, None) => {
                return Err(Error::setting(
                    "SASL credentials",
                    format!("security protocol {} needs a SASL mechanism, user name and password", protocol.name()),
                ))
            }
            (false, Some(_)) => {
                let with_sasl = if protocol.uses_tls() { "SASL_SSL" } else { "SASL_PLAINTEXT" };
                return Err(Error::setting(
                    "security protocol",
                    format!("SASL credentials were given but it is {}: set it to {with_sasl}", protocol.name()),
                ));
            }
            _ => {}
        }
        if !protocol.uses_tls() && tls != TlsSettings::default() {
            let with_tls = if protocol.uses_sasl() { "SASL_SSL" } else { "SSL" };
            return Err(Error::setting(
                "security protocol",
                format!("TLS settings were given but it is {}: set it to {with_tls}", protocol.name()),
            ));
        }
        if let Some(credentials) = &sasl {
            if credentials.username.is_empty() {
                return Err(Error::setting("SASL user name", "it is empty"));
            }
            if credentials.password.expose().is_empty() {
                return Err(Error::setting(
                    "SASL password",
                    format!("the password of {} is empty", credentials.username),
                ));
            }
        }
        let tls = if protocol.uses_tls() { Some(tls::Tls::load(tls)?) } else { None };
        Ok(Security { protocol, sasl, tls })
    }

    /// The security protocol.
    pub fn protocol(&self) -> SecurityProtocol {
        self.protocol
    }

    /// The SASL credentials, if the protocol uses SASL.
    pub fn sasl(&self) -> Option<&SaslCredentials> {
        self.sasl.as_ref()
    }

    /// The TLS settings, if the protocol uses TLS.
    pub fn tls(&self) -> Option<&TlsSettings> {
        self.tls.as_ref().map(|t| &t.settings)
    }

    /// Whether the SASL password travels as it is, readable on the network
    /// (PLAIN without TLS): worth a warning where it is configured.
    pub fn sends_password_in_clear(&self) -> bool {
        self.sasl.as_ref().is_some_and(|c| c.mechanism == SaslMechanism::Plain) && self.tls.is_none()
    }

    /// The rustls configuration every connection uses, if the protocol uses TLS.
    pub(crate) fn rustls_config(&self) -> Option<Arc<rustls::ClientConfig>> {
        self.tls.as_ref().map(|t| t.config.clone())
    }

    /// `builder` with these settings: how other rskafka clients (the
    /// tests') connect exactly as this crate's do (feature `test-hooks`,
    /// tests only; not part of the API).
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn configure_rskafka(
        builder: rskafka::client::ClientBuilder,
        security: &Security,
    ) -> rskafka::client::ClientBuilder {
        security.configure(builder)
    }

    /// `builder` with these settings.
    pub(crate) fn configure(&self, mut builder: rskafka::client::ClientBuilder) -> rskafka::client::ClientBuilder {
        if let Some(sasl) = self.rskafka_sasl() {
            builder = builder.sasl_config(sasl);
        }
        if let Some(tls) = self.rustls_config() {
            builder = builder.tls_config(tls);
        }
        builder
    }

    /// rskafka's SASL configuration, if any.
    fn rskafka_sasl(&self) -> Option<rskafka::client::SaslConfig> {
        use rskafka::client::{Credentials, SaslConfig};
        let c = self.sasl.as_ref()?;
        let credentials = Credentials::new(c.username.clone(), c.password.expose().to_owned());
        Some(match c.mechanism {
            SaslMechanism::Plain => SaslConfig::Plain(credentials),
            SaslMechanism::ScramSha256 => SaslConfig::ScramSha256(credentials),
            SaslMechanism::ScramSha512 => SaslConfig::ScramSha512(credentials),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credentials(mechanism: SaslMechanism, username: &str, password: &str) -> SaslCredentials {
        SaslCredentials { mechanism, username: username.into(), password: Secret::new(password) }
    }

    #[test]
    fn secrets_never_print() {
        let c = credentials(SaslMechanism::ScramSha512, "billing", "hunter2-very-secret");
        let security = Security::new(SecurityProtocol::SaslPlaintext, Some(c), TlsSettings::default()).unwrap();
        for shown in [format!("{security:?}"), format!("{:?}", security.sasl().unwrap().password)] {
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains("redacted"), "{shown}");
        }
        assert_eq!(Secret::new("x").to_string(), "<redacted>");
    }

    #[test]
    fn names_parse_as_kafka_writes_them() {
        assert_eq!("SASL_PLAINTEXT".parse::<SecurityProtocol>().unwrap(), SecurityProtocol::SaslPlaintext);
        assert_eq!("plaintext".parse::<SecurityProtocol>().unwrap(), SecurityProtocol::Plaintext);
        assert_eq!("SCRAM-SHA-512".parse::<SaslMechanism>().unwrap(), SaslMechanism::ScramSha512);
        assert_eq!("scram-sha-256".parse::<SaslMechanism>().unwrap(), SaslMechanism::ScramSha256);
        assert_eq!("PLAIN".parse::<SaslMechanism>().unwrap(), SaslMechanism::Plain);
        assert_eq!("ssl".parse::<SecurityProtocol>().unwrap(), SecurityProtocol::Ssl);
        assert_eq!("SASL_SSL".parse::<SecurityProtocol>().unwrap(), SecurityProtocol::SaslSsl);
        let e = "SASL".parse::<SecurityProtocol>().unwrap_err().to_string();
        assert!(e.contains("unknown security protocol"), "{e}");
        assert!("GSSAPI".parse::<SaslMechanism>().unwrap_err().to_string().contains("unknown SASL mechanism"));
    }

    #[test]
    fn settings_that_do_not_fit_together() {
        let c = || credentials(SaslMechanism::Plain, "u", "p");
        let ca = TlsSettings { ca_location: Some("ca.pem".into()), ..TlsSettings::default() };
        let refused = |protocol, sasl, tls: &TlsSettings, expected: &str| {
            let e = Security::new(protocol, sasl, tls.clone()).unwrap_err().to_string();
            assert!(e.contains(expected), "{e}");
        };
        let none = &TlsSettings::default();
        use SecurityProtocol::*;
        refused(SaslPlaintext, None, none, "needs a SASL mechanism");
        refused(SaslSsl, None, none, "SASL_SSL needs a SASL mechanism");
        refused(Plaintext, Some(c()), none, "set it to SASL_PLAINTEXT");
        refused(Ssl, Some(c()), none, "set it to SASL_SSL");
        refused(Plaintext, None, &ca, "set it to SSL");
        refused(SaslPlaintext, Some(c()), &ca, "set it to SASL_SSL");
        refused(SaslPlaintext, Some(credentials(SaslMechanism::Plain, "", "p")), none, "user name");
        refused(SaslPlaintext, Some(credentials(SaslMechanism::Plain, "u", "")), none, "password");
        assert!(Security::new(SaslPlaintext, Some(c()), TlsSettings::default()).is_ok());
        assert_eq!(Security::default().protocol(), SecurityProtocol::Plaintext);
    }

    #[test]
    fn a_password_in_clear_is_told_apart() {
        use SaslMechanism::*;
        let security = |protocol, mechanism| {
            Security::new(protocol, Some(credentials(mechanism, "u", "p")), TlsSettings::default()).unwrap()
        };
        assert!(security(SecurityProtocol::SaslPlaintext, Plain).sends_password_in_clear());
        assert!(!security(SecurityProtocol::SaslPlaintext, ScramSha512).sends_password_in_clear());
        assert!(!security(SecurityProtocol::SaslSsl, Plain).sends_password_in_clear());
        assert!(!Security::default().sends_password_in_clear());
    }
}
