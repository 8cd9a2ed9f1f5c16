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
    /// Reads the pause once; false when the read failed. A read that fails
    /// keeps what was read last: a pause ends by itself at its time, and an
    /// unreadable group resumes nothing early.
    pub(crate) async fn read(&self) -> bool {
        match self.record.read().await {
            Ok(pause) => {
                let now = Timestamp::from(std::time::SystemTime::now());
                self.brake.set_pause(pause.filter(|p| p.holds_at(now)));
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the operators' pause of the listener; keeping what was read last");
                false
            }
        }
    }

    /// Reads it every interval until the listener stops; a failure is
    /// reported when the reads start failing, not at every read.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let mut failing = false;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
            if failing {
                failing = self
                    .record
                    .read()
                    .await
                    .map(|pause| {
                        let now = Timestamp::from(std::time::SystemTime::now());
                        self.brake.set_pause(pause.filter(|p| p.holds_at(now)));
                    })
                    .is_err();
            } else {
                failing = !self.read().await;
            }
        }
    }
}
