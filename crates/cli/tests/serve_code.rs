//! End to end against a real `sandkasten serve`: stateful code contexts. Python variables persist across cells
//! (`x = 41`, then `x + 1` is `42`), matplotlib figures come back as PNG and DataFrames as HTML, exceptions carry a
//! traceback, a cell past its timeout is interrupted (KeyboardInterrupt) and the context survives, JavaScript state
//! persists, two contexts share nothing, output streams over SSE, and deleting the sandbox leaves no kernel process,
//! cgroup or record behind. The Java kernel keeps declarations, answers values and errors and survives interrupts; so
//! does the R kernel, which also answers plots and starts in its context's directory.
//!
//! Every test runs on each isolation tier (`process::NAME`, `gvisor::NAME` and `microvm::NAME`, see `per_tier!`).

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::Tier;
use serde_json::{Value, json};

const KEY: &str = "code-tenant-key-0123456789abcdef";

/// A `sandkasten serve` process; SIGTERM and wait on drop.
struct Server {
    child: Child,
    base: String,
    agent: ureq::Agent,
    _dir: tempfile::TempDir,
}

/// An HTTP answer.
#[derive(Debug)]
struct Reply {
    status: u16,
    text: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

impl Server {
    /// A server whose creates that name no tier get `tier` (`[defaults] isolation`).
    fn start_on(tier: Tier) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let config = dir.path().join("sandkasten.toml");
        std::fs::write(&config, format!("[defaults]\nisolation = \"{tier}\"\n")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_sandkasten"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--config"])
            .arg(&config)
            .arg("--database")
            .arg(dir.path().join("sandkasten.db"))
            .env("SANDKASTEN_API_KEYS", format!("code:{KEY}"))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(120)))
            .build();
        let server = Server { child, base: format!("http://127.0.0.1:{port}"), agent: config.into(), _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(response) = server.agent.get(format!("{}/healthz", server.base)).call()
                && response.status() == 200
            {
                return server;
            }
            assert!(Instant::now() < deadline, "the server did not answer /healthz");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Reply {
        let url = format!("{}{path}", self.base);
        let auth = format!("Bearer {KEY}");
        let response = match (method, body) {
            ("GET", _) => self.agent.get(&url).header("authorization", &auth).call(),
            ("DELETE", _) => self.agent.delete(&url).header("authorization", &auth).call(),
            (_, Some(body)) => self.agent.post(&url).header("authorization", &auth).send_json(body),
            (_, None) => self.agent.post(&url).header("authorization", &auth).send_empty(),
        };
        let mut response = response.unwrap();
        let status = response.status().as_u16();
        let text = response.body_mut().with_config().limit(64 << 20).read_to_string().unwrap();
        Reply { status, text }
    }

    fn stream(&self, path: &str, body: Value) -> String {
        let mut response = self
            .agent
            .post(format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {KEY}"))
            .header("accept", "text/event-stream")
            .send_json(body)
            .unwrap();
        assert_eq!(response.status(), 200);
        response.body_mut().read_to_string().unwrap()
    }

    /// Runs a cell and returns the 200 answer's JSON.
    fn code(&self, id: &str, body: Value) -> Value {
        let reply = self.call("POST", &format!("/v1/sandboxes/{id}/code"), Some(body));
        assert_eq!(reply.status, 200, "{reply:?}");
        reply.json()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: kill has no memory-safety preconditions; the pid is our own child, not yet reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn main_text(outcome: &Value) -> Option<&str> {
    outcome["results"].as_array()?.iter().find(|r| r["is_main_result"] == true)?["text/plain"].as_str()
}

/// Host pids of sandbox `id`'s kernels (sandbox uids, in its cgroup, running a kernel; a microVM's VMM, whose
/// command line names its `sandkasten-…` disks, is not one).
fn kernel_pids(id: &str) -> Vec<u32> {
    common::processes_in_cgroup_matching(id)
        .into_iter()
        .map(|(pid, _)| pid)
        .filter(|pid| common::process_uid(*pid).is_some_and(|uid| uid >= common::SANDBOX_UID_BASE))
        .filter(|pid| {
            let cmdline = common::cmdline(*pid);
            cmdline.contains("sandkasten") && !cmdline.contains("qemu-system")
        })
        .collect()
}

fn has_python_module(module: &str) -> bool {
    Command::new("/usr/bin/python3").args(["-c", &format!("import {module}")]).status().is_ok_and(|s| s.success())
}

per_tier!(
    code_contexts_keep_state_return_rich_results_survive_interrupts_and_clean_up,
    java_contexts_keep_declarations_answer_values_and_errors_and_survive_interrupts,
    r_contexts_keep_state_answer_printed_values_plots_and_errors_and_survive_interrupts,
);

fn code_contexts_keep_state_return_rich_results_survive_interrupts_and_clean_up(tier: Tier) {
    let _lock = common::shared_lock();
    let server = Server::start_on(tier);
    // Cells run up to the sandbox's command limit, 10 s by default: an emulated CPU (a microVM under TCG) takes
    // ~25 s to import matplotlib.
    let timeout_ms = if tier == Tier::Microvm { 120_000 } else { 10_000 };
    let body =
        json!({"isolation": tier.name(), "limits": {"memory_bytes": 1_073_741_824u64, "timeout_ms": timeout_ms}});
    let created = server.call("POST", "/v1/sandboxes", Some(body));
    assert_eq!(created.status, 201, "{created:?}");
    assert_eq!(created.json()["isolation"]["tier"], tier.name(), "{created:?}");
    let id = created.json()["id"].as_str().unwrap().to_owned();
    let py = |code: &str| server.code(&id, json!({"language": "python", "code": code}));

    // State persists across cells.
    let first = py("x = 41\nprint('set')");
    assert_eq!(first["stdout"], "set\n");
    assert_eq!(first["execution_count"], 1);
    let default_context = first["context_id"].as_str().unwrap().to_owned();
    let second = py("x + 1");
    assert_eq!(main_text(&second), Some("42"), "{second}");
    assert_eq!(second["context_id"], default_context.as_str());
    assert_eq!(second["execution_count"], 2);

    // Rich results.
    if has_python_module("matplotlib") {
        let plot = py("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.title('t')");
        assert_eq!(plot["error"], Value::Null, "{plot}");
        let png = plot["results"].as_array().unwrap().iter().find_map(|r| r["image/png"].as_str()).unwrap();
        assert!(common::base64_decode(png).starts_with(b"\x89PNG\r\n\x1a\n"));
    } else {
        eprintln!("skipped: matplotlib is not installed (scripts/setup.sh installs it)");
    }
    if has_python_module("pandas") {
        let frame = py("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})");
        assert!(frame["results"][0]["text/html"].as_str().unwrap().contains("<table"), "{frame}");
    } else {
        eprintln!("skipped: pandas is not installed (scripts/setup.sh installs it)");
    }

    // Errors.
    let raised = py("def g():\n    return 1 / 0\ng()");
    assert_eq!(raised["error"]["name"], "ZeroDivisionError");
    let traceback = raised["error"]["traceback"].to_string();
    assert!(traceback.contains("return 1 / 0"), "{traceback}");

    // A cell past its timeout is interrupted; the context survives.
    let started = Instant::now();
    let spin = server.code(&id, json!({"language": "python", "code": "while True: pass", "timeout_ms": 1000}));
    assert_eq!(spin["error"]["name"], "KeyboardInterrupt", "{spin}");
    assert_eq!(spin["context_restarted"], false);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(main_text(&py("x")), Some("41"), "the context kept its state");

    // JavaScript.
    let js = |code: &str| server.code(&id, json!({"language": "javascript", "code": code}));
    js("let y = 41");
    let js_answer = js("y + 1");
    assert_eq!(main_text(&js_answer), Some("42"), "{js_answer}");
    assert_ne!(js_answer["context_id"], default_context.as_str());

    // TypeScript: the JavaScript kernel, cells transpiled (types stripped), a context of its own.
    let ts = |code: &str| server.code(&id, json!({"language": "typescript", "code": code}));
    ts("interface P { v: number }\nconst p: P = { v: 20 }");
    let ts_answer = ts("(p.v as number) * 2 + (typeof y)");
    assert_eq!(main_text(&ts_answer), Some("'40undefined'"), "{ts_answer}");
    let ts_broken = ts("let z: = 1");
    assert_eq!(ts_broken["error"]["name"], "SyntaxError", "{ts_broken}");

    // Two contexts share nothing.
    let other = server.call("POST", &format!("/v1/sandboxes/{id}/contexts"), Some(json!({"language": "python"})));
    assert_eq!(other.status, 201, "{other:?}");
    let other_id = other.json()["id"].as_str().unwrap().to_owned();
    let isolated = server.code(&id, json!({"context_id": other_id, "code": "x"}));
    assert_eq!(isolated["error"]["name"], "NameError", "{isolated}");
    let listed = server.call("GET", &format!("/v1/sandboxes/{id}/contexts"), None).json();
    assert_eq!(listed["contexts"].as_array().unwrap().len(), 4, "{listed}");

    // Output streams as events.
    let events = server
        .stream(&format!("/v1/sandboxes/{id}/code"), json!({"language": "python", "code": "print('streamed')\nx * 2"}));
    let stdout = events.find("event: stdout").unwrap_or_else(|| panic!("{events}"));
    let result = events.find("event: result").unwrap_or_else(|| panic!("{events}"));
    let end = events.find("event: end").unwrap_or_else(|| panic!("{events}"));
    assert!(stdout < result && result < end, "{events}");
    assert!(events.contains("\"text/plain\":\"82\""), "{events}");

    // Restart and remove.
    let restarted = server.call("POST", &format!("/v1/sandboxes/{id}/contexts/{default_context}/restart"), None);
    assert_eq!(restarted.status, 200, "{restarted:?}");
    let after_restart = py("'x' in globals()");
    assert_eq!(main_text(&after_restart), Some("False"), "{after_restart}");
    let removed = server.call("DELETE", &format!("/v1/sandboxes/{id}/contexts/{other_id}"), None);
    assert_eq!(removed.status, 204, "{removed:?}");

    // Deleting the sandbox leaves nothing.
    let kernels = kernel_pids(&id);
    if tier != Tier::Process {
        // gVisor and microVM: the kernels are processes of the guest's kernel (the Sentry, the VM's own), not of the
        // host. The guest lists them; on the host only runsc, the Sentry and the gofer (QEMU) run, and
        // `assert_gone` checks they are gone.
        assert!(kernels.is_empty(), "guest processes are host processes: {kernels:?}");
        let list = "for f in /proc/[0-9]*/cmdline; do head -c 100 $f | tr '\\0' ' '; echo; done";
        let inside = server.call("POST", &format!("/v1/sandboxes/{id}/exec"), Some(json!({ "cmd": list })));
        let listing = inside.json()["stdout"].as_str().unwrap_or_default().to_owned();
        for kernel in ["sandkasten Python kernel", "sandkasten JavaScript kernel"] {
            assert!(listing.contains(kernel), "no {kernel} runs in the sandbox: {listing}");
        }
    } else {
        assert!(kernels.len() >= 2, "the python and node kernels run in the sandbox: {kernels:?}");
    }
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), None).status, 204);
    common::assert_gone(tier, &id);
    for pid in kernels {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists()
                || common::process_uid(pid).is_none_or(|uid| uid < common::SANDBOX_UID_BASE),
            "kernel {pid} outlived its sandbox"
        );
    }
    let gone =
        server.call("POST", &format!("/v1/sandboxes/{id}/code"), Some(json!({"language": "python", "code": "1"})));
    assert!(gone.status == 404 || gone.status == 409, "{gone:?}");
}

