//! `cargo xtask tidy`: the rules between crates and modules, as checks:
//! pure Rust, the layers, who names what, no module circles, examples.

use std::{path::PathBuf, process::Command};

use anyhow::{bail, Context};

use crate::paths::{cargo, workspace_root};

/// The rules between crates: pure Rust, the layers, names.
pub(crate) fn tidy() -> anyhow::Result<()> {
    tidy_dependencies()?;
    tidy_ladder_names()?;
    tidy_transport_free()?;
    tidy_layers()?;
    tidy_public_api()?;
    tidy_circles()?;
    tidy_core_examples()
}

/// No module imports one that imports it back, in any crate of the
/// workspace (its libraries, binaries, test and bench crates, xtask):
/// layers stay layers (see [`crate::circles`]).
fn tidy_circles() -> anyhow::Result<()> {
    let root = workspace_root();
    let mut crate_roots = Vec::new();
    let mut places: Vec<PathBuf> = vec![root.join("xtask"), root.join("tests")];
    for folder in ["crates", "examples"] {
        for entry in std::fs::read_dir(root.join(folder))? {
            places.push(entry?.path());
        }
    }
    for place in places {
        for file in ["src/lib.rs", "src/main.rs"] {
            crate_roots.push(place.join(file));
        }
        // Binaries and test crates of their own (`tests/it/main.rs`...).
        for entry in std::fs::read_dir(&place)? {
            crate_roots.push(entry?.path().join("main.rs"));
        }
        // Cargo examples, one file each.
        if let Ok(examples) = std::fs::read_dir(place.join("examples")) {
            for entry in examples {
                crate_roots.push(entry?.path());
            }
        }
    }
    crate_roots.retain(|f| f.is_file() && f.extension().is_some_and(|e| e == "rs"));
    crate_roots.sort();
    let mut offenders = Vec::new();
    for crate_root in &crate_roots {
        for circle in crate::circles::circles(crate_root)? {
            let files: Vec<String> =
                circle.iter().map(|f| f.strip_prefix(&root).unwrap_or(f).display().to_string()).collect();
            offenders.push(files.join(" -> "));
        }
    }
    verdict(
        offenders,
        "modules import each other in a circle (move what both need below both)",
        &format!("no module circles in {} crates", crate_roots.len()),
    )
}

/// Only `retry-kafka`'s `protocol/` names `kafka_protocol`: the layers above
/// it speak in the crate's own types, so the wire library can change under
/// one folder.
fn tidy_layers() -> anyhow::Result<()> {
    let src = workspace_root().join("crates").join("retry-kafka").join("src");
    let mut offenders = Vec::new();
    for (path, text) in rust_files(std::slice::from_ref(&src), &[src.join("protocol")])? {
        if text.contains("kafka_protocol") {
            offenders.push(path.strip_prefix(workspace_root()).unwrap_or(&path).display().to_string());
        }
    }
    verdict(
        offenders,
        "only crates/retry-kafka/src/protocol/ may name kafka_protocol; these do",
        "only retry-kafka's protocol/ names kafka_protocol",
    )
}

/// The crates whose types retry-kafka's public API must not name: a
/// service that upgrades one of them, or never heard of it, must not have to
/// care. (`bytes` is the vocabulary of retry-core's records, so it may.)
const HIDDEN_DEPENDENCIES: &[&str] =
    &["rskafka", "kafka_protocol", "prometheus_client", "tokio", "tokio_util", "rustls", "tracing"];

/// retry-kafka's public items (functions, types, fields, re-exports) name
/// no type of [`HIDDEN_DEPENDENCIES`], except test hooks behind a feature.
fn tidy_public_api() -> anyhow::Result<()> {
    let src = workspace_root().join("crates").join("retry-kafka").join("src");
    let mut offenders = Vec::new();
    for (path, text) in rust_files(std::slice::from_ref(&src), &[])? {
        for (line, signature) in public_signatures(&text) {
            if let Some(dependency) = HIDDEN_DEPENDENCIES.iter().find(|d| signature.contains(&format!("{d}::"))) {
                let shown = path.strip_prefix(workspace_root()).unwrap_or(&path).display().to_string();
                offenders.push(format!("{shown}:{line}: names {dependency}: {signature}"));
            }
        }
    }
    verdict(
        offenders,
        "retry-kafka's public API names a dependency's type (wrap it, or put a test hook behind a feature)",
        "retry-kafka's public API names no dependency's type",
    )
}

/// Each public item's signature in `text` (from `pub` to the `{`, `;` or,
/// for a field, `,` that ends it), with its line; items behind a
/// `#[cfg(feature = ...)]` test hook are left out.
fn public_signatures(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    for (n, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        if !trimmed.starts_with("pub ") || trimmed.starts_with("pub mod ") {
            continue;
        }
        let hook = lines[n.saturating_sub(3)..n].iter().any(|l| l.contains("#[cfg(feature = "));
        if hook {
            continue;
        }
        // A function's parameters end their lines with commas; a field ends with one.
        let function = trimmed.split('(').next().is_some_and(|head| head.split_whitespace().any(|w| w == "fn"));
        let mut signature = String::new();
        for more in &lines[n..] {
            signature.push_str(more.trim());
            signature.push(' ');
            let end = more.trim_end();
            if more.contains('{') || end.ends_with(';') || (!function && end.ends_with(',')) {
                break;
            }
        }
        let end = signature.find(['{', ';']).unwrap_or(signature.len());
        found.push((n + 1, signature[..end].trim().to_owned()));
    }
    found
}

