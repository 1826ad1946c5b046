//! The official `mcp` Python client against a real `sandkasten serve`: over streamable HTTP (`/mcp`) and over stdio
//! (`sandkasten mcp`, the relay), `tests/mcp/client.py` lists the tools, calls each, is refused without a key or with
//! a wrong one, and finds tenant t1's sandboxes invisible and unusable as tenant t2. Afterwards every sandbox its
//! sessions created is gone from the host, except the one created with `persist: true`, which still runs.
//!
//! Besides, without Python: the tools run on the tier `create_sandbox` asks for (per tier); a session's sandboxes are killed when it expires idle and when the server stops, and a
//! tenant cannot open more sessions than `[mcp] max_sessions_per_tenant`.
//!
//! The venv comes from `scripts/setup-mcp.sh` (run by `scripts/setup.sh`): a missing one fails the test.

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod serve;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Tier;
use serde_json::{Value, json};
use serve::{KEY_1, KEY_2, Server, assert_sandbox_gone, assert_sandbox_gone_on, children_of};

/// Longest one client run may take before it is killed and the test fails (it takes a few seconds).
const CLIENT_LIMIT: Duration = Duration::from_secs(110);

/// The suite's Python.
fn venv_python() -> PathBuf {
    common::venvs::venv_python("mcp-venv", "setup-mcp.sh", "the pinned mcp client")
}

/// Runs `tests/mcp/client.py KIND` against `server` under a watchdog; answers its output (printed for nextest).
fn run_client(server: &Server, kind: &str) -> String {
    let scratch = tempfile::tempdir().expect("tempdir");
    let log_path = scratch.path().join("client.log");
    let log = std::fs::File::create(&log_path).expect("create the client log");
    let mut child = Command::new(venv_python())
        .arg(common::venvs::repo_root().join("tests/mcp/client.py"))
        .arg(kind)
        .current_dir(scratch.path())
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
        .env("SANDKASTEN_URL", &server.url)
        .env("SANDKASTEN_BIN", common::bin())
        .env("MCP_KEY", KEY_1)
        .env("MCP_OTHER_KEY", KEY_2)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("dup the log"))
        .stderr(log)
        .spawn()
        .expect("start the mcp client");
    let deadline = Instant::now() + CLIENT_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the client") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = std::fs::read_to_string(&log_path).unwrap_or_default();
    println!("--- client.py {kind} ---\n{output}--- end ---");
    let status = status.unwrap_or_else(|| panic!("client.py {kind} did not finish within {CLIENT_LIMIT:?}"));
    assert!(status.success(), "client.py {kind} failed (its output is above)");
    assert!(output.contains(&format!("mcp {kind}: ok")), "client.py {kind} did not finish its checks");
    output
}

/// The ids the client printed after `prefix `.
fn printed(output: &str, prefix: &str) -> Vec<String> {
    output.lines().filter_map(|line| line.strip_prefix(prefix)?.strip_prefix(' ')).map(str::to_owned).collect()
}

/// The sandbox's state as the native API reports it to t1.
fn state_of(server: &Server, id: &str) -> String {
    let reply = server.call("GET", &format!("/v1/sandboxes/{id}"), KEY_1, None);
    reply.json["state"].as_str().unwrap_or("?").to_owned()
}

/// Waits until the server runs no sandbox agent any more.
fn assert_no_agents(server: &Server) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let agents: Vec<u32> = children_of(server.pid()).into_iter().flat_map(children_of).collect();
        if agents.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "sandbox agents still running: {agents:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The client's run on `kind`, then: every session sandbox ended and gone from the host, the persisted one running
