//! `stock` reserves stock for every confirmed order through an inventory's
//! HTTP API: a second service on the retry ladder, small enough to copy.
//! The handler below depends on `retry-core` alone; the service around it,
//! `examples/stock-service.rs`, runs it on Kafka with `retry-kafka`:
//!
//! ```text
//! INVENTORY_URL=http://127.0.0.1:8090 cargo run -p stock --example stock-service -- create-topics
//! INVENTORY_URL=http://127.0.0.1:8090 cargo run -p stock --example stock-service
//! ```
//!
//! Its failures are not billing's. The inventory answers 409 while stock is
//! short and 404 while it has not seen the order yet: both pass with time (a
//! delivery, the order service catching up), so both are retried, on a slow
//! ladder (`1m,10m,1h`). A 422 is an order it can never reserve: it goes to
//! the dead-letter topic at once, as does a payload that is not an order.

use std::time::Duration;

use reqwest::StatusCode;
use retry_core::{ConsumedRecord, FailureKind, HandlerError, RecordHandler};
use serde::Deserialize;

/// The part of an `OrderConfirmed` event this service reads.
#[derive(Deserialize)]
struct OrderConfirmed {
    event_id: String,
    order_id: String,
}

/// Reserves the stock of each confirmed order: `PUT <inventory>/reservations/<order_id>`,
/// which the inventory treats as idempotent (the order id names the reservation).
#[derive(Debug, Clone)]
pub struct ReserveStock {
    http: reqwest::Client,
    reservations: String,
}

impl ReserveStock {
    /// A handler for the inventory at `inventory_url`, giving up on a call after `timeout`.
    pub fn new(inventory_url: &str, timeout: Duration) -> Result<Self, String> {
        let url = reqwest::Url::parse(inventory_url).map_err(|e| format!("INVENTORY_URL {inventory_url:?}: {e}"))?;
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
        Ok(ReserveStock { http, reservations: format!("{}/reservations", url.as_str().trim_end_matches('/')) })
    }
}

/// What an answer of the inventory means: `None` is success.
pub fn classify(status: StatusCode) -> Option<FailureKind> {
    match status.as_u16() {
        200..=299 => None,
        // Short stock, an order not seen yet, a lock or a rate limit: later.
        404 | 408 | 409 | 423 | 429 | 500..=599 => Some(FailureKind::Transient),
        _ => Some(FailureKind::Permanent),
    }
}

impl RecordHandler for ReserveStock {
    async fn handle(&self, record: ConsumedRecord) -> Result<(), HandlerError> {
        let value = record.value.as_deref().unwrap_or_default();
        let order: OrderConfirmed = serde_json::from_slice(value)
            .map_err(|e| HandlerError::permanent(format!("not an OrderConfirmed event: {e}")))?;
        let safe =
            |id: &str| !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        // Both go into the request (its path, a header): refuse what could not.
        if !safe(&order.order_id) || !safe(&order.event_id) {
            return Err(HandlerError::permanent("order_id and event_id must be 1 to 64 letters, digits or dashes"));
        }
        let response = self
            .http
            .put(format!("{}/{}", self.reservations, order.order_id))
            .header("Idempotency-Key", &order.event_id)
            .json(&serde_json::json!({ "event_id": order.event_id }))
            .send()
            .await
            .map_err(|e| HandlerError::transient(format!("the inventory did not answer: {e}")))?;
        match classify(response.status()) {
            None => Ok(()),
            Some(kind) => Err(HandlerError::new(kind, format!("the inventory answered {}", response.status()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_inventory_means() {
        use FailureKind::{Permanent, Transient};
        for (status, expected) in [
            (200, None),
            (204, None),
            (404, Some(Transient)),
            (409, Some(Transient)),
            (429, Some(Transient)),
            (503, Some(Transient)),
            (301, Some(Permanent)),
            (400, Some(Permanent)),
            (422, Some(Permanent)),
        ] {
            assert_eq!(classify(StatusCode::from_u16(status).unwrap()), expected, "{status}");
        }
    }
}
