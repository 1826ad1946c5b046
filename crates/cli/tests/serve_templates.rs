//! Built templates through the server (issue #16), on every tier: a template built into a cache
//! (`sandkasten template build --cache DIR`, one `run` step, no network) is what `{"template": NAME}` names on create
//! and on `POST /v1/run` once the server reads that cache (`[templates] cache`): its file is at `/opt`, read-only, its
//! environment is under the request's, its `workdir` is where commands start and its `user` names uid 1000, the
//! answers name it, the CLI names it (`run --server`, `sandbox create`), and
//! E2B's create takes its name as a template id. A name
//! that is neither built in nor built is 422 saying how to build it, and nothing is created.

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod serve;

use std::time::Duration;

use common::{Cli, Tier};
use serde_json::json;
use serve::{KEY_1, Server, assert_sandbox_gone_on};

per_tier!(a_built_template_is_what_create_and_run_name);

fn a_built_template_is_what_create_and_run_name(tier: Tier) {
    let cache = common::build_template(
        "name = \"marked\"\nbase = \"host\"\nworkdir = \"/opt/app\"\nuser = \"analyst\"\n\
         run = [\"echo made-by-the-template > /opt/marker && mkdir /opt/app\"]\n\
         [env]\nFROM_TEMPLATE = \"template\"\nBOTH = \"template\"\n",
    );
    let config = format!("[templates]\ncache = \"{}\"\n", cache.path().display());
    let server = Server::start_with_on(tier, &config);

    let id = server.create_on(tier, json!({"template": "marked", "env": {"BOTH": "request"}}));
    let info = server.call("GET", &format!("/v1/sandboxes/{id}"), KEY_1, None);
    assert_eq!(info.json["template"], "marked", "{info:?}");
    let seen = server.exec(&id, "cat /opt/marker; echo $FROM_TEMPLATE $BOTH; touch /opt/x 2>/dev/null || echo ro");
    assert_eq!(seen.status, 200, "{seen:?}");
    assert_eq!(seen.json["stdout"], "made-by-the-template\ntemplate request\nro\n", "{seen:?}");
    // The template's working directory and its name for the sandbox user.
    let seen = server.exec(&id, "pwd; whoami; id -u");
    assert_eq!(seen.json["stdout"], "/opt/app\nanalyst\n1000\n", "{seen:?}");
    // The template's files are root's inside on every tier (the process tier idmaps its layers to the sandbox's
    // root), read-only to its root too.
    let seen =
        server.exec(&id, "stat -c '%U:%G' /opt/marker /opt/app; sudo sh -c 'touch /opt/x 2>/dev/null || echo ro'");
    assert_eq!(seen.json["stdout"], "root:root\nroot:root\nro\n", "{seen:?}");
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    assert_sandbox_gone_on(tier, &id);

    // A sandbox without a template has no marker: the file is the template's, not the host's.
    let plain = server.create_on(tier, json!({}));
    let seen = server.exec(&plain, "cat /opt/marker 2>/dev/null || echo absent");
    assert_eq!(seen.json["stdout"], "absent\n", "{seen:?}");
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{plain}"), KEY_1, None).status, 204);
    assert!(!std::path::Path::new("/opt/marker").exists(), "the host has the template's file");

    let run = server.call(
        "POST",
        "/v1/run",
        KEY_1,
        Some(json!({"isolation": tier.name(), "template": "marked", "cmd": "cat /opt/marker"})),
    );
    assert_eq!(run.status, 200, "{run:?}");
    assert_eq!(run.json["stdout"], "made-by-the-template\n", "{run:?}");

    // The CLI names it too: `run --server … --template`, `sandbox create --template`.
    let isolation = tier.name();
    let url = server.url.as_str();
    let cli_run = Cli::new([
        "run",
        "--server",
        url,
        "--isolation",
        isolation,
        "--template",
        "marked",
        "--",
        "cat",
        "/opt/marker",
    ])
    .env("SANDKASTEN_API_KEY", KEY_1)
    .watchdog(Duration::from_secs(120))
    .output();
    assert_eq!(cli_run.stdout_text(), "made-by-the-template\n", "{}", cli_run.describe());
    let created = Cli::new(["sandbox", "--url", url, "create", "--isolation", isolation, "--template", "marked"])
        .env("SANDKASTEN_API_KEY", KEY_1)
        .watchdog(Duration::from_secs(120))
        .output();
    assert_eq!(created.code, 0, "{}", created.describe());
    let cli_id = created.stdout_text().trim().to_owned();
    assert_eq!(server.call("GET", &format!("/v1/sandboxes/{cli_id}"), KEY_1, None).json["template"], "marked");
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{cli_id}"), KEY_1, None).status, 204);

    let listed = server.call("GET", "/v1/sandboxes", KEY_1, None);
    let before = listed.json["sandboxes"].as_array().map_or(0, Vec::len);
    let unknown = server.call("POST", "/v1/sandboxes", KEY_1, Some(json!({"template": "nonesuch"})));
    assert_eq!(unknown.status, 422, "{unknown:?}");
    let message = unknown.json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("\"nonesuch\"") && message.contains("template build"), "{message}");
    let listed = server.call("GET", "/v1/sandboxes", KEY_1, None);
    assert_eq!(listed.json["sandboxes"].as_array().map_or(0, Vec::len), before, "a refused create made a sandbox");

    // E2B's create takes the built template's name as its template id.
    let e2b = server
        .http()
        .post(format!("{}/sandboxes", server.url))
        .header("X-API-Key", KEY_1)
        .send_json(json!({"templateID": "marked"}))
        .unwrap();
    assert_eq!(e2b.status().as_u16(), 201);
    let created: serde_json::Value = serde_json::from_reader(e2b.into_body().into_reader()).unwrap();
    let e2b_id = created["sandboxID"].as_str().unwrap_or_default().to_owned();
    assert_eq!(created["templateID"], "marked", "{created}");
    let seen = server.exec(&e2b_id, "cat /opt/marker; echo $HOME");
    assert_eq!(seen.json["stdout"], "made-by-the-template\n/home/user\n", "{seen:?}");

    // Its files snapshot restores onto the same template through E2B's create too.
    assert_eq!(server.exec(&e2b_id, "echo kept > /home/user/note").json["exit_code"], 0);
    let e2b_post = |path: String, body: serde_json::Value| {
        let reply = server.http().post(format!("{}{path}", server.url)).header("X-API-Key", KEY_1).send_json(body);
        let reply = reply.unwrap();
        let status = reply.status().as_u16();
        (status, serde_json::from_reader::<_, serde_json::Value>(reply.into_body().into_reader()).unwrap())
    };
    let (status, taken) = e2b_post(format!("/sandboxes/{e2b_id}/snapshots"), json!({"memory": false}));
    assert_eq!(status, 201, "{taken}");
    let snapshot = taken["snapshotID"].as_str().unwrap_or_default().to_owned();
    let (status, restored) = e2b_post("/sandboxes".to_owned(), json!({"templateID": snapshot}));
    assert_eq!(status, 201, "{restored}");
    let restored = restored["sandboxID"].as_str().unwrap_or_default().to_owned();
    let seen = server.exec(&restored, "cat /opt/marker /home/user/note");
    assert_eq!(seen.json["stdout"], "made-by-the-template\nkept\n", "the restore lost its template: {seen:?}");
    assert_eq!(server.call("GET", &format!("/v1/sandboxes/{restored}"), KEY_1, None).json["template"], "marked");
    for id in [&e2b_id, &restored] {
        assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
        assert_sandbox_gone_on(tier, id);
    }
    assert_eq!(server.call("DELETE", &format!("/v1/snapshots/{snapshot}"), KEY_1, None).status, 204);
}
