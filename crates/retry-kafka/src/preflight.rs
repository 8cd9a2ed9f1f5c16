//! Before the first record: whether each bootstrap broker can be reached
//! with the connection's settings (TCP, TLS, SASL), which version of each
//! request this crate would speak with it, and whether the brokers the
//! cluster advertises (where every client goes after bootstrapping) can be
//! reached too: a wrong `advertised.listeners` passes a bootstrap and
//! fails every fetch. A preflight contacts every broker on its own, where a
//! listener stops at the first that answers, so that one unreachable or
//! misconfigured broker of three is reported too.
//!
//! It sits above every layer (it asks the connection layer and the
//! protocol, with the listeners' group protocol in mind), and nothing
//! imports it.

use crate::{
    consumer::config::GroupProtocol,
    protocol::{
        metadata,
        wire::{Connection, Purpose},
    },
    ConnectionConfig, Result, SecurityProtocol,
};

/// What one bootstrap broker answered to a connection made with the
/// configured security.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerContact {
    /// The broker, `host:port` as configured.
    pub addr: String,
    /// How the connection was secured (the TLS handshake, when there is
    /// one, succeeded).
    pub security: SecurityProtocol,
    /// Who the broker authenticated, when SASL is on: the mechanism and
    /// the user name (never the password).
    pub authenticated_as: Option<(&'static str, String)>,
    /// Each request this crate sends, and the version it would use.
    pub requests: Vec<RequestSupport>,
    /// How the broker was found: configured, or advertised by the cluster.
    pub found: Found,
}

/// How a preflight found a broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// A bootstrap broker, as configured.
    Bootstrap,
    /// A broker the cluster advertises that is not among the bootstrap
    /// brokers: its node id.
    Advertised(i32),
}

/// One request and the version this crate would speak to a broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestSupport {
    /// Kafka's name of the request, e.g. `JoinGroup`.
    pub api: &'static str,
    /// The version both sides support, the highest; `None` when there is none.
    pub version: Option<i16>,
    /// Whether listeners of the group protocol asked about need it (the
    /// idempotent producer, topic creation and group descriptions are
    /// optional: without them, republication is not idempotent, topics are
    /// created elsewhere, and tools cannot show a group's state).
    pub needed: bool,
}

impl BrokerContact {
    /// The needed requests the broker has no version of.
    pub fn missing(&self) -> Vec<&'static str> {
        self.requests.iter().filter(|r| r.needed && r.version.is_none()).map(|r| r.api).collect()
    }
}

/// Contacts every bootstrap broker of `config` on its own, as listeners
/// of `protocol` would connect: TCP, TLS and SASL as configured, then
/// ApiVersions; then every broker the cluster advertises that is not a
/// bootstrap broker. One result per broker, the configured ones first in
/// their order; each error names the broker and, for TLS and SASL, what
/// failed. An advertised broker's error is [`Found::Advertised`]'s
/// when it is unreachable (the address is the one advertised).
///
/// ```no_run
/// # async fn check() -> retry_kafka::Result<()> {
/// use retry_kafka::{contact_brokers, ConnectionConfig, GroupProtocol};
///
/// let config = ConnectionConfig::new("kafka-1:9092,kafka-2:9092", "billing")?;
/// for (addr, _found, contact) in contact_brokers(&config, GroupProtocol::Classic).await {
///     match contact {
///         Ok(contact) if contact.missing().is_empty() => println!("{addr}: ok"),
///         Ok(contact) => println!("{addr}: lacks {:?}", contact.missing()),
///         Err(e) => println!("{addr}: {e}"),
///     }
/// }
/// # Ok(())
/// # }
/// ```
pub async fn contact_brokers(
    config: &ConnectionConfig,
    protocol: GroupProtocol,
) -> Vec<(String, Found, Result<BrokerContact>)> {
    let mut contacts = Vec::new();
    let mut advertised = Vec::new();
    for addr in config.bootstrap() {
        let contact = contact(addr, Found::Bootstrap, config, protocol).await;
        if let Ok((_, listed)) = &contact {
            for (node, listed_addr) in listed {
                if !config.bootstrap().contains(listed_addr) && !advertised.iter().any(|(_, a)| a == listed_addr) {
                    advertised.push((*node, listed_addr.clone()));
                }
            }
        }
        contacts.push((addr.clone(), Found::Bootstrap, contact.map(|(c, _)| c)));
    }
    for (node, addr) in advertised {
        let contact = contact(&addr, Found::Advertised(node), config, protocol).await.map(|(c, _)| c);
        contacts.push((addr, Found::Advertised(node), contact));
    }
    contacts
}

/// Connects to `addr`, and asks which brokers the cluster advertises.
async fn contact(
    addr: &str,
    found: Found,
    config: &ConnectionConfig,
    protocol: GroupProtocol,
) -> Result<(BrokerContact, Vec<(i32, String)>)> {
    let mut connection = Connection::connect(addr, config).await?;
    let requests = connection
        .negotiated()
        .into_iter()
        .map(|(api, purpose, version)| RequestSupport { api, version, needed: needed(purpose, protocol) })
        .collect();
    let authenticated_as = config.security().sasl().map(|c| (c.mechanism.name(), c.username.clone()));
    let security = config.security().protocol();
    let contact = BrokerContact { addr: addr.to_owned(), security, authenticated_as, requests, found };
    // A broker that lacks what listeners need is reported as it is; its
    // Metadata (which it may not speak either) is not asked for.
    if !contact.missing().is_empty() {
        return Ok((contact, Vec::new()));
    }
    let advertised = metadata::advertised(&mut connection).await?;
    Ok((contact, advertised))
}

/// Whether listeners of `protocol` cannot do without a request of `purpose`.
fn needed(purpose: Purpose, protocol: GroupProtocol) -> bool {
    match (purpose, protocol) {
        (Purpose::Always, _) => true,
        (Purpose::ClassicGroups, GroupProtocol::Classic) => true,
        (Purpose::ConsumerGroups, GroupProtocol::Consumer) => true,
        (
            Purpose::ClassicGroups
            | Purpose::ConsumerGroups
            | Purpose::IdempotentProduce
            | Purpose::TopicCreation
            | Purpose::GroupDescription,
            _,
        ) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_each_group_protocol_cannot_do_without() {
        use GroupProtocol::{Classic, Consumer};
        // (purpose, needed by classic listeners, needed by consumer-protocol listeners)
        let table = [
            (Purpose::Always, true, true),
            (Purpose::ClassicGroups, true, false),
            (Purpose::ConsumerGroups, false, true),
            (Purpose::IdempotentProduce, false, false),
            (Purpose::TopicCreation, false, false),
            (Purpose::GroupDescription, false, false),
        ];
        for (purpose, classic, consumer) in table {
            assert_eq!((needed(purpose, Classic), needed(purpose, Consumer)), (classic, consumer), "{purpose:?}");
        }
    }

    #[test]
    fn missing_lists_only_needed_requests_without_a_version() {
        let support = |api, version, needed| RequestSupport { api, version, needed };
        let contact = BrokerContact {
            addr: "b:9092".into(),
            security: SecurityProtocol::Plaintext,
            authenticated_as: None,
            found: Found::Bootstrap,
            requests: vec![
                support("Fetch", Some(10), true),
                support("ConsumerGroupHeartbeat", None, true),
                support("CreateTopics", None, false),
            ],
        };
        assert_eq!(contact.missing(), ["ConsumerGroupHeartbeat"]);
    }
}
