//! Building templates through the server (issue #16): `POST /v1/templates` by an admin tenant runs the build in the
//! server's own build sandboxes and streams its events (`step`, `output`, `layer`, `ready`, `done`) as server-sent
//! events; the template is then listed and what `{"template": NAME}` names, a rebuild takes every layer from the
//! cache, a template built through the API extends another, and a failing step ends the stream with `failed` naming
//! the step with its output, leaving no template. A server killed with SIGKILL during a build leaves no mount, and
//! the next build runs.

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod serve;

use std::io::Read;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use serve::{KEY_1, Server};

const KEY_OPS: &str = "ops-key-0123456789abcdefghij";

/// A server reading `cache`, with an admin tenant `ops`.
fn server(cache: &std::path::Path) -> Server {
    Server::start_with(&format!(
        "[templates]\ncache = \"{}\"\n\n[[tenants]]\nname = \"ops\"\napi_keys = [\"{KEY_OPS}\"]\nadmin = true\n",
        cache.display()
    ))
}

/// POSTs a build and reads its whole stream: `(event, data)` pairs.
fn build(server: &Server, body: Value) -> Vec<(String, Value)> {
    let response = server
        .http()
        .post(format!("{}/v1/templates", server.url))
        .header("Authorization", format!("Bearer {KEY_OPS}"))
        .send_json(body)
        .unwrap();
    let status = response.status();
    let mut text = String::new();
    response.into_body().into_reader().read_to_string(&mut text).unwrap();
    assert_eq!(status, 200, "{text}");
    parse_events(&text)
}

fn parse_events(text: &str) -> Vec<(String, Value)> {
    let mut events = Vec::new();
    for block in text.split("\n\n") {
        let mut name = String::new();
        let mut data = String::new();
        for line in block.lines() {
            if let Some(rest) = line.strip_prefix("event:") {
                name = rest.trim().to_owned();
            } else if let Some(rest) = line.strip_prefix("data:") {
                data.push_str(rest.trim_start());
            }
        }
        if !name.is_empty() {
            events.push((name, serde_json::from_str(&data).unwrap_or(Value::Null)));
        }
    }
    events
}

fn named<'a>(events: &'a [(String, Value)], name: &str) -> Vec<&'a Value> {
    events.iter().filter(|(event, _)| event == name).map(|(_, data)| data).collect()
}

fn cache_dir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("sk-api-templates-").tempdir_in("/var/tmp").expect("cache dir")
}

#[test]
fn a_template_is_built_through_the_api_and_used() {
    require_root!();
    let cache = cache_dir();
    let server = server(cache.path());
    let spec = json!({
        "name": "api-built",
        "base": "host",
        "files": [{"src": "hello.txt", "dest": "/opt/app/hello.txt"}],
        "run": ["echo step-output-through-the-api; cat /opt/app/hello.txt > /opt/made"],
        "ready": "test -s /opt/made",
        "workdir": "/opt/app",
    });
    let hello = base64::engine::general_purpose::STANDARD.encode("hello from the request\n");
    let body = json!({"spec": spec, "files": {"hello.txt": hello}});
    let events = build(&server, body.clone());
    let steps = named(&events, "step");
    assert_eq!(steps.len(), 2, "{events:?}");
    assert!(steps.iter().all(|step| step["cached"] == false && step["total"] == 2), "{steps:?}");
    assert!(steps[0]["title"].as_str().unwrap().starts_with("files /opt/app/hello.txt"), "{steps:?}");
    let output: String =
        named(&events, "output").iter().map(|o| o["data"].as_str().unwrap_or_default().to_owned()).collect();
    assert!(output.contains("step-output-through-the-api"), "{events:?}");
    assert_eq!(named(&events, "layer").len(), 2, "{events:?}");
    assert_eq!(named(&events, "ready").len(), 1, "{events:?}");
    let done = named(&events, "done");
    assert_eq!(done.len(), 1, "{events:?}");
    assert_eq!(done[0]["name"], "api-built");
    assert_eq!(events.last().map(|(name, _)| name.as_str()), Some("done"));

    let listed = server.call("GET", "/v1/templates", KEY_1, None);
    assert!(listed.json["templates"].as_array().unwrap().iter().any(|t| t["name"] == "api-built"), "{listed:?}");
    let id = server.create(json!({"template": "api-built"}));
    let seen = server.exec(&id, "pwd; cat /opt/made");
    assert_eq!(seen.json["stdout"], "/opt/app\nhello from the request\n", "{seen:?}");
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);

    let again = build(&server, body);
    assert!(named(&again, "step").iter().all(|step| step["cached"] == true), "{again:?}");
    assert_eq!(named(&again, "done")[0]["digest"], done[0]["digest"], "an unchanged rebuild made another template");

    // A template of the API extends another; its Dockerfile form works the same.
    let extended = build(
        &server,
        json!({"dockerfile": "FROM api-built\nRUN cat /opt/made > /opt/extended\n", "name": "api-extended"}),
    );
    assert_eq!(named(&extended, "done").len(), 1, "{extended:?}");
    let id = server.create(json!({"template": "api-extended"}));
    let seen = server.exec(&id, "cat /opt/extended /opt/app/hello.txt");
    assert_eq!(seen.json["stdout"], "hello from the request\nhello from the request\n", "{seen:?}");
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);

    let failing = build(
        &server,
        json!({"spec": {"name": "api-broken", "base": "host", "run": ["echo visible-failure; exit 4"]}}),
    );
    let failed = named(&failing, "failed");
    assert_eq!(failed.len(), 1, "{failing:?}");
    assert_eq!(failed[0]["step"], json!({"index": 0, "title": "run echo visible-failure; exit 4"}));
    assert!(failed[0]["message"].as_str().unwrap().contains("exited with 4"), "{failed:?}");
    assert!(failed[0]["output"].as_str().unwrap().contains("visible-failure"), "{failed:?}");
    let listed = server.call("GET", "/v1/templates", KEY_1, None);
    assert!(!listed.json["templates"].as_array().unwrap().iter().any(|t| t["name"] == "api-broken"), "{listed:?}");
}

