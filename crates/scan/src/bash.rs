//! Bash: its rule table and the visitor. Also scans the command lines other languages hand to a shell
//! (`os.system`, `subprocess`, `child_process`), so `rm -rf /` is caught wherever it is run from.

use tree_sitter::{Language, Node};

use crate::engine::{LanguageScan, parse, walk};
use crate::finding::Severity;
use crate::findings::{Findings, Position};
use crate::imports::Import;
use crate::rules::{Rule, SENSITIVE_PATH_WRITE, is_sensitive_path};

/// `rm -rf /`, `mkfs`, `dd of=/dev/sda` and the like.
pub const DESTRUCTIVE_COMMAND: Rule = Rule {
    id: "destructive_command",
    severity: Severity::Critical,
    explanation: "this would destroy the filesystem; delete only the files your task created, by their paths",
};
/// A function that calls itself in a pipe or in the background: `:(){ :|:& };:`.
pub const FORK_BOMB: Rule = Rule {
    id: "fork_bomb",
    severity: Severity::Critical,
    explanation: "this multiplies processes until the limit kills the sandbox; start a bounded number of processes",
};
/// `/dev/tcp/...`, `nc -e`: a raw network connection from the shell.
pub const RAW_SOCKET: Rule = Rule {
    id: "raw_socket",
    severity: Severity::High,
    explanation: "raw network connections from generated code look like a reverse shell; use an HTTP client for \
                  the hosts your task needs",
};
/// A shell handed to a network connection (`nc -e /bin/sh`, `bash -i >& /dev/tcp/…`).
pub const REVERSE_SHELL: Rule = Rule {
    id: "reverse_shell",
    severity: Severity::Critical,
    explanation: "this hands a shell to a remote host; remove it",
};
/// `eval` of a string.
pub const DYNAMIC_EVAL: Rule = Rule {
    id: "dynamic_eval",
    severity: Severity::High,
    explanation: "evaluating a computed string hides what runs; write the commands out",
};
/// Decoded data piped into a shell (`base64 -d | sh`).
pub const OBFUSCATED_EXEC: Rule = Rule {
    id: "obfuscated_exec",
    severity: Severity::Critical,
    explanation: "running decoded data hides what runs; write the code out in plain text",
};
/// A download piped into a shell (`curl … | sh`).
pub const DOWNLOAD_EXEC: Rule = Rule {
    id: "download_exec",
    severity: Severity::High,
    explanation: "running a script straight from the network skips any review; download it, inspect it, then run it",
};

/// Bash's rules, for listing.
pub const RULES: &[&Rule] =
    &[&DESTRUCTIVE_COMMAND, &FORK_BOMB, &RAW_SOCKET, &REVERSE_SHELL, &DYNAMIC_EVAL, &OBFUSCATED_EXEC, &DOWNLOAD_EXEC];

/// Targets that `rm -r` must not get: the root, the home directory, system directories, everything.
const PRECIOUS: &[&str] =
    &["/", "/*", "~", "~/", "~/*", "$HOME", "${HOME}", "$HOME/", "$HOME/*", "/home", "/root", "*", ".", "..", "/."];
/// Shells and interpreters that run what is piped into them.
const SHELLS: &[&str] = &["sh", "bash", "zsh", "dash", "ksh", "python", "python3", "perl", "node", "ruby"];
/// Commands that decode data.
const DECODERS: &[&str] = &["base64", "base32", "xxd", "openssl", "uudecode", "gunzip", "zcat", "rev"];
/// Commands that download.
const DOWNLOADERS: &[&str] = &["curl", "wget", "fetch"];
/// Commands that change the paths among their arguments.
const PATH_WRITERS: &[&str] = &[
    "tee", "rm", "chmod", "chown", "chgrp", "truncate", "touch", "mkdir", "rmdir", "cp", "mv", "ln", "install", "shred",
];
/// Commands that run the command in their arguments.
const WRAPPERS: &[&str] =
    &["sudo", "doas", "env", "nohup", "timeout", "exec", "command", "nice", "xargs", "time", "stdbuf"];
/// Netcat-like commands whose `-e`/`-c` run a program on the connection.
const NETCATS: &[&str] = &["nc", "ncat", "netcat", "socat"];

/// The bash scanner (no state of its own).
#[derive(Default)]
pub(crate) struct BashScan {
    /// Where findings go when the bash is a command line inside another language's string (then every finding
    /// points at that string).
    anchor: Option<Position>,
}

fn text<'s>(node: Node<'_>, source: &'s [u8]) -> &'s str {
    std::str::from_utf8(source.get(node.byte_range()).unwrap_or_default()).unwrap_or_default()
}

