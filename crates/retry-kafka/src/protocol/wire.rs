//! One connection to one broker (TCP, or TLS over TCP, and SASL as the
//! security configuration says), speaking the Kafka protocol through the
//! `kafka-protocol` crate: framing, correlation ids, and version negotiation.
//!
//! rskafka covers produce, fetch and metadata; this covers what it lacks
//! (group membership, offsets, topic creation with configs). One request is
//! in flight per connection, so callers that must not wait on each other
//! (heartbeats and commits) use connections of their own.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::{
    messages::{
        ApiKey, ApiVersionsRequest, RequestHeader, ResponseHeader, SaslAuthenticateRequest, SaslHandshakeRequest,
    },
    protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes, VersionRange},
};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::TcpStream,
};

use crate::{connection::security::tls, ConnectionConfig, Error, Result, SaslCredentials};

/// The byte stream under a connection: TCP, or TLS over TCP.
trait Transport: AsyncRead + AsyncWrite + Unpin + Send + Sync {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync> Transport for T {}

/// The largest response we accept; a larger length prefix means a corrupt
/// stream, not a real message.
const MAX_RESPONSE_BYTES: usize = 128 << 20;

/// The highest version of each request that this crate fills in correctly.
/// Newer versions change semantics (batched coordinators and offset fetches,
/// KIP-848 member epochs), so we negotiate up to these and no further.
///
/// The classic group requests stop at their last non-flexible versions
/// (JoinGroup 5, SyncGroup 3, Heartbeat 3), which carry all we use, static
/// membership (KIP-345) included, and LeaveGroup at 2, before its batch
/// form (a member that leaves names itself; static members do not leave).
/// Every broker from Kafka 2.3 to 4.x serves them, and they are close to
/// what the most deployed client (librdkafka) speaks, so brokers whose newer
/// encodings are less travelled still understand us: librdkafka's mock
/// cluster, for one, advertises JoinGroup v6 but reads its protocol list as
/// a fixed-width array and drops the connection, and advertises LeaveGroup
/// v4 but reads and answers every version in the v0-2 layout.
pub(crate) fn highest_implemented(key: ApiKey) -> i16 {
    match key {
        ApiKey::ApiVersions => 3,
        ApiKey::FindCoordinator => 3,
        ApiKey::JoinGroup => 5,
        ApiKey::SyncGroup => 3,
        ApiKey::Heartbeat => 3,
        ApiKey::LeaveGroup => 2,
        // v9 carries a consumer-protocol member's epoch (KIP-848), and
        // Kafka refuses older versions from such members; classic members
        // commit at v8 at most (see `GroupClient::commit_with_metadata`).
        ApiKey::OffsetCommit => 9,
        // v1: the member names itself (a UUID of its own) when it joins.
        ApiKey::ConsumerGroupHeartbeat => 1,
        ApiKey::ConsumerGroupDescribe => 0,
        // The last non-flexible version.
        ApiKey::DescribeGroups => 4,
        ApiKey::OffsetFetch => 7,
        ApiKey::CreateTopics => 7,
        // The last non-flexible version: it has leaders and broker
        // addresses, all we read, and librdkafka's mock cluster appends a
        // stray byte to its flexible Metadata answers.
        ApiKey::Metadata => 8,
        // v10: from v11 on a consumer's fetch carries client metadata (a
        // rack), and then any replica may answer it (KIP-392), a follower
        // up to its own high watermark, without saying it no longer leads.
        // Up to v10 only the leader answers; others say
        // NOT_LEADER_OR_FOLLOWER and the reader finds the leader again.
        ApiKey::Fetch => 10,
        ApiKey::DescribeConfigs => 4,
        // The last non-flexible version: record errors and messages, all we read.
        ApiKey::Produce => 8,
        // v3 is the first whose request names no producer (-1) for an
        // idempotent producer; tansu serves idempotence only from there.
        ApiKey::InitProducerId => 4,
        ApiKey::SaslHandshake => 1,
        ApiKey::SaslAuthenticate => 2,
        _ => 0,
    }
}

/// The requests this crate sends on connections of its own, each with
/// what needs it.
pub(crate) const SENT: &[(ApiKey, Purpose)] = &[
    (ApiKey::Metadata, Purpose::Always),
    (ApiKey::Produce, Purpose::Always),
    (ApiKey::Fetch, Purpose::Always),
    (ApiKey::FindCoordinator, Purpose::Always),
    (ApiKey::OffsetFetch, Purpose::Always),
    (ApiKey::OffsetCommit, Purpose::Always),
    (ApiKey::JoinGroup, Purpose::ClassicGroups),
    (ApiKey::SyncGroup, Purpose::ClassicGroups),
    (ApiKey::Heartbeat, Purpose::ClassicGroups),
    (ApiKey::LeaveGroup, Purpose::ClassicGroups),
    (ApiKey::DescribeGroups, Purpose::GroupDescription),
    (ApiKey::ConsumerGroupHeartbeat, Purpose::ConsumerGroups),
    (ApiKey::ConsumerGroupDescribe, Purpose::GroupDescription),
    (ApiKey::InitProducerId, Purpose::IdempotentProduce),
    (ApiKey::CreateTopics, Purpose::TopicCreation),
];

/// What a request is needed for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// Every listener sends it.
    Always,
    /// Listeners on the classic group protocol.
    ClassicGroups,
    /// Listeners on the consumer group protocol (KIP-848).
    ConsumerGroups,
    /// The idempotent producer of republications, where the broker has one.
    IdempotentProduce,
    /// `topics create`.
    TopicCreation,
    /// Tools that show a group's state (operators, preflights); listeners
    /// do without.
    GroupDescription,
}

