//! The module graph of a crate, read from its source: which module files
//! import which (`use crate::…`, `use super::…`, and paths like
//! `crate::a::b::f()` in code), and the circles in it.
//!
//! A module is one file (`foo.rs` or `foo/mod.rs`); modules written inline
//! (`mod tests { … }`) belong to their file, but `super::` inside them
//! counts from where they are. A path is followed through re-exports
//! (`pub use`, `pub(crate) use`) to the file that defines the name it ends
//! on, so a crate root that gathers its public API is not a hub every
//! module imports; re-exports and `mod` declarations themselves are not
//! imports. Macros' `$crate::` and paths through names brought in by a
//! private `use` are not followed (the `use` itself is).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use anyhow::Context;

/// One module file of a crate: where it sits in the module tree and what it
/// says.
struct Module {
    file: PathBuf,
    /// Its own path in the crate, `[]` for the root.
    path: Vec<String>,
    /// Paths it imports, each absolute from the crate root.
    imports: Vec<Vec<String>>,
    /// Names it re-exports, with the absolute path each stands for.
    reexports: BTreeMap<String, Vec<String>>,
    /// Child modules declared in it, by name.
    children: BTreeSet<String>,
}

/// The modules of the crate whose root file is `root` (`lib.rs`, `main.rs`
/// or a binary's or test's own), found by following `mod` declarations.
fn read_crate(root: &Path) -> anyhow::Result<Vec<Module>> {
    let mut modules = Vec::new();
    let mut stack = vec![(root.to_path_buf(), Vec::<String>::new())];
    while let Some((file, path)) = stack.pop() {
        let text = std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
        let module = parse(&file, path, &text);
        // A file's children sit beside it (root and mod.rs) or in a folder
        // named after it.
        let dir = match file.file_name().and_then(|n| n.to_str()) {
            Some("mod.rs" | "lib.rs" | "main.rs") => file.parent().expect("a file has a folder").to_path_buf(),
            _ if module.path.is_empty() => file.parent().expect("a file has a folder").to_path_buf(),
            _ => file.with_extension(""),
        };
        for child in &module.children {
            let flat = dir.join(format!("{child}.rs"));
            let nested = dir.join(child).join("mod.rs");
            let found = [flat, nested].into_iter().find(|p| p.is_file());
            if let Some(found) = found {
                let mut child_path = module.path.clone();
                child_path.push(child.clone());
                stack.push((found, child_path));
            }
        }
        modules.push(module);
    }
    modules.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(modules)
}

/// The circles among the modules of the crate rooted at `root`: each as
/// its files in import order, the first repeated at the end. Empty when
/// there are none.
pub(crate) fn circles(root: &Path) -> anyhow::Result<Vec<Vec<PathBuf>>> {
    let modules = read_crate(root)?;
    let index: BTreeMap<&[String], usize> = modules.iter().enumerate().map(|(i, m)| (m.path.as_slice(), i)).collect();
    let mut edges: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); modules.len()];
    for (i, module) in modules.iter().enumerate() {
        for import in &module.imports {
            if let Some(target) = resolve(&modules, &index, import, 0) {
                if target != i {
                    edges[i].insert(target);
                }
            }
        }
    }
    Ok(strongly_connected(&edges)
        .into_iter()
        .filter(|group| group.len() > 1)
        .map(|group| cycle_through(&edges, &group).into_iter().map(|i| modules[i].file.clone()).collect())
        .collect())
}

/// The module file that defines what `path` names: the deepest module on
/// it, followed through the re-exports it meets.
fn resolve(modules: &[Module], index: &BTreeMap<&[String], usize>, path: &[String], depth: usize) -> Option<usize> {
    if depth > 16 {
        return None; // re-exports that go round: nothing to learn here
    }
    let mut at = *index.get(&[][..])?;
    for (n, segment) in path.iter().enumerate() {
        let here = &modules[at];
        if here.children.contains(segment) {
            let mut child = here.path.clone();
            child.push(segment.clone());
            match index.get(child.as_slice()) {
                Some(found) => {
                    at = *found;
                    continue;
                }
                None => return Some(at), // an inline module: part of this file
            }
        }
        if let Some(target) = here.reexports.get(segment) {
            let mut full = target.clone();
            full.extend(path[n + 1..].iter().cloned());
            return resolve(modules, index, &full, depth + 1);
        }
        return Some(at);
    }
    Some(at)
}

