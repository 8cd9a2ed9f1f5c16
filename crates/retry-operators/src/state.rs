//! What the operators' routes share: the service's token, policy and
//! dead-letter store, the replay jobs, and the limits of every answer.

use std::{
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use retry_core::RetryPolicy;
use retry_kafka::BrakeView;

use super::{auth::AuthFailures, jobs::Jobs, store::DeadLetterStore};

/// The most records one page of `/messages` returns.
pub(crate) const MAX_PAGE: usize = 100;
/// The most bytes of keys, values and headers one page of `/messages` returns.
pub(crate) const MAX_PAGE_BYTES: usize = 1 << 20;
/// The largest request body accepted.
pub(crate) const MAX_BODY_BYTES: usize = 64 * 1024;
/// The loop guard: records replayed this often are refused unless overridden.
pub(crate) const MAX_REPLAYS: u32 = 3;

/// What the routes share.
pub(crate) struct Operators<S> {
    pub(crate) token: String,
    pub(crate) policy: RetryPolicy,
    pub(crate) store: Arc<S>,
    /// Replays refuse records older than this unless overridden.
    pub(crate) idempotency_window: Option<Duration>,
    /// How long `wait=true` waits for a replay before answering 202.
    pub(crate) wait_limit: Duration,
    pub(crate) auth_failures: Mutex<AuthFailures>,
    pub(crate) jobs: Jobs,
    /// The consumer group of the ladder's source.
    pub(crate) group: String,
    /// This instance's listener's brake, once it started; never set when
    /// the instance consumes nothing (`billing-bin operators`).
    pub(crate) brake: OnceLock<BrakeView>,
}

impl<S: DeadLetterStore> Operators<S> {
    pub(crate) fn new(
        token: String,
        policy: RetryPolicy,
        store: S,
        idempotency_window: Option<Duration>,
        auth_failures: AuthFailures,
        group: String,
    ) -> Self {
        Operators {
            token,
            policy,
            store: Arc::new(store),
            idempotency_window,
            wait_limit: Duration::from_secs(20),
            auth_failures: Mutex::new(auth_failures),
            jobs: Jobs::default(),
            group,
            brake: OnceLock::new(),
        }
    }
}