/// The name of a request type, for messages.
pub(crate) fn api_name<R: Request>() -> &'static str {
    match ApiKey::try_from(R::KEY) {
        Ok(key) => api_key_name(key),
        Err(()) => "unknown request",
    }
}

fn api_key_name(key: ApiKey) -> &'static str {
    match key {
        ApiKey::ApiVersions => "ApiVersions",
        ApiKey::FindCoordinator => "FindCoordinator",
        ApiKey::JoinGroup => "JoinGroup",
        ApiKey::SyncGroup => "SyncGroup",
        ApiKey::Heartbeat => "Heartbeat",
        ApiKey::LeaveGroup => "LeaveGroup",
        ApiKey::OffsetCommit => "OffsetCommit",
        ApiKey::OffsetFetch => "OffsetFetch",
        ApiKey::ConsumerGroupHeartbeat => "ConsumerGroupHeartbeat",
        ApiKey::ConsumerGroupDescribe => "ConsumerGroupDescribe",
        ApiKey::DescribeGroups => "DescribeGroups",
        ApiKey::CreateTopics => "CreateTopics",
        ApiKey::Metadata => "Metadata",
        ApiKey::DescribeConfigs => "DescribeConfigs",
        ApiKey::Fetch => "Fetch",
        ApiKey::Produce => "Produce",
        ApiKey::InitProducerId => "InitProducerId",
        ApiKey::SaslHandshake => "SaslHandshake",
        ApiKey::SaslAuthenticate => "SaslAuthenticate",
        _ => "a Kafka request",
    }
}

/// A connection to one broker, with the API versions it supports.
pub(crate) struct Connection {
    addr: String,
    stream: Box<dyn Transport>,
    client_id: StrBytes,
    next_correlation_id: i32,
    timeout: Duration,
    versions: HashMap<i16, (i16, i16)>,
    /// Set while a request awaits its answer: if the caller gave up on it
    /// (a cancelled future), its answer may still arrive, and the next
    /// request would read it as its own. Such a connection is not reused.
    in_flight: bool,
    /// How it was made, to authenticate again (KIP-368) or connect anew.
    config: ConnectionConfig,
    /// When the broker's session limit (`connections.max.reauth.ms`) asks
    /// for authenticating again before the next request.
    reauthenticate_at: Option<Instant>,
    /// When that session ends: past it, the broker closes the connection on
    /// its next request, re-authentication included.
    session_ends_at: Option<Instant>,
}

impl Connection {
    /// Connects to `addr` as `config` says: TLS when the security protocol
    /// asks for it, then which API versions the broker supports, then SASL
    /// when the protocol asks for it. Every step, and every later request,
    /// is bounded by the request timeout.
    pub(crate) async fn connect(addr: &str, config: &ConnectionConfig) -> Result<Self> {
        let mut conn = Self::connect_unauthenticated(addr, config).await?;
        if let Some(credentials) = config.security.sasl() {
            conn.authenticate(credentials).await?;
        }
        tracing::debug!(broker = addr, "connected to a broker");
        Ok(conn)
    }