/// A word as the shell would see it when it is literal: quotes removed.
fn unquoted<'s>(node: Node<'_>, source: &'s [u8]) -> &'s str {
    let raw = text(node, source);
    match node.kind() {
        "raw_string" => raw.trim_matches('\''),
        "string" => raw.trim_matches('"'),
        _ => raw,
    }
}

/// The program a command name runs (`/bin/rm` → `rm`).
fn program(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

impl BashScan {
    fn at(&self, node: Node<'_>, source: &[u8]) -> Position {
        self.anchor.unwrap_or_else(|| Position::of(node, source))
    }

    fn command(&self, node: Node<'_>, source: &[u8], findings: &mut Findings) {
        let Some(name) = node.child_by_field_name("name") else { return };
        let mut name = program(text(name, source));
        let mut cursor = node.walk();
        let mut args: Vec<&str> =
            node.children_by_field_name("argument", &mut cursor).map(|a| unquoted(a, source)).collect();
        // `sudo rm -rf /`, `env X=1 rm …`, `timeout 5 rm …`: the command they run.
        while WRAPPERS.contains(&name) {
            let Some(index) =
                args.iter().position(|a| !a.starts_with('-') && !a.contains('=') && a.parse::<f64>().is_err())
            else {
                break;
            };
            name = program(args[index]);
            args.drain(..=index);
        }
        let at = self.at(node, source);
        for arg in &args {
            if arg.contains("/dev/tcp/") || arg.contains("/dev/udp/") {
                findings.push(&RAW_SOCKET, at, format!("{name} reaches {arg}"));
            }
        }
        match name {
            "rm" => {
                let flags: String =
                    args.iter().filter(|a| a.starts_with('-') && !a.starts_with("--")).map(|a| &a[1..]).collect();
                let recursive = flags.contains('r') || flags.contains('R') || args.contains(&"--recursive");
                let no_preserve = args.contains(&"--no-preserve-root");
                if let Some(target) = args.iter().find(|a| PRECIOUS.contains(a) || is_system_dir(a))
                    && (recursive || no_preserve)
                {
                    findings.push(&DESTRUCTIVE_COMMAND, at, format!("rm -r of {target}"));
                    return;
                }
            }
            "dd" => {
                if let Some(of) = args.iter().find_map(|a| a.strip_prefix("of=")).filter(|of| {
                    of.starts_with("/dev/sd")
                        || of.starts_with("/dev/nvme")
                        || of.starts_with("/dev/vd")
                        || of.starts_with("/dev/xvd")
                }) {
                    findings.push(&DESTRUCTIVE_COMMAND, at, format!("dd onto the disk {of}"));
                    return;
                }
                if let Some(of) = args.iter().find_map(|a| a.strip_prefix("of=")).filter(|of| is_sensitive_path(of)) {
                    findings.push(&SENSITIVE_PATH_WRITE, at, format!("dd writes {of}"));
                }
            }
            _ if name.starts_with("mkfs") || name == "wipefs" => {
                findings.push(&DESTRUCTIVE_COMMAND, at, format!("{name} formats a filesystem"));
                return;
            }
            "eval" => findings.push(&DYNAMIC_EVAL, at, "eval of a string"),
            // `bash -c 'rm -rf /'`: the command line is bash too (one level: its own findings point here).
            _ if SHELLS[..5].contains(&name) && self.anchor.is_none() => {
                if let Some(line) = args.iter().position(|a| *a == "-c").and_then(|i| args.get(i + 1)) {
                    scan_command_line(line, at, findings);
                }
            }
            _ if NETCATS.contains(&name)
                && args
                    .iter()
                    .any(|a| *a == "-e" || *a == "-c" || a.starts_with("exec:") || a.starts_with("EXEC:")) =>
            {
                findings.push(&REVERSE_SHELL, at, format!("{name} runs a program on a network connection"));
            }
            _ => {}
        }
        if PATH_WRITERS.contains(&name) {
            let candidates: &[&str] = if matches!(name, "cp" | "mv" | "ln" | "install") {
                args.last().map(std::slice::from_ref).unwrap_or_default()
            } else {
                &args
            };
            if let Some(path) = candidates.iter().find(|a| is_sensitive_path(a)) {
                findings.push(&SENSITIVE_PATH_WRITE, at, format!("{name} changes {path}"));
            }
        }
    }

    fn redirect(&self, node: Node<'_>, source: &[u8], findings: &mut Findings) {
        let Some(destination) = node.child_by_field_name("destination") else { return };
        let destination_text = unquoted(destination, source);
        let at = self.at(node, source);
        if destination_text.contains("/dev/tcp/") || destination_text.contains("/dev/udp/") {
            let shell =
                node.parent().and_then(|p| p.child_by_field_name("body")).and_then(|b| b.child_by_field_name("name"));
            if shell.is_some_and(|s| SHELLS.contains(&program(text(s, source)))) {
                findings.push(&REVERSE_SHELL, at, format!("a shell's input and output go to {destination_text}"));
            }
            findings.push(&RAW_SOCKET, at, format!("a redirection to {destination_text}"));
            return;
        }
        let mut cursor = node.walk();
        let writes = node.children(&mut cursor).any(|c| matches!(c.kind(), ">" | ">>" | ">|" | "&>" | "&>>" | ">&"));
        if writes && is_sensitive_path(destination_text) {
            findings.push(&SENSITIVE_PATH_WRITE, at, format!("a redirection writes {destination_text}"));
        }
    }

    fn pipeline(&self, node: Node<'_>, source: &[u8], findings: &mut Findings) {
        let mut cursor = node.walk();
        let names: Vec<&str> = node
            .named_children(&mut cursor)
            .filter_map(|c| c.child_by_field_name("name").map(|n| program(text(n, source))))
            .collect();
        let Some((last, earlier)) = names.split_last() else { return };
        if !SHELLS.contains(last) {
            return;
        }
        let at = self.at(node, source);
        if let Some(decoder) = earlier.iter().find(|n| DECODERS.contains(n)) {
            findings.push(&OBFUSCATED_EXEC, at, format!("{decoder} output piped into {last}"));
        } else if let Some(downloader) = earlier.iter().find(|n| DOWNLOADERS.contains(n)) {
            findings.push(&DOWNLOAD_EXEC, at, format!("{downloader} output piped into {last}"));
        }
    }

    /// `f(){ f|f& }`: a function whose body runs itself in a pipe or in the background.
    fn function(&self, node: Node<'_>, source: &[u8], findings: &mut Findings) {
        let (Some(name), Some(body)) = (node.child_by_field_name("name"), node.child_by_field_name("body")) else {
            return;
        };
        let name = text(name, source);
        let body_text = text(body, source);
        if !(body_text.contains('|') || body_text.contains('&')) {
            return;
        }
        // A bounded look at the body's commands (a fork bomb is short).
        let mut cursor = body.walk();
        let mut seen = 0;
        let mut calls_itself = false;
        'walk: loop {
            let current = cursor.node();
            seen += 1;
            if current.kind() == "command"
                && current.child_by_field_name("name").is_some_and(|n| text(n, source) == name)
            {
                calls_itself = true;
                break;
            }
            if seen > 256 {
                break;
            }
            if cursor.goto_first_child() {
                continue;
            }
            loop {
                if cursor.goto_next_sibling() {
                    break;
                }
                if !cursor.goto_parent() || cursor.node() == body {
                    break 'walk;
                }
            }
        }
        if calls_itself {
            findings.push(&FORK_BOMB, self.at(node, source), format!("function {name} starts copies of itself"));
        }
    }
}

