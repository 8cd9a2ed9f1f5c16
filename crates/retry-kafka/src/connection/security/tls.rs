//! TLS for every connection: the rustls client configuration built once from
//! the settings Kafka users know (`ssl.ca.location`,
//! `ssl.certificate.location`, `ssl.key.location`,
//! `ssl.endpoint.identification.algorithm`), and what a failed handshake
//! means, in words an operator can act on.

use std::{
    fmt,
    path::{Path, PathBuf},
    sync::Arc,
};

use rustls::{
    client::{
        danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
        WebPkiServerVerifier,
    },
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName, UnixTime},
    AlertDescription, CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

use crate::{Error, Result, TlsFile};

/// Where trust and identity come from for `SSL` and `SASL_SSL`;
/// [`TlsSettings::default`] trusts the system's CAs, presents no client
/// certificate and verifies host names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// A PEM file of the CA certificates to trust (`ssl.ca.location`);
    /// `None`: the system's bundle (`$SSL_CERT_FILE`, else the usual paths).
    pub ca_location: Option<PathBuf>,
    /// The client's certificate chain, PEM (`ssl.certificate.location`), for
    /// brokers that require mutual TLS.
    pub certificate_location: Option<PathBuf>,
    /// The client certificate's private key, PEM (`ssl.key.location`).
    pub key_location: Option<PathBuf>,
    /// Whether the broker's certificate must name the host connected to
    /// (`ssl.endpoint.identification.algorithm=https`). Turning it off still
    /// checks that a trusted CA signed the certificate, but lets anyone with
    /// such a certificate impersonate the broker.
    pub verify_hostname: bool,
}

impl Default for TlsSettings {
    fn default() -> Self {
        TlsSettings { ca_location: None, certificate_location: None, key_location: None, verify_hostname: true }
    }
}

/// The settings and the rustls configuration made of them.
#[derive(Clone)]
pub(crate) struct Tls {
    pub(crate) settings: TlsSettings,
    pub(crate) config: Arc<ClientConfig>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.settings.fmt(f)
    }
}

impl PartialEq for Tls {
    fn eq(&self, other: &Self) -> bool {
        self.settings == other.settings
    }
}

impl Eq for Tls {}

/// Where Linux distributions keep their CA bundle, as OpenSSL looks for it.
const SYSTEM_CA_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

impl Tls {
    /// Reads the files `settings` name and builds the client configuration;
    /// each problem names the setting and the file.
    pub(crate) fn load(settings: TlsSettings) -> Result<Tls> {
        let roots = match &settings.ca_location {
            Some(path) => roots_from(path, TlsFile::Ca)?,
            None => system_roots()?,
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::setting("TLS", format!("cannot set up TLS: {e}")))?;
        let builder = if settings.verify_hostname {
            builder.with_root_certificates(roots)
        } else {
            let chain = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| Error::setting("TLS", format!("cannot set up TLS verification: {e}")))?;
            builder.dangerous().with_custom_certificate_verifier(Arc::new(AnyHostName(chain)))
        };
        let config = match (&settings.certificate_location, &settings.key_location) {
            (None, None) => builder.with_no_client_auth(),
            (Some(certificate), Some(key)) => {
                let chain = certificates(certificate, TlsFile::Certificate)?;
                let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                    let encrypted = std::fs::read_to_string(key).is_ok_and(|t| t.contains("ENCRYPTED"));
                    let reason = if encrypted {
                        "the key is encrypted, which is not supported: give it unencrypted (PKCS#8, e.g. `openssl \
                         pkcs8 -topk8 -nocrypt`) in a file only this service can read"
                            .to_owned()
                    } else {
                        e.to_string()
                    };
                    file_error(TlsFile::Key, key, reason)
                })?;
                builder.with_client_auth_cert(chain, key_der).map_err(|e| {
                    Error::setting(
                        "TLS client certificate",
                        format!(
                            "the client certificate {} and key {} cannot be used together: {e}",
                            certificate.display(),
                            key.display()
                        ),
                    )
                })?
            }
            (Some(_), None) => {
                return Err(Error::setting(
                    "TLS client certificate",
                    format!(
                        "a client certificate ({}) needs its private key ({})",
                        TlsFile::Certificate.property(),
                        TlsFile::Key.property()
                    ),
                ))
            }
            (None, Some(_)) => {
                return Err(Error::setting(
                    "TLS client certificate",
                    format!(
                        "a client key ({}) needs its certificate ({})",
                        TlsFile::Key.property(),
                        TlsFile::Certificate.property()
                    ),
                ))
            }
        };
        Ok(Tls { settings, config: Arc::new(config) })
    }
}