    /// Connects (with TLS if configured) and negotiates versions, without SASL.
    async fn connect_unauthenticated(addr: &str, config: &ConnectionConfig) -> Result<Self> {
        let (client_id, timeout) = (&config.client_id, config.request_timeout);
        let connect = tokio::time::timeout(timeout, TcpStream::connect(addr)).await;
        let tcp = match connect {
            Ok(Ok(stream)) => stream,
            Ok(Err(source)) => return Err(Error::Connect { addr: addr.to_owned(), source }),
            Err(_) => return Err(Error::Timeout { addr: addr.to_owned(), api: "connect", timeout }),
        };
        let _ = tcp.set_nodelay(true);
        let stream: Box<dyn Transport> = match config.security.rustls_config() {
            None => Box::new(tcp),
            Some(rustls_config) => {
                let handshake = tokio_rustls::TlsConnector::from(rustls_config).connect(tls::server_name(addr)?, tcp);
                match tokio::time::timeout(timeout, handshake).await {
                    Ok(Ok(stream)) => Box::new(stream),
                    Ok(Err(e)) => return Err(tls_failure(addr, &e)),
                    Err(_) => {
                        let reason = format!(
                            "no TLS handshake within {timeout:?}: is {addr} a TLS listener? (a plaintext listener \
                             waits for the rest of what it takes for a request)"
                        );
                        return Err(Error::Tls { addr: addr.to_owned(), reason });
                    }
                }
            }
        };
        let mut conn = Connection {
            addr: addr.to_owned(),
            stream,
            client_id: StrBytes::from_string(client_id.to_owned()),
            next_correlation_id: 1,
            timeout,
            versions: HashMap::new(),
            in_flight: false,
            config: config.clone(),
            reauthenticate_at: None,
            session_ends_at: None,
        };
        let request = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("kafka-retry"))
            .with_client_software_version(StrBytes::from_static_str(env!("CARGO_PKG_VERSION")));
        // Our highest version first. A broker that lacks it answers (KIP-511)
        // UNSUPPORTED_VERSION in the v0 layout, whatever version was asked,
        // listing the ApiVersions range it has; ask again within that range.
        let ours = highest_implemented(ApiKey::ApiVersions);
        let body = conn.exchange_raw::<ApiVersionsRequest>(&request, ours, timeout).await?;
        let response = match api_versions_fallback(&body) {
            None => conn.decode_exact::<ApiVersionsRequest>(body, ours)?,
            Some(their_max) => {
                let version = ours.min(their_max).max(0);
                tracing::debug!(addr, version, "the broker lacks ApiVersions v{ours}; asking in v{version}");
                let body = conn.exchange_raw::<ApiVersionsRequest>(&request, version, timeout).await?;
                conn.decode_exact::<ApiVersionsRequest>(body, version)?
            }
        };
        if let Some(error) = kafka_protocol::ResponseError::try_from_code(response.error_code) {
            return Err(Error::Broker { api: "ApiVersions", context: None, error: error.into() });
        }
        conn.versions = response.api_keys.iter().map(|k| (k.api_key, (k.min_version, k.max_version))).collect();
        Ok(conn)
    }

    /// SaslHandshake, then SaslAuthenticate until the mechanism is done
    /// (KIP-152). A refusal names the broker, the user and the mechanism,
    /// never the password.
    async fn authenticate(&mut self, credentials: &SaslCredentials) -> Result<()> {
        use rsasl::prelude::{Mechname, SASLClient, SASLConfig};
        let mechanism = credentials.mechanism.name();
        let refused = |conn: &Self, reason: String| Error::Authentication {
            addr: conn.addr.clone(),
            mechanism,
            username: credentials.username.clone(),
            reason,
        };
        let (handshake, _) =
            self.request(&SaslHandshakeRequest::default().with_mechanism(str_bytes(mechanism)), self.timeout).await?;
        if handshake.error_code != 0 {
            let offered: Vec<String> = handshake.mechanisms.iter().map(|m| m.to_string()).collect();
            return Err(refused(
                self,
                format!("the broker does not offer {mechanism} (it offers {})", offered.join(", ")),
            ));
        }
        let config =
            SASLConfig::with_credentials(None, credentials.username.clone(), credentials.password.expose().to_owned())
                .map_err(|e| refused(self, format!("cannot set up the SASL client: {e}")))?;
        let name = Mechname::parse(mechanism.as_bytes()).map_err(|e| refused(self, e.to_string()))?;
        let mut session = SASLClient::new(config).start_suggested(&[name]).map_err(|e| refused(self, e.to_string()))?;
        let mut received: Option<Vec<u8>> = None;
        loop {
            let mut to_send = Vec::new();
            let state = session.step(received.as_deref(), &mut to_send).map_err(|e| {
                // A SCRAM server refuses a wrong password in its last message
                // (e=invalid-proof), not with an error code.
                let reason = if received.is_some() {
                    format!("wrong user name or password (the exchange ended with: {e})")
                } else {
                    format!("the exchange failed: {e}")
                };
                refused(self, reason)
            })?;
            if state.has_sent_message() {
                let request = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(to_send));
                let (response, _) = self.request(&request, self.timeout).await?;
                if response.error_code != 0 {
                    let message = response.error_message.map(|m| m.to_string()).unwrap_or_default();
                    let reason = match kafka_protocol::ResponseError::try_from_code(response.error_code) {
                        Some(kafka_protocol::ResponseError::SaslAuthenticationFailed) => {
                            format!("wrong user name or password ({message})")
                        }
                        other => format!("{other:?} ({message})"),
                    };
                    return Err(refused(self, reason));
                }
                received = Some(response.auth_bytes.to_vec());
                let now = Instant::now();
                self.reauthenticate_at = reauthentication_delay(response.session_lifetime_ms).map(|delay| now + delay);
                self.session_ends_at = u64::try_from(response.session_lifetime_ms)
                    .ok()
                    .filter(|ms| *ms > 0)
                    .map(|ms| now + Duration::from_millis(ms));
            }
            if state.is_finished() {
                return Ok(());
            }
        }
    }

    /// Whether the last request was abandoned before its answer came: the
    /// connection then holds an answer nobody reads, and must be replaced.
    pub(crate) fn is_broken(&self) -> bool {
        self.in_flight
    }

    /// The broker's address.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// How long one request may take.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The version of each request of [`SENT`] this connection would use:
    /// the highest both we and the broker support; `None` where there is none.
    pub(crate) fn negotiated(&self) -> Vec<(&'static str, Purpose, Option<i16>)> {
        SENT.iter()
            .map(|&(key, purpose)| {
                let ours = key.valid_versions();
                let ours = VersionRange { min: ours.min, max: highest_implemented(key).min(ours.max) };
                let version = self.versions.get(&(key as i16)).and_then(|&(their_min, their_max)| {
                    let version = ours.max.min(their_max);
                    (version >= ours.min && version >= their_min).then_some(version)
                });
                (api_key_name(key), purpose, version)
            })
            .collect()
    }

    /// The version of `R` to use: the highest that both we and the broker support.
    pub(crate) fn version_of<R: Request>(&self) -> Result<i16> {
        self.version_at_most::<R>(i16::MAX)
    }

    /// The same, at most `highest`: a caller for whom a later version
    /// means something else (a classic member's OffsetCommit).
    pub(crate) fn version_at_most<R: Request>(&self, highest: i16) -> Result<i16> {
        let key = ApiKey::try_from(R::KEY).map_err(|()| self.protocol_error::<R>("unknown api key".into()))?;
        let ours =
            VersionRange { min: R::VERSIONS.min, max: highest_implemented(key).min(R::VERSIONS.max).min(highest) };
        let theirs = self.versions.get(&R::KEY).copied();
        let unsupported = || Error::UnsupportedVersion {
            addr: self.addr.clone(),
            api: api_name::<R>(),
            ours_min: ours.min,
            ours_max: ours.max,
            theirs,
        };
        let (their_min, their_max) = theirs.ok_or_else(unsupported)?;
        let version = ours.max.min(their_max);
        if version < ours.min || version < their_min {
            return Err(unsupported());
        }
        Ok(version)
    }

    /// Sends `request` at the negotiated version and returns the response
    /// with that version.
    pub(crate) async fn send<R: Request>(&mut self, request: &R) -> Result<(R::Response, i16)> {
        self.send_within(request, self.timeout).await
    }

    /// Like [`send`](Self::send), for requests the broker may legitimately
    /// hold for long (JoinGroup waits for the whole group).
    pub(crate) async fn send_within<R: Request>(
        &mut self,
        request: &R,
        timeout: Duration,
    ) -> Result<(R::Response, i16)> {
        self.send_capped(request, timeout, i16::MAX).await
    }

    /// Authenticates again before the session the broker granted ends
    /// (KIP-368). A broker that refuses that on a live connection (tansu
    /// grants sessions but answers a second handshake as an unknown
    /// mechanism) gets a new connection, authenticated from the start.
    async fn renew_session(&mut self) -> Result<()> {
        self.reauthenticate_at = None;
        let Some(credentials) = self.config.security.sasl().cloned() else {
            return Ok(());
        };
        tracing::debug!(addr = %self.addr, "the SASL session nears its end; authenticating again (KIP-368)");
        match self.authenticate(&credentials).await {
            Err(e @ Error::Authentication { .. }) => {
                tracing::debug!(addr = %self.addr, error = %e, "authenticating again was refused; connecting anew");
                let (addr, config) = (self.addr.clone(), self.config.clone());
                *self = Box::pin(Connection::connect(&addr, &config)).await?;
                Ok(())
            }
            other => other,
        }
    }

    /// Like [`send`](Self::send), at version `highest` at most.
    pub(crate) async fn send_at_most<R: Request>(&mut self, request: &R, highest: i16) -> Result<(R::Response, i16)> {
        self.send_capped(request, self.timeout, highest).await
    }

    /// Sends `request` at the highest version both sides support, at most
    /// `highest`, within `timeout`; a SASL session about to end is renewed
    /// first, one that ended is replaced by a new connection.
    async fn send_capped<R: Request>(
        &mut self,
        request: &R,
        timeout: Duration,
        highest: i16,
    ) -> Result<(R::Response, i16)> {
        let now = Instant::now();
        if self.session_ends_at.is_some_and(|at| now >= at) {
            // Idle past its session: the broker would close it on this
            // request; a new connection, authenticated from the start.
            tracing::debug!(addr = %self.addr, "the SASL session ended while the connection was idle; connecting anew");
            let (addr, config) = (self.addr.clone(), self.config.clone());
            *self = Box::pin(Connection::connect(&addr, &config)).await?;
        } else if self.reauthenticate_at.is_some_and(|at| now >= at) {
            self.renew_session().await?;
        }
        let version = self.version_at_most::<R>(highest)?;
        Ok((self.exchange(request, version, timeout).await?, version))
    }

    /// Sends `request` at the negotiated version, as it is: no
    /// re-authentication first (authentication itself goes through here).
    async fn request<R: Request>(&mut self, request: &R, timeout: Duration) -> Result<(R::Response, i16)> {
        let version = self.version_of::<R>()?;
        Ok((self.exchange(request, version, timeout).await?, version))
    }

    async fn exchange<R: Request>(&mut self, request: &R, version: i16, timeout: Duration) -> Result<R::Response> {
        let body = self.exchange_raw(request, version, timeout).await?;
        self.decode_exact::<R>(body, version)
    }

    /// Sends `request` at `version` and returns the response's body, after
    /// its header (whose correlation id is checked).
    async fn exchange_raw<R: Request>(&mut self, request: &R, version: i16, timeout: Duration) -> Result<Bytes> {
        let api = api_name::<R>();
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id = self.next_correlation_id.wrapping_add(1);

        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(self.client_id.clone()));
        let mut frame = BytesMut::new();
        frame.put_i32(0); // length, filled in below
        header
            .encode(&mut frame, R::header_version(version))
            .and_then(|()| request.encode(&mut frame, version))
            .map_err(|e| self.protocol_error::<R>(format!("cannot encode: {e}")))?;
        let len = i32::try_from(frame.len() - 4).map_err(|_| self.protocol_error::<R>("request too large".into()))?;
        frame[..4].copy_from_slice(&len.to_be_bytes());

        self.in_flight = true;
        let exchange = async {
            self.stream.write_all(&frame).await?;
            let len = self.stream.read_i32().await?;
            let len = usize::try_from(len).ok().filter(|l| (4..=MAX_RESPONSE_BYTES).contains(l)).ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, format!("implausible response length {len}"))
            })?;
            let mut body = vec![0u8; len];
            self.stream.read_exact(&mut body).await?;
            Ok::<_, std::io::Error>(body)
        };
        let body = match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok(body)) => {
                self.in_flight = false;
                body
            }
            // A broker that refuses the client certificate says so after the
            // TLS 1.3 handshake, on the first read.
            Ok(Err(source)) if tls::explain(&source).is_some() => return Err(tls_failure(&self.addr, &source)),
            Ok(Err(source)) => return Err(Error::Io { addr: self.addr.clone(), api, source }),
            Err(_) => return Err(Error::Timeout { addr: self.addr.clone(), api, timeout }),
        };

        let mut buf = Bytes::from(body);
        let response_header = ResponseHeader::decode(&mut buf, R::Response::header_version(version))
            .map_err(|e| self.protocol_error::<R>(format!("cannot decode the response header: {e}")))?;
        if response_header.correlation_id != correlation_id {
            return Err(self.protocol_error::<R>(format!(
                "response correlation id {} does not match request {correlation_id}",
                response_header.correlation_id
            )));
        }
        Ok(buf)
    }

    /// Decodes a response body of `version`, which must be consumed exactly:
    /// bytes left over mean the broker and we disagree on the layout, and
    /// whatever was decoded cannot be trusted.
    fn decode_exact<R: Request>(&self, mut body: Bytes, version: i16) -> Result<R::Response> {
        let response = R::Response::decode(&mut body, version)
            .map_err(|e| self.protocol_error::<R>(format!("cannot decode the v{version} response: {e}")))?;
        if body.has_remaining() {
            return Err(self.protocol_error::<R>(format!(
                "{} bytes left over after the v{version} response: the broker and this client disagree on its layout",
                body.remaining()
            )));
        }
        Ok(response)
    }

    fn protocol_error<R: Request>(&self, reason: String) -> Error {
        Error::Protocol { addr: self.addr.clone(), api: api_name::<R>(), reason }
    }
}

