//! JavaScript (Node): its rule table, the call families it looks for (as data), and the visitor. `require` and
//! `import` bindings are followed (`const cp = require("child_process"); cp.exec(...)`, `const { exec } = …`).

use std::collections::HashMap;

use tree_sitter::{Language, Node};

use crate::bash::scan_command_line;
use crate::engine::LanguageScan;
use crate::finding::Severity;
use crate::findings::{Findings, Position};
use crate::imports::Import;
use crate::rules::{Rule, SENSITIVE_PATH_WRITE, is_sensitive_path};

/// `child_process.exec`, `spawn`, `execSync`, ...: a new program.
pub const PROCESS_EXEC: Rule = Rule {
    id: "process_exec",
    severity: Severity::Medium,
    explanation: "starting programs from generated code is rarely needed; do the work in JavaScript, or use \
                  execFile with the program and its arguments as an array",
};
/// A process started in an endless loop.
pub const FORK_BOMB: Rule = Rule {
    id: "fork_bomb",
    severity: Severity::Critical,
    explanation: "starting processes in a loop multiplies them until the limit kills the sandbox; start a bounded \
                  number",
};
/// `eval`, `new Function`, `vm.runIn*Context` of a computed string.
pub const DYNAMIC_EVAL: Rule = Rule {
    id: "dynamic_eval",
    severity: Severity::High,
    explanation: "evaluating a computed string hides what runs; write the code out",
};
/// `eval(Buffer.from(…, "base64").toString())`, `eval(atob(…))`.
pub const OBFUSCATED_EXEC: Rule = Rule {
    id: "obfuscated_exec",
    severity: Severity::Critical,
    explanation: "running decoded code hides what runs; write the code out in plain text",
};
/// `net.connect`, `new net.Socket`, `dgram.createSocket`.
pub const RAW_SOCKET: Rule = Rule {
    id: "raw_socket",
    severity: Severity::High,
    explanation: "raw sockets from generated code look like a reverse shell; use fetch for the hosts your task needs",
};
/// A require or import of a module that runs programs, opens sockets or evaluates code.
pub const SENSITIVE_IMPORT: Rule = Rule {
    id: "sensitive_import",
    severity: Severity::Low,
    explanation: "this module can start programs, open sockets or evaluate code; make sure the task needs it",
};

/// JavaScript's rules, for listing.
pub const RULES: &[&Rule] =
    &[&PROCESS_EXEC, &FORK_BOMB, &DYNAMIC_EVAL, &OBFUSCATED_EXEC, &RAW_SOCKET, &SENSITIVE_IMPORT];

/// Calls that run a program (`child_process.*`); the ones given a command line have it scanned as bash.
const PROCESS_CALLS: &[&str] = &[
    "child_process.exec",
    "child_process.execSync",
    "child_process.execFile",
    "child_process.execFileSync",
    "child_process.spawn",
    "child_process.spawnSync",
    "child_process.fork",
];
/// Calls that evaluate code (also as `new`).
const EVAL_CALLS: &[&str] = &[
    "eval",
    "Function",
    "vm.runInNewContext",
    "vm.runInThisContext",
    "vm.runInContext",
    "vm.Script",
    "vm.compileFunction",
];
/// Text in an evaluated argument that shows it was decoded first.
const DECODE_MARKERS: &[&str] =
    &["base64", "atob(", "fromCharCode", "hex'", "hex\"", "unescape(", "decodeURIComponent("];
/// Calls that open a raw socket (also as `new`).
const SOCKET_CALLS: &[&str] =
    &["net.connect", "net.createConnection", "net.Socket", "dgram.createSocket", "tls.connect", "net.createServer"];
/// `fs` functions that change the path that is their first argument (`fs.promises.*` too).
const PATH_CALLS: &[&str] = &[
    "writeFile",
    "writeFileSync",
    "appendFile",
    "appendFileSync",
    "createWriteStream",
    "unlink",
    "unlinkSync",
    "rm",
    "rmSync",
    "rmdir",
    "rmdirSync",
    "chmod",
    "chmodSync",
    "chown",
    "chownSync",
    "rename",
    "renameSync",
    "copyFile",
    "copyFileSync",
    "symlink",
    "symlinkSync",
    "mkdir",
    "mkdirSync",
    "truncate",
    "truncateSync",
    "cp",
    "cpSync",
];
/// Modules whose require is worth a note.
const SENSITIVE_MODULES: &[&str] = &["child_process", "net", "dgram", "vm", "worker_threads", "cluster", "tls"];

