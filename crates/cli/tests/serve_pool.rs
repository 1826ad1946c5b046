//! Warm pools of `sandkasten serve` against a real server: two callers never share a sandbox, a used sandbox never
//! returns to a pool, a pool member killed from the host is replaced, the pool refills after a burst, quotas count
//! claimed sandboxes only, shutdown leaves nothing behind, an admin resizes a pool through the API, and a pool of
//! the `e2b` template serves the E2B facade. Zygote pools: runs fork from the zygote, and a code context adopts the
//! member's spare kernel (preloaded, shared with nobody). A pool of a built template serves creates naming it and
//! preloads the template's modules.

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod serve;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::json;
use serve::{KEY_1, KEY_2, Server, assert_sandbox_gone, children_of, metric};

/// One pool of the default limits, `min` ready, at most `max`.
fn pool(min: usize, max: usize) -> String {
    format!("[[pools]]\nname = \"std\"\nmin = {min}\nmax = {max}\n")
}

fn pool_size(server: &Server) -> f64 {
    metric(server, "sandkasten_pool_size{class=\"std\"}")
}

/// Waits (up to 20 s) until the pool holds `want` ready sandboxes.
fn wait_pool_size(server: &Server, want: f64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let size = pool_size(server);
        if size == want {
            return;
        }
        assert!(Instant::now() < deadline, "the pool holds {size} sandboxes, want {want}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The server's sandboxes (claimed or not): id → agent pid, found through the spawner's children and their cgroups.
fn server_sandboxes(server: &Server) -> Vec<(String, u32)> {
    let mut found = Vec::new();
    for spawner in children_of(server.pid()) {
        for agent in children_of(spawner) {
            let cgroups = std::fs::read_to_string(format!("/proc/{agent}/cgroup")).unwrap_or_default();
            let id = cgroups.lines().find_map(|line| {
                let rest = &line[line.find("/sandkasten/")? + "/sandkasten/".len()..];
                Some(rest.split('/').next()?.to_owned())
            });
            if let Some(id) = id {
                found.push((id, agent));
            }
        }
    }
    found
}

fn create_as(server: &Server, key: &str) -> String {
    let reply = server.call("POST", "/v1/sandboxes", key, Some(json!({})));
    assert_eq!(reply.status, 201, "create failed: {reply:?}");
    reply.json["id"].as_str().expect("id").to_owned()
}

fn delete(server: &Server, key: &str, id: &str) {
    let reply = server.call("DELETE", &format!("/v1/sandboxes/{id}"), key, None);
    assert_eq!(reply.status, 204, "delete failed: {reply:?}");
}

#[test]
fn concurrent_callers_get_distinct_sandboxes_from_the_pool() {
    require_root!();
    let _lock = common::shared_lock();
    let server = Server::start_with(&pool(2, 4));
    wait_pool_size(&server, 2.0);
    let (a, b) = std::thread::scope(|scope| {
        let first = scope.spawn(|| create_as(&server, KEY_1));
        let second = scope.spawn(|| create_as(&server, KEY_1));
        (first.join().unwrap(), second.join().unwrap())
    });
    assert_ne!(a, b);
    assert!(metric(&server, "sandkasten_pool_hits_total") >= 2.0, "both creates were pool hits");
    let wrote = server.exec(&a, "echo mine > /tmp/marker && cat /tmp/marker");
    assert_eq!(wrote.json["stdout"], "mine\n", "{wrote:?}");
    let other = server.exec(&b, "test -e /tmp/marker && echo visible || echo absent");
    assert_eq!(other.json["stdout"], "absent\n", "{other:?}");
    let pids = server_sandboxes(&server);
    let agent = |id: &str| pids.iter().find(|(s, _)| s == id).map(|(_, p)| *p);
    assert!(agent(&a).is_some() && agent(&b).is_some() && agent(&a) != agent(&b), "distinct agents: {pids:?}");
}

#[test]
fn a_used_sandbox_never_returns_to_the_pool() {
    require_root!();
    let _lock = common::shared_lock();
    let server = Server::start_with(&pool(1, 1));
    let mut seen = BTreeSet::new();
    for _ in 0..3 {
        wait_pool_size(&server, 1.0);
        let id = create_as(&server, KEY_1);
        assert!(seen.insert(id.clone()), "sandbox {id} was handed out twice");
        let probe = server.exec(&id, "test -e /tmp/used && echo used || echo fresh; touch /tmp/used");
        assert_eq!(probe.json["stdout"], "fresh\n", "{probe:?}");
        delete(&server, KEY_1, &id);
        assert_sandbox_gone(&id);
    }
    assert!(metric(&server, "sandkasten_pool_hits_total") >= 3.0);
}

#[test]
fn a_pool_member_killed_from_the_host_is_replaced() {
    require_root!();
    let _lock = common::shared_lock();
    let server = Server::start_with(&pool(2, 2));
    wait_pool_size(&server, 2.0);
    let members = server_sandboxes(&server);
    assert_eq!(members.len(), 2, "{members:?}");
    let (victim, _) = members[0].clone();
    let procs = common::cgroup_paths(&victim)
        .into_iter()
        .find_map(|path| std::fs::read_to_string(path.join("cgroup.procs")).ok())
        .expect("the member's cgroup.procs");
    for pid in procs.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
        // SAFETY: kill(2) of a pool member's process, found in its cgroup.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    assert_sandbox_gone(&victim);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now: Vec<String> = server_sandboxes(&server).into_iter().map(|(id, _)| id).collect();
        if now.len() == 2 && !now.contains(&victim) && pool_size(&server) == 2.0 {
            break;
        }
        assert!(Instant::now() < deadline, "the killed member was not replaced: {now:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    for _ in 0..2 {
        let id = create_as(&server, KEY_1);
        assert_ne!(id, victim);
        assert_eq!(server.exec(&id, "echo ok").json["stdout"], "ok\n");
    }
}

#[test]
fn the_pool_refills_after_a_burst_and_runs_use_it() {
    require_root!();
    let _lock = common::shared_lock();
    let server = Server::start_with(&pool(3, 6));
    wait_pool_size(&server, 3.0);
    let ids: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..5).map(|_| scope.spawn(|| create_as(&server, KEY_1))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(ids.iter().collect::<BTreeSet<_>>().len(), 5, "{ids:?}");
    let (hits, misses) =
        (metric(&server, "sandkasten_pool_hits_total"), metric(&server, "sandkasten_pool_misses_total"));
    assert_eq!(hits + misses, 5.0, "hits {hits}, misses {misses}");
    assert!(hits >= 3.0, "hits {hits}");
    // Each miss raised the pool's target by one (up to max): it refills past min.
    let target = (3.0 + misses).min(6.0);
    assert_eq!(metric(&server, "sandkasten_pool_target{class=\"std\"}"), target);
    wait_pool_size(&server, target);
    assert!(metric(&server, "sandkasten_pool_refill_seconds_count") >= 3.0 + target);
    let run = server.call("POST", "/v1/run", KEY_1, Some(json!({"language": "bash", "code": "echo hi"})));
    assert_eq!(run.status, 200, "{run:?}");
    assert_eq!(run.json["stdout"], "hi\n", "{run:?}");
    assert!(metric(&server, "sandkasten_pool_hits_total") > hits, "POST /v1/run took a pool sandbox");
    for id in &ids {
        delete(&server, KEY_1, id);
    }
}

#[test]
fn quotas_count_claimed_sandboxes_only() {
    require_root!();
    let _lock = common::shared_lock();
    // t2 may run 8 sandboxes; the pool's 4 idle members are nobody's.
    let server = Server::start_with(&pool(4, 4));
    wait_pool_size(&server, 4.0);
    let ids: Vec<String> = (0..8).map(|_| create_as(&server, KEY_2)).collect();
    let refused = server.call("POST", "/v1/sandboxes", KEY_2, Some(json!({})));
    assert_eq!(refused.status, 429, "{refused:?}");
    let listed = server.call("GET", "/v1/sandboxes", KEY_2, None);
    assert_eq!(listed.json["sandboxes"].as_array().map(Vec::len), Some(8));
    assert_eq!(server.call("GET", "/v1/sandboxes", KEY_1, None).json["sandboxes"].as_array().map(Vec::len), Some(0));
    wait_pool_size(&server, 4.0);
    delete(&server, KEY_2, &ids[0]);
    create_as(&server, KEY_2);
}

#[test]
fn shutdown_leaves_nothing_of_the_pool() {
    require_root!();
    let _lock = common::shared_lock();
    let mut server = Server::start_with(&pool(3, 3));
    wait_pool_size(&server, 3.0);
    let claimed = create_as(&server, KEY_1);
    wait_pool_size(&server, 3.0);
    let all = server_sandboxes(&server);
    assert_eq!(all.len(), 4, "{all:?}");
    server.stop_with(libc::SIGTERM);
    for (id, pid) in &all {
        assert_sandbox_gone(id);
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "agent {pid} of {id} survived");
    }
    assert!(all.iter().any(|(id, _)| *id == claimed));
}

/// An admin tenant's key (the tenant is added by `with_admin`).
const KEY_ADMIN: &str = "ops-key-0123456789abcdefghij";

/// `extra` config plus an admin tenant `ops`.
fn with_admin(extra: &str) -> String {
    format!("{extra}\n[[tenants]]\nname = \"ops\"\napi_keys = [\"{KEY_ADMIN}\"]\nadmin = true\n")
}

#[test]
fn an_admin_resizes_a_pool_and_the_host_follows() {
    require_root!();
    let _lock = common::shared_lock();
    let server = Server::start_with(&with_admin(&pool(1, 2)));
    wait_pool_size(&server, 1.0);
    let listed = server.call("GET", "/v1/pools", KEY_1, None);
    assert_eq!(listed.status, 200, "{listed:?}");
    let std = &listed.json["pools"][0];
    assert_eq!((std["name"].as_str(), std["min"].as_u64(), std["max"].as_u64()), (Some("std"), Some(1), Some(2)));

    let refused = server.call("PUT", "/v1/pools/std", KEY_1, Some(json!({"min": 3, "max": 3})));
    assert_eq!((refused.status, refused.json["error"]["code"].as_str()), (403, Some("forbidden")), "{refused:?}");
    let bad = server.call("PUT", "/v1/pools/std", KEY_ADMIN, Some(json!({"min": 3, "max": 2})));
    assert_eq!(bad.status, 400, "{bad:?}");
    let unknown = server.call("PUT", "/v1/pools/nope", KEY_ADMIN, Some(json!({"min": 1, "max": 1})));
    assert_eq!(unknown.status, 404, "{unknown:?}");
    assert_eq!(server_sandboxes(&server).len(), 1, "refused resizes change nothing");

    let grown = server.call("PUT", "/v1/pools/std", KEY_ADMIN, Some(json!({"min": 3, "max": 3})));
    assert_eq!(grown.status, 200, "{grown:?}");
    wait_pool_size(&server, 3.0);
    let members = server_sandboxes(&server);
    assert_eq!(members.len(), 3, "three live members on the host: {members:?}");

    let shrunk = server.call("PUT", "/v1/pools/std", KEY_ADMIN, Some(json!({"min": 1, "max": 1})));
    assert_eq!((shrunk.status, shrunk.json["ready"].as_u64()), (200, Some(1)), "{shrunk:?}");
    let left = server_sandboxes(&server);
    assert_eq!(left.len(), 1, "the surplus is destroyed before the answer: {left:?}");
    for (id, pid) in members.iter().filter(|(id, _)| *id != left[0].0) {
        assert_sandbox_gone(id);
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "agent {pid} of {id} survived");
    }
    let id = create_as(&server, KEY_1);
    assert_eq!(id, left[0].0, "the remaining member is still handed out");
    wait_pool_size(&server, 1.0);
    delete(&server, KEY_1, &id);
}

