//! TLS in front of the test broker: certificates made at start (a CA, a
//! server certificate for `localhost`, a client certificate) and stunnel
//! terminating TLS on the advertised port, since tansu's own TLS options do
//! not wrap its connections.

use std::{
    fs,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

use crate::process;

/// The host name in the server certificate, and the one brokers advertise.
/// Its IP address (127.0.0.1) is deliberately not in the certificate, so
/// that connecting by address is a host name mismatch the tests can provoke.
pub(crate) const SERVER_NAME: &str = "localhost";

/// The PEM files of a TLS broker, in one directory.
pub(crate) struct TlsFiles {
    dir: PathBuf,
}

impl TlsFiles {
    /// The files in `dir` (made by [`TlsFiles::generate`]).
    pub(crate) fn at(dir: &Path) -> TlsFiles {
        TlsFiles { dir: dir.to_owned() }
    }

    /// The CA that signed the server and client certificates.
    pub(crate) fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// The server's certificate (for [`SERVER_NAME`]).
    pub(crate) fn server_certificate(&self) -> PathBuf {
        self.dir.join("server.pem")
    }

    /// The server's private key.
    pub(crate) fn server_key(&self) -> PathBuf {
        self.dir.join("server.key")
    }

    /// A client certificate the server trusts (mutual TLS).
    pub(crate) fn client_certificate(&self) -> PathBuf {
        self.dir.join("client.pem")
    }

    /// Its private key.
    pub(crate) fn client_key(&self) -> PathBuf {
        self.dir.join("client.key")
    }

    /// Makes a fresh CA, and a server and a client certificate signed by it, in `dir`.
    pub(crate) fn generate(dir: &Path) -> anyhow::Result<TlsFiles> {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let files = TlsFiles::at(dir);
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(DnType::CommonName, "kafka-retry test CA");
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
        write(&files.ca(), &ca.pem())?;

        let leaf = |name: &str, usage: ExtendedKeyUsagePurpose, cert: PathBuf, key: PathBuf| -> anyhow::Result<()> {
            let sans = if usage == ExtendedKeyUsagePurpose::ServerAuth { vec![name.to_owned()] } else { Vec::new() };
            let mut params = CertificateParams::new(sans)?;
            params.distinguished_name.push(DnType::CommonName, name);
            params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
            params.extended_key_usages = vec![usage];
            let key_pair = KeyPair::generate()?;
            let certificate = params.signed_by(&key_pair, &ca)?;
            write(&cert, &certificate.pem())?;
            write(&key, &key_pair.serialize_pem())
        };
        leaf(SERVER_NAME, ExtendedKeyUsagePurpose::ServerAuth, files.server_certificate(), files.server_key())?;
        leaf(
            "kafka-retry-client",
            ExtendedKeyUsagePurpose::ClientAuth,
            files.client_certificate(),
            files.client_key(),
        )?;
        Ok(files)
    }
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// Whether the TLS terminator asks clients for a certificate it trusts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClientAuth {
    /// Any client may connect (server-only TLS).
    None,
    /// Only clients with a certificate signed by the test CA (mutual TLS).
    Required,
}

/// Starts stunnel in the foreground, in a process group of its own:
/// TLS on `accept`, plaintext to `connect`. Its configuration and log go to
/// `dir`.
pub(crate) fn spawn_stunnel(
    files: &TlsFiles,
    accept: &str,
    connect: &str,
    client_auth: ClientAuth,
    dir: &Path,
) -> anyhow::Result<std::process::Child> {
    let mut conf = format!(
        "foreground = yes\npid = {}\ndebug = notice\n\n[kafka]\naccept = {accept}\nconnect = {connect}\ncert = {}\nkey = \
         {}\nsocket = l:TCP_NODELAY=1\nsocket = r:TCP_NODELAY=1\n",
        dir.join("stunnel.pid").display(),
        files.server_certificate().display(),
        files.server_key().display()
    );
    if client_auth == ClientAuth::Required {
        conf.push_str(&format!("CAfile = {}\nrequireCert = yes\nverifyChain = yes\n", files.ca().display()));
    }
    let conf_path = stunnel_config(dir);
    write(&conf_path, &conf)?;
    let log = fs::OpenOptions::new().create(true).append(true).open(dir.join("stunnel.log"))?;
    let mut cmd = Command::new(stunnel()?);
    cmd.arg(&conf_path).stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log).process_group(0);
    cmd.spawn().with_context(|| format!("cannot start {}", process::show(&cmd)))
}

/// The stunnel configuration of a broker whose data is in `dir`.
pub(crate) fn stunnel_config(dir: &Path) -> PathBuf {
    dir.join("stunnel.conf")
}

/// The pid stunnel wrote at start, if it runs for the broker in `dir`.
pub(crate) fn stunnel_pid(dir: &Path) -> Option<u32> {
    fs::read_to_string(dir.join("stunnel.pid")).ok()?.trim().parse().ok()
}

/// The stunnel binary: Debian's `stunnel4` package installs it as
/// `stunnel4` (and `stunnel`).
fn stunnel() -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        for name in ["stunnel4", "stunnel"] {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    anyhow::bail!(
        "stunnel is needed to put TLS in front of the test broker: install Debian's `stunnel4` package \
         (apt-get install stunnel4)"
    )
}
