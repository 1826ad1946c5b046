//! Python: its rule table, the call families it looks for (as data), and the visitor. Import aliases are followed
//! (`import subprocess as sp; sp.run(...)`, `from os import system`), so a renamed call is still the call.

use std::collections::HashMap;

use tree_sitter::{Language, Node};

use crate::bash::scan_command_line;
use crate::engine::LanguageScan;
use crate::finding::Severity;
use crate::findings::{Findings, Position};
use crate::imports::Import;
use crate::rules::{Rule, SENSITIVE_PATH_WRITE, is_sensitive_path};

/// `os.system`, `subprocess.*`, `os.exec*`, `pty.spawn`: a new program.
pub const PROCESS_EXEC: Rule = Rule {
    id: "process_exec",
    severity: Severity::Medium,
    explanation: "starting programs from generated code is rarely needed; do the work in Python, or name the \
                  program and its arguments as a list",
};
/// `os.fork()` outside a loop.
pub const PROCESS_FORK: Rule = Rule {
    id: "process_fork",
    severity: Severity::Medium,
    explanation: "forking is rarely needed; use concurrent.futures or multiprocessing with a bounded pool",
};
/// `os.fork()` in a loop: `while True: os.fork()`.
pub const FORK_BOMB: Rule = Rule {
    id: "fork_bomb",
    severity: Severity::Critical,
    explanation: "forking in a loop multiplies processes until the limit kills the sandbox; use a bounded pool",
};
/// `eval`, `exec`, `compile` of a computed string.
pub const DYNAMIC_EVAL: Rule = Rule {
    id: "dynamic_eval",
    severity: Severity::High,
    explanation: "evaluating a computed string hides what runs; write the code out",
};
/// `exec(base64.b64decode(...))`, `eval(compile(...))`, `getattr(__builtins__, ...)`.
pub const OBFUSCATED_EXEC: Rule = Rule {
    id: "obfuscated_exec",
    severity: Severity::Critical,
    explanation: "running decoded or indirectly looked-up code hides what runs; write the code out in plain text",
};
/// `socket.socket(...)`, `socket.create_connection(...)`.
pub const RAW_SOCKET: Rule = Rule {
    id: "raw_socket",
    severity: Severity::High,
    explanation: "raw sockets from generated code look like a reverse shell; use an HTTP client (urllib, requests) \
                  for the hosts your task needs",
};
/// `os.dup2(...)`: standard streams moved onto another descriptor.
pub const FD_REDIRECT: Rule = Rule {
    id: "fd_redirect",
    severity: Severity::High,
    explanation: "moving the standard streams onto another descriptor is how a shell is handed to a socket; use \
                  subprocess's stdout= and stderr= arguments",
};
/// A socket together with `dup2` or a shell: a reverse shell.
pub const REVERSE_SHELL: Rule = Rule {
    id: "reverse_shell",
    severity: Severity::Critical,
    explanation: "a socket with its descriptors given to a shell hands the shell to a remote host; remove it",
};
/// An import of a module that runs programs, opens sockets or loads native code.
pub const SENSITIVE_IMPORT: Rule = Rule {
    id: "sensitive_import",
    severity: Severity::Low,
    explanation: "this module can start programs, open sockets or load native code; make sure the task needs it",
};

/// Python's rules, for listing.
pub const RULES: &[&Rule] = &[
    &PROCESS_EXEC,
    &PROCESS_FORK,
    &FORK_BOMB,
    &DYNAMIC_EVAL,
    &OBFUSCATED_EXEC,
    &RAW_SOCKET,
    &FD_REDIRECT,
    &REVERSE_SHELL,
    &SENSITIVE_IMPORT,
];

/// Calls that run a program; a `*` ends a prefix. Their string arguments are scanned as bash.
const PROCESS_CALLS: &[&str] = &[
    "os.system",
    "os.popen",
    "os.exec*",
    "os.spawn*",
    "os.posix_spawn*",
    "subprocess.*",
    "pty.spawn",
    "commands.getoutput",
    "commands.getstatusoutput",
    "asyncio.create_subprocess_*",
];
/// Calls that evaluate code.
const EVAL_CALLS: &[&str] = &["eval", "exec", "compile", "builtins.eval", "builtins.exec", "builtins.compile"];
/// Text in an evaluated argument that shows it was decoded first.
const DECODE_MARKERS: &[&str] = &[
    "b64decode",
    "b32decode",
    "b16decode",
    "a85decode",
    "b85decode",
    "decodebytes",
    "a2b_base64",
    "fromhex",
    "decompress",
    "codecs.decode",
    "rot13",
    "rot_13",
    "marshal.loads",
    "pickle.loads",
    "compile(",
    "unhexlify",
];
/// Calls that open a raw socket.
const SOCKET_CALLS: &[&str] =
    &["socket.socket", "socket.create_connection", "socket.create_server", "socket.fromfd", "socket.socketpair"];
