//! The layer test: reads the layer table of ARCHITECTURE.md and the `use`
//! lines and `crate::` paths of `framework/src`, and fails on every import
//! of a room (top-level module) that the importing room's row does not
//! allow, and on every circle of files that no written exception covers.
//!
//! It owns a small lexer (comments, doc comments and literals are blanked
//! before anything is read), a use-tree parser and a file-level import
//! graph with a strongly-connected-components pass, as rust-analyzer's
//! tidy tests do. It never compiles or runs the framework, and it never
//! resolves names beyond module files and their `use` re-exports: an
//! import names the file that defines or re-exports what it names.
//! Rustdoc links live in comments and are not imports.
//!
//! The exception lists may only shrink: an exception that no import or
//! circle needs any more fails the test, so the lists stay honest.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Imports across rooms that break the table today, as (importing file,
/// imported room, reason). Empty when the table holds.
const LAYER_EXCEPTIONS: &[(&str, &str, &str)] = &[];

/// Circles of files known today, as (name, reason, files). Each circle
/// found must lie inside one entry's files, and each listed file must
/// still be on a circle.
const CIRCLE_EXCEPTIONS: &[(&str, &str, &[&str])] = &[
    (
        "kafka sink",
        "the transactional sink's files share its state machine both ways.",
        &[
            "connectors/kafka/marker.rs",
            "connectors/kafka/recover.rs",
            "connectors/kafka/registry.rs",
            "connectors/kafka/sink.rs",
            "connectors/kafka/txn.rs",
            "connectors/kafka/unblock.rs",
        ],
    ),
    (
        "job core",
        "operators, their snapshots, the shell and inspect share types defined in each other.",
        &[
            "job/incremental.rs",
            "job/inspect/mod.rs",
            "job/operator.rs",
            "job/ops.rs",
            "job/route.rs",
            "job/shell/env.rs",
            "job/shell/event.rs",
            "job/shell/part.rs",
            "job/shell/pending.rs",
            "job/shell/snapshot.rs",
            "job/snapshots/mod.rs",
        ],
    ),
    (
        "job recovery",
        "the physical plan, the writer and recovery hand each other their hooks.",
        &[
            "job/physical.rs",
            "job/recovery.rs",
            "job/restore_check.rs",
            "job/writer.rs",
        ],
    ),
    (
        "stream builder",
        "the typed and keyed streams and the builder name each other.",
        &[
            "job/stream/builder.rs",
            "job/stream/keyed.rs",
            "job/stream/typed.rs",
        ],
    ),
    (
        "keyed backends",
        "the flat backend encodes slices with the copy-on-write tables' encoder, and those name the flat backend's types back (`SLICES_PER_KEY_GROUP`, `KeyGroupPart` and `EncodedSlices` have moved out).",
        &[
            "keyed/backend.rs",
            "keyed/cow.rs",
            "keyed/cow_state.rs",
        ],
    ),
    (
        "spilling backend",
        "the spilling state, its snapshot and restore files and the adaptive store import each other's types.",
        &[
            "keyed/spill/restore.rs",
            "keyed/spill/snapshot.rs",
            "keyed/spill/state.rs",
            "keyed/store.rs",
        ],
    ),
    (
        "storage engine",
        "the engine, its I/O and the in-memory store import each other's types.",
        &["storage/engine.rs", "storage/io.rs", "storage/memory.rs"],
    ),
];

#[test]
fn no_room_imports_a_room_its_row_does_not_allow() {
    let crate_src = Crate::read();
    let table = layer_table();
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    for (from, imports) in &crate_src.imports {
        let Some(room) = room_of(from) else { continue };
        let Some(allowed) = table.get(room) else {
            problems.push(format!(
                "{from}: room `{room}` has no row in the layer table"
            ));
            continue;
        };
        for import in imports {
            let Some(target) = crate_src.named_room(&import.path) else {
                continue;
            };
            if target == room || allowed.contains(&target) {
                continue;
            }
            if let Some(index) = LAYER_EXCEPTIONS
                .iter()
                .position(|(file, to, _)| *file == from && *to == target)
            {
                used.insert(index);
                continue;
            }
            problems.push(format!(
                "{from}:{}: `{room}` imports `{}`, and its row allows only {allowed:?}",
                import.line,
                import.path.join("::"),
            ));
        }
    }
    for (index, (file, to, _)) in LAYER_EXCEPTIONS.iter().enumerate() {
        if !used.contains(&index) {
            problems.push(format!(
                "the exception ({file} imports `{to}`) is no longer needed: remove it"
            ));
        }
    }
    check(problems);
}

