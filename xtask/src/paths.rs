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

/// The binary `krate` of `version`, installed with `cargo install` into
/// `<cache>/<krate>-<version>/` on first use. The install goes to a
/// `.partial` directory that is renamed only once it succeeded, so an
/// interrupted install is never mistaken for a good one.
pub(crate) fn cargo_install_cached(
    krate: &str,
    version: &str,
    extra_args: &[&str],
    how_long: &str,
) -> anyhow::Result<PathBuf> {
    use anyhow::Context;
    let cache = cache_dir();
    let dir = cache.join(format!("{krate}-{version}"));
    let bin = dir.join("bin").join(krate);
    if bin.is_file() {
        return Ok(bin);
    }
    std::fs::create_dir_all(&cache).with_context(|| format!("cannot create the cache {}", cache.display()))?;
    let partial = cache.join(format!("{krate}-{version}.partial-{}", std::process::id()));
    let target = cache.join(format!("{krate}-{version}.target"));
    eprintln!("installing {krate} {version} into {} (once per machine; {how_long})", dir.display());
    crate::process::run(
        std::process::Command::new(cargo())
            .args(["install", krate, "--version", version, "--locked"])
            .args(extra_args)
            .arg("--root")
            .arg(&partial)
            .env("CARGO_TARGET_DIR", &target)
            // Outside the workspace: a plain install, not under our toolchain file or config.
            .current_dir(&cache),
    )?;
    std::fs::rename(&partial, &dir)
        .with_context(|| format!("cannot move {} to {}", partial.display(), dir.display()))?;
    let _ = std::fs::remove_dir_all(&target);
    Ok(bin)
}