/// After how long a SASL session of `lifetime_ms` (the broker's
/// `connections.max.reauth.ms`, 0 when it sets none) is renewed: at 85% of
/// it, as Kafka's own clients do at the earliest, so the renewal is over
/// before the broker would close the connection.
fn reauthentication_delay(lifetime_ms: i64) -> Option<Duration> {
    u64::try_from(lifetime_ms)
        .ok()
        .filter(|ms| *ms > 0)
        .map(|ms| Duration::from_millis(ms / 100 * 85 + ms % 100 * 85 / 100))
}

/// A failed TLS handshake or TLS read, explained.
fn tls_failure(addr: &str, e: &std::io::Error) -> Error {
    let reason = tls::explain(e).unwrap_or_else(|| {
        format!("the connection ended during the handshake ({e}): is {addr} a TLS listener, and does it accept this client?")
    });
    Error::Tls { addr: addr.to_owned(), reason }
}

/// Connects once to the first bootstrap broker that answers, so that wrong
/// credentials, an untrusted certificate or a host name mismatch fail at
/// once with [`Error::Authentication`] or [`Error::Tls`] (naming the broker
/// and what to fix) instead of after rskafka's retries with its own
/// wording. Other failures are left to the caller's connection attempt,
/// which reports them.
pub(crate) async fn check_security(config: &ConnectionConfig) -> Result<()> {
    if config.security.sasl().is_none() && config.security.rustls_config().is_none() {
        return Ok(());
    }
    for addr in &config.bootstrap {
        match Connection::connect(addr, config).await {
            Ok(_) => return Ok(()),
            Err(e @ (Error::Authentication { .. } | Error::Tls { .. })) => return Err(e),
            Err(e) => tracing::debug!(%addr, error = %e, "cannot check the credentials against this broker"),
        }
    }
    Ok(())
}