#[test]
fn no_circle_of_files_outside_the_written_exceptions() {
    let crate_src = Crate::read();
    let mut edges: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for (from, imports) in &crate_src.imports {
        let targets = edges.entry(from.as_str()).or_default();
        for import in imports {
            if let Some(target) = crate_src.resolve(&import.path, 0) {
                // A module file re-exporting its own children is how a
                // room shows its face, not a dependency of its code.
                let below = module_of(&target).starts_with(&module_of(from));
                if target != *from && !below {
                    targets.insert(target);
                }
            }
        }
    }
    let circles = strongly_connected(&edges);
    let mut problems = Vec::new();
    let on_circles: BTreeSet<&String> = circles.iter().flatten().collect();
    for circle in &circles {
        let covered = CIRCLE_EXCEPTIONS
            .iter()
            .any(|(_, _, files)| circle.iter().all(|file| files.contains(&file.as_str())));
        if !covered {
            let rooms: BTreeSet<&str> = circle.iter().filter_map(|f| room_of(f)).collect();
            let kind = if rooms.len() > 1 {
                "across rooms"
            } else {
                "inside a room"
            };
            problems.push(format!("a circle of files {kind}: {circle:?}"));
        }
    }
    for (name, _, files) in CIRCLE_EXCEPTIONS {
        for file in *files {
            if !on_circles.contains(&file.to_string()) {
                problems.push(format!(
                    "the circle exception `{name}` lists {file}, which is on no circle: remove it"
                ));
            }
        }
    }
    check(problems);
}

/// Fails with every problem, one a line.
fn check(problems: Vec<String>) {
    assert!(problems.is_empty(), "\n{}\n", problems.join("\n"));
}

fn framework_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The room of a file (`job/ops.rs` is in `job`); `lib.rs` is in none.
fn room_of(file: &str) -> Option<&str> {
    let (room, _) = file
        .split_once('/')
        .or_else(|| file.strip_suffix(".rs").map(|r| (r, "")))?;
    (room != "lib").then_some(room)
}