/// System directories a recursive removal must not get.
fn is_system_dir(path: &str) -> bool {
    let trimmed = path.trim_end_matches('/').trim_end_matches("/*");
    matches!(trimmed, "/etc" | "/usr" | "/var" | "/bin" | "/sbin" | "/lib" | "/lib64" | "/boot" | "/opt" | "/srv")
}

impl LanguageScan for BashScan {
    fn grammar() -> Language {
        tree_sitter_bash::LANGUAGE.into()
    }

    fn visit(&mut self, node: Node<'_>, source: &[u8], findings: &mut Findings, _imports: &mut Vec<Import>) {
        match node.kind() {
            "command" => self.command(node, source, findings),
            "file_redirect" => self.redirect(node, source, findings),
            "pipeline" => self.pipeline(node, source, findings),
            "function_definition" => self.function(node, source, findings),
            _ => {}
        }
    }
}

/// Scans a command line another language hands to a shell; its findings point at `at` (the string).
pub(crate) fn scan_command_line(line: &str, at: Position, findings: &mut Findings) {
    let source = line.as_bytes();
    let mut scanner = BashScan { anchor: Some(at) };
    match parse(&BashScan::grammar(), source, findings) {
        Ok(Some(tree)) => walk(&mut scanner, &tree, source, findings, &mut Vec::new()),
        Ok(None) => findings.stop("parsing a command line reached its deadline"),
        // The same grammar parsed (or will parse) bash code; a load failure here is not the input's.
        Err(_) => findings.stop("the bash grammar could not be loaded"),
    }
}
