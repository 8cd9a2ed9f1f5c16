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
    let jar = cache.join(format!("spring-peer-{:016x}.jar", sources_hash(&project)?));
    if jar.is_file() {
        return Ok(jar);
    }
    fs::create_dir_all(&cache).with_context(|| format!("cannot create the cache {}", cache.display()))?;
    // Built in a copy, so the sources' folder gains no target/.
    let build = cache.join(format!("spring-peer.partial-{}", std::process::id()));
    let _ = fs::remove_dir_all(&build);
    copy_dir(&project, &build)?;
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

/// A hash of the peer's pom, sources and resources: its jar's cache key.
fn sources_hash(project: &std::path::Path) -> anyhow::Result<u64> {
    let mut files = Vec::new();
    for extension in ["xml", "java", "properties"] {
        files.extend(files_with_extension(&[project.to_path_buf()], &[], extension)?);
    }
    files.sort();
    // SipHash with fixed keys: the same sources give the same key on every run.
    let mut hasher = std::hash::DefaultHasher::new();
    for (path, text) in files {
        path.strip_prefix(project).unwrap_or(&path).hash(&mut hasher);
        text.hash(&mut hasher);
    }
    Ok(hasher.finish())
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) -> anyhow::Result<()> {
    fs::create_dir_all(to).with_context(|| format!("cannot create {}", to.display()))?;
    for entry in fs::read_dir(from).with_context(|| format!("cannot read {}", from.display()))? {
        let path = entry?.path();
        let target = to.join(path.file_name().expect("a directory entry has a name"));
        if path.is_dir() {
            if !path.ends_with("target") {
                copy_dir(&path, &target)?;
            }
        } else {
            fs::copy(&path, &target).with_context(|| format!("cannot copy {}", path.display()))?;
        }
    }
    Ok(())
}
