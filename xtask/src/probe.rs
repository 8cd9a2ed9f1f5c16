//! A broker seen from the wire, without a Kafka client (xtask stays
//! light): a free port to put one on, and whether one answers.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs},
    time::Duration,
};

use anyhow::{bail, Context};

/// A port free on loopback now, for a broker that binds it seconds later
/// (a JVM starting): drawn below the kernel's ephemeral range, where no
/// outgoing connection takes it meanwhile (the tests beside it open
/// thousands), else, failing that, any free port.
pub(crate) fn free_port() -> anyhow::Result<u16> {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    const LOWEST: u16 = 10_000;
    if ephemeral_low > LOWEST + 1_000 {
        let span = u64::from(ephemeral_low - LOWEST);
        let mut draw = random_seed();
        for _ in 0..64 {
            // xorshift: enough to spread concurrent runs over the span.
            draw ^= draw << 13;
            draw ^= draw >> 7;
            draw ^= draw << 17;
            let port = LOWEST + (draw % span) as u16;
            // Never the same port twice in one run: a cluster's nodes
            // draw theirs before any binds it.
            let mut given = GIVEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if !given.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
                given.insert(port);
                return Ok(port);
            }
        }
    }
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot find a free port on 127.0.0.1")?;
    Ok(listener.local_addr()?.port())
}

/// The ports [`free_port`] drew in this process.
static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// A seed that differs between calls and processes.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher
        .write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    hasher.finish() | 1
}

/// The first IPv4 address of `addr` (where our brokers listen), else its first.
pub(crate) fn resolve(addr: &str) -> anyhow::Result<SocketAddr> {
    let all: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
    all.iter().find(|a| a.is_ipv4()).or(all.first()).copied().with_context(|| format!("{addr} does not resolve"))
}

/// Sends one request (a non-flexible header: api key, version, correlation
/// id, client id) and returns the response after its correlation id.
///
/// Hand-written rather than through a Kafka client: xtask stays light, and
/// this is all a readiness check needs.
fn ask(addr: &str, api_key: i16, version: i16, request_body: &[u8]) -> anyhow::Result<Vec<u8>> {
    const CORRELATION_ID: i32 = 0x0c0ffee;
    let socket = resolve(addr)?;
    let mut stream = TcpStream::connect_timeout(&socket, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let client_id = b"xtask";
    let mut body = Vec::new();
    body.extend_from_slice(&api_key.to_be_bytes());
    body.extend_from_slice(&version.to_be_bytes());
    body.extend_from_slice(&CORRELATION_ID.to_be_bytes());
    body.extend_from_slice(&(client_id.len() as i16).to_be_bytes());
    body.extend_from_slice(client_id);
    body.extend_from_slice(request_body);
    let mut request = (body.len() as i32).to_be_bytes().to_vec();
    request.extend_from_slice(&body);
    stream.write_all(&request)?;

    let mut len = [0u8; 4];
    stream.read_exact(&mut len)?;
    let len = i32::from_be_bytes(len);
    if !(4..=16 << 20).contains(&len) {
        bail!("implausible response length {len} (api key {api_key})");
    }
    let mut response = vec![0u8; len as usize];
    stream.read_exact(&mut response)?;
    let correlation = i32::from_be_bytes(response[0..4].try_into()?);
    if correlation != CORRELATION_ID {
        bail!("response has correlation id {correlation}, expected {CORRELATION_ID}");
    }
    Ok(response.split_off(4))
}

/// Sends an ApiVersions (v0) request and checks that an answer comes.
pub(crate) fn probe_api_versions(addr: &str) -> anyhow::Result<()> {
    let answer = ask(addr, 18, 0, &[])?;
    if answer.len() < 4 {
        bail!("implausible ApiVersions response");
    }
    Ok(())
}

/// Sends a Metadata (v1) request, checks that the answer lists a broker,
/// and says how many it lists.
pub(crate) fn probe_metadata(addr: &str) -> anyhow::Result<usize> {
    let topics_all = (-1i32).to_be_bytes(); // topics: null, i.e. all
    let answer = ask(addr, 3, 1, &topics_all)?;
    let brokers = i32::from_be_bytes(answer.get(0..4).context("a Metadata response too short")?.try_into()?);
    if brokers < 1 {
        bail!("Metadata response lists no broker yet");
    }
    Ok(brokers as usize)
}

/// Sends a FindCoordinator (v1) request for a group and checks that a
/// coordinator answers for it: on a cluster just started, the offsets
/// topic is created by the first such request and loaded after, and until
/// then a group can neither join nor commit (`COORDINATOR_NOT_AVAILABLE`).
pub(crate) fn probe_coordinator(addr: &str) -> anyhow::Result<()> {
    let group = b"kafka-retry-readiness";
    let mut body = (group.len() as i16).to_be_bytes().to_vec();
    body.extend_from_slice(group);
    body.push(0); // key type: a group
    let answer = ask(addr, 10, 1, &body)?;
    // throttle_time_ms, then error_code.
    let error = i16::from_be_bytes(answer.get(4..6).context("a FindCoordinator response too short")?.try_into()?);
    if error != 0 {
        bail!("no group coordinator yet (FindCoordinator answered error {error})");
    }
    Ok(())
}
