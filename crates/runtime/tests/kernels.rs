//! The code-interpreter kernels (`resources/kernels/`) run directly on the host, outside any sandbox: state across
//! cells, last-expression values, errors with tracebacks, rich results (matplotlib PNG, pandas HTML, when those
//! libraries are installed), interrupts that leave the context alive, and the same basics for JavaScript; modules named
//! as arguments are loaded before "ready" and the arguments are hidden from cells (a pool member's spare kernel).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use sandkasten_runtime::live::contexts::{BASH_KERNEL, NODE_KERNEL, PYTHON_KERNEL};
use serde_json::{Value, json};

struct Kernel {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next: u64,
    _config: tempfile::TempDir,
}

/// A cell's reply with the streams gathered.
struct Cell {
    reply: Value,
    stdout: String,
    stderr: String,
}

impl Cell {
    fn text(&self) -> Option<&str> {
        self.reply["results"].as_array()?.iter().find(|r| r["is_main_result"] == true)?["text/plain"].as_str()
    }
}

impl Kernel {
    fn start(program: &str, flag: &str, source: &str) -> Option<Kernel> {
        Kernel::start_with(program, flag, source, &[])
    }

    /// A kernel started with `preload` arguments (a pool member's spare kernel).
    fn start_with(program: &str, flag: &str, source: &str, preload: &[&str]) -> Option<Kernel> {
        if !Path::new(program).exists() {
            eprintln!("skipped: {program} is not installed");
            return None;
        }
        let config = tempfile::tempdir().unwrap();
        // In a process group of its own, as in a sandbox (the host's interrupt goes to the group).
        let mut child = Command::new(program)
            .process_group(0)
            .args([flag, source])
            .args(preload)
            .env("MPLCONFIGDIR", config.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut kernel = Kernel { child, stdin, stdout, next: 1, _config: config };
        let ready = kernel.message();
        assert_eq!(ready["type"], "ready", "{ready}");
        Some(kernel)
    }

    fn python() -> Option<Kernel> {
        Kernel::start("/usr/bin/python3", "-c", PYTHON_KERNEL)
    }

    fn node() -> Option<Kernel> {
        Kernel::node_with(&[])
    }

    fn bash() -> Option<Kernel> {
        Kernel::start("/usr/bin/python3", "-c", BASH_KERNEL)
    }

    /// Runs `code` with `env` for this cell only.
    fn run_with_env(&mut self, code: &str, env: Value) -> Cell {
        let id = self.next;
        self.next += 1;
        let request = json!({"id": id, "code": code, "env": env, "timeout_ms": 30_000});
        writeln!(self.stdin, "{request}").unwrap();
        self.stdin.flush().unwrap();
        self.wait(id)
    }

    fn node_with(preload: &[&str]) -> Option<Kernel> {
        let Some(node) = ["/usr/bin/node", "/usr/local/bin/node"].into_iter().find(|p| Path::new(p).exists()) else {
            eprintln!("skipped: node is not installed");
            return None;
        };
        Kernel::start_with(node, "-e", NODE_KERNEL, preload)
    }

    fn message(&mut self) -> Value {
        let mut line = String::new();
        assert!(self.stdout.read_line(&mut line).unwrap() > 0, "the kernel closed its stdout");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not a message ({e}): {line:?}"))
    }

    fn send(&mut self, code: &str, timeout_ms: u64) -> u64 {
        let id = self.next;
        self.next += 1;
        let request = json!({"id": id, "code": code, "timeout_ms": timeout_ms});
        writeln!(self.stdin, "{request}").unwrap();
        self.stdin.flush().unwrap();
        id
    }

    fn wait(&mut self, id: u64) -> Cell {
        let (mut stdout, mut stderr) = (String::new(), String::new());
        loop {
            let message = self.message();
            match message["type"].as_str() {
                Some("stream") if message["name"] == "stdout" => stdout.push_str(message["text"].as_str().unwrap()),
                Some("stream") => stderr.push_str(message["text"].as_str().unwrap()),
                Some("reply") if message["id"] == id => return Cell { reply: message, stdout, stderr },
                _ => {}
            }
        }
    }

    fn run(&mut self, code: &str) -> Cell {
        let id = self.send(code, 30_000);
        self.wait(id)
    }

    fn interrupt(&self) {
        let status = Command::new("kill").args(["-INT", &self.child.id().to_string()]).status().unwrap();
        assert!(status.success());
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn has_module(module: &str) -> bool {
    let found = Command::new("/usr/bin/python3").args(["-c", &format!("import {module}")]).status();
    let ok = found.is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipped: python3 has no {module}");
    }
    ok
}

#[test]
fn python_state_persists_and_the_last_expression_is_the_result() {
    let Some(mut k) = Kernel::python() else { return };
    let first = k.run("x = 41\nprint('set')");
    assert_eq!(first.stdout, "set\n");
    assert_eq!(first.reply["results"], json!([]));
    assert_eq!(first.reply["execution_count"], 1);
    let second = k.run("x + 1");
    assert_eq!(second.text(), Some("42"));
    assert_eq!(second.reply["execution_count"], 2);
    assert_eq!(second.reply["error"], Value::Null);
    assert_eq!(k.run("def f(a):\n    return a * 2\nimport math").text(), None);
    assert_eq!(k.run("f(x) + math.floor(0.5)").text(), Some("82"));
    let subprocess = k.run("import os, sys\nprint('err', file=sys.stderr)\nos.system('echo from-a-child')\nNone");
    assert_eq!(subprocess.stdout, "from-a-child\n");
    assert_eq!(subprocess.stderr, "err\n");
    // The requests on the kernel's stdin are out of the cell's reach.
    assert_eq!(k.run("repr(__import__('sys').stdin.read())").text(), Some("\"''\""));
}

#[test]
fn python_errors_carry_name_value_and_the_users_traceback() {
    let Some(mut k) = Kernel::python() else { return };
    let cell = k.run("def g():\n    return 1 / 0\ng()");
    let error = &cell.reply["error"];
    assert_eq!(error["name"], "ZeroDivisionError");
    assert_eq!(error["value"], "division by zero");
    let traceback: Vec<&str> = error["traceback"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect();
    assert!(traceback.iter().any(|l| l.contains("<cell-1>\", line 3")), "{traceback:?}");
    assert!(traceback.iter().any(|l| l.contains("return 1 / 0")), "{traceback:?}");
    assert!(!traceback.iter().any(|l| l.contains("<string>")), "kernel frames leak: {traceback:?}");
    assert_eq!(k.run("syntax error here").reply["error"]["name"], "SyntaxError");
    assert_eq!(k.run("raise SystemExit(3)").reply["error"]["name"], "SystemExit");
    assert_eq!(k.run("'still alive'").text(), Some("'still alive'"));
}

#[test]
fn python_interrupt_raises_keyboard_interrupt_and_the_context_survives() {
    let Some(mut k) = Kernel::python() else { return };
    k.run("x = 41");
    let id = k.send("while True:\n    pass", 60_000);
    std::thread::sleep(Duration::from_millis(300));
    k.interrupt();
    let cell = k.wait(id);
    assert_eq!(cell.reply["error"]["name"], "KeyboardInterrupt", "{}", cell.reply);
    let traceback = cell.reply["error"]["traceback"].to_string();
    assert!(!traceback.contains("_on_sigint"), "{traceback}");
    // An interrupt between cells is ignored.
    k.interrupt();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(k.run("x + 1").text(), Some("42"));
}

#[test]
fn python_matplotlib_figures_are_png() {
    if !has_module("matplotlib") {
        return;
    }
    let Some(mut k) = Kernel::python() else { return };
    let cell = k.run("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nNone");
    assert_eq!(cell.reply["error"], Value::Null, "{}", cell.reply);
    let results = cell.reply["results"].as_array().unwrap();
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0]["is_main_result"], false);
    let png = base64::engine::general_purpose::STANDARD.decode(results[0]["image/png"].as_str().unwrap()).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    // The figure was closed: the next cell has only its own value.
    assert_eq!(k.run("1").reply["results"].as_array().unwrap().len(), 1);
}

#[test]
fn python_dataframes_are_html() {
    if !has_module("pandas") {
        return;
    }
    let Some(mut k) = Kernel::python() else { return };
    let cell = k.run("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})");
    let result = &cell.reply["results"][0];
    assert!(result["text/html"].as_str().unwrap().contains("<table"), "{result}");
    assert!(result["text/plain"].as_str().unwrap().contains('a'));
    assert_eq!(result["is_main_result"], true);
}

#[test]
fn javascript_state_persists_and_errors_are_structured() {
    let Some(mut k) = Kernel::node() else { return };
    let first = k.run("let x = 41; console.log('set', {a: 1})");
    assert_eq!(first.stdout, "set { a: 1 }\n");
    assert_eq!(k.run("x + 1").text(), Some("42"));
    assert_eq!(k.run("await Promise.resolve(x * 2)").text(), Some("82"));
    let cell = k.run("function boom() { throw new RangeError('bad') }\nboom()");
    assert_eq!(cell.reply["error"]["name"], "RangeError");
    assert_eq!(cell.reply["error"]["value"], "bad");
    assert!(cell.reply["error"]["traceback"].to_string().contains("boom"));
    assert_eq!(k.run("console.error('e'); 'ok'").stderr, "e\n");
}

#[test]
fn javascript_timeout_stops_the_cell_and_the_context_survives() {
    let Some(mut k) = Kernel::node() else { return };
    k.run("var y = 41");
    let id = k.send("while (true) {}", 300);
    let cell = k.wait(id);
    assert_eq!(cell.reply["error"]["name"], "TimeoutError", "{}", cell.reply);
    assert_eq!(k.run("y + 1").text(), Some("42"));
}

#[test]
fn python_preloads_its_arguments_before_ready_and_hides_them() {
    let Some(mut cold) = Kernel::python() else { return };
    let probe = "import sys\n('fractions' in sys.modules, 'no_such_module_x' in sys.modules, sys.argv)";
    assert_eq!(cold.run(probe).text(), Some("(False, False, ['-c'])"), "the kernel itself does not import fractions");
    let Some(mut spare) =
        Kernel::start_with("/usr/bin/python3", "-c", PYTHON_KERNEL, &["fractions", "no_such_module_x"])
    else {
        return;
    };
    let preloaded = spare.run(probe);
    assert_eq!(preloaded.text(), Some("(True, False, ['-c'])"), "{}", preloaded.reply);
    assert_eq!(spare.run("'fractions' in globals()").text(), Some("False"), "imported, not bound in the cell's scope");
    assert_eq!(spare.run("n = 1\nn + 1").text(), Some("2"));
}

#[test]
fn javascript_preloads_its_arguments_before_ready_and_hides_them() {
    let dir = tempfile::tempdir().unwrap();
    let module = dir.path().join("preloaded.js");
    let marker = dir.path().join("loaded");
    std::fs::write(&module, format!("require('fs').writeFileSync({:?}, '1');", marker.to_str().unwrap())).unwrap();
    let Some(mut spare) = Kernel::node_with(&[module.to_str().unwrap(), "no-such-module-x"]) else { return };
    assert!(marker.exists(), "the module was required before the kernel reported ready");
    let cached = format!("[process.argv.length, {:?} in require.cache]", module.to_str().unwrap());
    assert_eq!(spare.run(&cached).text(), Some("[ 1, true ]"));
    assert_eq!(spare.run("let n = 1; n + 1").text(), Some("2"));
}

#[test]
fn a_cells_env_is_put_back_after_it_in_every_kernel() {
    let checks: [(Option<Kernel>, &str); 3] = [
        (Kernel::python(), "import os; print(os.environ.get('CELL_VAR', 'unset'), os.environ['HOME'])"),
        (Kernel::node(), "console.log(process.env.CELL_VAR || 'unset', process.env.HOME)"),
        (Kernel::bash(), "echo ${CELL_VAR:-unset} $HOME"),
    ];
    for (kernel, code) in checks {
        let Some(mut k) = kernel else { continue };
        let home = std::env::var("HOME").unwrap();
        let inside = k.run_with_env(code, json!({"CELL_VAR": "set", "HOME": "/elsewhere"}));
        assert_eq!(inside.stdout, "set /elsewhere\n", "{code}");
        let after = k.run(code);
        assert_eq!(after.stdout, format!("unset {home}\n"), "{code}: removed, and HOME has its own value again");
    }
}

#[test]
fn bash_cells_share_one_shell_and_an_interrupt_stops_only_the_cell() {
    let Some(mut k) = Kernel::bash() else { return };
    let first = k.run("cd /tmp; X=41; echo out; echo err >&2");
    assert_eq!((first.stdout.as_str(), first.stderr.as_str()), ("out\n", "err\n"));
    assert_eq!(first.reply["error"], Value::Null);
    assert_eq!(k.run("echo $((X + 1)) $(pwd)").stdout, "42 /tmp\n");
    let failed = k.run("exit_with() { return $1; }; exit_with 3");
    assert_eq!(failed.reply["error"]["value"], "3", "{}", failed.reply);
    let id = k.send("sleep 30; echo not-reached", 30_000);
    std::thread::sleep(Duration::from_millis(300));
    // The host signals the kernel's whole process group.
    let group = format!("-{}", k.child.id());
    let _ = Command::new("kill").args(["-INT", "--", &group]).status();
    let interrupted = k.wait(id);
    assert_eq!(interrupted.stdout, "");
    assert_eq!(interrupted.reply["error"]["value"], "130", "{}", interrupted.reply);
    assert_eq!(k.run("echo $X").stdout, "41\n", "the shell lives on");
}
