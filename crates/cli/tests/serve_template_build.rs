//! Building templates through the server (issue #16): `POST /v1/templates` by an admin tenant runs the build in the
//! server's own build sandboxes and streams its events (`step`, `output`, `layer`, `ready`, `done`) as server-sent
//! events; the template is then listed and what `{"template": NAME}` names, a rebuild takes every layer from the
//! cache, a template built through the API extends another, and a failing step ends the stream with `failed` naming
//! the step with its output, leaving no template. A server killed with SIGKILL during a build leaves no mount, and
//! the next build runs. A hostile version in the shared template store, whose record names a host directory as a
//! layer, is skipped: a create or run naming it is refused, nothing of it reaches the cache and no sandbox sees the
//! directory. A gVisor memory snapshot keeps its template's layers through the template's removal.

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod serve;

use std::io::Read;
use std::os::unix::fs::PermissionsExt as _;
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

/// A server reading `cache` and sharing templates through the store at `store` (`[templates] share`), with an admin
/// tenant `ops`.
fn sharing(cache: &std::path::Path, store: &std::path::Path) -> Server {
    Server::start_with(&format!(
        "[templates]\ncache = \"{}\"\nshare = true\n\n[snapshots]\nstore = \"file://{}\"\n\n[[tenants]]\n\
         name = \"ops\"\napi_keys = [\"{KEY_OPS}\"]\nadmin = true\n",
        cache.display(),
        store.display()
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
    let shared = |cache: &std::path::Path| sharing(cache, store.path());
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

/// A hostile version in the shared template store: a record whose layer is an absolute host path (a directory holding
/// a secret), with a digest computed over that layer list and a manifest named by the version-id scheme, so that only
/// the check that layer digests are hex stands between it and a sandbox (a digest becomes `layers/<digest>` under the
/// cache, and joining an absolute path replaces the base: the pull would skip it as present and `/opt` would show the
/// host directory's `opt`). A create and a run naming the template are refused as for an unknown one, nothing of it
/// reaches the cache, no sandbox exists, and no sandbox reads the secret; a genuine version beside it is still pulled
/// and used.
#[test]
fn a_hostile_record_in_the_template_store_mounts_no_host_directory() {
    require_root!();
    let store = tempfile::Builder::new().prefix("sk-hostile-store-").tempdir_in("/var/tmp").expect("store");
    let (first_cache, second_cache) = (cache_dir(), cache_dir());
    let shared = |cache: &std::path::Path| sharing(cache, store.path());
    // The host directory the hostile record names, laid out and readable as a layer is (its `opt` is what `/opt`
    // shows), with a secret in it; under /var/tmp, as the caches are (a layer under /tmp fails the sandbox's setup, so
    // the test would pass there whether or not the record were refused).
    let host = tempfile::Builder::new().prefix("sk-host-secret-").tempdir_in("/var/tmp").expect("host dir");
    std::fs::create_dir(host.path().join("opt")).unwrap();
    for dir in [host.path().to_owned(), host.path().join("opt")] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let canary = common::Canary::create(host.path().join("opt/secret.txt"));
    std::fs::set_permissions(&canary.path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let host_dir = host.path().display().to_string();

    // A genuine version of "evil", built and pushed by another server; its manifest is then copied into a hostile one.
    let first = shared(first_cache.path());
    let events = build(&first, json!({"spec": {"name": "evil", "base": "host", "run": ["echo genuine > /opt/where"]}}));
    assert_eq!(named(&events, "done").len(), 1, "{events:?}");
    drop(first);
    let manifests = store.path().join("templates/manifests");
    let pushed: Vec<_> = std::fs::read_dir(&manifests).unwrap().map(|entry| entry.unwrap().path()).collect();
    assert_eq!(pushed.len(), 1, "the build pushed one version: {pushed:?}");
    let genuine_text = std::fs::read(&pushed[0]).unwrap();
    let mut manifest: Value = serde_json::from_slice(&genuine_text).unwrap();
    let layers = vec![host_dir.clone()];
    let digest = sandkasten_template::cache::template_digest(&layers);
    let name_hash = sandkasten_template::steps::sha256_hex(b"evil");
    let hostile_id = format!("t-{}-{}", &name_hash[..20], &digest.trim_start_matches("sha256:")[..40]);
    let genuine_name = pushed[0].file_name().unwrap().to_str().unwrap().to_owned();
    assert!(genuine_name.starts_with(&hostile_id[..23]), "the version-id scheme: {genuine_name} {hostile_id}");
    let genuine_digest = manifest["metadata"]["digest"].clone();
    let record = &mut manifest["metadata"];
    assert_eq!(record["name"], "evil", "{record}");
    record["layers"] = json!(layers);
    record["digest"] = json!(digest);
    record["created"] = json!(record["created"].as_u64().unwrap() + 1);
    manifest["snapshot_id"] = json!(hostile_id);
    let hostile_path = manifests.join(format!("{hostile_id}.json"));
    std::fs::write(&hostile_path, serde_json::to_vec(&manifest).unwrap()).unwrap();
    // Only the hostile version in the store, first.
    let genuine_path = pushed[0].clone();
    std::fs::remove_file(&genuine_path).unwrap();

    let mut second = shared(second_cache.path());
    let leaked = |reply: &serve::Reply| String::from_utf8_lossy(&reply.body).contains(&canary.secret);
    let created = second.call("POST", "/v1/sandboxes", KEY_1, Some(json!({"template": "evil"})));
    if created.status == 201 {
        let id = created.json["id"].as_str().unwrap().to_owned();
        let seen = second.exec(&id, "cat /opt/secret.txt; ls -la /opt");
        let deleted = second.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None);
        assert!(!leaked(&seen), "a sandbox of the hostile template read the host's secret: {seen:?}");
        assert_eq!(deleted.status, 204, "{deleted:?}");
        serve::assert_sandbox_gone(&id);
    }
    assert!(!leaked(&created), "{created:?}");
    assert_eq!(created.status, 422, "the hostile version is not in the store for this server: {created:?}");
    let message = created.json["error"]["message"].as_str().unwrap();
    assert!(message.contains("neither built in"), "{created:?}");
    assert!(!message.contains(&host_dir), "the answer names the host directory: {created:?}");
    let run = second.call("POST", "/v1/run", KEY_1, Some(json!({"template": "evil", "cmd": "cat /opt/secret.txt"})));
    assert!(!leaked(&run), "a run of the hostile template read the host's secret: {run:?}");
    assert_eq!(run.status, 422, "{run:?}");
    assert!(run.json["error"]["message"].as_str().unwrap().contains("neither built in"), "{run:?}");
    let listed = second.call("GET", "/v1/sandboxes", KEY_1, None);
    assert_eq!(listed.json["sandboxes"], json!([]), "a refused sandbox exists: {listed:?}");
    assert!(!second_cache.path().join("templates/evil.json").exists(), "the hostile record reached the cache");
    let templates = second.call("GET", "/v1/templates", KEY_1, None);
    assert_eq!(templates.json["templates"], json!([]), "{templates:?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&host_dir), "the host directory is mounted somewhere");

    // Positive control: with the genuine version back beside the (newer) hostile one, a create pulls the genuine (on
    // a restarted server: a name the store lacked may be remembered as missing for a while).
    std::fs::write(&genuine_path, &genuine_text).unwrap();
    second.restart();
    let id = second.create(json!({"template": "evil"}));
    let seen = second.exec(&id, "cat /opt/where; cat /opt/secret.txt");
    assert!(!leaked(&seen), "{seen:?}");
    assert!(seen.json["stdout"].as_str().unwrap().starts_with("genuine\n"), "{seen:?}");
    assert_eq!(second.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    serve::assert_sandbox_gone(&id);
    let cached: Value =
        serde_json::from_slice(&std::fs::read(second_cache.path().join("templates/evil.json")).unwrap()).unwrap();
    assert_eq!(cached["digest"], genuine_digest, "{cached}");
}

/// A memory snapshot of a gVisor sandbox of a built template holds the template's layers: its restore mounts those
/// very layers again (the processes in it have them open), so removing the template keeps them, and the restored
/// copy reads the template's files with its process still running. Once the snapshot is deleted, the next removal
/// collects them.
#[test]
fn a_memory_snapshot_keeps_its_templates_layers_through_the_templates_removal() {
    require_runsc!();
    let cache = cache_dir();
    let server = Server::start_with_on(
        common::Tier::Gvisor,
        &format!(
            "[templates]\ncache = \"{}\"\n\n[[tenants]]\nname = \"ops\"\napi_keys = [\"{KEY_OPS}\"]\nadmin = true\n",
            cache.path().display()
        ),
    );
    for (name, run) in [("held-by-memory", "echo held > /opt/held"), ("another", "echo other > /opt/other")] {
        let events = build(&server, json!({"spec": {"name": name, "base": "host", "run": [run]}}));
        assert_eq!(named(&events, "done").len(), 1, "{events:?}");
    }
    let layer_dirs = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(cache.path().join("layers")).unwrap().flatten().map(|entry| entry.path()).collect()
    };
    assert_eq!(layer_dirs().len(), 2);
    let source = server.create_on(common::Tier::Gvisor, json!({"template": "held-by-memory", "timeout_s": 600}));
    let started = server.call(
        "POST",
        &format!("/v1/sandboxes/{source}/exec"),
        KEY_1,
        Some(json!({"cmd": "exec 3</opt/held; sleep 600", "background": true})),
    );
    assert_eq!(started.status, 202, "{started:?}");
    let taken = server.call("POST", &format!("/v1/sandboxes/{source}/snapshots"), KEY_1, Some(json!({"memory": true})));
    assert_eq!(taken.status, 201, "{taken:?}");
    let snapshot = taken.json["snapshot_id"].as_str().unwrap().to_owned();
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{source}"), KEY_1, None).status, 204);

    let removed = server.call("DELETE", "/v1/templates/held-by-memory", KEY_OPS, None);
    assert_eq!(removed.status, 204, "{removed:?}");
    assert_eq!(layer_dirs().len(), 2, "the memory snapshot's layer was collected");
    let restored = server.call("POST", "/v1/sandboxes", KEY_1, Some(json!({"snapshot": snapshot})));
    assert_eq!(restored.status, 201, "{restored:?}");
    let copy = restored.json["id"].as_str().unwrap().to_owned();
    let seen = server.exec(&copy, "cat /opt/held; pgrep -c sleep");
    assert_eq!(seen.json["stdout"], "held\n1\n", "{seen:?}");
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{copy}"), KEY_1, None).status, 204);

    assert_eq!(server.call("DELETE", &format!("/v1/snapshots/{snapshot}"), KEY_1, None).status, 204);
    assert_eq!(server.call("DELETE", "/v1/templates/another", KEY_OPS, None).status, 204);
    assert_eq!(layer_dirs(), Vec::<std::path::PathBuf>::new(), "layers nothing names any more stay");
}