/// Tarjan's strongly connected components of the graph `edges`.
fn strongly_connected(edges: &[BTreeSet<usize>]) -> Vec<Vec<usize>> {
    struct State<'a> {
        edges: &'a [BTreeSet<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        groups: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State<'_>, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for &w in s.edges[v].iter() {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut group = Vec::new();
            loop {
                let w = s.stack.pop().expect("v is on the stack");
                s.on_stack[w] = false;
                group.push(w);
                if w == v {
                    break;
                }
            }
            group.sort_unstable();
            s.groups.push(group);
        }
    }
    let n = edges.len();
    let mut s = State {
        edges,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        groups: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.groups
}

/// One circle through the members of `group` (a strongly connected
/// component): from its first member back to it, by shortest steps.
fn cycle_through(edges: &[BTreeSet<usize>], group: &[usize]) -> Vec<usize> {
    let start = group[0];
    let inside: BTreeSet<usize> = group.iter().copied().collect();
    // Breadth first from start's successors back to start.
    let mut came_from: BTreeMap<usize, usize> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for &w in &edges[v] {
            if !inside.contains(&w) || came_from.contains_key(&w) {
                continue;
            }
            came_from.insert(w, v);
            if w == start {
                queue.clear();
                break;
            }
            queue.push_back(w);
        }
    }
    let mut cycle = vec![start];
    let mut at = came_from[&start];
    while at != start {
        cycle.push(at);
        at = came_from[&at];
    }
    cycle.push(start);
    let last = cycle.len() - 1;
    cycle[1..last].reverse();
    cycle
}

