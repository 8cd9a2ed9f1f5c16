//! The foreign Kafka client for interop tests: confluent-kafka (Python over
//! librdkafka) in a virtualenv in the cache. It stays out of our own crates'
//! dependencies; only the integration tests run it, through
//! `tests/interop/kafka_client.py`.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::Context;

use crate::{paths::cache_dir, process::run};

/// The confluent-kafka release the interop tests use; its venv is keyed by it.
/// Its manylinux wheels bundle librdkafka, so nothing is compiled.
pub(crate) const CONFLUENT_KAFKA_VERSION: &str = "2.16.1";

/// The environment variable that tells the integration tests which python to run.
pub(crate) const PYTHON_ENV: &str = "KAFKA_RETRY_PYTHON";

/// The python of a virtualenv with confluent-kafka installed, created in the
/// cache on first use (`<cache>/venv-confluent-kafka-<version>/`).
///
/// The venv is built under a `.partial` name and renamed only once pip
/// succeeded and the module imports, so an interrupted install is never
/// taken for a good one.
pub(crate) fn interop_python() -> anyhow::Result<PathBuf> {
    let cache = cache_dir();
    let name = format!("venv-confluent-kafka-{CONFLUENT_KAFKA_VERSION}");
    let venv = cache.join(&name);
    let python = venv_python(&venv);
    if venv.exists() {
        if imports_confluent_kafka(&python) {
            return Ok(python);
        }
        // E.g. the base python it was made from was removed or upgraded.
        eprintln!("{} cannot import confluent_kafka; recreating it", venv.display());
        fs::remove_dir_all(&venv).with_context(|| format!("cannot remove {}: delete it by hand", venv.display()))?;
    }

    fs::create_dir_all(&cache).with_context(|| format!("cannot create the cache {}", cache.display()))?;
    let partial = cache.join(format!("{name}.partial-{}", std::process::id()));
    let _ = fs::remove_dir_all(&partial);
    eprintln!("installing confluent-kafka {CONFLUENT_KAFKA_VERSION} into {} (once per machine)", venv.display());
    let installed = install(&partial);
    if let Err(e) = installed {
        let _ = fs::remove_dir_all(&partial);
        return Err(e);
    }
    if let Err(e) = fs::rename(&partial, &venv) {
        let _ = fs::remove_dir_all(&partial);
        // Another xtask may have finished the same install first.
        if imports_confluent_kafka(&python) {
            return Ok(python);
        }
        return Err(e).with_context(|| format!("cannot move {} to {}", partial.display(), venv.display()));
    }
    Ok(python)
}

/// Creates a venv at `dir` and installs confluent-kafka into it.
fn install(dir: &Path) -> anyhow::Result<()> {
    run(Command::new("python3").args(["-m", "venv"]).arg(dir)).context(
        "cannot create a virtualenv for the interop tests: they need python3 (3.8 or later) with the venv \
         module (on Debian: `apt-get install python3-venv`)",
    )?;
    let python = venv_python(dir);
    run(Command::new(&python)
        .args(["-m", "pip", "install", "--no-input", "--quiet", "--disable-pip-version-check"])
        // A wheel or nothing: building librdkafka from source would need its C toolchain.
        .args(["--only-binary", ":all:"])
        .arg(format!("confluent-kafka=={CONFLUENT_KAFKA_VERSION}")))
    .with_context(|| {
        format!(
            "cannot install confluent-kafka {CONFLUENT_KAFKA_VERSION} from PyPI: check that PyPI is reachable \
             and that a wheel exists for this python (`python3 --version`) and platform"
        )
    })?;
    match import_error(&python) {
        None => Ok(()),
        Some(error) => anyhow::bail!(
            "confluent-kafka {CONFLUENT_KAFKA_VERSION} installed but does not import; python says:\n{error}"
        ),
    }
}

fn venv_python(venv: &Path) -> PathBuf {
    venv.join("bin").join("python")
}

fn imports_confluent_kafka(python: &Path) -> bool {
    import_error(python).is_none()
}

/// Why `python` cannot import confluent_kafka, or `None` if it can.
fn import_error(python: &Path) -> Option<String> {
    let output = Command::new(python).args(["-c", "import confluent_kafka"]).stdin(Stdio::null()).output();
    match output {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(String::from_utf8_lossy(&out.stderr).trim_end().to_owned()),
        Err(e) => Some(format!("cannot run {}: {e}", python.display())),
    }
}