/// The Java kernel (the JDK's jshell API in one JVM) inside the sandbox: state across cells, a String value shown as
/// its text, output, exceptions and compile errors as errors, a cell's env put back, an interrupt at the timeout
/// that leaves the context alive, and no kernel source file left in the sandbox's /tmp.
fn java_contexts_keep_declarations_answer_values_and_errors_and_survive_interrupts(tier: Tier) {
    if !Path::new("/usr/bin/jshell").exists() {
        eprintln!("skipped: no JDK on this host (/usr/bin/jshell; scripts/setup.sh installs openjdk-17-jdk-headless)");
        return;
    }
    let _lock = common::shared_lock();
    let server = Server::start_on(tier);
    let created = server.call("POST", "/v1/sandboxes", Some(json!({"isolation": tier.name()})));
    assert_eq!(created.status, 201, "{created:?}");
    let id = created.json()["id"].as_str().unwrap().to_owned();
    let java = |code: &str| server.code(&id, json!({"language": "java", "code": code}));

    let declared = java("import java.util.*;\nint x = 41;\nString greet(String who) { return \"hi \" + who; }");
    assert_eq!(declared["error"], Value::Null, "{declared}");
    assert_eq!(main_text(&declared), None, "declarations have no value: {declared}");
    let answer = java("x + 1");
    assert_eq!(main_text(&answer), Some("42"), "{answer}");
    assert_eq!(answer["execution_count"], 2);
    let text = java("System.out.println(greet(\"there\"));\nSystem.err.println(\"warned\");\ngreet(\"\\\"you\\\"\")");
    assert_eq!(text["stdout"], "hi there\n", "{text}");
    assert_eq!(text["stderr"], "warned\n", "{text}");
    assert_eq!(main_text(&text), Some("hi \"you\""), "a String is its text, without quotes: {text}");
    let list = java("List<Integer> l = new ArrayList<>(List.of(3, 1, 2)); Collections.sort(l); l");
    assert_eq!(main_text(&list), Some("[1, 2, 3]"), "{list}");

    let thrown = java("int divide(int a) {\n  return a / 0;\n}\ndivide(x)");
    assert_eq!(thrown["error"]["name"], "java.lang.ArithmeticException", "{thrown}");
    assert_eq!(thrown["error"]["value"], "/ by zero", "{thrown}");
    assert!(thrown["error"]["traceback"].to_string().contains("at divide"), "{thrown}");
    let broken = java("int y = ;");
    assert_eq!(broken["error"]["name"], "CompilationException", "{broken}");

    let env = server
        .code(&id, json!({"language": "java", "code": "System.getenv(\"CELL_ONLY\")", "env": {"CELL_ONLY": "set"}}));
    assert_eq!(main_text(&env), Some("set"), "{env}");
    let after = java("System.getenv(\"CELL_ONLY\") == null");
    assert_eq!(main_text(&after), Some("true"), "the cell's env was put back: {after}");

    let started = Instant::now();
    let spin = server.code(&id, json!({"language": "java", "code": "while (true) {}", "timeout_ms": 2000}));
    assert_eq!(spin["error"]["name"], "KeyboardInterrupt", "{spin}");
    assert_eq!(spin["context_restarted"], false, "{spin}");
    assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
    assert_eq!(main_text(&java("x")), Some("41"), "the context kept its state");

    let listing = server.call("POST", &format!("/v1/sandboxes/{id}/exec"), Some(json!({"cmd": "ls -A /tmp"})));
    let files = listing.json()["stdout"].as_str().unwrap_or_default().to_owned();
    assert!(!files.contains("sandkasten-java-kernel"), "the kernel's source file was left in /tmp: {files}");
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), None).status, 204);
    common::assert_gone(tier, &id);
}

