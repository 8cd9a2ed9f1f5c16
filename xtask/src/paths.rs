//! Where things live: the workspace, xtask's state, the cache of slow installs.

use std::path::PathBuf;

/// The workspace root.
pub(crate) fn workspace_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().expect("xtask lives in the workspace root").to_owned()
}

/// Where xtask keeps state between invocations (e.g. the running broker).
pub(crate) fn state_dir() -> PathBuf {
    workspace_root().join("target").join("xtask")
}

/// The cache of slow installs, outside the clone so fresh clones reuse it:
/// `$KAFKA_RETRY_CACHE_DIR`, else `$XDG_CACHE_HOME/kafka-retry`, else
/// `~/.cache/kafka-retry`. Entries are keyed by version (`tansu-0.6.0/`).
pub(crate) fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("KAFKA_RETRY_CACHE_DIR") {
        return dir.into();
    }
    let base = std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| "/tmp".into());
        home.join(".cache")
    });
    base.join("kafka-retry")
}

/// The cargo that runs us, so nested builds use the same toolchain.
pub(crate) fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}