/// SIGKILL of the server while a build step runs: after a restart no build mount or build sandbox remains, and a
/// build of the same spec runs to its end (nothing partial is taken for finished).
#[test]
fn a_server_killed_during_a_build_leaves_nothing_and_builds_again() {
    require_root!();
    let cache = cache_dir();
    let mut server = server(cache.path());
    let marker = common::unique_token("api-build-");
    let body = json!({"spec": {"name": "api-killed", "base": "host",
        "run": [format!("echo {marker}; echo partial > /opt/partial; sleep 60; echo not-reached")]}});
    let url = server.url.clone();
    let http = server.http().clone();
    let request = std::thread::spawn(move || {
        let response = http
            .post(format!("{url}/v1/templates"))
            .header("Authorization", format!("Bearer {KEY_OPS}"))
            .send_json(body);
        if let Ok(response) = response {
            let mut text = String::new();
            let _ = response.into_body().into_reader().read_to_string(&mut text);
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while common::host_pids_with(&marker).is_empty() {
        assert!(std::time::Instant::now() < deadline, "the build step never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    server.stop_with(libc::SIGKILL);
    let _ = request.join();
    server.relaunch();
    let build_dir = cache.path().join("build");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&build_dir.display().to_string()), "a build capture is still mounted");
    assert_eq!(std::fs::read_dir(&build_dir).map(|d| d.count()).unwrap_or(0), 0, "a capture directory remains");
    assert!(common::host_pids_with(&marker).is_empty(), "the build step's process outlived the server");
    let events =
        build(&server, json!({"spec": {"name": "api-killed", "base": "host", "run": ["echo done > /opt/partial"]}}));
    assert_eq!(named(&events, "done").len(), 1, "{events:?}");

    // SIGTERM during a build: the stream ends and the server stops (within `stop_with`'s 15 s, not the step's 60).
    let marker = common::unique_token("api-build-term-");
    let body = json!({"spec": {"name": "api-stopped", "base": "host",
        "run": [format!("echo {marker}; sleep 60; echo not-reached")]}});
    let (url, http) = (server.url.clone(), server.http().clone());
    let request = std::thread::spawn(move || {
        let response = http
            .post(format!("{url}/v1/templates"))
            .header("Authorization", format!("Bearer {KEY_OPS}"))
            .send_json(body);
        let mut text = String::new();
        if let Ok(response) = response {
            let _ = response.into_body().into_reader().read_to_string(&mut text);
        }
        text
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while common::host_pids_with(&marker).is_empty() {
        assert!(std::time::Instant::now() < deadline, "the second build never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    server.stop_with(libc::SIGTERM);
    let streamed = request.join().unwrap();
    assert!(!streamed.contains("event: done"), "{streamed}");
    assert!(common::host_pids_with(&marker).is_empty(), "the build step outlived the stopped server");
    server.relaunch();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&build_dir.display().to_string()), "a build capture is still mounted");
    let listed = server.call("GET", "/v1/templates", KEY_1, None);
    assert!(!listed.json["templates"].as_array().unwrap().iter().any(|t| t["name"] == "api-stopped"), "{listed:?}");
}

/// `[templates] share`: two servers with caches of their own and one store. A template built through the API on the
/// first is pushed to the store when its build ends; a create naming it on the second pulls it first and runs it.
#[test]
fn a_template_built_on_one_server_is_pulled_by_another_sharing_the_store() {
    require_root!();
    let store = tempfile::Builder::new().prefix("sk-shared-store-").tempdir_in("/var/tmp").expect("store");
    let (first_cache, second_cache) = (cache_dir(), cache_dir());
    let shared = |cache: &std::path::Path| {
        Server::start_with(&format!(
            "[templates]\ncache = \"{}\"\nshare = true\n\n[snapshots]\nstore = \"file://{}\"\n\n[[tenants]]\n\
             name = \"ops\"\napi_keys = [\"{KEY_OPS}\"]\nadmin = true\n",
            cache.display(),
            store.path().display()
        ))
    };
    let first = shared(first_cache.path());
    let events = build(
        &first,
        json!({"spec": {"name": "across-hosts", "base": "host", "run": ["echo built-on-the-first > /opt/where"]}}),
    );
    assert_eq!(named(&events, "done").len(), 1, "{events:?}");
    drop(first);
    let second = shared(second_cache.path());
    let listed = second.call("GET", "/v1/templates", KEY_1, None);
    assert_eq!(listed.json["templates"], json!([]), "the second cache starts empty: {listed:?}");
    let id = second.create(json!({"template": "across-hosts"}));
    let seen = second.exec(&id, "cat /opt/where");
    assert_eq!(seen.json["stdout"], "built-on-the-first\n", "{seen:?}");
    assert_eq!(second.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    let unknown = second.call("POST", "/v1/sandboxes", KEY_1, Some(json!({"template": "nowhere-built"})));
    assert_eq!(unknown.status, 422, "{unknown:?}");
}