/// Calls that change the path that is their first argument.
const PATH_CALLS: &[&str] = &[
    "os.remove",
    "os.unlink",
    "os.rmdir",
    "os.removedirs",
    "os.rename",
    "os.replace",
    "os.chmod",
    "os.chown",
    "os.mkdir",
    "os.makedirs",
    "os.symlink",
    "os.link",
    "os.truncate",
    "os.mknod",
    "shutil.rmtree",
    "shutil.move",
    "shutil.copy",
    "shutil.copy2",
    "shutil.copyfile",
    "shutil.copytree",
    "shutil.chown",
];
/// `pathlib.Path(...)` methods that change the path.
const PATH_METHODS: &[&str] =
    &["write_text", "write_bytes", "unlink", "rmdir", "chmod", "mkdir", "touch", "rename", "replace", "symlink_to"];
/// Modules whose import is worth a note.
const SENSITIVE_MODULES: &[&str] = &["subprocess", "pty", "ctypes", "socket", "cffi", "pexpect"];

/// Whether `name` is in a table whose entries may end in `*`.
fn in_table(table: &[&str], name: &str) -> bool {
    table.iter().any(|entry| match entry.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == *entry,
    })
}

fn text<'s>(node: Node<'_>, source: &'s [u8]) -> &'s str {
    std::str::from_utf8(source.get(node.byte_range()).unwrap_or_default()).unwrap_or_default()
}

/// The value of a string literal without interpolation (f-strings with `{…}` are not literal).
fn literal(node: Node<'_>, source: &[u8]) -> Option<String> {
    match node.kind() {
        "string" => {
            let mut cursor = node.walk();
            let mut value = String::new();
            for child in node.children(&mut cursor) {
                match child.kind() {
                    "interpolation" => return None,
                    "string_content" => value.push_str(text(child, source)),
                    _ => {}
                }
            }
            Some(value)
        }
        "concatenated_string" => {
            let mut cursor = node.walk();
            let parts: Option<Vec<String>> = node.named_children(&mut cursor).map(|c| literal(c, source)).collect();
            parts.map(|p| p.concat())
        }
        _ => None,
    }
}

/// The positional arguments of a call.
fn arguments<'t>(call: Node<'t>) -> Vec<Node<'t>> {
    let Some(list) = call.child_by_field_name("arguments") else { return Vec::new() };
    let mut cursor = list.walk();
    list.named_children(&mut cursor).filter(|a| a.kind() != "keyword_argument" && a.kind() != "comment").collect()
}

/// A keyword argument's value.
fn keyword<'t>(call: Node<'t>, name: &str, source: &[u8]) -> Option<Node<'t>> {
    let list = call.child_by_field_name("arguments")?;
    let mut cursor = list.walk();
    let found = list.named_children(&mut cursor).find(|a| {
        a.kind() == "keyword_argument" && a.child_by_field_name("name").is_some_and(|n| text(n, source) == name)
    });
    found.and_then(|a| a.child_by_field_name("value"))
}

/// The Python scanner: the names imports bound, and what it saw for the whole-file rules.
#[derive(Default)]
pub(crate) struct PythonScan {
    /// Local name → the module or module attribute it stands for.
    aliases: HashMap<String, String>,
    /// The first raw socket.
    socket: Option<Position>,
    /// Whether `dup2` (or a shell started with a socket's descriptors) was seen.
    dup2: bool,
}

impl PythonScan {
    /// The dotted name a callee stands for, aliases followed (`sp.run` → `subprocess.run`).
    fn qualified(&self, node: Node<'_>, source: &[u8]) -> Option<String> {
        match node.kind() {
            "identifier" => {
                let name = text(node, source);
                Some(self.aliases.get(name).cloned().unwrap_or_else(|| name.to_owned()))
            }
            "attribute" => {
                let object = self.qualified(node.child_by_field_name("object")?, source)?;
                Some(format!("{object}.{}", text(node.child_by_field_name("attribute")?, source)))
            }
            // `__import__("os").system`: the module the call imports.
            "call" => {
                let callee = self.qualified(node.child_by_field_name("function")?, source)?;
                if !is_import_call(&callee) {
                    // `Path("/etc/x").write_text`: the call's result, named after what was called.
                    return Some(format!("{callee}()"));
                }
                literal(*arguments(node).first()?, source)
            }
            _ => None,
        }
    }

