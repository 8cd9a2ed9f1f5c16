//! The Spring Kafka peer (`tests/peers/spring/`): a billing listener with
//! `@RetryableTopic`, built with Maven into one jar, once per machine and
//! version of its sources, and cached as `<cache>/spring-peer-<hash>.jar`.
//! The integration tests start it (`java -jar`) against any broker.

use std::{
    fs,
    hash::{Hash, Hasher},
    path::PathBuf,
    process::Command,
};

use anyhow::Context;

use crate::{
    paths::{cache_dir, files_with_extension, workspace_root},
    process,
};

/// The environment variable that tells the integration tests where the jar is.
pub(crate) const SPRING_PEER_ENV: &str = "KAFKA_RETRY_SPRING_PEER";

/// The peer's jar, built on first use (Maven resolves Spring Kafka from
/// Maven Central into its own repository) and whenever its sources change.
pub(crate) fn peer_jar() -> anyhow::Result<PathBuf> {
    let project = workspace_root().join("tests/peers/spring");
    let cache = cache_dir();
    let sources = sources(&project)?;
    let jar = cache.join(format!("spring-peer-{:016x}.jar", hash(&project, &sources)));
    if jar.is_file() {
        return Ok(jar);
    }
    fs::create_dir_all(&cache).with_context(|| format!("cannot create the cache {}", cache.display()))?;
    // Built in a copy, so the sources' folder gains no target/.
    let build = cache.join(format!("spring-peer.partial-{}", std::process::id()));
    let _ = fs::remove_dir_all(&build);
    for (path, text) in &sources {
        let target = build.join(path.strip_prefix(&project).unwrap_or(path));
        fs::create_dir_all(target.parent().unwrap_or(&build))?;
        fs::write(&target, text).with_context(|| format!("cannot write {}", target.display()))?;
    }
    eprintln!("building the Spring Kafka peer with Maven into {} (once per machine and version)", jar.display());
    let built = process::run(Command::new("mvn").current_dir(&build).args([
        "--batch-mode",
        "--quiet",
        "--file",
        "pom.xml",
        "-DskipTests",
        "package",
    ]));
    let result = built.context("cannot build the Spring Kafka peer (tests/peers/spring) with Maven").and_then(|()| {
        let partial = cache.join(format!("spring-peer.jar.partial-{}", std::process::id()));
        fs::copy(build.join("target/billing-spring-peer.jar"), &partial).context("Maven built no jar")?;
        fs::rename(&partial, &jar).with_context(|| format!("cannot move the jar to {}", jar.display()))
    });
    let _ = fs::remove_dir_all(&build);
    result.map(|()| jar)
}

/// The peer's pom, sources and resources, in a stable order.
fn sources(project: &std::path::Path) -> anyhow::Result<Vec<(PathBuf, String)>> {
    let mut files = Vec::new();
    for extension in ["xml", "java", "properties"] {
        files.extend(files_with_extension(&[project.to_path_buf()], &[], extension)?);
    }
    files.sort();
    Ok(files)
}

/// Its jar's cache key: SipHash with fixed keys, so the same sources give
/// the same key on every run.
fn hash(project: &std::path::Path, sources: &[(PathBuf, String)]) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    for (path, text) in sources {
        path.strip_prefix(project).unwrap_or(path).hash(&mut hasher);
        text.hash(&mut hasher);
    }
    hasher.finish()
}
