//! The import graph of `src/`, read from the sources: one node per file,
//! one edge per file a `use` or a path (`crate::…`, `super::…`, `self::…`,
//! `ferry::…` in the binary, and a bare `child::…` naming a child module)
//! names. A path is resolved to the longest
//! prefix that is a module file, so `crate::store::Store` is an edge to
//! `src/store/mod.rs` and `crate::store::clock::Now` one to
//! `src/store/clock.rs`. Inline modules (`mod tests { … }`) belong to their
//! file. Comments and string literals are blanked before reading, so a
//! path in a doc or a message is not an import; doc comments are kept
//! apart for the rule on what a module's docs may name.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path inside its crate: `["store", "clock"]`. The binary's
/// modules start with `bin` (`["bin"]` is main.rs).
pub type ModPath = Vec<String>;

pub struct File {
    pub path: PathBuf,
    pub module: ModPath,
    pub lines: usize,
    /// The source with comments and literals blanked.
    pub code: String,
    /// Its `//!` and `///` lines, as written.
    pub docs: Vec<(usize, String)>,
}

pub struct Graph {
    pub files: Vec<File>,
    /// Edges by index into `files`: from → to.
    pub edges: BTreeSet<(usize, usize)>,
}

impl Graph {
    pub fn read(src: &Path) -> Graph {
        let bin_roots = bin_modules(src);
        let mut files = Vec::new();
        walk(src, &mut |path| {
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut module: ModPath = rel
                .iter()
                .map(|c| c.to_string_lossy().into_owned())
                .collect();
            if module.last().map(String::as_str) == Some("mod") {
                module.pop();
            }
            if module == ["lib"] {
                module.clear();
            }
            if module == ["main"] {
                module = vec!["bin".into()];
            } else if module.first().is_some_and(|m| bin_roots.contains(m)) {
                module.insert(0, "bin".into());
            }
            let text = std::fs::read_to_string(path).unwrap();
            let docs = text
                .lines()
                .enumerate()
                .filter(|(_, l)| {
                    let l = l.trim_start();
                    l.starts_with("//!") || l.starts_with("///")
                })
                .map(|(i, l)| (i + 1, l.to_string()))
                .collect();
            files.push(File {
                path: path.to_path_buf(),
                module,
                lines: text.lines().count(),
                code: blank(&text),
                docs,
            });
        });
        files.sort_by(|a, b| a.module.cmp(&b.module));
        let index: BTreeMap<ModPath, usize> = files
            .iter()
            .enumerate()
            .map(|(i, f)| (f.module.clone(), i))
            .collect();
        let mut edges = BTreeSet::new();
        for (from, file) in files.iter().enumerate() {
            for (target, bare_under) in imports(file) {
                let Some(to) = resolve(&index, &target) else {
                    continue;
                };
                // A bare path (`use record::X`) names a child module, or
                // another crate's.
                if let Some(here) = bare_under {
                    let m = &files[to].module;
                    if !(m.len() > here.len() && m.starts_with(&here)) {
                        continue;
                    }
                }
                if to != from {
                    edges.insert((from, to));
                }
            }
        }
        Graph { files, edges }
    }

    pub fn name(&self, i: usize) -> String {
        display(&self.files[i].module)
    }

    /// Groups of files that import each other, directly or around a
    /// circle (Tarjan's strongly connected components of size > 1).
    pub fn circles(&self) -> Vec<Vec<usize>> {
        let n = self.files.len();
        let mut out: Vec<Vec<usize>> = vec![Vec::new(); n];
        for &(a, b) in &self.edges {
            out[a].push(b);
        }
        let mut state = Tarjan {
            out,
            index: vec![None; n],
            low: vec![0; n],
            stack: Vec::new(),
            on_stack: vec![false; n],
            next: 0,
            found: Vec::new(),
        };
        for v in 0..n {
            if state.index[v].is_none() {
                state.visit(v);
            }
        }
        state.found.into_iter().filter(|c| c.len() > 1).collect()
    }
}

pub fn display(module: &[String]) -> String {
    if module.is_empty() {
        "lib".into()
    } else {
        module.join("::")
    }
}

struct Tarjan {
    out: Vec<Vec<usize>>,
    index: Vec<Option<usize>>,
    low: Vec<usize>,
    stack: Vec<usize>,
    on_stack: Vec<bool>,
    next: usize,
    found: Vec<Vec<usize>>,
}

impl Tarjan {
    fn visit(&mut self, v: usize) {
        self.index[v] = Some(self.next);
        self.low[v] = self.next;
        self.next += 1;
        self.stack.push(v);
        self.on_stack[v] = true;
        for w in self.out[v].clone() {
            match self.index[w] {
                None => {
                    self.visit(w);
                    self.low[v] = self.low[v].min(self.low[w]);
                }
                Some(i) if self.on_stack[w] => self.low[v] = self.low[v].min(i),
                Some(_) => {}
            }
        }
        if Some(self.low[v]) == self.index[v] {
            let mut component = Vec::new();
            loop {
                let w = self.stack.pop().unwrap();
                self.on_stack[w] = false;
                component.push(w);
                if w == v {
                    break;
                }
            }
            component.sort();
            self.found.push(component);
        }
    }
}

