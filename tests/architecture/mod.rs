//! The floor plan, enforced: `src/lib.rs`'s "Layout" names the floors
//! bottom up, and these tests read the imports of every file under `src/`
//! ([`graph`]) and fail on what must never be (../shared/notes/LAYOUT.md):
//! an import that runs up a floor, a circle, a counter kept outside
//! `metrics`, an exit code outside the binary's `Exit`, a file over 500
//! lines, a module's docs naming a module above it.
//!
//! `FERRY_ARCH_SRC=<dir>` reads another tree (and `FERRY_ARCH_LAYOUT=<lib.rs>`
//! another floor plan), so an older tree can be measured against today's
//! plan; `-- --nocapture` prints the figures.

mod graph;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use graph::{display, Graph};

/// The floor of the binary (main.rs and its modules): above everything.
const BIN: usize = 100;
/// The floor of lib.rs itself: above every module it declares.
const LIB: usize = 99;

fn src_dir() -> PathBuf {
    std::env::var_os("FERRY_ARCH_SRC")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src"))
}

fn layout_file() -> PathBuf {
    std::env::var_os("FERRY_ARCH_LAYOUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| src_dir().join("lib.rs"))
}

struct Plan {
    graph: Graph,
    /// Top-level library module → its floor, as lib.rs places it.
    floors: BTreeMap<String, usize>,
    /// What went wrong reading the plan itself.
    problems: Vec<String>,
}

impl Plan {
    fn read() -> Plan {
        let graph = Graph::read(&src_dir());
        let layout = std::fs::read_to_string(layout_file()).expect("lib.rs");
        let tops: BTreeSet<String> = graph
            .files
            .iter()
            .filter(|f| f.module.len() == 1 && f.module[0] != "bin")
            .map(|f| f.module[0].clone())
            .collect();
        let (floors, problems) = floors_of(&layout, &tops);
        Plan {
            graph,
            floors,
            problems,
        }
    }

    fn floor(&self, i: usize) -> usize {
        let module = &self.graph.files[i].module;
        match module.first().map(String::as_str) {
            None => LIB,
            Some("bin") => BIN,
            Some(top) => *self.floors.get(top).unwrap_or(&0),
        }
    }

    fn top(&self, i: usize) -> String {
        match self.graph.files[i].module.first() {
            None => "lib".into(),
            Some(m) if m == "bin" => "bin".into(),
            Some(m) => m.clone(),
        }
    }

    /// Edges between two top-level modules.
    fn crossings(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.graph
            .edges
            .iter()
            .copied()
            .filter(|&(a, b)| self.top(a) != self.top(b))
    }

    fn file(&self, i: usize) -> String {
        let src = src_dir();
        let path = &self.graph.files[i].path;
        format!("src/{}", path.strip_prefix(&src).unwrap_or(path).display())
    }
}

/// Reads the numbered floors of lib.rs's "# Layout" section: a module is
/// placed on the floor whose item names it first (`` [`store`] ``,
/// `` [`mqtt::endpoints`] ``, `` `log_events` ``).
fn floors_of(layout: &str, tops: &BTreeSet<String>) -> (BTreeMap<String, usize>, Vec<String>) {
    let mut floors = BTreeMap::new();
    let mut problems = Vec::new();
    let mut floor = None;
    let mut last = 0;
    let mut in_layout = false;
    for line in layout.lines() {
        let Some(text) = line.trim_start().strip_prefix("//!") else {
            continue;
        };
        let text = text.trim();
        if text.starts_with('#') {
            in_layout = text.trim_start_matches('#').trim() == "Layout";
            floor = None;
            continue;
        }
        if !in_layout {
            continue;
        }
        if let Some((n, _)) = text.split_once(". ") {
            if let Ok(n) = n.parse::<usize>() {
                if n != last + 1 {
                    problems.push(format!("lib.rs: floor {n} follows floor {last}"));
                }
                last = n;
                floor = Some(n);
            }
        }
        let Some(floor) = floor else { continue };
        // Linked ([`store`]) or, for a module rustdoc cannot link (a
        // tests-only one), quoted (`log_events`).
        for (i, quoted) in text.split('`').enumerate() {
            if i % 2 == 0 {
                continue;
            }
            let name = quoted.trim_start_matches("crate::");
            let top = name.split("::").next().unwrap_or(name);
            if tops.contains(top) {
                floors.entry(top.to_string()).or_insert(floor);
            }
        }
    }
    for top in tops {
        if !floors.contains_key(top) {
            problems.push(format!(
                "src/lib.rs's Layout places `{top}` on no floor: link it as [`{top}`] in the numbered item of its floor"
            ));
        }
    }
    (floors, problems)
}

/// The rules of LAYOUT.md's "never" list an import can break, each with
/// the message a failure prints. The first that matches names the failure.
fn rule_broken(from: &str, to: &str) -> Option<&'static str> {
    let pipeline = |m: &str| m == "uplink" || m == "downlink";
    match (from, to) {
        ("config", _) => Some("config/ is a leaf: it imports no pipeline, south, north, alerts or store"),
        ("protocol", _) => Some("protocol/ imports only floor 1"),
        ("metrics", _) => Some("metrics imports no component (components call metrics, never the reverse)"),
        ("store", t) if pipeline(t) => Some("store/ imports no uplink/ or downlink/ file (the records it persists live in store/)"),
        (f, t) if pipeline(f) && pipeline(t) => Some("uplink/ and downlink/ never import each other: they meet as channels wired in gateway.rs"),
        _ => None,
    }
}