/// The layer table of ARCHITECTURE.md: per module, the modules it may
/// import.
fn layer_table() -> BTreeMap<String, BTreeSet<String>> {
    let text =
        fs::read_to_string(framework_dir().join("../ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let section = text
        .split("\n## Layers")
        .nth(1)
        .expect("a `## Layers` section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut layers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut rows = Vec::new();
    for line in section.lines().filter(|line| line.starts_with('|')) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if cells.len() != 3 || cells[0] == "layer" || cells[0].starts_with("---") {
            continue;
        }
        let names = |cell: &str| -> Vec<String> {
            cell.split(',')
                .map(|name| name.trim().trim_matches('`').to_string())
                .filter(|name| !name.is_empty() && name != "–" && name != "-")
                .collect()
        };
        layers.insert(cells[0].to_string(), names(cells[1]));
        rows.push((cells[0].to_string(), names(cells[1]), names(cells[2])));
    }
    assert!(!rows.is_empty(), "the layer table has no rows");
    let mut table = BTreeMap::new();
    for (layer, modules, may_import) in rows {
        // The modules of one layer may import each other.
        let mut allowed: BTreeSet<String> = layers[&layer].iter().cloned().collect();
        for layer in may_import {
            let members = layers
                .get(&layer)
                .unwrap_or_else(|| panic!("no layer `{layer}`"));
            allowed.extend(members.iter().cloned());
        }
        for module in modules {
            table.insert(module, allowed.clone());
        }
    }
    table
}

/// One path a file imports or names, made absolute (`crate` dropped).
#[derive(Debug, Clone)]
struct Import {
    path: Vec<String>,
    line: usize,
}

/// The framework's sources, read.
struct Crate {
    /// Module path (`["job", "ops"]`) to the file that holds it.
    modules: BTreeMap<Vec<String>, String>,
    /// Per file, what it imports or names.
    imports: BTreeMap<String, Vec<Import>>,
    /// Per module, the names its `use` lines bring in, and where from.
    uses: BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>>,
}

impl Crate {
    fn read() -> Crate {
        let root = framework_dir().join("src");
        let mut files = Vec::new();
        walk(&root, &mut files);
        let mut modules = BTreeMap::new();
        for file in &files {
            modules.insert(module_of(file), file.clone());
        }
        let mut found = Crate {
            modules,
            imports: BTreeMap::new(),
            uses: BTreeMap::new(),
        };
        for file in &files {
            let text = fs::read_to_string(root.join(file)).expect("a source file");
            let tokens = tokens(&blank(&text));
            found.parse(file, &tokens);
        }
        found
    }

    /// Reads one file's `use` trees and inline `crate::`/`super::` paths.
    fn parse(&mut self, file: &str, tokens: &[Token]) {
        let base = module_of(file);
        // Inline modules open at a brace depth: (name, depth).
        let mut inline: Vec<(String, usize)> = Vec::new();
        let mut depth = 0;
        let mut imports = Vec::new();
        let mut i = 0;
        while i < tokens.len() {
            let here: Vec<String> = base
                .iter()
                .cloned()
                .chain(inline.iter().map(|(name, _)| name.clone()))
                .collect();
            match tokens[i].text.as_str() {
                "{" => depth += 1,
                "}" => {
                    depth -= 1;
                    if inline.last().is_some_and(|(_, open)| *open == depth) {
                        inline.pop();
                    }
                }
                "mod" if i + 2 < tokens.len() && tokens[i + 2].text == "{" => {
                    let name = tokens[i + 1].text.clone();
                    self.modules
                        .entry(here.iter().cloned().chain([name.clone()]).collect())
                        .or_insert_with(|| file.to_string());
                    inline.push((name, depth));
                    depth += 1;
                    i += 3;
                    continue;
                }
                "use" => {
                    let line = tokens[i].line;
                    let mut paths = Vec::new();
                    let mut j = i + 1;
                    if tokens.get(j).is_some_and(|t| t.text == "::") {
                        j += 1;
                    }
                    use_tree(tokens, &mut j, Vec::new(), &mut paths);
                    for (path, alias) in paths {
                        if let Some(absolute) = self.absolute(&here, &path) {
                            if let Some(name) = alias {
                                self.uses
                                    .entry(here.clone())
                                    .or_default()
                                    .insert(name, absolute.clone());
                            }
                            imports.push(Import {
                                path: absolute,
                                line,
                            });
                        }
                    }
                    while j < tokens.len() && tokens[j].text != ";" {
                        j += 1;
                    }
                    i = j + 1;
                    continue;
                }
                "crate" | "super" if tokens.get(i + 1).is_some_and(|t| t.text == "::") => {
                    let line = tokens[i].line;
                    let mut path = vec![tokens[i].text.clone()];
                    let mut j = i + 1;
                    while tokens.get(j).is_some_and(|t| t.text == "::")
                        && tokens.get(j + 1).is_some_and(|t| t.is_ident())
                    {
                        path.push(tokens[j + 1].text.clone());
                        j += 2;
                    }
                    if let Some(absolute) = self.absolute(&here, &path) {
                        imports.push(Import {
                            path: absolute,
                            line,
                        });
                    }
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
        self.imports.insert(file.to_string(), imports);
    }

    /// Makes a path absolute from the module `here`, or `None` for
    /// another crate's.
    fn absolute(&self, here: &[String], path: &[String]) -> Option<Vec<String>> {
        let mut module = here.to_vec();
        let mut rest = path;
        match rest.first().map(String::as_str) {
            Some("crate") | Some("$crate") => {
                module.clear();
                rest = &rest[1..];
            }
            Some("super") | Some("self") => {
                while let Some(first) = rest.first() {
                    match first.as_str() {
                        "super" => {
                            module.pop()?;
                        }
                        "self" => {}
                        _ => break,
                    }
                    rest = &rest[1..];
                }
            }
            Some(first) => {
                let mut child = module.clone();
                child.push(first.to_string());
                if !self.modules.contains_key(&child) {
                    return None;
                }
            }
            None => return None,
        }
        module.extend(rest.iter().cloned());
        Some(module)
    }

    /// The room an absolute path names: its first segment when that is a
    /// room, or where the crate root re-exports it from.
    fn named_room(&self, path: &[String]) -> Option<String> {
        let first = path.first()?;
        if self.modules.contains_key(&vec![first.clone()]) {
            return Some(first.clone());
        }
        let target = self.uses.get(&Vec::new())?.get(first)?;
        self.named_room(target)
    }

    /// The file that defines what an absolute path names, following `use`
    /// re-exports.
    fn resolve(&self, path: &[String], hops: usize) -> Option<String> {
        let mut module = Vec::new();
        let mut i = 0;
        while i < path.len() {
            let mut child = module.clone();
            child.push(path[i].clone());
            if !self.modules.contains_key(&child) {
                break;
            }
            module = child;
            i += 1;
        }
        let file = self.modules.get(&module)?.clone();
        if i < path.len() && hops < 16 {
            if let Some(target) = self.uses.get(&module).and_then(|uses| uses.get(&path[i])) {
                let mut next = target.clone();
                next.extend(path[i + 1..].iter().cloned());
                if let Some(found) = self.resolve(&next, hops + 1) {
                    return Some(found);
                }
            }
        }
        Some(file)
    }
}

/// Reads one use tree from `tokens[*j]` under `prefix`, pushing each leaf
/// path with the name it binds (none for a glob).
fn use_tree(
    tokens: &[Token],
    j: &mut usize,
    mut prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>)>,
) {
    while let Some(token) = tokens.get(*j) {
        match token.text.as_str() {
            "{" => {
                *j += 1;
                while tokens.get(*j).is_some_and(|t| t.text != "}") {
                    use_tree(tokens, j, prefix.clone(), out);
                    if tokens.get(*j).is_some_and(|t| t.text == ",") {
                        *j += 1;
                    }
                }
                *j += 1;
                return;
            }
            "*" => {
                *j += 1;
                out.push((prefix, None));
                return;
            }
            text if token.is_ident() => {
                *j += 1;
                if text != "self" {
                    prefix.push(text.to_string());
                }
                if tokens.get(*j).is_some_and(|t| t.text == "::") {
                    *j += 1;
                    continue;
                }
                let mut name = prefix.last().cloned();
                if tokens.get(*j).is_some_and(|t| t.text == "as") {
                    name = tokens.get(*j + 1).map(|t| t.text.clone());
                    *j += 2;
                }
                out.push((prefix, name));
                return;
            }
            _ => return,
        }
    }
}

/// The module path of a file under `src` (`job/ops.rs` is `job::ops`).
fn module_of(file: &str) -> Vec<String> {
    let stem = file.strip_suffix(".rs").expect("a .rs file");
    let mut parts: Vec<String> = stem.split('/').map(str::to_string).collect();
    if matches!(parts.last().map(String::as_str), Some("mod") | Some("lib")) {
        parts.pop();
    }
    parts
}

fn walk(dir: &Path, files: &mut Vec<String>) {
    let root = framework_dir().join("src");
    let mut entries: Vec<_> = fs::read_dir(dir).expect("a directory").flatten().collect();
    entries.sort_by_key(|entry| entry.path());
    for entry in entries {
        let path = entry.path();
        if path.is_dir() {
            walk(&path, files);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            let rel = path.strip_prefix(&root).expect("under src");
            files.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
}

/// Blanks comments (doc comments too) and the insides of string and
/// character literals, keeping line breaks so lines still count.
fn blank(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let push_blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut nesting = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    nesting += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    nesting -= 1;
                    i += 2;
                    if nesting == 0 {
                        break;
                    }
                } else {
                    push_blank(&mut out, chars[i]);
                    i += 1;
                }
            }
        } else if c == 'r'
            && (i == 0 || !ident(chars[i - 1]) || chars[i - 1] == 'b')
            && matches!(next, Some('"') | Some('#'))
        {
            let mut hashes = 0;
            let mut k = i + 1;
            while chars.get(k) == Some(&'#') {
                hashes += 1;
                k += 1;
            }
            if chars.get(k) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            out.push('"');
            i = k + 1;
            while i < chars.len() {
                if chars[i] == '"' && (1..=hashes).all(|h| chars.get(i + h) == Some(&'#')) {
                    i += 1 + hashes;
                    break;
                }
                push_blank(&mut out, chars[i]);
                i += 1;
            }
            out.push('"');
        } else if c == '"' {
            out.push('"');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    push_blank(&mut out, chars[i]);
                    i += 1;
                }
                if i < chars.len() {
                    push_blank(&mut out, chars[i]);
                    i += 1;
                }
            }
            out.push('"');
            i += 1;
        } else if c == '\'' && (next == Some('\\') || chars.get(i + 2) == Some(&'\'')) {
            out.push('\'');
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            out.push('\'');
            i += 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

#[derive(Debug)]
struct Token {
    text: String,
    line: usize,
}

impl Token {
    fn is_ident(&self) -> bool {
        self.text
            .chars()
            .next()
            .is_some_and(|c| c.is_alphabetic() || c == '_' || c == '$')
    }
}

/// Splits blanked code into identifiers, `::` and single punctuation.
fn tokens(code: &str) -> Vec<Token> {
    let chars: Vec<char> = code.chars().collect();
    let mut tokens = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_alphanumeric() || c == '_' || c == '$' {
            let start = i;
            i += 1;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let text: String = chars[start..i].iter().collect();
            let text = text.strip_prefix("r#").map(str::to_string).unwrap_or(text);
            tokens.push(Token { text, line });
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            tokens.push(Token {
                text: "::".into(),
                line,
            });
            i += 2;
        } else {
            tokens.push(Token {
                text: c.to_string(),
                line,
            });
            i += 1;
        }
    }
    tokens
}

/// The strongly connected components of more than one file (Tarjan).
fn strongly_connected(edges: &BTreeMap<&str, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<&'a str, BTreeSet<String>>,
        index: BTreeMap<String, usize>,
        low: BTreeMap<String, usize>,
        stack: Vec<String>,
        on_stack: BTreeSet<String>,
        found: Vec<Vec<String>>,
    }
    impl Walk<'_> {
        fn visit(&mut self, node: &str) {
            let n = self.index.len();
            self.index.insert(node.to_string(), n);
            self.low.insert(node.to_string(), n);
            self.stack.push(node.to_string());
            self.on_stack.insert(node.to_string());
            let targets: Vec<String> = self
                .edges
                .get(node)
                .map(|t| t.iter().cloned().collect())
                .unwrap_or_default();
            for target in targets {
                if !self.index.contains_key(&target) {
                    self.visit(&target);
                    let low = self.low[node].min(self.low[&target]);
                    self.low.insert(node.to_string(), low);
                } else if self.on_stack.contains(&target) {
                    let low = self.low[node].min(self.index[&target]);
                    self.low.insert(node.to_string(), low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut component = Vec::new();
                while let Some(top) = self.stack.pop() {
                    self.on_stack.remove(&top);
                    let done = top == node;
                    component.push(top);
                    if done {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in edges.keys() {
        if !walk.index.contains_key(*node) {
            walk.visit(node);
        }
    }
    walk.found.sort();
    walk.found
}