/// The error code of UNSUPPORTED_VERSION.
const UNSUPPORTED_VERSION: i16 = 35;

/// If `body` is an ApiVersions answer of UNSUPPORTED_VERSION, the highest
/// ApiVersions version the broker lists in it (0 when it lists none).
///
/// Such an answer has the v0 layout whatever version was asked (KIP-511):
/// error code, then an array of (key, min, max). Some brokers append a
/// throttle time after it, so trailing bytes are allowed here, and only here.
fn api_versions_fallback(body: &[u8]) -> Option<i16> {
    let mut buf = body;
    if buf.len() < 2 || buf.get_i16() != UNSUPPORTED_VERSION {
        return None;
    }
    let count = if buf.remaining() >= 4 { buf.get_i32() } else { 0 };
    let api_versions_key = ApiKey::ApiVersions as i16;
    for _ in 0..count.max(0) {
        if buf.remaining() < 6 {
            break;
        }
        let (key, _min, max) = (buf.get_i16(), buf.get_i16(), buf.get_i16());
        if key == api_versions_key {
            return Some(max);
        }
    }
    Some(0)
}

/// Turns a response error code into a result.
pub(crate) fn check(api: &'static str, context: impl FnOnce() -> String, code: i16) -> Result<()> {
    match kafka_protocol::ResponseError::try_from_code(code) {
        None => Ok(()),
        Some(error) => Err(Error::Broker { api, context: Some(context()), error: error.into() }),
    }
}