    fn import_statement(&mut self, node: Node<'_>, source: &[u8], imports: &mut Vec<Import>) {
        let at = Position::of(node, source);
        let mut cursor = node.walk();
        for name in node.children_by_field_name("name", &mut cursor) {
            let (module, alias) = match name.kind() {
                "aliased_import" => {
                    let module = name.child_by_field_name("name").map(|n| text(n, source)).unwrap_or_default();
                    let alias = name.child_by_field_name("alias").map(|n| text(n, source)).unwrap_or(module);
                    (module, alias.to_owned())
                }
                _ => {
                    let module = text(name, source);
                    (module, module.split('.').next().unwrap_or(module).to_owned())
                }
            };
            let bound = if alias.contains('.') || name.kind() != "aliased_import" {
                module.split('.').next().unwrap_or(module).to_owned()
            } else {
                module.to_owned()
            };
            self.aliases.insert(alias, bound);
            imports.push(Import { module: Some(module.to_owned()), at, how: "import" });
        }
    }

    fn import_from(&mut self, node: Node<'_>, source: &[u8], imports: &mut Vec<Import>) {
        let Some(module) = node.child_by_field_name("module_name") else { return };
        let module = text(module, source).to_owned();
        let at = Position::of(node, source);
        let mut cursor = node.walk();
        for name in node.children_by_field_name("name", &mut cursor) {
            let (imported, alias) = match name.kind() {
                "aliased_import" => (
                    name.child_by_field_name("name").map(|n| text(n, source)).unwrap_or_default(),
                    name.child_by_field_name("alias").map(|n| text(n, source)).unwrap_or_default(),
                ),
                _ => (text(name, source), text(name, source)),
            };
            self.aliases.insert(alias.to_owned(), format!("{module}.{imported}"));
        }
        imports.push(Import { module: Some(module), at, how: "from … import" });
    }

    fn call(&mut self, node: Node<'_>, source: &[u8], findings: &mut Findings, imports: &mut Vec<Import>) {
        let Some(function) = node.child_by_field_name("function") else { return };
        let at = Position::of(node, source);
        let Some(callee) = self.qualified(function, source) else { return };
        let args = arguments(node);
        let first = args.first().copied();
        if is_import_call(&callee) {
            let module = first.and_then(|a| literal(a, source));
            imports.push(Import {
                module,
                at,
                how: if callee == "__import__" { "__import__" } else { "import_module" },
            });
            return;
        }
        if callee == "getattr"
            && first.is_some_and(|a| matches!(text(a, source), "__builtins__" | "builtins" | "__import__('builtins')"))
        {
            findings.push(&OBFUSCATED_EXEC, at, "getattr on the builtins");
            return;
        }
        if in_table(EVAL_CALLS, &callee) {
            let argument = first.map(|a| text(a, source)).unwrap_or_default();
            if DECODE_MARKERS.iter().any(|m| argument.contains(m))
                || first.is_some_and(|a| is_builtins_lookup(a, source))
            {
                findings.push(&OBFUSCATED_EXEC, at, format!("{callee} of decoded or compiled code"));
            } else if first.is_some_and(|a| literal(a, source).is_none()) {
                findings.push(&DYNAMIC_EVAL, at, format!("{callee} of a computed value"));
            } else {
                findings.push(&DYNAMIC_EVAL, at, format!("{callee} of a string"));
            }
            return;
        }
        if in_table(PROCESS_CALLS, &callee) {
            findings.push(&PROCESS_EXEC, at, format!("{callee} starts a program"));
            if let Some(line) = first.and_then(|a| command_line(a, source)) {
                scan_command_line(&line, at, findings);
            }
            return;
        }
        if matches!(callee.as_str(), "os.fork" | "os.forkpty") {
            if in_loop(node) {
                findings.push(&FORK_BOMB, at, format!("{callee} in a loop"));
            } else {
                findings.push(&PROCESS_FORK, at, format!("{callee} forks the process"));
            }
            return;
        }
        if in_table(SOCKET_CALLS, &callee) {
            findings.push(&RAW_SOCKET, at, format!("{callee} opens a socket"));
            self.socket.get_or_insert(at);
            return;
        }
        if callee == "os.dup2" {
            findings.push(&FD_REDIRECT, at, "os.dup2 moves a descriptor");
            self.dup2 = true;
            return;
        }
        self.path_write(node, &callee, first, source, findings);
    }