/// A pool with a Python zygote preloading `json`.
fn zygote_pool(min: usize, max: usize) -> String {
    format!("[[pools]]\nname = \"std\"\nmin = {min}\nmax = {max}\nzygote = \"python\"\npreload = [\"json\"]\n")
}

fn run_python(server: &Server, code: &str, limits: Option<serde_json::Value>) -> serve::Reply {
    let mut body = json!({"language": "python", "code": code});
    if let Some(limits) = limits {
        body["limits"] = limits;
    }
    let reply = server.call("POST", "/v1/run", KEY_1, Some(body));
    assert_eq!(reply.status, 200, "{reply:?}");
    reply
}

#[test]
fn python_runs_fork_from_the_pool_zygote() {
    require_root!();
    let _lock = common::shared_lock();
    let server = Server::start_with(&zygote_pool(2, 4));
    wait_pool_size(&server, 2.0);
    let (hits, forks) =
        (metric(&server, "sandkasten_pool_hits_total"), metric(&server, "sandkasten_zygote_runs_total"));
    let four = run_python(&server, "import json\nprint(2+2)", None);
    assert_eq!(four.json["stdout"], "4\n", "{four:?}");
    assert_eq!(four.json["exit_code"], 0, "{four:?}");
    assert_eq!(four.json["timed_out"], false, "{four:?}");
    assert!(metric(&server, "sandkasten_pool_hits_total") > hits, "the run took a pool sandbox");
    assert!(metric(&server, "sandkasten_zygote_runs_total") > forks, "the run forked from the zygote");
    assert_sandbox_gone(four.json["sandbox_id"].as_str().expect("sandbox_id"));

    wait_pool_size(&server, 2.0);
    let set = run_python(&server, "x = 41\nimport sys\nprint(__name__, sys.argv, __file__)", None);
    assert_eq!(set.json["stdout"], "__main__ ['/tmp/main.py'] /tmp/main.py\n", "{set:?}");
    wait_pool_size(&server, 2.0);
    let probe = run_python(&server, "print('x' in globals())", None);
    assert_eq!(probe.json["stdout"], "False\n", "{probe:?}");
    assert_ne!(set.json["sandbox_id"], probe.json["sandbox_id"]);

    wait_pool_size(&server, 2.0);
    let raised = run_python(&server, "def f():\n    raise ValueError('boom')\nf()", None);
    assert_eq!(raised.json["exit_code"], 1, "{raised:?}");
    let stderr = raised.json["stderr"].as_str().unwrap_or_default();
    assert!(stderr.starts_with("Traceback (most recent call last):"), "{stderr}");
    assert!(stderr.contains("File \"/tmp/main.py\", line 3") && stderr.contains("ValueError: boom"), "{stderr}");
    assert!(!stderr.contains("<string>"), "no zygote frames: {stderr}");

    // Each run waits for a ready member (a member holds a zygote and a spare kernel: refilling takes a moment).
    wait_pool_size(&server, 2.0);
    let exited = run_python(&server, "import sys; print('bye'); sys.exit(3)", None);
    assert_eq!((exited.json["exit_code"].as_i64(), exited.json["stdout"].as_str()), (Some(3), Some("bye\n")));

    wait_pool_size(&server, 2.0);
    let killed = run_python(&server, "import os\nos.kill(os.getpid(), 9)", None);
    assert_eq!(killed.json["signal"], 9, "{killed:?}");
    assert_eq!(killed.json["exit_code"], serde_json::Value::Null, "{killed:?}");
    assert_eq!(killed.json["timed_out"], false, "{killed:?}");
    assert!(metric(&server, "sandkasten_zygote_runs_total") >= forks + 6.0);
}