fn file_error(file: TlsFile, path: &Path, e: impl fmt::Display) -> Error {
    Error::TlsFile { file, path: path.to_owned(), reason: e.to_string() }
}

/// The certificates of a PEM file; at least one.
fn certificates(path: &Path, file: TlsFile) -> Result<Vec<CertificateDer<'static>>> {
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(file, path, e))?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| file_error(file, path, e))?;
    if certificates.is_empty() {
        return Err(file_error(file, path, "it holds no PEM certificate"));
    }
    Ok(certificates)
}

fn roots_from(path: &Path, file: TlsFile) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for certificate in certificates(path, file)? {
        roots.add(certificate).map_err(|e| file_error(file, path, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(roots)
}

/// The system's CAs: `$SSL_CERT_FILE` if set, else the first bundle of
/// [`SYSTEM_CA_BUNDLES`] that exists.
fn system_roots() -> Result<RootCertStore> {
    if let Some(path) = std::env::var_os("SSL_CERT_FILE").filter(|p| !p.is_empty()) {
        return roots_from(Path::new(&path), TlsFile::Ca);
    }
    match SYSTEM_CA_BUNDLES.iter().map(Path::new).find(|p| p.is_file()) {
        Some(path) => roots_from(path, TlsFile::Ca),
        None => Err(Error::setting(
            "TLS CA",
            format!(
                "no system CA bundle was found (looked at $SSL_CERT_FILE and {}): set {} to the CA file",
                SYSTEM_CA_BUNDLES.join(", "),
                TlsFile::Ca.property()
            ),
        )),
    }
}

/// Verifies the chain as usual but accepts any host name: what
/// `ssl.endpoint.identification.algorithm=none` asks for. The name check
/// runs after the chain check, so an untrusted certificate still fails.
#[derive(Debug)]
struct AnyHostName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyHostName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The server name to verify for `addr` (`host:port`, `[v6]:port`).
pub(crate) fn server_name(addr: &str) -> Result<ServerName<'static>> {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_owned()).map_err(|e| {
        Error::setting("bootstrap brokers", format!("{addr}: {host:?} is not a host name TLS can verify: {e}"))
    })
}

/// What a TLS failure means for an operator, if `e` carries one.
pub(crate) fn explain(e: &std::io::Error) -> Option<String> {
    e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()).map(explain_rustls)
}