/// What retry-core may depend on: a buffer type, an error derive, and what
/// the derive is built with. Anything else (a runtime, a clock, a client)
/// would break its promise of no I/O.
const CORE_DEPENDENCIES: &[&str] =
    &["retry-core", "bytes", "thiserror", "thiserror-impl", "proc-macro2", "quote", "syn", "unicode-ident"];

/// Crates whose code is a service's domain: they implement retry-core's
/// handler contract and must build without the Kafka transport.
const TRANSPORT_FREE_CRATES: &[&str] = &["billing", "stock"];

/// What a transport-free crate must not pull in: the Kafka transport and
/// what only the transport needs.
const TRANSPORT_CRATES: &[&str] =
    &["retry-kafka", "rskafka", "kafka-protocol", "prometheus-client", "rsasl", "lz4_flex", "ruzstd"];

/// tokio features an HTTP client never needs; a domain crate that has them
/// brought a runtime of its own.
const RUNTIME_FEATURES: &[&str] = &["rt-multi-thread", "macros", "signal", "process"];

/// The crates of `krate`'s normal and build dependency graph, as
/// `name version` lines, each once.
fn dependency_graph(krate: &str) -> anyhow::Result<Vec<String>> {
    let out = Command::new(cargo())
        .current_dir(workspace_root())
        .args(["tree", "--edges", "normal,build", "--prefix", "none", "--format", "{p}", "--package", krate])
        .output()
        .context("cannot run cargo tree")?;
    if !out.status.success() {
        bail!("cargo tree -p {krate} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let mut lines: Vec<String> = String::from_utf8(out.stdout)?.lines().map(str::to_owned).collect();
    lines.sort();
    lines.dedup();
    Ok(lines)
}

/// The same, by crate name.
fn dependency_names(krate: &str) -> anyhow::Result<Vec<String>> {
    let graph = dependency_graph(krate)?;
    let mut names: Vec<String> = graph.iter().filter_map(|l| l.split_whitespace().next()).map(str::to_owned).collect();
    names.dedup();
    Ok(names)
}

/// retry-core depends on nothing that could do I/O; the domain crates on
/// retry-core, never on the transport, and on no runtime of their own.
fn tidy_transport_free() -> anyhow::Result<()> {
    let mut offenders = Vec::new();
    for name in dependency_names("retry-core")? {
        if !CORE_DEPENDENCIES.contains(&name.as_str()) {
            offenders.push(format!("retry-core depends on {name}, which it must not (it does no I/O)"));
        }
    }
    for krate in TRANSPORT_FREE_CRATES {
        for name in dependency_names(krate)? {
            if TRANSPORT_CRATES.contains(&name.as_str()) {
                offenders.push(format!("{krate} depends on {name}: a domain crate needs retry-core only"));
            }
        }
        let features = Command::new(cargo())
            .current_dir(workspace_root())
            .args(["tree", "--edges", "features,normal", "--prefix", "none", "--package", krate, "--invert", "tokio"])
            .output()
            .context("cannot run cargo tree")?;
        // A crate without tokio in its graph at all has nothing to check.
        for line in String::from_utf8_lossy(&features.stdout).lines() {
            for feature in RUNTIME_FEATURES {
                if line.contains(&format!("tokio feature \"{feature}\"")) {
                    offenders.push(format!(
                        "{krate} enables tokio's {feature}: a domain crate runs on its service's runtime"
                    ));
                }
            }
        }
    }
    let fine =
        format!("retry-core does no I/O; {} build without the Kafka transport", TRANSPORT_FREE_CRATES.join(", "));
    verdict(offenders, "dependencies across the layers", &fine)
}

/// Every public type, trait, function and module of retry-core shows
/// itself in an example that compiles and runs (a doc test): a reuser's
/// first reading is these pages.
fn tidy_core_examples() -> anyhow::Result<()> {
    let src = workspace_root().join("crates").join("retry-core").join("src");
    let mut offenders = Vec::new();
    for (path, text) in rust_files(&[src], &[])? {
        if path.file_stem().is_some_and(|s| s == "tests") {
            continue;
        }
        let lines: Vec<&str> = text.lines().take_while(|l| !l.starts_with("#[cfg(test)]")).collect();
        for (n, line) in lines.iter().enumerate() {
            // A public module of its own file: its items have examples, and
            // its file says what it is.
            if let Some(name) = line.strip_prefix("pub mod ").and_then(|l| l.strip_suffix(';')) {
                let dir = path.parent().expect("a file has a folder");
                let file =
                    [dir.join(format!("{name}.rs")), dir.join(name).join("mod.rs")].into_iter().find(|f| f.is_file());
                let described =
                    file.and_then(|f| std::fs::read_to_string(f).ok()).is_some_and(|t| t.starts_with("//! "));
                if !described {
                    let shown = path.strip_prefix(workspace_root()).unwrap_or(&path).display().to_string();
                    offenders.push(format!("{shown}:{}: {line} (its file starts with no //! description)", n + 1));
                }
                continue;
            }
            let item = ["pub struct ", "pub enum ", "pub trait ", "pub type ", "pub fn ", "pub mod ", "pub const fn "];
            if !item.iter().any(|i| line.starts_with(i)) {
                continue;
            }
            let doc = lines[..n]
                .iter()
                .rev()
                .take_while(|l| l.starts_with("///") || l.starts_with("#["))
                .any(|l| l.starts_with("/// ```"));
            if !doc {
                let shown = path.strip_prefix(workspace_root()).unwrap_or(&path).display().to_string();
                offenders.push(format!("{shown}:{}: {}", n + 1, line.trim_end_matches(" {")));
            }
        }
    }
    verdict(
        offenders,
        "retry-core items without an example in their documentation",
        "every public item of retry-core has an example",
    )
}

/// Ladder names are retry-core's: no other code formats one, so a change
/// of naming rule cannot leave a stale copy behind.
fn tidy_ladder_names() -> anyhow::Result<()> {
    let root = workspace_root();
    let mut offenders = Vec::new();
    let roots: Vec<_> =
        ["crates", "examples", "tests", "xtask"].iter().map(|d| root.join(d)).filter(|d| d.is_dir()).collect();
    for (path, text) in rust_files(&roots, &[root.join("crates").join("retry-core")])? {
        for (n, line) in text.lines().enumerate() {
            let formats = line.contains("format!(") || line.contains("write!(") || line.contains("push_str(");
            let names = [".retry-{", "}.retry-", "}.dlq\"", ".dlq-operators", ".replay-lock"];
            if formats && names.iter().any(|name| line.contains(name)) {
                let shown = path.strip_prefix(&root).unwrap_or(&path).display().to_string();
                offenders.push(format!("{shown}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    verdict(
        offenders,
        "ladder and group names are retry-core's (RetryTopology, LadderGroups); these lines format one",
        "only retry-core formats ladder and group names",
    )
}

/// Every `.rs` file below `roots` with its text, except below `skip` and
/// `target` folders.
fn rust_files(roots: &[PathBuf], skip: &[PathBuf]) -> anyhow::Result<Vec<(PathBuf, String)>> {
    crate::paths::files_with_extension(roots, skip, "rs")
}

/// Crates that must stay pure Rust: no C Kafka client, no OpenSSL, no `-sys`
/// crate (C libraries make builds slow and deployments fragile).
const PURE_RUST_CRATES: &[&str] = &["retry-core", "retry-kafka"];

/// `-sys` crates that bind no C library, so they are fine.
const PURE_SYS_CRATES: &[&str] = &["linux-raw-sys"];

fn tidy_dependencies() -> anyhow::Result<()> {
    let mut offenders = Vec::new();
    for krate in PURE_RUST_CRATES {
        for line in dependency_graph(krate)? {
            let name = line.split_whitespace().next().unwrap_or_default();
            let banned = (name.ends_with("-sys") && !PURE_SYS_CRATES.contains(&name))
                || name.contains("rdkafka")
                || name.contains("openssl");
            if banned {
                offenders.push(format!("{krate} depends on {line}"));
            }
        }
    }
    verdict(
        offenders,
        "dependencies that are not pure Rust",
        &format!("{} stay pure Rust", PURE_RUST_CRATES.join(", ")),
    )
}

/// Fails with `problem` and every offender (sorted, each once), or says
/// the rule holds.
fn verdict(mut offenders: Vec<String>, problem: &str, fine: &str) -> anyhow::Result<()> {
    if !offenders.is_empty() {
        offenders.sort();
        offenders.dedup();
        bail!("{problem}:\n  {}", offenders.join("\n  "));
    }
    eprintln!("tidy: {fine}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_signatures_are_read_whole_and_test_hooks_left_out() {
        let text = "pub struct A {\n    pub client: rskafka::Client,\n    inner: u8,\n}\n\
                    pub fn f(\n    x: u8,\n) -> tokio::task::JoinHandle<()> {\n}\n\
                    pub(crate) fn g() -> rustls::Config {}\n\
                    #[cfg(feature = \"test-hooks\")]\npub fn hook(b: rskafka::Builder) {}\n";
        let named: Vec<String> = public_signatures(text).into_iter().map(|(_, s)| s).collect();
        assert_eq!(
            named,
            ["pub struct A", "pub client: rskafka::Client,", "pub fn f( x: u8, ) -> tokio::task::JoinHandle<()>"]
        );
    }
}
