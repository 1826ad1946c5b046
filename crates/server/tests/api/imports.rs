//! The server crate's import graph, read from its sources: one node per `.rs` file under `src/` (a `mod.rs` is its
//! directory's module), an edge from a file to every module whose items it names — `crate::…` paths (use trees
//! included), `super::…`, and paths through a child module (`sandboxes::create` in `api/mod.rs`). Comments, string
//! literals (raw ones too) and `#[cfg(test)]` modules (at the end of a file, as everywhere here) are left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path inside the crate (`[]` is the crate root, `["api", "error"]` is `crate::api::error`).
pub type Module = Vec<String>;

/// Every module of the crate: its file and the modules it names.
pub struct Graph {
    /// The file of each module, relative to `src/`.
    pub files: BTreeMap<Module, PathBuf>,
    /// The modules each module names (itself excluded).
    pub edges: BTreeMap<Module, BTreeSet<Module>>,
}

/// The server crate's `src/` directory.
pub fn source_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
}

/// The module a file under `src/` is.
fn module_of(relative: &Path) -> Module {
    let mut parts: Module = relative.iter().map(|part| part.to_string_lossy().into_owned()).collect();
    if let Some(last) = parts.last_mut() {
        *last = last.trim_end_matches(".rs").to_owned();
    }
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The code of a file without its comments, the contents of its string and character literals, and its trailing
/// `#[cfg(test)]` module.
pub fn code_of(source: &str) -> String {
    let source = source.find("#[cfg(test)]").map_or(source, |at| &source[..at]);
    let chars: Vec<char> = source.chars().collect();
    let mut code = String::with_capacity(source.len());
    let mut i = 0;
    while i < chars.len() {
        match (chars[i], chars.get(i + 1).copied()) {
            ('/', Some('/')) => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            ('/', Some('*')) => {
                i += 2;
                while i < chars.len() && !(chars[i] == '*' && chars.get(i + 1) == Some(&'/')) {
                    i += 1;
                }
                i += 2;
            }
            ('r', Some('#' | '"')) if i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_') => {
                let hashes = chars[i + 1..].iter().take_while(|c| **c == '#').count();
                if chars.get(i + 1 + hashes) != Some(&'"') {
                    code.push('r');
                    i += 1;
                    continue;
                }
                i += hashes + 2;
                while i < chars.len() && !(chars[i] == '"' && chars[i + 1..].iter().take(hashes).all(|c| *c == '#')) {
                    i += 1;
                }
                i += hashes + 1;
                code.push_str("\"\"");
            }
            ('"', _) => {
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
                code.push_str("\"\"");
            }
            ('\'', Some('\\')) => {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            }
            ('\'', Some(_)) if chars.get(i + 2) == Some(&'\'') => i += 3,
            (c, _) => {
                code.push(c);
                i += 1;
            }
        }
    }
    code
}

/// The code as tokens: identifiers, `::`, and single punctuation characters.
fn tokens(code: &str) -> Vec<String> {
    let chars: Vec<char> = code.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            tokens.push(chars[start..i].iter().collect());
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            tokens.push("::".to_owned());
            i += 2;
        } else {
            if !c.is_whitespace() {
                tokens.push(c.to_string());
            }
            i += 1;
        }
    }
    tokens
}

/// The paths of a path or use tree starting at `tokens[at]` (an identifier), prefixed by `prefix`; where it ends.
fn paths_at(tokens: &[String], mut at: usize, prefix: Module, paths: &mut Vec<Module>) -> usize {
    let mut path = prefix;
    while let Some(token) = tokens.get(at) {
        if token == "{" {
            at += 1;
            while tokens.get(at).is_some_and(|t| t != "}") {
                if tokens[at] == "," {
                    at += 1;
                } else if tokens[at].chars().all(|c| c.is_alphanumeric() || c == '_') {
                    at = paths_at(tokens, at, path.clone(), paths);
                } else {
                    at += 1;
                }
            }
            return at + 1;
        }
        if !token.chars().all(|c| c.is_alphanumeric() || c == '_') {
            break;
        }
        path.push(token.clone());
        at += 1;
        if tokens.get(at).map(String::as_str) != Some("::") {
            break;
        }
        at += 1;
    }
    paths.push(path);
    at
}

