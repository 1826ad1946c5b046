//! Filesystem pauses against a real `sandkasten serve` (#12, E2B's `pause(keep_memory=False)`): `{"mode":
//! "filesystem"}` saves the sandbox's files to the snapshot store and releases everything else on every tier — checked
//! on the host: no process, cgroup, mount, netns, bundle or runsc state of it remains while it is paused, and its
//! background process is gone. Requests answer 409 `paused`; the resume makes it again under the same id on the same
//! files (a module "installed" into home imports, `/tmp` is back) with fresh processes. A kill -9 of the server and
//! its spawner while it is paused keeps it paused, and it resumes after the restart. The CLI's `pause --filesystem`.
//!
//! Every test runs on each isolation tier (`process::NAME`, `gvisor::NAME` and `microvm::NAME`, see `per_tier!`).

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod serve;

use common::Tier;
use serde_json::{Value, json};
use serve::{KEY_1, Server};

per_tier!(
    a_filesystem_pause_releases_everything_and_the_resume_starts_fresh_on_the_files,
    kill_9_while_paused_to_the_filesystem_keeps_it_paused_and_it_resumes_after_the_restart,
    the_cli_pauses_to_the_filesystem,
);

fn call(server: &Server, method: &str, path: &str, body: Option<Value>) -> serve::Reply {
    server.call(method, path, KEY_1, body)
}

/// Files a program would leave: a module installed into the user's site-packages, a note in the workspace, one in
/// `/tmp`.
const SETUP: &str = "site=$(/usr/bin/python3 -c 'import site; print(site.getusersitepackages())') && \
     mkdir -p $site/kept_pkg && echo 'VALUE = 7' > $site/kept_pkg/__init__.py && \
     echo kept > /workspace/note && echo in-tmp > /tmp/t";

/// What the resumed sandbox must show of `SETUP`.
fn assert_files_back(server: &Server, id: &str) {
    let imported = server.exec(id, "/usr/bin/python3 -c 'import kept_pkg; print(kept_pkg.VALUE)'");
    assert_eq!(imported.json["stdout"], "7\n", "the installed module is back: {imported:?}");
    assert_eq!(server.exec(id, "cat /workspace/note /tmp/t").json["stdout"], "kept\nin-tmp\n");
}

fn pause_to_files(server: &Server, id: &str) {
    let paused = call(server, "POST", &format!("/v1/sandboxes/{id}/pause"), Some(json!({"mode": "filesystem"})));
    assert_eq!(paused.status, 200, "{paused:?}");
    assert_eq!(
        (paused.json["state"].as_str(), paused.json["pause_mode"].as_str()),
        (Some("paused"), Some("filesystem"))
    );
}

fn a_filesystem_pause_releases_everything_and_the_resume_starts_fresh_on_the_files(tier: Tier) {
    let server = Server::start_on(tier);
    let id = server.create_on(tier, json!({"timeout_s": 600}));
    let base = format!("/v1/sandboxes/{id}");
    let setup = server.exec(&id, SETUP);
    assert_eq!(setup.json["exit_code"], 0, "{setup:?}");
    let token = format!("kept-sleeper-{}", std::process::id());
    let started = call(
        &server,
        "POST",
        &format!("{base}/exec"),
        Some(json!({"cmd": format!("exec -a {token} sleep 600"), "background": true})),
    );
    assert_eq!(started.status, 202, "{started:?}");

    pause_to_files(&server, &id);
    // Everything of the sandbox is released on the host, as after a delete.
    serve::assert_sandbox_gone_on(tier, &id);
    let sleepers: Vec<String> =
        common::host_pids().into_iter().map(common::cmdline).filter(|line| line.contains(&token)).collect();
    assert!(sleepers.is_empty(), "its processes ended: {sleepers:?}");
    let refused = call(&server, "POST", &format!("{base}/exec"), Some(json!({"cmd": "true"})));
    assert_eq!((refused.status, refused.json["error"]["code"].as_str()), (409, Some("paused")), "{refused:?}");
    let listed = call(&server, "GET", "/v1/snapshots", None);
    assert_eq!(listed.json["snapshots"], json!([]), "the files are not a snapshot of the tenant's: {listed:?}");

    let resumed = call(&server, "POST", &format!("{base}/resume"), None);
    assert_eq!((resumed.status, resumed.json["state"].as_str()), (200, Some("running")), "{resumed:?}");
    assert_files_back(&server, &id);
    let sleeping = server.exec(&id, &format!("ps -eo args | grep -c '^{token}' || true"));
    assert_eq!(sleeping.json["stdout"], "0\n", "processes start fresh: {sleeping:?}");
    assert_eq!(call(&server, "DELETE", &base, None).status, 204);
    serve::assert_sandbox_gone_on(tier, &id);
}

fn kill_9_while_paused_to_the_filesystem_keeps_it_paused_and_it_resumes_after_the_restart(tier: Tier) {
    // Exclusive: what a crash leaves is collected by the next spawner; no other run may take it first.
    let mut server = Server::start_exclusive_on(tier);
    let id = server.create_on(tier, json!({}));
    assert_eq!(server.exec(&id, SETUP).json["exit_code"], 0);
    pause_to_files(&server, &id);
    let spawners = serve::children_of(server.pid());
    // SAFETY: kill(2) of the spawner, a child of our child, which we just listed.
    unsafe { libc::kill(spawners[0] as libc::pid_t, libc::SIGKILL) };
    server.stop_with(libc::SIGKILL);
    server.relaunch();
    let info = call(&server, "GET", &format!("/v1/sandboxes/{id}"), None);
    assert_eq!(
        (info.json["state"].as_str(), info.json["pause_mode"].as_str()),
        (Some("paused"), Some("filesystem")),
        "{info:?}"
    );
    let resumed = call(&server, "POST", &format!("/v1/sandboxes/{id}/resume"), None);
    assert_eq!(resumed.status, 200, "{resumed:?}");
    assert_files_back(&server, &id);
    assert_eq!(call(&server, "DELETE", &format!("/v1/sandboxes/{id}"), None).status, 204);
    serve::assert_sandbox_gone_on(tier, &id);
}

fn the_cli_pauses_to_the_filesystem(tier: Tier) {
    let server = Server::start_on(tier);
    let id = server.create_on(tier, json!({}));
    assert_eq!(server.exec(&id, SETUP).json["exit_code"], 0);
    let cli = |args: &[&str]| {
        std::process::Command::new(common::bin())
            .args(["sandbox", "--url", &server.url])
            .args(args)
            .env("SANDKASTEN_API_KEY", KEY_1)
            .output()
            .unwrap()
    };
    let paused = cli(&["pause", "--filesystem", &id]);
    assert!(paused.status.success(), "{paused:?}");
    assert_eq!(String::from_utf8_lossy(&paused.stdout).trim(), id);
    let info = call(&server, "GET", &format!("/v1/sandboxes/{id}"), None);
    assert_eq!(info.json["pause_mode"], "filesystem", "{info:?}");
    serve::assert_sandbox_gone_on(tier, &id);
    let resumed = cli(&["resume", &id]);
    assert!(resumed.status.success(), "{resumed:?}");
    assert_files_back(&server, &id);
}