fn text<'s>(node: Node<'_>, source: &'s [u8]) -> &'s str {
    std::str::from_utf8(source.get(node.byte_range()).unwrap_or_default()).unwrap_or_default()
}

/// The value of a string literal, or of a template without substitutions.
fn literal(node: Node<'_>, source: &[u8]) -> Option<String> {
    match node.kind() {
        "string" | "template_string" => {
            let mut cursor = node.walk();
            let mut value = String::new();
            for child in node.named_children(&mut cursor) {
                match child.kind() {
                    "template_substitution" => return None,
                    _ => value.push_str(text(child, source)),
                }
            }
            Some(value)
        }
        _ => None,
    }
}

/// The arguments of a call or `new`.
fn arguments<'t>(call: Node<'t>) -> Vec<Node<'t>> {
    let Some(list) = call.child_by_field_name("arguments") else { return Vec::new() };
    let mut cursor = list.walk();
    list.named_children(&mut cursor).filter(|a| a.kind() != "comment").collect()
}

/// A module name as it is matched: `node:fs` is `fs`.
fn module_name(name: &str) -> &str {
    name.strip_prefix("node:").unwrap_or(name)
}

/// The JavaScript scanner: the names requires and imports bound.
#[derive(Default)]
pub(crate) struct JavascriptScan {
    /// Local name → the module or module member it stands for.
    aliases: HashMap<String, String>,
}

impl JavascriptScan {
    /// The dotted name a callee stands for, bindings followed (`cp.exec` → `child_process.exec`).
    fn qualified(&self, node: Node<'_>, source: &[u8]) -> Option<String> {
        match node.kind() {
            "identifier" => {
                let name = text(node, source);
                Some(self.aliases.get(name).cloned().unwrap_or_else(|| name.to_owned()))
            }
            "member_expression" => {
                let object = self.qualified(node.child_by_field_name("object")?, source)?;
                Some(format!("{object}.{}", text(node.child_by_field_name("property")?, source)))
            }
            // `require("child_process").exec`.
            "call_expression" => {
                let callee = node.child_by_field_name("function")?;
                if text(callee, source) != "require" {
                    return None;
                }
                literal(*arguments(node).first()?, source).map(|m| module_name(&m).to_owned())
            }
            "parenthesized_expression" => self.qualified(node.named_child(0)?, source),
            _ => None,
        }
    }