#[test]
fn a_zygote_run_past_its_time_limit_is_killed_with_its_sandbox() {
    require_root!();
    let _lock = common::shared_lock();
    // Runs take a pool's sandboxes when their limits equal the pool's: this pool's runs have a 1 s time limit.
    let server = Server::start_with(&format!("{}limits = {{ timeout_ms = 1000 }}\n", zygote_pool(1, 2)));
    wait_pool_size(&server, 1.0);
    let forks = metric(&server, "sandkasten_zygote_runs_total");
    let started = Instant::now();
    let spin =
        run_python(&server, "print('spinning', flush=True)\nwhile True: pass", Some(json!({"timeout_ms": 1000})));
    assert_eq!(spin.json["timed_out"], true, "{spin:?}");
    assert_eq!(spin.json["stdout"], "spinning\n", "{spin:?}");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    assert!(metric(&server, "sandkasten_zygote_runs_total") > forks);
    assert_sandbox_gone(spin.json["sandbox_id"].as_str().expect("sandbox_id"));
    // A plain create from a zygote pool gets a sandbox without the zygote running in it.
    wait_pool_size(&server, 1.0);
    let hits = metric(&server, "sandkasten_pool_hits_total");
    let created = server.call("POST", "/v1/sandboxes", KEY_1, Some(json!({"limits": {"timeout_ms": 1000}})));
    assert_eq!(created.status, 201, "{created:?}");
    assert!(metric(&server, "sandkasten_pool_hits_total") > hits, "the create took a pool sandbox");
    let id = created.json["id"].as_str().expect("id").to_owned();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let listed = server.call("GET", &format!("/v1/sandboxes/{id}/commands"), KEY_1, None);
        let running = listed.json["commands"].as_array().map(|c| c.iter().filter(|c| c["state"] == "running").count());
        if running == Some(0) {
            break;
        }
        assert!(Instant::now() < deadline, "the zygote still runs in a created sandbox: {listed:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(server.exec(&id, "echo ok").json["stdout"], "ok\n");
    delete(&server, KEY_1, &id);
}

/// A pool with a Node.js zygote preloading `fs`.
fn node_zygote_pool(min: usize, max: usize) -> String {
    format!("[[pools]]\nname = \"std\"\nmin = {min}\nmax = {max}\nzygote = \"node\"\npreload = [\"fs\"]\n")
}

fn run_code(server: &Server, language: &str, code: &str) -> serve::Reply {
    let reply = server.call("POST", "/v1/run", KEY_1, Some(json!({"language": language, "code": code})));
    assert_eq!(reply.status, 200, "{reply:?}");
    reply
}

#[test]
fn node_runs_start_from_the_pool_zygote_and_share_nothing() {
    require_root!();
    let _lock = common::shared_lock();
    let server = Server::start_with(&node_zygote_pool(2, 4));
    wait_pool_size(&server, 2.0);
    let (hits, forks) =
        (metric(&server, "sandkasten_pool_hits_total"), metric(&server, "sandkasten_zygote_runs_total"));
    let four = run_code(&server, "node", "console.log(2 + 2)");
    assert_eq!((four.json["stdout"].as_str(), four.json["exit_code"].as_i64()), (Some("4\n"), Some(0)), "{four:?}");
    assert!(metric(&server, "sandkasten_pool_hits_total") > hits, "the run took a pool sandbox");
    assert!(metric(&server, "sandkasten_zygote_runs_total") > forks, "the run went to the zygote");
    assert_sandbox_gone(four.json["sandbox_id"].as_str().expect("sandbox_id"));

    // What `node /tmp/main.js` shows, and nothing of the zygote.
    wait_pool_size(&server, 2.0);
    let main = run_code(
        &server,
        "node",
        "console.log(JSON.stringify(process.argv.slice(1)), require.main === module, __filename, \
         typeof globalThis.require, typeof process._eval)",
    );
    assert_eq!(main.json["stdout"], "[\"/tmp/main.js\"] true /tmp/main.js undefined undefined\n", "{main:?}");

    // A global, a file in /tmp and one in /workspace set by one run are invisible to the next.
    wait_pool_size(&server, 2.0);
    let set = run_code(
        &server,
        "node",
        "globalThis.secret = 41; const fs = require('fs'); fs.writeFileSync('/tmp/mark', '1'); \
         fs.writeFileSync('/workspace/mark', '1'); console.log('set')",
    );
    assert_eq!(set.json["stdout"], "set\n", "{set:?}");
    wait_pool_size(&server, 2.0);
    let probe = run_code(
        &server,
        "node",
        "const fs = require('fs'); console.log(typeof globalThis.secret, fs.existsSync('/tmp/mark'), \
         fs.existsSync('/workspace/mark'))",
    );
    assert_eq!(probe.json["stdout"], "undefined false false\n", "{probe:?}");
    assert_ne!(set.json["sandbox_id"], probe.json["sandbox_id"]);

    wait_pool_size(&server, 2.0);
    let thrown = run_code(&server, "node", "function f() {\n  throw new Error('boom');\n}\nf();\n");
    assert_eq!(thrown.json["exit_code"], 1, "{thrown:?}");
    let stderr = thrown.json["stderr"].as_str().unwrap_or_default();
    assert!(stderr.starts_with("/tmp/main.js:2\n") && stderr.contains("Error: boom"), "{stderr}");
    assert!(!stderr.contains("[eval]"), "no zygote frames: {stderr}");

    wait_pool_size(&server, 2.0);
    let exited = run_code(&server, "node", "console.log('bye'); process.exit(3)");
    assert_eq!((exited.json["exit_code"].as_i64(), exited.json["stdout"].as_str()), (Some(3), Some("bye\n")));
    wait_pool_size(&server, 2.0);
    let killed = run_code(&server, "node", "process.kill(process.pid, 'SIGKILL')");
    assert_eq!((killed.json["signal"].as_i64(), killed.json["timed_out"].as_bool()), (Some(9), Some(false)));
    assert!(metric(&server, "sandkasten_zygote_runs_total") >= forks + 6.0);

    // Python code on a Node pool member runs plainly, and the Node zygote is not left running beside it.
    wait_pool_size(&server, 2.0);
    let forks = metric(&server, "sandkasten_zygote_runs_total");
    let python = run_code(
        &server,
        "python",
        "import os\nlive = set()\nfor p in filter(str.isdigit, os.listdir('/proc')):\n    \
         stat = open(f'/proc/{p}/stat').read()\n    if stat.rsplit(')', 1)[1].split()[0] != 'Z':\n        \
         live.add(stat.split('(', 1)[1].rsplit(')', 1)[0])\nprint(sorted(live))",
    );
    let live = python.json["stdout"].as_str().unwrap_or_default();
    assert!(live.contains("python3") && !live.contains("node"), "{python:?}");
    assert_eq!(metric(&server, "sandkasten_zygote_runs_total"), forks, "Python never goes to a Node zygote");
}

#[test]
fn an_e2b_pool_serves_the_facades_creates_with_the_e2b_layout() {
    require_root!();
    let _lock = common::shared_lock();
    let server = Server::start_with(
        "[[pools]]\nname = \"std\"\ntemplate = \"e2b\"\nlimits = { timeout_ms = 3600000 }\nmin = 1\nmax = 2\n",
    );
    wait_pool_size(&server, 1.0);
    let mut reply = server
        .http()
        .post(format!("{}/v2/sandboxes", server.url))
        .header("X-API-KEY", KEY_1)
        .send_json(json!({ "templateID": "base", "timeout": 60 }))
        .expect("create through the E2B facade");
    assert_eq!(reply.status(), 201);
    let body: serde_json::Value = reply.body_mut().read_json().expect("the create answer");
    let id = body["sandboxID"].as_str().expect("sandboxID").to_owned();
    assert_eq!(metric(&server, "sandkasten_pool_hits_total"), 1.0, "the facade's create was a pool hit");
    let layout = server.exec(&id, "whoami; pwd; echo $HOME; stat -c %U /home/user");
    assert_eq!(layout.json["stdout"], "user\n/home/user\n/home/user\nuser\n", "{layout:?}");
    delete(&server, KEY_1, &id);
    assert_sandbox_gone(&id);
}

/// A pool of a built template: its members carry the template's layers and environment, a create or run naming the
/// template (and no environment of its own) takes one, and the zygote has imported the template's own `preload`
/// besides the pool's. A create with an environment of its own is not served by the pool.
#[test]
fn a_pool_of_a_built_template_serves_its_creates_with_the_templates_preload() {
    require_root!();
    let _lock = common::shared_lock();
    let cache = common::build_template(
        "name = \"warmed\"\nbase = \"host\"\npreload = [\"warm\"]\n\
         run = [\"mkdir -p /opt/mods && echo 'import os; LOADED_IN = os.getpid()' > /opt/mods/warm.py\"]\n\
         [env]\nPYTHONPATH = \"/opt/mods\"\n",
    );
    let config = format!(
        "[templates]\ncache = \"{}\"\n[[pools]]\nname = \"std\"\ntemplate = \"warmed\"\nmin = 1\nmax = 2\n\
         zygote = \"python\"\npreload = [\"json\"]\n",
        cache.path().display()
    );
    let server = Server::start_with(&config);
    wait_pool_size(&server, 1.0);
    let hits = metric(&server, "sandkasten_pool_hits_total");
    let code = "import sys, os\nprint('warm' in sys.modules, 'json' in sys.modules, sys.modules['warm'].LOADED_IN != os.getpid())";
    let run =
        server.call("POST", "/v1/run", KEY_1, Some(json!({"template": "warmed", "language": "python", "code": code})));
    assert_eq!(run.status, 200, "{run:?}");
    assert_eq!(
        run.json["stdout"], "True True True\n",
        "the zygote imported the template's and the pool's preload: {run:?}"
    );
    assert_eq!(metric(&server, "sandkasten_pool_hits_total"), hits + 1.0, "the run took a pool member");

    wait_pool_size(&server, 1.0);
    let created = server.call("POST", "/v1/sandboxes", KEY_1, Some(json!({"template": "warmed"})));
    assert_eq!(created.status, 201, "{created:?}");
    assert_eq!(metric(&server, "sandkasten_pool_hits_total"), hits + 2.0, "the create took a pool member");
    let id = created.json["id"].as_str().expect("id").to_owned();
    assert_eq!(created.json["template"], "warmed", "{created:?}");
    let seen = server.exec(&id, "cat /opt/mods/warm.py; echo $PYTHONPATH");
    assert_eq!(seen.json["stdout"], "import os; LOADED_IN = os.getpid()\n/opt/mods\n", "{seen:?}");
    delete(&server, KEY_1, &id);

    let own_env = server.call("POST", "/v1/sandboxes", KEY_1, Some(json!({"template": "warmed", "env": {"A": "1"}})));
    assert_eq!(own_env.status, 201, "{own_env:?}");
    assert_eq!(metric(&server, "sandkasten_pool_hits_total"), hits + 2.0, "a create with its own env took a member");
    delete(&server, KEY_1, own_env.json["id"].as_str().expect("id"));
}

/// Host pids of sandbox `id`'s code-context kernels of `language` ("Python" or "JavaScript"), running or spare.
fn kernels_of(id: &str, language: &str) -> BTreeSet<u32> {
    let marker = format!("sandkasten {language} kernel");
    common::processes_in_cgroup_matching(id)
        .into_iter()
        .map(|(pid, _)| pid)
        .filter(|pid| common::process_uid(*pid).is_some_and(|uid| uid >= common::SANDBOX_UID_BASE))
        .filter(|pid| common::cmdline(*pid).contains(&marker))
        .collect()
}

fn create_context(server: &Server, key: &str, id: &str, language: &str) -> String {
    let reply = server.call("POST", &format!("/v1/sandboxes/{id}/contexts"), key, Some(json!({"language": language})));
    assert_eq!(reply.status, 201, "{reply:?}");
    reply.json["id"].as_str().expect("context id").to_owned()
}

/// A cell's main result as text (or its error's name).
fn cell(server: &Server, key: &str, id: &str, context: &str, code: &str) -> String {
    let reply = server.call(
        "POST",
        &format!("/v1/sandboxes/{id}/code"),
        key,
        Some(json!({"context_id": context, "code": code})),
    );
    assert_eq!(reply.status, 200, "{reply:?}");
    if let Some(error) = reply.json["error"]["name"].as_str() {
        return format!("error: {error}");
    }
    let results = reply.json["results"].as_array().cloned().unwrap_or_default();
    let main = results.iter().find(|r| r["is_main_result"] == true);
    main.and_then(|r| r["text/plain"].as_str()).unwrap_or("(none)").to_owned()
}

/// A Python zygote pool preloading `fractions`, which neither the kernel nor the zygote imports on its own.
fn fractions_pool(min: usize, max: usize) -> String {
    format!("[[pools]]\nname = \"std\"\nmin = {min}\nmax = {max}\nzygote = \"python\"\npreload = [\"fractions\"]\n")
}

const HAS_FRACTIONS: &str = "import sys\n('fractions' in sys.modules, sys.argv)";

#[test]
fn a_context_on_a_zygote_member_adopts_its_spare_kernel_and_shares_nothing() {
    require_root!();
    let _lock = common::shared_lock();
    let server = Server::start_with(&fractions_pool(2, 3));
    wait_pool_size(&server, 2.0);
    let hits = metric(&server, "sandkasten_pool_hits_total");
    let first = create_as(&server, KEY_1);
    assert!(metric(&server, "sandkasten_pool_hits_total") > hits, "the create took a pool sandbox");
    // The spare was started before the claim; the context's kernel is that very process.
    let spare = kernels_of(&first, "Python");
    assert_eq!(spare.len(), 1, "one spare kernel waits in the claimed member: {spare:?}");
    let adopted = create_context(&server, KEY_1, &first, "python");
    assert_eq!(kernels_of(&first, "Python"), spare, "the context adopted the spare instead of starting one");
    assert_eq!(
        cell(&server, KEY_1, &first, &adopted, HAS_FRACTIONS),
        "(True, ['-c'])",
        "preloaded, argv as a cold kernel"
    );
    cell(&server, KEY_1, &first, &adopted, "secret = 41");
    assert_eq!(cell(&server, KEY_1, &first, &adopted, "secret + 1"), "42");

    // The spare is handed out once: the next context starts cold, from nothing preloaded, and works.
    let cold = create_context(&server, KEY_1, &first, "python");
    assert_eq!(cell(&server, KEY_1, &first, &cold, HAS_FRACTIONS), "(False, ['-c'])");
    assert_eq!(cell(&server, KEY_1, &first, &cold, "'secret' in globals()"), "False");
    assert_eq!(kernels_of(&first, "Python").len(), 2);

    // A fresh sandbox of the same pool: its own spare, nothing of the first caller's.
    wait_pool_size(&server, 2.0);
    let second = create_as(&server, KEY_2);
    assert_ne!(first, second);
    let theirs = create_context(&server, KEY_2, &second, "python");
    assert_eq!(cell(&server, KEY_2, &second, &theirs, HAS_FRACTIONS), "(True, ['-c'])");
    assert_eq!(cell(&server, KEY_2, &second, &theirs, "'secret' in globals()"), "False", "no state crosses callers");
    let (mine, other) = (kernels_of(&first, "Python"), kernels_of(&second, "Python"));
    assert!(mine.is_disjoint(&other), "two callers never share a kernel: {mine:?} {other:?}");

    // A default context (first cell without a context id) of the other sandbox finds no spare left: it starts cold.
    let default = server.call(
        "POST",
        &format!("/v1/sandboxes/{second}/code"),
        KEY_2,
        Some(json!({"language": "python", "code": HAS_FRACTIONS})),
    );
    assert_eq!(default.status, 200, "{default:?}");
    assert_eq!(default.json["results"][0]["text/plain"], "(False, ['-c'])", "{default:?}");

    // A restart starts cold: state and preloaded modules are gone, the context works.
    let restarted = server.call("POST", &format!("/v1/sandboxes/{first}/contexts/{adopted}/restart"), KEY_1, None);
    assert_eq!(restarted.status, 200, "{restarted:?}");
    assert_eq!(cell(&server, KEY_1, &first, &adopted, "'secret' in globals()"), "False");
    assert_eq!(cell(&server, KEY_1, &first, &adopted, HAS_FRACTIONS), "(False, ['-c'])");
    assert!(kernels_of(&first, "Python").is_disjoint(&spare), "the adopted kernel was replaced");

    // Destroying the sandboxes leaves nothing: no kernel, spare or adopted.
    let kernels: BTreeSet<u32> = kernels_of(&first, "Python").union(&kernels_of(&second, "Python")).copied().collect();
    delete(&server, KEY_1, &first);
    delete(&server, KEY_2, &second);
    assert_sandbox_gone(&first);
    assert_sandbox_gone(&second);
    for pid in kernels {
        let uid = common::process_uid(pid);
        assert!(uid.is_none_or(|uid| uid < common::SANDBOX_UID_BASE), "kernel {pid} outlived its sandbox");
    }
}

#[test]
fn a_run_discards_the_spare_kernel_and_a_node_context_adopts_its_own() {
    require_root!();
    let _lock = common::shared_lock();
    let server = Server::start_with(&fractions_pool(1, 2));
    wait_pool_size(&server, 1.0);
    // A one-shot run gets the member's memory and pids: the spare kernel is gone before the program starts.
    let probe = "import os\nkernels = 0\nfor p in filter(str.isdigit, os.listdir('/proc')):\n    try:\n        \
                 kernels += b'sandkasten Python kernel' in open(f'/proc/{p}/cmdline', 'rb').read()\n    \
                 except OSError:\n        pass\nprint(kernels)";
    let forks = metric(&server, "sandkasten_zygote_runs_total");
    let ran = run_python(&server, probe, None);
    assert!(metric(&server, "sandkasten_zygote_runs_total") > forks, "the run used the zygote");
    assert_eq!(ran.json["stdout"], "0\n", "{ran:?}");
    assert_sandbox_gone(ran.json["sandbox_id"].as_str().expect("sandbox_id"));
    drop(server);

    let server = Server::start_with(&node_zygote_pool(1, 2));
    wait_pool_size(&server, 1.0);
    let id = create_as(&server, KEY_1);
    let spare = kernels_of(&id, "JavaScript");
    assert_eq!(spare.len(), 1, "{spare:?}");
    let context = create_context(&server, KEY_1, &id, "javascript");
    assert_eq!(kernels_of(&id, "JavaScript"), spare, "the context adopted the spare");
    assert_eq!(cell(&server, KEY_1, &id, &context, "let n = 41; [n + 1, process.argv.length]"), "[ 42, 1 ]");
    let cold = create_context(&server, KEY_1, &id, "javascript");
    assert_eq!(cell(&server, KEY_1, &id, &cold, "typeof n"), "'undefined'");
    delete(&server, KEY_1, &id);
    assert_sandbox_gone(&id);
}