/// (until deleted here).
fn client_over(kind: &str) {
    require_root!();
    let server = Server::start();
    let output = run_client(&server, kind);
    let ended = printed(&output, "ended");
    // One-shot, named, created-and-killed, created-and-left, and t2's own.
    assert!(ended.len() >= 5, "the client reported {} session sandboxes: {ended:?}", ended.len());
    for id in &ended {
        assert_ne!(state_of(&server, id), "running", "{id} outlived its MCP session");
        if state_of(&server, id) == "?" {
            // t2's sandbox: t1 does not see it; ask as t2.
            let reply = server.call("GET", &format!("/v1/sandboxes/{id}"), KEY_2, None);
            assert_eq!(reply.json["state"], "destroyed", "{id} of t2 outlived its session: {reply:?}");
        }
        assert_sandbox_gone(id);
    }
    let persisted = printed(&output, "persisted");
    assert_eq!(persisted.len(), 1, "{persisted:?}");
    assert_eq!(state_of(&server, &persisted[0]), "running", "the persist: true sandbox was killed with the session");
    let reply = server.call("DELETE", &format!("/v1/sandboxes/{}", persisted[0]), KEY_1, None);
    assert_eq!(reply.status, 204, "{reply:?}");
    assert_sandbox_gone(&persisted[0]);
    assert_no_agents(&server);
}

#[test]
fn python_mcp_client_over_streamable_http() {
    client_over("http");
}

#[test]
fn python_mcp_client_over_stdio_relay() {
    client_over("stdio");
}

// ---------------------------------------------------------------------------------------------------------------------
// Session ends without a client's DELETE, over raw streamable HTTP
// ---------------------------------------------------------------------------------------------------------------------

/// A JSON-RPC POST to `/mcp` as `key` (in session `session`, when given); answers the status, the session id header
/// and the JSON-RPC messages of the body (SSE `data:` lines, or one JSON body).
fn post(server: &Server, key: &str, session: Option<&str>, message: Value) -> (u16, Option<String>, Vec<Value>) {
    let mut request = server
        .http()
        .post(format!("{}/mcp", server.url))
        .header("Authorization", format!("Bearer {key}"))
        .header("Accept", "application/json, text/event-stream")
        .header("Mcp-Protocol-Version", "2025-06-18");
    if let Some(session) = session {
        request = request.header("Mcp-Session-Id", session);
    }
    let mut response = request.send_json(message).expect("post /mcp");
    let status = response.status().as_u16();
    let session = response.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let body = response.body_mut().read_to_string().unwrap_or_default();
    let messages = match body.trim_start().starts_with('{') {
        true => serde_json::from_str(&body).into_iter().collect(),
        false => body
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .filter_map(|data| serde_json::from_str(data.trim()).ok())
            .collect(),
    };
    (status, session, messages)
}

/// Opens a session as `key` (initialize, initialized); answers its id.
fn open_session(server: &Server, key: &str) -> String {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}});
    let (status, session, messages) = post(server, key, None, init);
    assert_eq!(status, 200, "initialize: {messages:?}");
    let session = session.expect("a session id");
    let (status, _, _) =
        post(server, key, Some(&session), json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    assert_eq!(status, 202);
    session
}

/// Calls `tool` in `session` as t1; answers the text of its result (which must not be a tool error).
fn call_tool(server: &Server, session: &str, tool: &str, arguments: Value) -> String {
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": tool, "arguments": arguments}});
    let (status, _, messages) = post(server, KEY_1, Some(session), call);
    assert_eq!(status, 200, "{messages:?}");
    let result = messages.iter().find(|m| m.get("result").is_some()).unwrap_or_else(|| panic!("{messages:?}"));
    assert_ne!(result["result"]["isError"], true, "{tool} failed: {result}");
    result["result"]["content"][0]["text"].as_str().unwrap_or_else(|| panic!("no text in {result}")).to_owned()
}

/// `create_sandbox` in `session`; answers the id.
fn create_in(server: &Server, session: &str, arguments: Value) -> String {
    let text = call_tool(server, session, "create_sandbox", arguments);
    let id = text.split_whitespace().nth(1).expect("sandbox sb-… created").to_owned();
    assert!(id.starts_with("sb-"), "{text}");
    id
}

/// Ends `session` as t1 (the client's DELETE).
fn end_session(server: &Server, session: &str) {
    let reply = server
        .http()
        .delete(format!("{}/mcp", server.url))
        .header("Authorization", format!("Bearer {KEY_1}"))
        .header("Mcp-Session-Id", session)
        .header("Mcp-Protocol-Version", "2025-06-18")
        .call()
        .expect("delete the session");
    assert_eq!(reply.status().as_u16(), 200, "ending the session");
}