#[test]
fn lib_rs_places_every_module_on_a_floor() {
    let plan = Plan::read();
    assert!(plan.problems.is_empty(), "{}", plan.problems.join("\n"));
}

#[test]
fn imports_run_downward() {
    let plan = Plan::read();
    let mut wrong = Vec::new();
    let mut up = 0;
    for (a, b) in plan.crossings() {
        let (fa, fb) = (plan.floor(a), plan.floor(b));
        // Floor 1's plain types may use each other (never in a circle:
        // see the next test); every other import goes to a lower floor.
        let fine = fb < fa || (fa == 1 && fb == 1);
        if fb > fa {
            up += 1;
        }
        if !fine {
            let rule = rule_broken(&plan.top(a), &plan.top(b))
                .unwrap_or("a module imports only from floors below its own");
            wrong.push(format!(
                "{} (floor {fa}) imports {} (floor {fb}): {rule}",
                plan.file(a),
                plan.file(b)
            ));
        }
    }
    println!(
        "{} files, {} imports between files, {} between top-level modules, {up} running up a floor",
        plan.graph.files.len(),
        plan.graph.edges.len(),
        plan.crossings().count()
    );
    assert!(
        wrong.is_empty(),
        "{} imports break the floor plan:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn no_file_imports_itself_around_a_circle() {
    let plan = Plan::read();
    let circles = plan.graph.circles();
    let described: Vec<String> = circles
        .iter()
        .map(|c| {
            let names: Vec<String> = c.iter().map(|&i| plan.graph.name(i)).collect();
            format!("{} files: {}", c.len(), names.join(", "))
        })
        .collect();
    println!(
        "circles: {}",
        if described.is_empty() {
            "none".into()
        } else {
            described.join("; ")
        }
    );
    assert!(
        circles.is_empty(),
        "import circles (each file reaches itself):\n{}",
        described.join("\n")
    );
}

#[test]
fn only_admin_and_the_cli_import_ops_and_only_the_top_imports_gateway_admin_cli() {
    let plan = Plan::read();
    let mut wrong = Vec::new();
    for (a, b) in plan.crossings() {
        let (from, to) = (plan.top(a), plan.top(b));
        let allowed: &[&str] = match to.as_str() {
            "ops" => &["admin", "bin"],
            "admin" => &["gateway", "lib", "bin"],
            "gateway" => &["lib", "bin"],
            _ => continue,
        };
        if !allowed.contains(&from.as_str()) {
            wrong.push(format!(
                "{} imports {}: only {allowed:?} may",
                plan.file(a),
                plan.file(b)
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The device door (`south::door`) judges what devices send for both
/// pipelines; they read what it hands on through channels, so only the
/// wiring (and the door itself) may name it.
#[test]
fn only_the_wiring_enters_the_device_door() {
    let plan = Plan::read();
    let door = ["south", "door"];
    let wrong: Vec<String> = plan
        .graph
        .edges
        .iter()
        .filter(|&&(a, b)| {
            let (from, to) = (&plan.graph.files[a].module, &plan.graph.files[b].module);
            to.starts_with(&door.map(String::from))
                && !from.starts_with(&door.map(String::from))
                && !matches!(from.first().map(String::as_str), Some("gateway" | "bin"))
        })
        .map(|&(a, b)| format!("{} imports {}", plan.file(a), plan.file(b)))
        .collect();
    assert!(
        wrong.is_empty(),
        "only gateway.rs enters the device door (the pipelines read what it hands on):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn counters_live_only_in_metrics() {
    let plan = Plan::read();
    let mut wrong = Vec::new();
    for (i, f) in plan.graph.files.iter().enumerate() {
        if f.module.first().map(String::as_str) == Some("metrics") {
            continue;
        }
        for (n, l) in f.code.lines().enumerate() {
            let l = l.trim_start();
            if l.starts_with("pub") && l.contains(" static ") && l.contains("Atomic") {
                wrong.push(format!("{}:{}: {}", plan.file(i), n + 1, l.trim()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "a `pub static` atomic outside metrics (a counter belongs in the registry, bumped through metrics):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn exit_codes_are_written_only_by_the_binarys_exit_type() {
    let plan = Plan::read();
    // main.rs returns (as an `ExitCode`) what the Exit type decides.
    let exit_type = |m: &[String]| m == ["bin", "cli", "exit"];
    let main = |m: &[String]| m == ["bin"];
    let mut wrong = Vec::new();
    for (i, f) in plan.graph.files.iter().enumerate() {
        if exit_type(&f.module) {
            continue;
        }
        for (n, line) in f.code.lines().enumerate() {
            let code = line.contains("ExitCode::")
                || line.contains("process::exit")
                || (!main(&f.module) && line.contains("ExitCode"));
            if code {
                wrong.push(format!("{}:{}: {}", plan.file(i), n + 1, line.trim()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "exit codes outside src/cli/exit.rs (the one Exit type decides them; the library returns typed errors):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_file_under_src_is_over_500_lines() {
    let plan = Plan::read();
    let mut sizes: Vec<usize> = plan.graph.files.iter().map(|f| f.lines).collect();
    sizes.sort();
    println!(
        "file sizes: median {} lines, max {}",
        sizes[sizes.len() / 2],
        sizes.last().unwrap()
    );
    let wrong: Vec<String> = plan
        .graph
        .files
        .iter()
        .enumerate()
        .filter(|(_, f)| f.lines > 500)
        .map(|(i, f)| format!("{}: {} lines", plan.file(i), f.lines))
        .collect();
    assert!(
        wrong.is_empty(),
        "files over 500 lines (split by concern):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn a_modules_docs_name_no_module_above_it() {
    let plan = Plan::read();
    let children: BTreeSet<Vec<String>> =
        plan.graph.files.iter().map(|f| f.module.clone()).collect();
    let mut wrong = Vec::new();
    for (i, f) in plan.graph.files.iter().enumerate() {
        let floor = plan.floor(i);
        if floor >= LIB {
            continue;
        }
        for (n, line) in &f.docs {
            for named in doc_links(line) {
                let Some(&above) = plan.floors.get(&named) else {
                    continue;
                };
                // A link to its own child module ([`north`] in protocol).
                let child: Vec<String> = f.module.iter().cloned().chain([named.clone()]).collect();
                if !line.contains(&format!("crate::{named}")) && children.contains(&child) {
                    continue;
                }
                if above > floor && named != plan.top(i) {
                    wrong.push(format!(
                        "{}:{n}: names `{named}` (floor {above}) from floor {floor}",
                        plan.file(i)
                    ));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "a lower module's docs name its consumers (say what it offers, not who uses it):\n{}",
        wrong.join("\n")
    );
}

/// The top-level modules a doc line links (`` [`crate::store`] ``,
/// `` [`uplink::record`] ``) or paths (`crate::uplink`).
fn doc_links(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(start) = rest.find("[`") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("`]") else { break };
        let name = after[..end].trim_start_matches("crate::");
        if after[..end].starts_with("crate::") || name.contains("::") || !name.contains(['(', ' '])
        {
            out.push(name.split("::").next().unwrap_or(name).to_string());
        }
        rest = &after[end..];
    }
    let mut rest = line;
    while let Some(start) = rest.find("crate::") {
        let after = &rest[start + 7..];
        let name: String = after
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        out.push(name);
        rest = after;
    }
    out.sort();
    out.dedup();
    out
}

#[test]
fn the_graph_reader_sees_uses_paths_and_inline_modules() {
    let code = graph::blank(
        "use crate::a::{b, c::{d as e}};\n// crate::ignored\nfn f() { let s = \"crate::no\"; super::z::w(); }\nmod tests { use super::*; }\n",
    );
    assert!(!code.contains("ignored") && !code.contains("crate::no"));
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("a/c")).unwrap();
    std::fs::write(dir.path().join("lib.rs"), "pub mod a; pub mod z;").unwrap();
    // A bare path naming a child module is an import of it; one naming
    // anything else (a type, another crate) is not.
    std::fs::write(
        dir.path().join("a/mod.rs"),
        "pub mod b; pub mod c;\nfn f() { c::g(); Vec::<u8>::new(); std::mem::drop(1); }",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("a/b.rs"),
        "use crate::a::{c::d, b};\nmod tests { use super::*; use crate::z; }",
    )
    .unwrap();
    std::fs::write(dir.path().join("a/c.rs"), "fn f() { super::b::g(); }").unwrap();
    std::fs::write(dir.path().join("z.rs"), "").unwrap();
    let g = Graph::read(dir.path());
    let edges: BTreeSet<(String, String)> = g
        .edges
        .iter()
        .map(|&(a, b)| (g.name(a), g.name(b)))
        .collect();
    let want: BTreeSet<(String, String)> = [
        ("a", "a::c"),
        ("a::b", "a::c"),
        ("a::b", "z"),
        ("a::c", "a::b"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(edges, want);
    assert_eq!(g.circles().len(), 1);
    let names: Vec<String> = g.circles()[0]
        .iter()
        .map(|&i| display(&g.files[i].module))
        .collect();
    assert_eq!(names, ["a::b", "a::c"]);
}

/// The fork's patch count, as vendor/README.md and Cargo.toml state it, is
/// the number of patches vendor/README.md lists (`N. **title**` items).
#[test]
fn the_fork_s_patch_count_is_the_number_of_patches_listed() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("vendor/README.md")).expect("vendor/README.md");
    let listed = readme
        .lines()
        .filter(|l| {
            l.split_once(". **")
                .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .count();
    let stated = |text: &str, what: &str| -> usize {
        let at = text
            .find(" patches (")
            .unwrap_or_else(|| panic!("{what} states no patch count"));
        text[..at]
            .rsplit(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{what}: no number before \" patches (\""))
    };
    let cargo = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    assert_eq!(
        stated(&readme, "vendor/README.md"),
        listed,
        "vendor/README.md's count"
    );
    assert_eq!(stated(&cargo, "Cargo.toml"), listed, "Cargo.toml's count");
}

/// Every module `src/lib.rs` declares is named in the README's Layout
/// section (as `src/NAME.rs` or `src/NAME/`), so the two do not drift.
#[test]
fn the_readme_layout_names_every_module_of_the_library() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).expect("src/lib.rs");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let start = readme.find("## Layout\n").expect("a Layout section");
    let layout = &readme[start..];
    let layout = &layout[..layout[3..].find("\n## ").map_or(layout.len(), |e| e + 3)];
    let missing: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod ").and_then(|m| m.strip_suffix(';')))
        .filter(|m| {
            !layout.contains(&format!("`src/{m}.rs`")) && !layout.contains(&format!("`src/{m}/`"))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "README.md's Layout does not name: {missing:?}"
    );
}