    fn path_write(
        &self,
        node: Node<'_>,
        callee: &str,
        first: Option<Node<'_>>,
        source: &[u8],
        findings: &mut Findings,
    ) {
        let at = Position::of(node, source);
        let path = first.and_then(|a| literal(a, source));
        if callee == "open" || callee == "io.open" || callee == "os.open" {
            let mode = arguments(node).get(1).copied().or_else(|| keyword(node, "mode", source));
            let mode = mode.map(|m| text(m, source)).unwrap_or_default();
            let writes = mode.contains('w')
                || mode.contains('a')
                || mode.contains('x')
                || mode.contains('+')
                || mode.contains("O_WRONLY")
                || mode.contains("O_RDWR");
            if writes && let Some(path) = path.filter(|p| is_sensitive_path(p)) {
                findings.push(&SENSITIVE_PATH_WRITE, at, format!("{callee} writes {path}"));
            }
            return;
        }
        if in_table(PATH_CALLS, callee) {
            if let Some(path) = path.filter(|p| is_sensitive_path(p) || p == "/") {
                findings.push(&SENSITIVE_PATH_WRITE, at, format!("{callee} changes {path}"));
            }
            return;
        }
        // `Path("/etc/x").write_text(...)`.
        let Some((object, method)) = callee.rsplit_once('.') else { return };
        let object = object.trim_end_matches("()");
        if PATH_METHODS.contains(&method) && (object.ends_with("Path") || object.ends_with("PosixPath")) {
            let path = node
                .child_by_field_name("function")
                .and_then(|f| f.child_by_field_name("object"))
                .and_then(|o| arguments(o).first().copied())
                .and_then(|a| literal(a, source));
            if let Some(path) = path.filter(|p| is_sensitive_path(p)) {
                findings.push(&SENSITIVE_PATH_WRITE, at, format!("Path.{method} changes {path}"));
            }
        }
    }
}

/// `__import__` and `importlib.import_module`.
fn is_import_call(callee: &str) -> bool {
    matches!(callee, "__import__" | "importlib.import_module" | "importlib.__import__" | "builtins.__import__")
}

/// `__builtins__.__dict__[...]`, `globals()["__builtins__"]`: builtins looked up by name.
fn is_builtins_lookup(node: Node<'_>, source: &[u8]) -> bool {
    let text = text(node, source);
    text.contains("__builtins__") || text.contains("__dict__")
}

/// The command line a process call's first argument spells: a literal string, or a list of literal strings joined
/// with spaces.
fn command_line(argument: Node<'_>, source: &[u8]) -> Option<String> {
    match argument.kind() {
        "list" | "tuple" => {
            let mut cursor = argument.walk();
            let words: Option<Vec<String>> = argument.named_children(&mut cursor).map(|w| literal(w, source)).collect();
            words.map(|w| w.join(" "))
        }
        _ => literal(argument, source),
    }
}

/// Whether a node is inside a `while` or `for` loop (looking up at most 64 levels).
fn in_loop(node: Node<'_>) -> bool {
    let mut current = node.parent();
    for _ in 0..64 {
        match current {
            Some(n) if matches!(n.kind(), "while_statement" | "for_statement") => return true,
            Some(n) if matches!(n.kind(), "function_definition" | "class_definition") => return false,
            Some(n) => current = n.parent(),
            None => return false,
        }
    }
    false
}

impl LanguageScan for PythonScan {
    fn grammar() -> Language {
        tree_sitter_python::LANGUAGE.into()
    }

    fn visit(&mut self, node: Node<'_>, source: &[u8], findings: &mut Findings, imports: &mut Vec<Import>) {
        match node.kind() {
            "import_statement" => self.import_statement(node, source, imports),
            "import_from_statement" => self.import_from(node, source, imports),
            "call" => self.call(node, source, findings, imports),
            _ => {}
        }
    }

    fn finish(&mut self, findings: &mut Findings, imports: &[Import]) {
        sensitive_imports(imports, findings);
        if let (Some(at), true) = (self.socket, self.dup2) {
            findings.push(&REVERSE_SHELL, at, "a socket and os.dup2 together");
        }
    }
}

/// Notes imports of sensitive modules (run after the walk, from the import list).
fn sensitive_imports(imports: &[Import], findings: &mut Findings) {
    for import in imports {
        if let Some(module) = &import.module {
            let top = module.split('.').next().unwrap_or(module);
            if SENSITIVE_MODULES.contains(&top) {
                findings.push(&SENSITIVE_IMPORT, import.at, format!("import of '{module}'"));
            }
        }
    }
}