impl Graph {
    /// The graph of the crate's sources.
    pub fn read() -> Graph {
        let root = source_dir();
        let mut found = Vec::new();
        rust_files(&root, &mut found);
        let files: BTreeMap<Module, PathBuf> = found
            .into_iter()
            .map(|path| {
                let relative = path.strip_prefix(&root).unwrap().to_path_buf();
                (module_of(&relative), relative)
            })
            .collect();
        let mut graph = Graph { files, edges: BTreeMap::new() };
        for (module, file) in &graph.files {
            let code = code_of(&std::fs::read_to_string(root.join(file)).unwrap());
            let named = graph.named_by(module, &tokens(&code));
            graph.edges.insert(module.clone(), named);
        }
        graph
    }

    /// The module a path names: its longest prefix that is a module.
    fn resolve(&self, path: &[String]) -> Module {
        (0..=path.len()).rev().map(|n| path[..n].to_vec()).find(|m| self.files.contains_key(m)).unwrap_or_default()
    }

    fn named_by(&self, module: &Module, tokens: &[String]) -> BTreeSet<Module> {
        let mut paths = Vec::new();
        let mut at = 0;
        while at < tokens.len() {
            let starts_path = tokens.get(at + 1).is_some_and(|t| t == "::")
                && (at == 0 || tokens[at - 1] != "::")
                && tokens[at].chars().all(|c| c.is_alphanumeric() || c == '_');
            if !starts_path {
                at += 1;
                continue;
            }
            let base = match tokens[at].as_str() {
                "crate" => Some(Vec::new()),
                "super" => Some(module[..module.len().saturating_sub(1)].to_vec()),
                "self" => Some(module.clone()),
                child => {
                    let mut candidate = module.clone();
                    candidate.push(child.to_owned());
                    self.files.contains_key(&candidate).then_some(module.clone())
                }
            };
            match base {
                Some(base) => {
                    let skip_keyword = matches!(tokens[at].as_str(), "crate" | "super" | "self");
                    let start = if skip_keyword { at + 2 } else { at };
                    at = paths_at(tokens, start, base, &mut paths).max(at + 1);
                }
                None => at += 1,
            }
        }
        paths.iter().map(|path| self.resolve(path)).filter(|named| named != module).collect()
    }

    /// A cycle of modules (each naming the next, the last naming the first), if there is one.
    pub fn cycle(&self) -> Option<Vec<Module>> {
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            Open,
            Done,
        }
        fn visit(graph: &Graph, module: &Module, marks: &mut BTreeMap<Module, Mark>, stack: &mut Vec<Module>) -> bool {
            marks.insert(module.clone(), Mark::Open);
            stack.push(module.clone());
            for next in graph.edges.get(module).into_iter().flatten() {
                match marks.get(next) {
                    Some(Mark::Open) => {
                        let from = stack.iter().position(|m| m == next).unwrap_or(0);
                        stack.drain(..from);
                        return true;
                    }
                    Some(Mark::Done) => {}
                    None => {
                        if visit(graph, next, marks, stack) {
                            return true;
                        }
                    }
                }
            }
            stack.pop();
            marks.insert(module.clone(), Mark::Done);
            false
        }
        let mut marks = BTreeMap::new();
        for module in self.files.keys() {
            let mut stack = Vec::new();
            if !marks.contains_key(module) && visit(self, module, &mut marks, &mut stack) {
                return Some(stack);
            }
        }
        None
    }

    /// A module's file, for messages.
    pub fn file(&self, module: &Module) -> String {
        self.files.get(module).map_or_else(|| format!("{module:?}"), |file| file.display().to_string())
    }
}