fn walk(dir: &Path, f: &mut dyn FnMut(&Path)) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            walk(&path, f);
        } else if path.extension().is_some_and(|e| e == "rs") {
            f(&path);
        }
    }
}

/// The top-level modules main.rs declares (`mod cli;`): the binary's own.
fn bin_modules(src: &Path) -> BTreeSet<String> {
    let Ok(main) = std::fs::read_to_string(src.join("main.rs")) else {
        return BTreeSet::new();
    };
    let code = blank(&main);
    let tokens = tokenize(&code);
    let mut out = BTreeSet::new();
    for w in tokens.windows(3) {
        if w[0] == "mod" && w[2] == ";" {
            out.insert(w[1].clone());
        }
    }
    out
}

/// Blanks comments, string and char literals (keeping line breaks).
pub fn blank(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let keep_newlines = |s: &[char], out: &mut String| {
        for ch in s {
            out.push(if *ch == '\n' { '\n' } else { ' ' });
        }
    };
    while i < c.len() {
        let rest = &c[i..];
        if rest.starts_with(&['/', '/']) {
            let end = rest.iter().position(|&ch| ch == '\n').unwrap_or(rest.len());
            keep_newlines(&rest[..end], &mut out);
            i += end;
        } else if rest.starts_with(&['/', '*']) {
            let mut depth = 0;
            let mut j = 0;
            while j < rest.len() {
                if rest[j..].starts_with(&['/', '*']) {
                    depth += 1;
                    j += 2;
                } else if rest[j..].starts_with(&['*', '/']) {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            keep_newlines(&rest[..j], &mut out);
            i += j;
        } else if let Some(len) = raw_string(rest, i > 0 && is_ident(c[i - 1])) {
            keep_newlines(&rest[..len], &mut out);
            out.push(' ');
            i += len;
        } else if rest[0] == '"' {
            let mut j = 1;
            while j < rest.len() && rest[j] != '"' {
                j += if rest[j] == '\\' { 2 } else { 1 };
            }
            let j = (j + 1).min(rest.len());
            keep_newlines(&rest[..j], &mut out);
            i += j;
        } else if rest[0] == '\'' {
            // A char literal ('x', '\n', '\''), not a lifetime ('a).
            let len = if rest.get(1) == Some(&'\\') {
                rest.iter()
                    .skip(2)
                    .position(|&ch| ch == '\'')
                    .map(|p| p + 3)
            } else if rest.get(2) == Some(&'\'') {
                Some(3)
            } else {
                None
            };
            match len {
                Some(len) => {
                    keep_newlines(&rest[..len], &mut out);
                    i += len;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            out.push(rest[0]);
            i += 1;
        }
    }
    out
}

/// The length of a raw string literal (`r"…"`, `r#"…"#`, `br"…"`) at the
/// start of `s`.
fn raw_string(s: &[char], after_ident: bool) -> Option<usize> {
    if after_ident {
        return None;
    }
    let mut j = 0;
    if s.first() == Some(&'b') {
        j += 1;
    }
    if s.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let hashes = s[j..].iter().take_while(|&&ch| ch == '#').count();
    j += hashes;
    if s.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < s.len() {
        if s[j] == '"'
            && s[j + 1..]
                .iter()
                .take(hashes)
                .filter(|&&ch| ch == '#')
                .count()
                == hashes
        {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(s.len())
}

fn is_ident(ch: char) -> bool {
    ch.is_alphanumeric() || ch == '_'
}

/// Identifiers, `::`, and every other character as its own token.
fn tokenize(code: &str) -> Vec<String> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        if is_ident(c[i]) {
            let start = i;
            while i < c.len() && is_ident(c[i]) {
                i += 1;
            }
            out.push(c[start..i].iter().collect());
        } else if c[i] == ':' && c.get(i + 1) == Some(&':') {
            out.push("::".into());
            i += 2;
        } else if c[i].is_whitespace() {
            i += 1;
        } else {
            out.push(c[i].to_string());
            i += 1;
        }
    }
    out
}

/// Every module path the file names, made absolute (crate-relative; the
/// binary's start with `bin`); a bare one (`record::X`) with the module it
/// was named in, as it may be a child module's or another crate's.
fn imports(file: &File) -> Vec<(ModPath, Option<ModPath>)> {
    let tokens = tokenize(&file.code);
    let is_bin = file.module.first().map(String::as_str) == Some("bin");
    let mut out = Vec::new();
    // The inline modules open at this point: (name, brace depth inside it).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        let t = tokens[i].as_str();
        match t {
            "{" => depth += 1,
            "}" => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d > depth) {
                    inline.pop();
                }
            }
            "mod" if tokens.get(i + 2).map(String::as_str) == Some("{") => {
                inline.push((tokens[i + 1].clone(), depth + 1));
            }
            _ => {}
        }
        let here: ModPath = file
            .module
            .iter()
            .cloned()
            .chain(inline.iter().map(|(m, _)| m.clone()))
            .collect();
        let preceded_by_path = i > 0 && tokens[i - 1] == "::";
        if t == "use" {
            let end = tokens[i..]
                .iter()
                .position(|t| t == ";")
                .map_or(tokens.len(), |p| i + p);
            for path in use_tree(&tokens[i + 1..end]) {
                match absolute(&here, &path, is_bin) {
                    Some(abs) => out.push((abs, None)),
                    None if !path.is_empty() => {
                        let abs = here.iter().chain(&path).cloned().collect();
                        out.push((abs, Some(here.clone())));
                    }
                    None => {}
                }
            }
            i = end;
            continue;
        }
        if !preceded_by_path && matches!(t, "crate" | "super" | "self" | "ferry") {
            let (path, j) = path_at(&tokens, i);
            if path.len() > 1 {
                if let Some(abs) = absolute(&here, &path, is_bin) {
                    out.push((abs, None));
                }
            }
            i = j;
            continue;
        }
        // A bare path in code (`v5::publish_size(..)`): an import of a
        // child module when its first name is one (`Graph::read` keeps
        // only those).
        if !preceded_by_path
            && t.chars().all(is_ident)
            && !t.starts_with(|c: char| c.is_ascii_digit())
            && tokens.get(i + 1).map(String::as_str) == Some("::")
            && tokens.get(i + 2).is_some_and(|t| t.chars().all(is_ident))
        {
            let (path, j) = path_at(&tokens, i);
            let abs = here.iter().chain(&path).cloned().collect();
            out.push((abs, Some(here.clone())));
            i = j;
            continue;
        }
        i += 1;
    }
    out
}

/// The path that starts at `tokens[i]` (`a::b::c`), and the index just
/// past it.
fn path_at(tokens: &[String], i: usize) -> (Vec<String>, usize) {
    let mut path = vec![tokens[i].clone()];
    let mut j = i + 1;
    while tokens.get(j).map(String::as_str) == Some("::")
        && tokens.get(j + 1).is_some_and(|t| t.chars().all(is_ident))
    {
        path.push(tokens[j + 1].clone());
        j += 2;
    }
    (path, j)
}

/// Expands a use tree (`a::{b, c::{d as e}}`) into its paths.
fn use_tree(tokens: &[String]) -> Vec<Vec<String>> {
    fn walk(tokens: &[String], prefix: &[String], out: &mut Vec<Vec<String>>) {
        let mut path = prefix.to_vec();
        let mut i = 0;
        while i < tokens.len() {
            match tokens[i].as_str() {
                "::" => {}
                "{" => {
                    // Split the group at top-level commas.
                    let mut depth = 0;
                    let mut start = i + 1;
                    let mut j = i;
                    while j < tokens.len() {
                        match tokens[j].as_str() {
                            "{" => depth += 1,
                            "}" => {
                                depth -= 1;
                                if depth == 0 {
                                    walk(&tokens[start..j], &path, out);
                                    break;
                                }
                            }
                            "," if depth == 1 => {
                                walk(&tokens[start..j], &path, out);
                                start = j + 1;
                            }
                            _ => {}
                        }
                        j += 1;
                    }
                    return;
                }
                "as" => break,
                "*" => break,
                t if t.chars().all(is_ident) => path.push(t.to_string()),
                _ => {}
            }
            i += 1;
        }
        if path.len() > prefix.len() || !path.is_empty() {
            out.push(path);
        }
    }
    let mut out = Vec::new();
    // `pub use`, `pub(crate) use`: the tree starts after `use`.
    walk(tokens, &[], &mut out);
    out
}

fn absolute(here: &[String], path: &[String], is_bin: bool) -> Option<ModPath> {
    let first = path.first()?.as_str();
    let mut cur: ModPath;
    let mut rest = path;
    match first {
        "crate" => {
            cur = if is_bin {
                vec!["bin".into()]
            } else {
                Vec::new()
            };
            rest = &rest[1..];
        }
        "ferry" if is_bin => {
            cur = Vec::new();
            rest = &rest[1..];
        }
        "self" | "super" => {
            cur = here.to_vec();
            while let Some(seg) = rest.first() {
                match seg.as_str() {
                    "self" => {}
                    "super" => {
                        cur.pop();
                    }
                    _ => break,
                }
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    cur.extend(rest.iter().cloned());
    Some(cur)
}

fn resolve(index: &BTreeMap<ModPath, usize>, path: &[String]) -> Option<usize> {
    (0..=path.len())
        .rev()
        .find_map(|n| index.get(&path[..n]).copied())
}