per_tier!(tools_run_on_the_tier_asked_for);

/// `create_sandbox` with `isolation` puts the session's commands and code on that tier (the process tier shares the
/// host's kernel, gVisor's Sentry and a microVM's guest kernel are kernels of their own), and its end removes them
/// from the host.
fn tools_run_on_the_tier_asked_for(tier: Tier) {
    let server = Server::start_on(tier);
    let session = open_session(&server, KEY_1);
    let id = create_in(&server, &session, json!({"isolation": tier.name(), "name": "t"}));
    let text = call_tool(&server, &session, "exec", json!({"command": "cat /proc/version", "sandbox": "t"}));
    // A microVM's line also says how it is accelerated: `(microvm (tcg))`.
    let head = text.lines().next().unwrap_or_default();
    let shown = match tier {
        Tier::Microvm => ["tcg", "kvm"].iter().any(|accel| head == format!("sandbox {id} (microvm ({accel}))")),
        _ => head == format!("sandbox {id} ({tier})"),
    };
    assert!(shown, "{text}");
    let host = std::fs::read_to_string("/proc/version").expect("host /proc/version");
    match tier {
        Tier::Process => assert!(text.contains(&host), "{text}"),
        _ => assert!(!text.contains(&host), "the {tier} sandbox runs on the host's kernel: {text}"),
    }
    let text = call_tool(&server, &session, "run_code", json!({"language": "python", "code": "6 * 7", "sandbox": "t"}));
    assert!(text.contains("--- result ---\n42"), "{text}");
    end_session(&server, &session);
    assert_sandbox_gone_on(tier, &id);
}

/// Waits until sandbox `id` is no longer running (the session's end kills it in the background).
fn wait_ended(server: &Server, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while state_of(server, id) == "running" {
        assert!(Instant::now() < deadline, "{id} still runs after its session ended");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_sandbox_gone(id);
}

#[test]
fn idle_session_expires_and_its_sandboxes_are_killed() {
    require_root!();
    let server = Server::start_with("[mcp]\nidle_timeout_s = 1\n");
    let session = open_session(&server, KEY_1);
    let owned = create_in(&server, &session, json!({}));
    let kept = create_in(&server, &session, json!({"persist": true}));
    wait_ended(&server, &owned);
    assert_eq!(state_of(&server, &kept), "running", "persist: true was killed at the idle expiry");
    // The session is gone: its id is unknown now.
    let (status, _, _) = post(&server, KEY_1, Some(&session), json!({"jsonrpc": "2.0", "id": 3, "method": "ping"}));
    assert_eq!(status, 404);
    server.call("DELETE", &format!("/v1/sandboxes/{kept}"), KEY_1, None);
    assert_sandbox_gone(&kept);
}

#[test]
fn server_shutdown_kills_what_open_sessions_created() {
    require_root!();
    let mut server = Server::start();
    let session = open_session(&server, KEY_1);
    let owned = create_in(&server, &session, json!({}));
    let kept = create_in(&server, &session, json!({"persist": true}));
    server.stop_with(libc::SIGTERM);
    assert_sandbox_gone(&owned);
    server.relaunch();
    assert_eq!(state_of(&server, &owned), "destroyed", "the session's sandbox was not killed at shutdown");
    server.call("DELETE", &format!("/v1/sandboxes/{kept}"), KEY_1, None);
    assert_sandbox_gone(&kept);
}

#[test]
fn sessions_per_tenant_are_bounded() {
    require_root!();
    let server = Server::start_with("[mcp]\nmax_sessions_per_tenant = 2\n");
    let first = open_session(&server, KEY_1);
    open_session(&server, KEY_1);
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}});
    let (status, _, messages) = post(&server, KEY_1, None, init.clone());
    assert_eq!(status, 429, "{messages:?}");
    assert_eq!(messages[0]["error"]["code"], "quota_exceeded", "{messages:?}");
    // Another tenant is not held up by t1's sessions.
    open_session(&server, KEY_2);
    // Ending one makes room.
    end_session(&server, &first);
    let (status, _, messages) = post(&server, KEY_1, None, init);
    assert_eq!(status, 200, "{messages:?}");
}
