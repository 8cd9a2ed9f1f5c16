//! Every instance polls the operators' pause of its listener and hands it
//! to the brake, where records wait for it.

use std::{sync::Arc, time::Duration};

use retry_core::Timestamp;
use tokio_util::sync::CancellationToken;

use crate::{admin::pause::PauseRecord, consumer::brake::SharedBrake};

/// Reads the pause every `interval` until the listener stops.
pub(crate) struct PauseWatch {
    pub(crate) record: PauseRecord,
    pub(crate) interval: Duration,
    pub(crate) brake: Arc<SharedBrake>,
}

impl PauseWatch {
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        // A read that fails keeps what was read last: a pause ends by
        // itself at its time, and an unreadable group resumes nothing early.
        let mut failing = false;
        loop {
            match self.record.read().await {
                Ok(pause) => {
                    failing = false;
                    let now = Timestamp::from(std::time::SystemTime::now());
                    self.brake.set_pause(pause.filter(|p| p.holds_at(now)));
                }
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "cannot read the operators' pause of the listener; keeping what was read last");
                }
                Err(_) => {}
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
        }
    }
}
