//! One TCP connection to one broker, speaking the Kafka protocol through the
//! `kafka-protocol` crate: framing, correlation ids, and version negotiation.
//!
//! rskafka covers produce, fetch and metadata; this covers what it lacks
//! (group membership, offsets, topic creation with configs). One request is
//! in flight per connection, so callers that must not wait on each other
//! (heartbeats and commits) use connections of their own.

use std::{collections::HashMap, time::Duration};

use bytes::{Buf, BufMut, BytesMut};
use kafka_protocol::{
    messages::{ApiKey, ApiVersionsRequest, ApiVersionsResponse, RequestHeader, ResponseHeader},
    protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes, VersionRange},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use crate::{Error, Result};

/// The largest response we accept; a larger length prefix means a corrupt
/// stream, not a real message.
const MAX_RESPONSE_BYTES: usize = 128 << 20;

/// The highest version of each request that this crate fills in correctly.
/// Newer versions change semantics (batched coordinators and offset fetches,
/// KIP-848 member epochs), so we negotiate up to these and no further.
fn highest_implemented(key: ApiKey) -> i16 {
    match key {
        ApiKey::ApiVersions => 3,
        ApiKey::FindCoordinator => 3,
        ApiKey::JoinGroup => 7,
        ApiKey::SyncGroup => 5,
        ApiKey::Heartbeat => 4,
        ApiKey::LeaveGroup => 4,
        ApiKey::OffsetCommit => 8,
        ApiKey::OffsetFetch => 7,
        ApiKey::CreateTopics => 7,
        ApiKey::Metadata => 12,
        // v12+ are flexible versions, and some brokers put tagged fields in
        // their responses that decoders reject; v11 has everything we read.
        ApiKey::Fetch => 11,
        ApiKey::DescribeConfigs => 4,
        _ => 0,
    }
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
        ApiKey::CreateTopics => "CreateTopics",
        ApiKey::Metadata => "Metadata",
        ApiKey::DescribeConfigs => "DescribeConfigs",
        ApiKey::Fetch => "Fetch",
        _ => "a Kafka request",
    }
}

/// A connection to one broker, with the API versions it supports.
pub(crate) struct Connection {
    addr: String,
    stream: TcpStream,
    client_id: StrBytes,
    next_correlation_id: i32,
    timeout: Duration,
    versions: HashMap<i16, (i16, i16)>,
}

impl Connection {
    /// Connects to `addr` and asks which API versions it supports. Every
    /// step, and every later request, is bounded by `timeout`.
    pub(crate) async fn connect(addr: &str, client_id: &str, timeout: Duration) -> Result<Self> {
        let connect = tokio::time::timeout(timeout, TcpStream::connect(addr)).await;
        let stream = match connect {
            Ok(Ok(stream)) => stream,
            Ok(Err(source)) => return Err(Error::Connect { addr: addr.to_owned(), source }),
            Err(_) => return Err(Error::Timeout { addr: addr.to_owned(), api: "connect", timeout }),
        };
        let _ = stream.set_nodelay(true);
        let mut conn = Connection {
            addr: addr.to_owned(),
            stream,
            client_id: StrBytes::from_string(client_id.to_owned()),
            next_correlation_id: 1,
            timeout,
            versions: HashMap::new(),
        };
        let request = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("kafka-retry"))
            .with_client_software_version(StrBytes::from_static_str(env!("CARGO_PKG_VERSION")));
        // v3 first; a broker that lacks it answers in v0 with its own range.
        let mut response: ApiVersionsResponse = conn.send_version(&request, 3).await?;
        if response.error_code == 35 {
            response = conn.send_version(&request, 0).await?;
        }
        if let Some(error) = kafka_protocol::ResponseError::try_from_code(response.error_code) {
            return Err(Error::Broker { api: "ApiVersions", context: None, error });
        }
        conn.versions = response.api_keys.iter().map(|k| (k.api_key, (k.min_version, k.max_version))).collect();
        Ok(conn)
    }

    /// The broker's address.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// The version of `R` to use: the highest that both we and the broker support.
    pub(crate) fn version_of<R: Request>(&self) -> Result<i16> {
        let key = ApiKey::try_from(R::KEY).map_err(|()| self.protocol_error::<R>("unknown api key".into()))?;
        let ours = VersionRange { min: R::VERSIONS.min, max: highest_implemented(key).min(R::VERSIONS.max) };
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
        let version = self.version_of::<R>()?;
        Ok((self.exchange(request, version, timeout).await?, version))
    }

    async fn send_version<R: Request>(&mut self, request: &R, version: i16) -> Result<R::Response> {
        self.exchange(request, version, self.timeout).await
    }

    async fn exchange<R: Request>(&mut self, request: &R, version: i16, timeout: Duration) -> Result<R::Response> {
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
            Ok(Ok(body)) => body,
            Ok(Err(source)) => return Err(Error::Io { addr: self.addr.clone(), api, source }),
            Err(_) => return Err(Error::Timeout { addr: self.addr.clone(), api, timeout }),
        };

        let mut buf = bytes::Bytes::from(body);
        let response_header = ResponseHeader::decode(&mut buf, R::Response::header_version(version))
            .map_err(|e| self.protocol_error::<R>(format!("cannot decode the response header: {e}")))?;
        if response_header.correlation_id != correlation_id {
            return Err(self.protocol_error::<R>(format!(
                "response correlation id {} does not match request {correlation_id}",
                response_header.correlation_id
            )));
        }
        let response = R::Response::decode(&mut buf, version)
            .map_err(|e| self.protocol_error::<R>(format!("cannot decode the response: {e}")))?;
        if buf.has_remaining() {
            tracing::debug!(api, remaining = buf.remaining(), "ignoring trailing bytes after a response");
        }
        Ok(response)
    }

    fn protocol_error<R: Request>(&self, reason: String) -> Error {
        Error::Protocol { addr: self.addr.clone(), api: api_name::<R>(), reason }
    }
}

/// Turns a response error code into a result.
pub(crate) fn check(api: &'static str, context: impl FnOnce() -> String, code: i16) -> Result<()> {
    match kafka_protocol::ResponseError::try_from_code(code) {
        None => Ok(()),
        Some(error) => Err(Error::Broker { api, context: Some(context()), error }),
    }
}

/// A `StrBytes` from any string.
pub(crate) fn str_bytes(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_owned())
}