/// What `text`, the file of the module at `path`, imports, re-exports and
/// declares.
fn parse(file: &Path, path: Vec<String>, text: &str) -> Module {
    let tokens = tokenize(text);
    let mut module = Module {
        file: file.to_path_buf(),
        path,
        imports: Vec::new(),
        reexports: BTreeMap::new(),
        children: BTreeSet::new(),
    };
    // Inline modules open here: (name, brace depth inside them).
    let mut inline: Vec<(String, usize, bool)> = Vec::new();
    let mut inline_modules: BTreeSet<Vec<String>> = BTreeSet::new();
    let mut uses: Vec<Use> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        let t = tokens[i].as_str();
        match t {
            "{" => depth += 1,
            "}" => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d, _)| *d > depth) {
                    inline.pop();
                }
            }
            "mod" if is_ident(tokens.get(i + 1)) => {
                let name = tokens[i + 1].clone();
                match tokens.get(i + 2).map(String::as_str) {
                    Some(";") if inline.is_empty() => {
                        module.children.insert(name);
                    }
                    Some("{") => {
                        let mut inside = current(&module.path, &inline);
                        inside.push(name.clone());
                        inline_modules.insert(inside);
                        // A test module is a leaf nothing imports: what it
                        // imports closes no circle.
                        let test = i >= 7 && tokens[i - 7..i].join("") == "#[cfg(test)]";
                        inline.push((name, depth + 1, test));
                        depth += 1;
                        i += 3;
                        continue;
                    }
                    _ => {}
                }
            }
            "use" => {
                let public = i > 0 && (tokens[i - 1] == "pub" || tokens[i - 1] == ")");
                let end = tokens[i..].iter().position(|t| t == ";").map_or(tokens.len(), |e| i + e);
                let here = current(&module.path, &inline);
                let mut leaves = Vec::new();
                use_tree(&tokens[i + 1..end], &mut Vec::new(), &mut leaves);
                // Resolved once the file's `mod` declarations are all known.
                let in_test = inline.iter().any(|(_, _, test)| *test);
                uses.extend(leaves.into_iter().filter(|_| !in_test).map(|(segments, alias)| Use {
                    here: here.clone(),
                    segments,
                    alias,
                    reexport: public && inline.is_empty(),
                }));
                i = end;
            }
            "crate" | "super" | "self" if tokens.get(i + 1).is_some_and(|t| t == "::") => {
                // A path in code: as far as it goes.
                let preceded_by_dollar = i > 0 && tokens[i - 1] == "$";
                let mut segments = vec![t.to_owned()];
                let mut j = i + 1;
                while tokens.get(j).is_some_and(|t| t == "::") && is_ident(tokens.get(j + 1)) {
                    segments.push(tokens[j + 1].clone());
                    j += 2;
                }
                if !preceded_by_dollar && !inline.iter().any(|(_, _, test)| *test) {
                    if let Some(absolute) = absolute(&current(&module.path, &inline), &segments) {
                        module.imports.push(absolute);
                    }
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    for Use { here, segments, alias, reexport } in uses {
        // A path from a module of this file (2018 paths: `use child::X`).
        let relative = segments.first().is_some_and(|first| {
            let mut child = here.clone();
            child.push(first.clone());
            (here == module.path && module.children.contains(first)) || inline_modules.contains(&child)
        });
        let absolute = if relative {
            Some(here.iter().chain(segments.iter().filter(|s| *s != "self")).cloned().collect())
        } else {
            absolute(&here, &segments)
        };
        let Some(absolute) = absolute else { continue };
        let name = alias.or_else(|| segments.last().cloned()).unwrap_or_default();
        if reexport && name != "*" && name != "self" {
            module.reexports.insert(name, absolute);
        } else {
            module.imports.push(absolute);
        }
    }
    module
}

/// A `use` leaf, resolved once the whole file is read.
struct Use {
    /// The module it is written in.
    here: Vec<String>,
    segments: Vec<String>,
    alias: Option<String>,
    /// `pub use` at the file's top level: a re-export, not an import.
    reexport: bool,
}

/// The module path where the parser is: the file's, then its open inline modules.
fn current(file: &[String], inline: &[(String, usize, bool)]) -> Vec<String> {
    file.iter().cloned().chain(inline.iter().map(|(n, _, _)| n.clone())).collect()
}

/// `segments` (starting with `crate`, `super` or `self`) from the module
/// at `here`, as a path from the crate root; `None` for other roots (other
/// crates, the standard library).
fn absolute(here: &[String], segments: &[String]) -> Option<Vec<String>> {
    let mut path = match segments.first()?.as_str() {
        "crate" => Vec::new(),
        "self" => here.to_vec(),
        "super" => here.to_vec(),
        _ => return None,
    };
    let mut rest = segments.iter().peekable();
    if segments[0] == "crate" || segments[0] == "self" {
        rest.next();
    }
    while rest.peek().is_some_and(|s| *s == "super") {
        rest.next();
        path.pop()?;
    }
    path.extend(rest.filter(|s| *s != "self").cloned());
    Some(path)
}

/// The leaves of a use tree (`a::{b, c::d as e, f::*}`), each as its
/// segments and its alias.
fn use_tree(tokens: &[String], prefix: &mut Vec<String>, leaves: &mut Vec<(Vec<String>, Option<String>)>) {
    let mut i = 0;
    let depth_before = prefix.len();
    while i < tokens.len() {
        match tokens[i].as_str() {
            "::" => {}
            "{" => {
                let close = matching(tokens, i);
                for part in split_top(&tokens[i + 1..close]) {
                    use_tree(part, prefix, leaves);
                }
                prefix.truncate(depth_before);
                return;
            }
            "as" => {
                if let Some(last) = leaves.last_mut() {
                    last.1 = tokens.get(i + 1).cloned();
                }
                i += 1;
            }
            t => {
                prefix.push(t.to_owned());
                let next = tokens.get(i + 1).map(String::as_str);
                if next != Some("::") {
                    leaves.push((prefix.clone(), None));
                }
            }
        }
        i += 1;
    }
    prefix.truncate(depth_before);
}

/// The index of the brace closing the one at `open`.
fn matching(tokens: &[String], open: usize) -> usize {
    let mut depth = 0;
    for (i, t) in tokens.iter().enumerate().skip(open) {
        match t.as_str() {
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    tokens.len()
}

/// `tokens` split at the commas outside braces.
fn split_top(tokens: &[String]) -> Vec<&[String]> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, t) in tokens.iter().enumerate() {
        match t.as_str() {
            "{" => depth += 1,
            "}" => depth -= 1,
            "," if depth == 0 => {
                parts.push(&tokens[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&tokens[start..]);
    parts.into_iter().filter(|p| !p.is_empty()).collect()
}

fn is_ident(token: Option<&String>) -> bool {
    token.is_some_and(|t| t.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_' || c == '*'))
}

/// Rust source as identifiers, `::` and single punctuation, without
/// comments, strings and character literals (lifetimes are dropped too).
fn tokenize(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || (next == Some('#') && raw_string_at(&chars, i))) {
            // A raw string: r"…", r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            j += 1; // the opening quote
            while j < chars.len() {
                if chars[j] == '"' && (1..=hashes).all(|h| chars.get(j + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            i = j;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
        } else if c == '\'' {
            // A character literal ('a', '\n', '\u{..}') or a lifetime ('a).
            if next == Some('\\') {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            // A byte string or raw identifier prefix glued to what follows.
            let word: String = chars[start..i].iter().collect();
            if (word == "b" || word == "br") && chars.get(i).is_some_and(|c| *c == '"' || *c == '\'' || *c == '#') {
                continue; // the literal is skipped on the next turn
            }
            tokens.push(word.trim_start_matches("r#").to_owned());
        } else if c == ':' && next == Some(':') {
            tokens.push("::".to_owned());
            i += 2;
        } else if c.is_whitespace() {
            i += 1;
        } else {
            tokens.push(c.to_string());
            i += 1;
        }
    }
    tokens
}

/// Whether `r#` at `i` opens a raw string (`r#"`, `r##"`), not a raw identifier.
fn raw_string_at(chars: &[char], i: usize) -> bool {
    let mut j = i + 1;
    while chars.get(j) == Some(&'#') {
        j += 1;
    }
    chars.get(j) == Some(&'"')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A crate in a temporary folder: `files` as (path under src, text).
    fn planted(name: &str, files: &[(&str, &str)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-circles-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (path, text) in files {
            let file = dir.join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, text).unwrap();
        }
        dir
    }

    fn names(root: &Path, circles: &[Vec<PathBuf>]) -> Vec<String> {
        circles
            .iter()
            .map(|c| {
                c.iter().map(|f| f.strip_prefix(root).unwrap().display().to_string()).collect::<Vec<_>>().join(" -> ")
            })
            .collect()
    }

    #[test]
    fn a_planted_circle_is_found_and_layers_are_not() {
        let layered = [
            ("lib.rs", "mod low;\nmod high;\npub use high::Api;\npub use low::Base;\n"),
            ("low.rs", "pub struct Base;\n"),
            (
                "high/mod.rs",
                "mod part;\npub use part::Api;\nuse crate::Base; // through the root's re-export: low.rs\n",
            ),
            ("high/part.rs", "pub struct Api(crate::low::Base);\nfn f() -> super::super::Base { todo!() }\n"),
        ];
        let root = planted("layered", &layered);
        assert_eq!(names(&root, &circles(&root.join("lib.rs")).unwrap()), Vec::<String>::new());

        // The same crate with one import from the bottom back up.
        let mut planted_circle = layered.to_vec();
        planted_circle[1] = ("low.rs", "pub struct Base;\nfn up() { let _ = crate::high::part::Api; }\n");
        let root = planted("circle", &planted_circle);
        assert_eq!(names(&root, &circles(&root.join("lib.rs")).unwrap()), ["high/part.rs -> low.rs -> high/part.rs"]);
    }

    #[test]
    fn what_is_not_an_import_does_not_count() {
        let files = [
            ("lib.rs", "mod a;\nmod b;\n"),
            // Comments, strings, `$crate`, another crate's path, and an
            // inline test module reaching its parent are not edges to b.
            (
                "a.rs",
                "// crate::b::X\n/* use crate::b; */\nconst S: &str = \"crate::b::X\";\nconst R: &str = r#\"crate::b\"#;\n\
                 macro_rules! m { () => { $crate::b::X } }\nuse std::fmt;\npub struct A;\n\
                 #[cfg(test)]\nmod tests {\n    use super::A;\n}\n",
            ),
            ("b.rs", "use crate::a::A;\nuse super::{a::{self, A as Other}};\n"),
        ];
        let root = planted("not-imports", &files);
        assert_eq!(names(&root, &circles(&root.join("lib.rs")).unwrap()), Vec::<String>::new());
    }

    #[test]
    fn use_trees_name_every_leaf() {
        let tokens = tokenize("crate::{a::{b, c as d}, e::*, self}");
        let mut leaves = Vec::new();
        use_tree(&tokens, &mut Vec::new(), &mut leaves);
        let rendered: Vec<String> = leaves
            .iter()
            .map(|(p, alias)| {
                format!("{}{}", p.join("::"), alias.as_ref().map_or(String::new(), |a| format!(" as {a}")))
            })
            .collect();
        assert_eq!(rendered, ["crate::a::b", "crate::a::c as d", "crate::e::*", "crate::self"]);
    }
}