    /// `const x = require("m")`, `const { a, b: c } = require("m")`: the names bound.
    fn declarator(&mut self, node: Node<'_>, source: &[u8]) {
        let (Some(name), Some(value)) = (node.child_by_field_name("name"), node.child_by_field_name("value")) else {
            return;
        };
        let Some(module) = self.qualified(value, source) else { return };
        match name.kind() {
            "identifier" => {
                self.aliases.insert(text(name, source).to_owned(), module);
            }
            "object_pattern" => {
                let mut cursor = name.walk();
                for property in name.named_children(&mut cursor) {
                    match property.kind() {
                        "shorthand_property_identifier_pattern" => {
                            let local = text(property, source);
                            self.aliases.insert(local.to_owned(), format!("{module}.{local}"));
                        }
                        "pair_pattern" => {
                            let (Some(key), Some(value)) =
                                (property.child_by_field_name("key"), property.child_by_field_name("value"))
                            else {
                                continue;
                            };
                            self.aliases
                                .insert(text(value, source).to_owned(), format!("{module}.{}", text(key, source)));
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }

    /// `import x from "m"`, `import * as x from "m"`, `import { a as b } from "m"`, `export … from "m"`.
    fn import(&mut self, node: Node<'_>, source: &[u8], imports: &mut Vec<Import>) {
        let Some(module) = node.child_by_field_name("source").and_then(|s| literal(s, source)) else { return };
        let bound = module_name(&module).to_owned();
        imports.push(Import { module: Some(module), at: Position::of(node, source), how: "import" });
        let mut cursor = node.walk();
        let Some(clause) = node.named_children(&mut cursor).find(|c| c.kind() == "import_clause") else { return };
        let mut cursor = clause.walk();
        for part in clause.named_children(&mut cursor) {
            match part.kind() {
                "identifier" => {
                    self.aliases.insert(text(part, source).to_owned(), bound.clone());
                }
                "namespace_import" => {
                    if let Some(local) = part.named_child(0) {
                        self.aliases.insert(text(local, source).to_owned(), bound.clone());
                    }
                }
                "named_imports" => {
                    let mut cursor = part.walk();
                    for specifier in part.named_children(&mut cursor) {
                        let Some(name) = specifier.child_by_field_name("name") else { continue };
                        let local = specifier.child_by_field_name("alias").unwrap_or(name);
                        self.aliases.insert(text(local, source).to_owned(), format!("{bound}.{}", text(name, source)));
                    }
                }
                _ => {}
            }
        }
    }

    fn call(
        &mut self,
        node: Node<'_>,
        callee_node: Node<'_>,
        source: &[u8],
        findings: &mut Findings,
        imports: &mut Vec<Import>,
    ) {
        let at = Position::of(node, source);
        let args = arguments(node);
        let first = args.first().copied();
        if callee_node.kind() == "import"
            || (callee_node.kind() == "identifier" && text(callee_node, source) == "require")
        {
            let module = first.and_then(|a| literal(a, source));
            imports.push(Import {
                module,
                at,
                how: if callee_node.kind() == "import" { "import()" } else { "require" },
            });
            return;
        }
        let Some(callee) = self.qualified(callee_node, source) else { return };
        let callee = callee.strip_prefix("globalThis.").unwrap_or(&callee).to_owned();
        if EVAL_CALLS.contains(&callee.as_str()) {
            let argument = args.iter().map(|a| text(*a, source)).collect::<Vec<_>>().join(",");
            if DECODE_MARKERS.iter().any(|m| argument.contains(m)) {
                findings.push(&OBFUSCATED_EXEC, at, format!("{callee} of decoded code"));
            } else {
                findings.push(&DYNAMIC_EVAL, at, format!("{callee} of a string"));
            }
            return;
        }
        if PROCESS_CALLS.contains(&callee.as_str()) {
            if in_loop(node) {
                findings.push(&FORK_BOMB, at, format!("{callee} in a loop"));
            } else {
                findings.push(&PROCESS_EXEC, at, format!("{callee} starts a program"));
            }
            let line = match (first.and_then(|a| literal(a, source)), args.get(1)) {
                (Some(program), Some(list)) if list.kind() == "array" => {
                    let mut cursor = list.walk();
                    let words: Vec<String> =
                        list.named_children(&mut cursor).filter_map(|w| literal(w, source)).collect();
                    Some(format!("{program} {}", words.join(" ")))
                }
                (line, _) => line,
            };
            if let Some(line) = line {
                scan_command_line(&line, at, findings);
            }
            return;
        }
        if SOCKET_CALLS.contains(&callee.as_str()) {
            findings.push(&RAW_SOCKET, at, format!("{callee} opens a socket"));
            return;
        }
        let Some((object, function)) = callee.rsplit_once('.') else { return };
        if (object == "fs" || object == "fs.promises" || object == "fs/promises")
            && PATH_CALLS.contains(&function)
            && let Some(path) = first.and_then(|a| literal(a, source)).filter(|p| is_sensitive_path(p) || p == "/")
        {
            findings.push(&SENSITIVE_PATH_WRITE, at, format!("{callee} changes {path}"));
        }
    }
}

/// Whether a node is inside a loop (looking up at most 64 levels, stopping at a function).
fn in_loop(node: Node<'_>) -> bool {
    let mut current = node.parent();
    for _ in 0..64 {
        match current {
            Some(n)
                if matches!(n.kind(), "while_statement" | "for_statement" | "do_statement" | "for_in_statement") =>
            {
                return true;
            }
            Some(n)
                if matches!(
                    n.kind(),
                    "function_declaration" | "arrow_function" | "function_expression" | "method_definition"
                ) =>
            {
                return false;
            }
            Some(n) => current = n.parent(),
            None => return false,
        }
    }
    false
}

impl LanguageScan for JavascriptScan {
    fn grammar() -> Language {
        tree_sitter_javascript::LANGUAGE.into()
    }

    fn visit(&mut self, node: Node<'_>, source: &[u8], findings: &mut Findings, imports: &mut Vec<Import>) {
        match node.kind() {
            "import_statement" | "export_statement" => self.import(node, source, imports),
            "variable_declarator" => self.declarator(node, source),
            "call_expression" => {
                if let Some(callee) = node.child_by_field_name("function") {
                    self.call(node, callee, source, findings, imports);
                }
            }
            "new_expression" => {
                if let Some(callee) = node.child_by_field_name("constructor") {
                    self.call(node, callee, source, findings, imports);
                }
            }
            _ => {}
        }
    }

    fn finish(&mut self, findings: &mut Findings, imports: &[Import]) {
        for import in imports {
            if let Some(module) = &import.module {
                let top = module_name(module).split('/').next().unwrap_or(module);
                if SENSITIVE_MODULES.contains(&top) {
                    findings.push(&SENSITIVE_IMPORT, import.at, format!("require of '{module}'"));
                }
            }
        }
    }
}