/// The R kernel (one R session driven by `r_kernel.py`) inside the sandbox: state across cells, the last visible
/// value printed as the console prints it, earlier ones and `cat` on stdout, `message` on stderr, a plot as a PNG,
/// errors with the condition's class and the calls, a cell's env put back, a context's `cwd`, and an interrupt at the
/// timeout that leaves the session alive. Skipped where the sandbox has no R (a microVM guest image built before
/// `r-base-core` joined `scripts/setup-microvm.sh`).
fn r_contexts_keep_state_answer_printed_values_plots_and_errors_and_survive_interrupts(tier: Tier) {
    if !Path::new("/usr/bin/R").exists() {
        eprintln!("skipped: no R on this host (/usr/bin/R; scripts/setup.sh installs r-base-core)");
        return;
    }
    let _lock = common::shared_lock();
    let server = Server::start_on(tier);
    // Cells run up to the sandbox's command limit, 10 s by default: an emulated CPU (a microVM under TCG) starts R
    // and draws a plot an order of magnitude slower.
    let timeout_ms = if tier == Tier::Microvm { 120_000 } else { 10_000 };
    let body = json!({"isolation": tier.name(), "limits": {"timeout_ms": timeout_ms}});
    let created = server.call("POST", "/v1/sandboxes", Some(body));
    assert_eq!(created.status, 201, "{created:?}");
    let id = created.json()["id"].as_str().unwrap().to_owned();
    let probe = server.call("POST", &format!("/v1/sandboxes/{id}/exec"), Some(json!({"cmd": "test -x /usr/bin/R"})));
    if probe.json()["exit_code"] != 0 {
        eprintln!(
            "skipped: the {tier} sandbox has no /usr/bin/R (rebuild the microVM image: scripts/setup-microvm.sh)"
        );
        assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), None).status, 204);
        return;
    }
    let r = |code: &str| server.code(&id, json!({"language": "r", "code": code}));

    let assigned = r("x <- 41\nsquare <- function(n) n^2");
    assert_eq!(assigned["error"], Value::Null, "{assigned}");
    assert_eq!(main_text(&assigned), None, "an assignment is invisible: {assigned}");
    let answer = r("x + 1");
    assert_eq!(main_text(&answer), Some("[1] 42"), "{answer}");
    assert_eq!(answer["execution_count"], 2);
    let printed = r("square(1:3)\ncat('hi', 'there\\n')\nmessage('warned')\nc(a = 1, b = 2)");
    assert_eq!(printed["stdout"], "[1] 1 4 9\nhi there\n", "an earlier visible value is printed: {printed}");
    assert_eq!(printed["stderr"], "warned\n", "{printed}");
    assert_eq!(main_text(&printed), Some("a b \n1 2 "), "{printed}");
    assert_eq!(main_text(&r("'quoted'")), Some("[1] \"quoted\""));

    let plot = r("plot(1:10)");
    assert_eq!(plot["error"], Value::Null, "{plot}");
    let png = plot["results"].as_array().unwrap().iter().find_map(|r| r["image/png"].as_str());
    assert!(png.is_some_and(|png| common::base64_decode(png).starts_with(b"\x89PNG\r\n\x1a\n")), "{plot}");

    let failed = r("inner <- function(n) stop('bad value: ', n)\nouter <- function(n) inner(n)\nouter(x)");
    assert_eq!(failed["error"]["name"], "Error", "{failed}");
    assert_eq!(failed["error"]["value"], "bad value: 41", "{failed}");
    let traceback = failed["error"]["traceback"].to_string();
    assert!(traceback.contains("Error in inner(n) : bad value: 41") && traceback.contains("outer(x)"), "{failed}");
    let classed = r("stop(structure(class = c('myError', 'error', 'condition'), list(message = 'mine', call = NULL)))");
    assert_eq!(classed["error"]["name"], "myError", "{classed}");
    let broken = r("1 +");
    assert!(broken["error"]["value"].as_str().unwrap_or_default().contains("unexpected end of input"), "{broken}");

    let env =
        server.code(&id, json!({"language": "r", "code": "Sys.getenv('CELL_ONLY')", "env": {"CELL_ONLY": "set"}}));
    assert_eq!(main_text(&env), Some("[1] \"set\""), "{env}");
    let after = r("is.na(Sys.getenv('CELL_ONLY', unset = NA))");
    assert_eq!(main_text(&after), Some("[1] TRUE"), "the cell's env was put back: {after}");

    let started = Instant::now();
    let spin = server.code(&id, json!({"language": "r", "code": "repeat {}", "timeout_ms": 2000}));
    assert_eq!(spin["error"]["name"], "KeyboardInterrupt", "{spin}");
    assert_eq!(spin["context_restarted"], false, "{spin}");
    assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
    assert_eq!(main_text(&r("x")), Some("[1] 41"), "the session kept its state");

    let made = server.call("POST", &format!("/v1/sandboxes/{id}/exec"), Some(json!({"cmd": "mkdir -p /tmp/r-work"})));
    assert_eq!(made.json()["exit_code"], 0, "{made:?}");
    let context = server.call(
        "POST",
        &format!("/v1/sandboxes/{id}/contexts"),
        Some(json!({"language": "r", "cwd": "/tmp/r-work"})),
    );
    assert_eq!(context.status, 201, "{context:?}");
    let context_id = context.json()["id"].as_str().unwrap().to_owned();
    let there = server.code(&id, json!({"context_id": context_id, "code": "paste(getwd(), exists('x'))"}));
    assert_eq!(main_text(&there), Some("[1] \"/tmp/r-work FALSE\""), "its own session, in its cwd: {there}");

    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), None).status, 204);
    common::assert_gone(tier, &id);
}