fn explain_rustls(e: &rustls::Error) -> String {
    use CertificateError as C;
    match e {
        rustls::Error::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => format!(
            "its certificate is not signed by a CA this client trusts: set {} to the CA that signed it",
            TlsFile::Ca.property()
        ),
        rustls::Error::InvalidCertificate(C::NotValidForNameContext { expected, presented }) => format!(
            "its certificate is not valid for {} (it names {}): connect by a name it holds, or turn host \
             name verification off (ssl.endpoint.identification.algorithm=none) if you accept the risk",
            expected.to_str(),
            if presented.is_empty() {
                "no host".to_owned()
            } else {
                presented.iter().map(|n| bare_name(n)).collect::<Vec<_>>().join(", ")
            }
        ),
        rustls::Error::InvalidCertificate(C::NotValidForName) => "its certificate does not name that host: connect \
            by a name it holds, or turn host name verification off (ssl.endpoint.identification.algorithm=none) if \
            you accept the risk"
            .to_owned(),
        rustls::Error::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => {
            "its certificate has expired".to_owned()
        }
        rustls::Error::InvalidCertificate(C::NotValidYet | C::NotValidYetContext { .. }) => {
            "its certificate is not valid yet (is this machine's clock right?)".to_owned()
        }
        rustls::Error::AlertReceived(
            AlertDescription::CertificateRequired
            | AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateUnknown
            | AlertDescription::HandshakeFailure,
        ) => format!(
            "the broker refused this client's certificate ({e}): it requires mutual TLS with a certificate it trusts; \
             set {} and {}",
            TlsFile::Certificate.property(),
            TlsFile::Key.property()
        ),
        rustls::Error::InvalidMessage(_) => {
            format!("the broker does not speak TLS ({e}): is it a plaintext listener? use the broker's TLS port")
        }
        other => other.to_string(),
    }
}

/// `localhost` from rustls' `DnsName("localhost")`, `10.0.0.1` from `IpAddress(10.0.0.1)`.
fn bare_name(presented: &str) -> &str {
    let inner = presented.split_once('(').and_then(|(_, rest)| rest.strip_suffix(')')).unwrap_or(presented);
    inner.trim_matches('"')
}

#[cfg(test)]
mod tests {
    use rustls::InvalidMessage;

    use super::*;

    #[track_caller]
    fn check(e: rustls::Error, expected: &str) {
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        let shown = explain(&io).expect("a TLS error");
        assert!(shown.contains(expected), "{shown:?} lacks {expected:?}");
    }

    #[test]
    fn handshake_failures_say_what_to_do() {
        let name = ServerName::try_from("kafka-1").unwrap();
        check(CertificateError::UnknownIssuer.into(), "set ssl.ca.location");
        check(
            CertificateError::NotValidForNameContext { expected: name, presented: vec!["DnsName(\"other\")".into()] }
                .into(),
            "not valid for kafka-1 (it names other)",
        );
        check(CertificateError::NotValidForName.into(), "ssl.endpoint.identification.algorithm=none");
        check(CertificateError::Expired.into(), "has expired");
        check(rustls::Error::AlertReceived(AlertDescription::CertificateRequired), "set ssl.certificate.location");
        check(rustls::Error::InvalidMessage(InvalidMessage::InvalidContentType), "plaintext listener");
        check(rustls::Error::DecryptError, "cannot decrypt");
        let plain = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "eof");
        assert_eq!(explain(&plain), None);
    }

    #[test]
    fn server_names_come_from_the_address() {
        for (addr, expected) in
            [("kafka-1:9093", "kafka-1"), ("127.0.0.1:9093", "127.0.0.1"), ("[::1]:9093", "::1"), ("broker", "broker")]
        {
            assert_eq!(server_name(addr).unwrap().to_str(), expected, "{addr}");
        }
    }

    #[test]
    fn files_are_checked_when_loaded() {
        let dir = std::env::temp_dir().join(format!("retry-kafka-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let missing = dir.join("missing.pem");
        let load = |ca: &Path, certificate: Option<&Path>, key: Option<&Path>| {
            Tls::load(TlsSettings {
                ca_location: Some(ca.to_owned()),
                certificate_location: certificate.map(Path::to_owned),
                key_location: key.map(Path::to_owned),
                verify_hostname: true,
            })
            .unwrap_err()
        };
        let e = load(&missing, None, None);
        assert!(matches!(e, Error::TlsFile { file: TlsFile::Ca, .. }), "{e}");
        assert!(e.to_string().contains("ssl.ca.location") && e.to_string().contains("missing.pem"), "{e}");
        let e = load(&empty, None, None);
        assert!(e.to_string().contains("holds no PEM certificate"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
