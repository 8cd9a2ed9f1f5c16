//! What the console's browser test runs on: Debian's Chromium (installed
//! by `.ci/run`, never a browser a test tool downloads) and, from npm,
//! playwright-core to drive it and axe-core to check accessibility, in the
//! cache once per machine (`<cache>/console-test-<versions>/node_modules`).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context;

use crate::{paths::cache_dir, process::run};

const PLAYWRIGHT_CORE_VERSION: &str = "1.65.1";
const AXE_CORE_VERSION: &str = "4.14.1";
const CHROMIUM: &str = "/usr/bin/chromium";

/// The environment variables that tell the integration tests where these are.
pub(crate) const NODE_MODULES_ENV: &str = "KAFKA_RETRY_NODE_MODULES";
pub(crate) const CHROMIUM_ENV: &str = "KAFKA_RETRY_CHROMIUM";

/// Chromium's path and the `node_modules` folder holding playwright-core
/// and axe-core, installed on first use.
pub(crate) fn console_tools() -> anyhow::Result<(PathBuf, PathBuf)> {
    let chromium = PathBuf::from(CHROMIUM);
    if !chromium.exists() {
        anyhow::bail!(
            "{CHROMIUM} is missing: the console's browser test needs Debian's Chromium \
             (`apt-get install chromium`; `.ci/run` installs it)"
        );
    }
    let cache = cache_dir();
    let name = format!("console-test-playwright-core-{PLAYWRIGHT_CORE_VERSION}-axe-core-{AXE_CORE_VERSION}");
    let dir = cache.join(&name);
    let modules = dir.join("node_modules");
    if installed(&modules) {
        return Ok((chromium, modules));
    }
    fs::create_dir_all(&cache).with_context(|| format!("cannot create the cache {}", cache.display()))?;
    let partial = cache.join(format!("{name}.partial-{}", std::process::id()));
    let _ = fs::remove_dir_all(&partial);
    fs::create_dir_all(&partial)?;
    eprintln!("installing playwright-core and axe-core into {} (once per machine)", dir.display());
    let outcome = run(Command::new("npm")
        .args(["install", "--no-audit", "--no-fund", "--no-save", "--ignore-scripts", "--prefix"])
        .arg(&partial)
        .arg(format!("playwright-core@{PLAYWRIGHT_CORE_VERSION}"))
        .arg(format!("axe-core@{AXE_CORE_VERSION}"))
        // playwright-core never downloads a browser; this says so twice.
        .env("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1"))
    .context(
        "cannot install playwright-core and axe-core from npm: check that node, npm and the registry are reachable",
    );
    if let Err(e) = outcome {
        let _ = fs::remove_dir_all(&partial);
        return Err(e);
    }
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&partial, &dir).with_context(|| format!("cannot move {} to {}", partial.display(), dir.display()))?;
    Ok((chromium, modules))
}

fn installed(modules: &Path) -> bool {
    modules.join("playwright-core").join("package.json").exists()
        && modules.join("axe-core").join("axe.min.js").exists()
}