/// A `StrBytes` from any string.
pub(crate) fn str_bytes(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_owned())
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::{HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest, SyncGroupRequest};

    use super::*;

    #[track_caller]
    fn check_fallback(body: &[u8], expected: Option<i16>) {
        assert_eq!(api_versions_fallback(body), expected, "body {body:02x?}");
    }

    #[test]
    fn api_versions_fallback_reads_the_v0_layout() {
        let key = (ApiKey::ApiVersions as i16).to_be_bytes();
        let entry = |k: [u8; 2], max: i16| [&k[..], &0i16.to_be_bytes(), &max.to_be_bytes()].concat();
        let body = |error: i16, entries: &[Vec<u8>], trailer: &[u8]| {
            let mut b = error.to_be_bytes().to_vec();
            b.extend((entries.len() as i32).to_be_bytes());
            entries.iter().for_each(|e| b.extend(e));
            b.extend(trailer);
            b
        };
        // An answer without error is decoded as asked, not through the fallback.
        check_fallback(&body(0, &[entry(key, 3)], &[]), None);
        // Kafka's answer: v0 layout, only ApiVersions listed.
        check_fallback(&body(35, &[entry(key, 2)], &[]), Some(2));
        // librdkafka's mock: v0 layout plus a throttle time.
        check_fallback(&body(35, &[entry(key, 2)], &[0, 0, 0, 0]), Some(2));
        // ApiVersions among other keys.
        check_fallback(&body(35, &[entry(0i16.to_be_bytes(), 9), entry(key, 1)], &[]), Some(1));
        // Nothing listed, or a truncated answer: ask in v0.
        check_fallback(&body(35, &[], &[]), Some(0));
        check_fallback(&35i16.to_be_bytes(), Some(0));
        check_fallback(&[0], None);
    }

    #[test]
    fn sessions_are_renewed_before_the_broker_ends_them() {
        for (lifetime_ms, expected) in [
            (0, None),
            (-1, None),
            (100, Some(Duration::from_millis(85))),
            (60_000, Some(Duration::from_millis(51_000))),
            (i64::MAX, Some(Duration::from_millis(i64::MAX as u64 / 100 * 85 + 7 * 85 / 100))),
        ] {
            assert_eq!(reauthentication_delay(lifetime_ms), expected, "lifetime {lifetime_ms} ms");
        }
    }

    /// The group requests stay below their first flexible version, so a
    /// broker that misreads the flexible encodings still understands them.
    #[test]
    fn group_requests_are_negotiated_below_their_flexible_versions() {
        #[track_caller]
        fn check<R: Request>(expected_highest: i16) {
            let key = ApiKey::try_from(R::KEY).unwrap();
            let highest = highest_implemented(key);
            assert_eq!(highest, expected_highest, "{}", api_name::<R>());
            assert!(R::VERSIONS.min <= highest && highest <= R::VERSIONS.max, "{}", api_name::<R>());
            // Request header v2 is the flexible one.
            assert_eq!(R::header_version(highest), 1, "{} v{highest} is flexible", api_name::<R>());
        }
        check::<JoinGroupRequest>(5);
        check::<SyncGroupRequest>(3);
        check::<HeartbeatRequest>(3);
        check::<LeaveGroupRequest>(2);
    }
}
