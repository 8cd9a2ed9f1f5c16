//! A broker seen from the wire, without a Kafka client (xtask stays
//! light): a free port to put one on, and whether one answers.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs},
    time::Duration,
};

use anyhow::{bail, Context};

pub(crate) fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot find a free port on 127.0.0.1")?;
    Ok(listener.local_addr()?.port())
}

/// The first IPv4 address of `addr` (where our brokers listen), else its first.
pub(crate) fn resolve(addr: &str) -> anyhow::Result<SocketAddr> {
    let all: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
    all.iter().find(|a| a.is_ipv4()).or(all.first()).copied().with_context(|| format!("{addr} does not resolve"))
}

/// Sends an ApiVersions (v0) request and checks that an answer comes.
pub(crate) fn probe_api_versions(addr: &str) -> anyhow::Result<()> {
    let socket = resolve(addr)?;
    let mut stream = TcpStream::connect_timeout(&socket, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let client_id = b"xtask";
    let mut body = Vec::new();
    body.extend_from_slice(&18i16.to_be_bytes()); // api key: ApiVersions
    body.extend_from_slice(&0i16.to_be_bytes());
    body.extend_from_slice(&7i32.to_be_bytes());
    body.extend_from_slice(&(client_id.len() as i16).to_be_bytes());
    body.extend_from_slice(client_id);
    let mut request = (body.len() as i32).to_be_bytes().to_vec();
    request.extend_from_slice(&body);
    stream.write_all(&request)?;
    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    if i32::from_be_bytes(len) < 8 {
        bail!("implausible ApiVersions response");
    }
    Ok(())
}

/// Sends a Metadata (v1) request, checks that the answer lists a broker,
/// and says how many it lists.
///
/// Hand-written rather than through a Kafka client: xtask stays light, and
/// this is all a readiness check needs.
pub(crate) fn probe_metadata(addr: &str) -> anyhow::Result<usize> {
    let socket: SocketAddr =
        addr.to_socket_addrs()?.next().with_context(|| format!("{addr} does not resolve to an address"))?;
    let mut stream = TcpStream::connect_timeout(&socket, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;

    const CORRELATION_ID: i32 = 0x0c0ffee;
    let client_id = b"xtask";
    let mut body = Vec::new();
    body.extend_from_slice(&3i16.to_be_bytes()); // api key: Metadata
    body.extend_from_slice(&1i16.to_be_bytes()); // api version
    body.extend_from_slice(&CORRELATION_ID.to_be_bytes());
    body.extend_from_slice(&(client_id.len() as i16).to_be_bytes());
    body.extend_from_slice(client_id);
    body.extend_from_slice(&(-1i32).to_be_bytes()); // topics: null, i.e. all
    let mut request = (body.len() as i32).to_be_bytes().to_vec();
    request.extend_from_slice(&body);
    stream.write_all(&request)?;

    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = i32::from_be_bytes(len);
    if !(8..=16 << 20).contains(&len) {
        bail!("implausible Metadata response length {len}");
    }
    let mut response = vec![0u8; len as usize];
    stream.read_exact(&mut response)?;
    let correlation = i32::from_be_bytes(response[0..4].try_into()?);
    let brokers = i32::from_be_bytes(response[4..8].try_into()?);
    if correlation != CORRELATION_ID {
        bail!("Metadata response has correlation id {correlation}, expected {CORRELATION_ID}");
    }
    if brokers < 1 {
        bail!("Metadata response lists no broker yet");
    }
    Ok(brokers as usize)
}
