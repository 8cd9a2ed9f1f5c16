//! How connections to the cluster authenticate: the security protocol and,
//! with SASL, the mechanism and credentials. One configuration, used by
//! every connection the crate opens (rskafka's and our own).
//!
//! Secrets never leave this module in clear: [`Secret`]'s `Debug` and
//! `Display` print a placeholder, and errors name the user and the
//! mechanism, never the password.

use std::{fmt, str::FromStr};

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
    /// SASL authentication, no encryption.
    SaslPlaintext,
}

impl SecurityProtocol {
    /// Its name as Kafka clients write it.
    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
        }
    }
}

impl FromStr for SecurityProtocol {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_uppercase().as_str() {
            "PLAINTEXT" => Ok(SecurityProtocol::Plaintext),
            "SASL_PLAINTEXT" => Ok(SecurityProtocol::SaslPlaintext),
            "SSL" | "SASL_SSL" => Err(Error::Config(format!(
                "security protocol {s} is not supported yet (TLS is not implemented): use PLAINTEXT or SASL_PLAINTEXT"
            ))),
            _ => Err(Error::Config(format!("unknown security protocol {s:?}: expected PLAINTEXT or SASL_PLAINTEXT"))),
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
            _ => Err(Error::Config(format!(
                "unknown SASL mechanism {s:?}: expected PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"
            ))),
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

/// How every connection authenticates; [`Security::default`] is PLAINTEXT.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Security {
    protocol: SecurityProtocol,
    sasl: Option<SaslCredentials>,
}

impl Security {
    /// `protocol` with `sasl` credentials; fails when they do not fit
    /// together (SASL without credentials, credentials without SASL, an
    /// empty user name or password).
    pub fn new(protocol: SecurityProtocol, sasl: Option<SaslCredentials>) -> Result<Self> {
        match (protocol, &sasl) {
            (SecurityProtocol::SaslPlaintext, None) => {
                return Err(Error::Config(
                    "security protocol SASL_PLAINTEXT needs a SASL mechanism, user name and password".into(),
                ))
            }
            (SecurityProtocol::Plaintext, Some(_)) => {
                return Err(Error::Config(
                    "SASL credentials were given but the security protocol is PLAINTEXT: set it to SASL_PLAINTEXT"
                        .into(),
                ))
            }
            _ => {}
        }
        if let Some(credentials) = &sasl {
            if credentials.username.is_empty() {
                return Err(Error::Config("the SASL user name is empty".into()));
            }
            if credentials.password.expose().is_empty() {
                return Err(Error::Config(format!("the SASL password of {} is empty", credentials.username)));
            }
        }
        Ok(Security { protocol, sasl })
    }

    /// The security protocol.
    pub fn protocol(&self) -> SecurityProtocol {
        self.protocol
    }

    /// The SASL credentials, if the protocol uses SASL.
    pub fn sasl(&self) -> Option<&SaslCredentials> {
        self.sasl.as_ref()
    }

    /// rskafka's SASL configuration, if any.
    pub(crate) fn rskafka_sasl(&self) -> Option<rskafka::client::SaslConfig> {
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
        let security = Security::new(SecurityProtocol::SaslPlaintext, Some(c)).unwrap();
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
        for (bad, expected) in [("SSL", "not supported yet"), ("SASL", "unknown security protocol")] {
            let e = bad.parse::<SecurityProtocol>().unwrap_err().to_string();
            assert!(e.contains(expected), "{bad}: {e}");
        }
        assert!("GSSAPI".parse::<SaslMechanism>().unwrap_err().to_string().contains("unknown SASL mechanism"));
    }

    #[test]
    fn settings_that_do_not_fit_together() {
        let c = || credentials(SaslMechanism::Plain, "u", "p");
        let refused = |protocol, sasl, expected: &str| {
            let e = Security::new(protocol, sasl).unwrap_err().to_string();
            assert!(e.contains(expected), "{e}");
        };
        refused(SecurityProtocol::SaslPlaintext, None, "needs a SASL mechanism");
        refused(SecurityProtocol::Plaintext, Some(c()), "set it to SASL_PLAINTEXT");
        refused(SecurityProtocol::SaslPlaintext, Some(credentials(SaslMechanism::Plain, "", "p")), "user name");
        refused(SecurityProtocol::SaslPlaintext, Some(credentials(SaslMechanism::Plain, "u", "")), "password");
        assert!(Security::new(SecurityProtocol::SaslPlaintext, Some(c())).is_ok());
        assert_eq!(Security::default().protocol(), SecurityProtocol::Plaintext);
    }
}
