//! Forks and filesystem snapshots against a real `sandkasten serve` (#12, items 2 to 4). A snapshot restored into a
//! new sandbox (of this tier, and of the other) has the files and the installed package, while the source changed on;
//! `kill -9` of the server in the middle of an upload leaves, after the restart, no snapshot row that cannot restore
//! and no chunk on disk that no manifest names, while a snapshot finished before still restores. With an `s3://`
//! store (a real `moto_server` on loopback) the manifest and chunks are objects in the bucket, nothing is written to
//! the local disk, the restore reads them back, and a delete empties the bucket (damaged chunks in S3 are the
//! snapshot store's own S3 test; moto refuses unsigned overwrites). A fork of 3 gives three
//! sandboxes with the source's files (home, /tmp, /dev/shm; modes and symlinks kept, a venv with an installed module
//! still imports) whose writes are invisible to each other and to the source; a fork the quota cannot hold keeps no
//! copy; a count of 0 is refused before anything is made. Checked on the host: the sandboxes that remain are exactly
//! the ones the API names, and nothing of the refused or deleted ones is left. A restore from a snapshot whose chunks
//! went bad on disk is refused with 409 naming the snapshot as damaged, and nothing of the sandbox it began is left.
//! Snapshots and forks of a sandbox whose files come and go while they are read (a loop creating and removing them)
//! succeed: a file gone before tar reads it is left out, not a failure.
//!
//! Every test runs on each isolation tier (`process::NAME`, `gvisor::NAME` and `microvm::NAME`, see `per_tier!`).

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
#[path = "../../snapshot-store/tests/moto/mod.rs"]
mod moto;
mod serve;

use common::Tier;
use serde_json::{Value, json};
use serve::{KEY_1, KEY_2, Server, assert_sandbox_gone_on};

per_tier!(
    fork_makes_independent_copies_with_the_files,
    a_fork_that_does_not_fit_keeps_no_copy_and_bad_counts_are_422,
    a_filesystem_snapshot_restores_the_files_and_the_installed_package_into_a_new_sandbox,
    kill_9_during_a_snapshot_upload_leaves_no_snapshot_that_lists_and_no_orphaned_chunk,
    the_cli_snapshots_restores_forks_lists_and_removes,
    snapshots_live_in_an_s3_store_when_one_is_configured,
    a_memory_snapshot_restores_running_processes_where_the_tier_can,
    kill_9_during_a_restore_leaves_no_sandbox_running_and_the_snapshot_restorable,
    a_corrupted_chunk_fails_the_restore_naming_the_snapshot_and_leaves_nothing,
    a_save_and_a_restore_show_their_bytes_while_they_run,
    files_that_come_and_go_while_a_snapshot_or_fork_reads_them_fail_neither,
);

fn call(server: &Server, method: &str, path: &str, body: Option<Value>) -> serve::Reply {
    server.call(method, path, KEY_1, body)
}

/// Files of every kind the copies must keep: nested, executable, a symlink, /tmp, /dev/shm, and a venv whose
/// site-packages holds a module (an installed package, as far as the interpreter can tell).
const PREPARE: &str = "set -e
mkdir -p /workspace/src/deep && echo original > /workspace/src/deep/state
printf '#!/bin/sh\\necho tool ran\\n' > /workspace/tool && chmod 750 /workspace/tool
ln -s src/deep/state /workspace/link
echo in-tmp > /tmp/scratch && echo in-shm > /dev/shm/segment
/usr/bin/python3 -m venv --without-pip /workspace/venv
site=$(/workspace/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')
echo 'ANSWER = 42' > \"$site/installed_here.py\"";

/// What a copy must see (one line each).
const CHECK: &str = "cat /workspace/src/deep/state; /workspace/tool; stat -c %a /workspace/tool; readlink /workspace/link; \
    cat /tmp/scratch /dev/shm/segment; /workspace/venv/bin/python -c 'import installed_here; print(installed_here.ANSWER)'";

const EXPECTED: &str = "original\ntool ran\n750\nsrc/deep/state\nin-tmp\nin-shm\n42\n";

fn fork_makes_independent_copies_with_the_files(tier: Tier) {
    let server = Server::start_on(tier);
    // The ticker is a background command, which runs up to the sandbox's command limit (10 s by default): under
    // software emulation a fork's copies are checked well after that, so the limit leaves the ticker room.
    let limits = json!({"timeout_ms": TICKER_LIMIT_MS});
    let source = server.create_on(tier, json!({"timeout_s": 600, "limits": limits, "metadata": {"task": "fix-42"}}));
    let prepared = server.exec(&source, PREPARE);
    assert_eq!(prepared.json["exit_code"], 0, "{prepared:?}");
    let ticker = call(
        &server,
        "POST",
        &format!("/v1/sandboxes/{source}/exec"),
        Some(json!({"cmd": TICKER, "background": true})),
    );
    assert_eq!(ticker.status, 202, "{ticker:?}");
    let (token, _) = first_tick(&server, &source);
    let forked = call(&server, "POST", &format!("/v1/sandboxes/{source}/fork"), Some(json!({"count": 3})));
    assert_eq!(forked.status, 201, "{forked:?}");
    let copies: Vec<String> =
        forked.json["sandboxes"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(copies.len(), 3, "{forked:?}");
    for (index, copy) in copies.iter().enumerate() {
        assert_ne!(copy, &source);
        let info = call(&server, "GET", &format!("/v1/sandboxes/{copy}"), None);
        assert_eq!(
            (info.json["state"].as_str(), info.json["isolation"]["tier"].as_str()),
            (Some("running"), Some(tier.name()))
        );
        assert_eq!(info.json["metadata"]["task"], "fix-42", "the copy keeps the source's metadata: {info:?}");
        let seen = server.exec(copy, CHECK);
        assert_eq!(seen.json["stdout"], EXPECTED, "copy {index} on {tier}: {seen:?}");
        // gVisor and microVMs fork memory too: the source's loop runs on in each copy. The process tier copies files
        // only: the loop's last file is there, and nothing writes it any more.
        // (Under software emulation with the source and three copies on two cores, a copy's loop may get little
        // CPU for a while: it has ten seconds to tick once more.)
        let (copied_token, first) = tick(&server, copy);
        assert_eq!(copied_token, token, "copy {index}");
        if tier.saves_memory() {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            loop {
                let (_, second) = tick(&server, copy);
                if second > first {
                    break;
                }
                assert!(std::time::Instant::now() < deadline, "the loop does not run on in copy {index}: {first}");
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        } else {
            std::thread::sleep(std::time::Duration::from_millis(300));
            let (_, second) = tick(&server, copy);
            assert_eq!(second, first, "copy {index} runs a loop it should not have");
        }
        let wrote =
            server.exec(copy, &format!("echo copy-{index} > /workspace/src/deep/state; echo {index} > /tmp/mine"));
        assert_eq!(wrote.json["exit_code"], 0, "{wrote:?}");
    }
    // Each copy sees only its own writes; the source none of them.
    for (index, copy) in copies.iter().enumerate() {
        let seen = server.exec(copy, "cat /workspace/src/deep/state /tmp/mine");
        assert_eq!(seen.json["stdout"], format!("copy-{index}\n{index}\n"), "{seen:?}");
    }
    // (`tick.new` is the source's ticker's file between its write and its rename: a listing may catch it; and a
    // listing on gVisor that runs into the rename of `tick.new` over `tick` may name `tick` twice.)
    let original = server.exec(&source, "cat /workspace/src/deep/state; ls /tmp | grep -vx tick.new | uniq");
    assert_eq!(original.json["stdout"], "original\nscratch\ntick\n", "{original:?}");
    for copy in &copies {
        assert_eq!(call(&server, "DELETE", &format!("/v1/sandboxes/{copy}"), None).status, 204);
        assert_sandbox_gone_on(tier, copy);
    }
    assert_eq!(server.exec(&source, "cat /workspace/src/deep/state").json["stdout"], "original\n");
    assert_eq!(call(&server, "DELETE", &format!("/v1/sandboxes/{source}"), None).status, 204);
    assert_sandbox_gone_on(tier, &source);
}

fn running_ids(server: &Server, key: &str) -> Vec<String> {
    let list = server.call("GET", "/v1/sandboxes", key, None);
    list.json["sandboxes"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_owned()).collect()
}

fn a_fork_that_does_not_fit_keeps_no_copy_and_bad_counts_are_422(tier: Tier) {
    let server = Server::start_on(tier);
    // t2 may run 8 sandboxes: the source and 7 copies fit, 8 copies do not.
    let mut body = json!({"timeout_s": 600, "isolation": tier.name()});
    let created = server.call("POST", "/v1/sandboxes", KEY_2, Some(body.take()));
    assert_eq!(created.status, 201, "{created:?}");
    let source = created.json["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/sandboxes/{source}/fork");
    let refused = server.call("POST", &path, KEY_2, Some(json!({"count": 8})));
    assert_eq!(refused.status, 429, "{refused:?}");
    assert!(refused.json["error"]["message"].as_str().unwrap().contains("max_sandboxes"), "{refused:?}");
    assert_eq!(running_ids(&server, KEY_2), vec![source.clone()], "a refused fork left a copy");
    // On the host: the spawner runs one sandbox (the source); the 7 copies made before the refusal are gone.
    let spawner = serve::spawner_of(&server);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while serve::children_of(spawner).len() != 1 {
        let left = serve::children_of(spawner);
        assert!(std::time::Instant::now() < deadline, "the spawner still runs {left:?} after the refused fork");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let rows = server.call("GET", "/v1/sandboxes?state=all", KEY_2, None);
    assert_eq!(rows.json["sandboxes"].as_array().unwrap().len(), 1, "a refused fork left a row: {rows:?}");
    for count in [0, 17] {
        let bad = server.call("POST", &path, KEY_2, Some(json!({"count": count})));
        assert_eq!(bad.status, 422, "{bad:?}");
        assert!(bad.json["error"]["message"].as_str().unwrap().contains("between 1 and 16"), "{bad:?}");
    }
    let missing = server.call("POST", &path, KEY_2, Some(json!({})));
    assert_eq!(missing.status, 422, "{missing:?}");
    // Another tenant's sandbox cannot be forked: it does not exist for them.
    assert_eq!(call(&server, "POST", &path, Some(json!({"count": 1}))).status, 404);
    assert_eq!(running_ids(&server, KEY_2), vec![source.clone()]);
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{source}"), KEY_2, None).status, 204);
    assert_sandbox_gone_on(tier, &source);
}

fn snapshot_of(server: &Server, id: &str) -> String {
    let taken = call(server, "POST", &format!("/v1/sandboxes/{id}/snapshots"), Some(json!({"name": "prepared"})));
    assert_eq!(taken.status, 201, "{taken:?}");
    assert_eq!(taken.json["state"], "ready", "{taken:?}");
    taken.json["snapshot_id"].as_str().unwrap().to_owned()
}

fn a_filesystem_snapshot_restores_the_files_and_the_installed_package_into_a_new_sandbox(tier: Tier) {
    // gc_grace_s = 0: a delete's GC removes the chunks at once (the default spares them an hour).
    let server = Server::start_with_on(tier, "[snapshots]\ngc_grace_s = 0\n");
    let source = server.create_on(tier, json!({"timeout_s": 600}));
    assert_eq!(server.exec(&source, PREPARE).json["exit_code"], 0);
    let snapshot = snapshot_of(&server, &source);
    // The source goes on and is then deleted: the snapshot is its own.
    assert_eq!(server.exec(&source, "echo later > /workspace/src/deep/state").json["exit_code"], 0);
    assert_eq!(call(&server, "DELETE", &format!("/v1/sandboxes/{source}"), None).status, 204);
    let other = if tier == Tier::Process { Tier::Gvisor } else { Tier::Process };
    for target in [tier, other] {
        let restored = call(
            &server,
            "POST",
            "/v1/sandboxes",
            Some(json!({"snapshot": snapshot, "isolation": target.name(), "timeout_s": 600})),
        );
        assert_eq!(restored.status, 201, "restore on {target}: {restored:?}");
        assert_eq!(restored.json["isolation"]["tier"], target.name());
        let copy = restored.json["id"].as_str().unwrap().to_owned();
        let seen = server.exec(&copy, CHECK);
        assert_eq!(seen.json["stdout"], EXPECTED, "a {tier} snapshot restored on {target}: {seen:?}");
        assert_eq!(call(&server, "DELETE", &format!("/v1/sandboxes/{copy}"), None).status, 204);
        assert_sandbox_gone_on(target, &copy);
    }
    assert_eq!(call(&server, "DELETE", &format!("/v1/snapshots/{snapshot}"), None).status, 204);
    let chunks = server.database().parent().unwrap().join("snapshots/chunks");
    assert_eq!(files_under(&chunks), Vec::<std::path::PathBuf>::new(), "a deleted snapshot left chunks");
}

fn a_corrupted_chunk_fails_the_restore_naming_the_snapshot_and_leaves_nothing(tier: Tier) {
    let server = Server::start_with_on(tier, "[snapshots]\ngc_grace_s = 0\n");
    let source = server.create_on(tier, json!({"timeout_s": 600}));
    assert_eq!(server.exec(&source, PREPARE).json["exit_code"], 0);
    let snapshot = snapshot_of(&server, &source);
    // The disk under the store goes bad: every chunk now holds other bytes.
    let chunks = files_under(&server.database().parent().unwrap().join("snapshots/chunks"));
    assert!(!chunks.is_empty());
    for chunk in &chunks {
        std::fs::write(chunk, b"not the chunk that was stored").unwrap();
    }
    let before: Vec<String> = all_ids(&server);
    let restore = json!({"snapshot": snapshot, "isolation": tier.name()});
    let refused = call(&server, "POST", "/v1/sandboxes", Some(restore));
    assert_eq!(refused.status, 409, "{refused:?}");
    let message = refused.json["error"]["message"].as_str().unwrap();
    assert!(message.contains(&snapshot) && message.contains("damaged"), "{message}");
    // Nothing of the sandbox the restore began is left: not running, nothing on the host.
    assert_eq!(running_ids(&server, KEY_1), vec![source.clone()]);
    for id in all_ids(&server).into_iter().filter(|id| !before.contains(id)) {
        assert_sandbox_gone_on(tier, &id);
    }
    // The damaged snapshot can still be deleted.
    assert_eq!(call(&server, "DELETE", &format!("/v1/snapshots/{snapshot}"), None).status, 204);
    assert_eq!(call(&server, "DELETE", &format!("/v1/sandboxes/{source}"), None).status, 204);
    assert_sandbox_gone_on(tier, &source);
}

/// A background loop that creates and removes files in `/tmp` as fast as it can: some the archive lists are gone
/// by the time it reads them.
const CHURN: &str = "while :; do for i in $(seq 100); do echo x > /tmp/churn-$i; done; rm -f /tmp/churn-*; done";

fn files_that_come_and_go_while_a_snapshot_or_fork_reads_them_fail_neither(tier: Tier) {
    let server = Server::start_with_on(tier, "[snapshots]\ngc_grace_s = 0\n");
    let source = server.create_on(tier, json!({"timeout_s": 600, "limits": {"timeout_ms": TICKER_LIMIT_MS}}));
    let churn =
        call(&server, "POST", &format!("/v1/sandboxes/{source}/exec"), Some(json!({"cmd": CHURN, "background": true})));
    assert_eq!(churn.status, 202, "{churn:?}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while server.exec(&source, "ls /tmp | grep -q churn-").json["exit_code"] != 0 {
        assert!(std::time::Instant::now() < deadline, "the churn loop in {source} made no file in 30 s");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    for _ in 0..5 {
        let taken = call(&server, "POST", &format!("/v1/sandboxes/{source}/snapshots"), Some(json!({})));
        assert_eq!((taken.status, taken.json["state"].as_str()), (201, Some("ready")), "{taken:?}");
    }
    if !tier.saves_memory() {
        // A fork of a tier that copies files reads them the same way (a memory fork reads none).
        for _ in 0..3 {
            let forked = call(&server, "POST", &format!("/v1/sandboxes/{source}/fork"), Some(json!({"count": 1})));
            assert_eq!(forked.status, 201, "{forked:?}");
            let copy = forked.json["sandboxes"][0]["id"].as_str().unwrap().to_owned();
            assert_eq!(call(&server, "DELETE", &format!("/v1/sandboxes/{copy}"), None).status, 204);
        }
    }
    assert_eq!(call(&server, "DELETE", &format!("/v1/sandboxes/{source}"), None).status, 204);
    assert_sandbox_gone_on(tier, &source);
}

/// The transfers of direction `direction` the snapshot rows `rows` show.
fn transfers_in(rows: &[Value], direction: &str) -> Vec<(u64, Option<u64>)> {
    rows.iter()
        .flat_map(|row| row["transfers"].as_array().cloned().unwrap_or_default())
        .filter(|transfer| transfer["direction"] == direction)
        .map(|transfer| (transfer["bytes_done"].as_u64().unwrap(), transfer["bytes_total"].as_u64()))
        .collect()
}

/// Runs `request` in a thread while polling `rows` (snapshot rows) for transfers of `direction`; returns the
/// request's reply and every transfer seen.
fn watching(
    request: impl FnOnce() -> serve::Reply + Send,
    rows: impl Fn() -> Vec<Value>,
    direction: &str,
) -> (serve::Reply, Vec<(u64, Option<u64>)>) {
    std::thread::scope(|scope| {
        let running = scope.spawn(request);
        let mut seen = Vec::new();
        while !running.is_finished() {
            seen.extend(transfers_in(&rows(), direction));
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        (running.join().unwrap(), seen)
    })
}

fn a_save_and_a_restore_show_their_bytes_while_they_run(tier: Tier) {
    let server = Server::start_with_on(tier, "[snapshots]\ngc_grace_s = 0\n");
    let source = server.create_on(tier, json!({"timeout_s": 600, "limits": {"disk_bytes": 128u64 << 20}}));
    assert_eq!(server.exec(&source, "head -c 12582912 /dev/urandom > ~/noise").json["exit_code"], 0);
    let path = format!("/v1/sandboxes/{source}/snapshots");
    let listed = || call(&server, "GET", "/v1/snapshots", None).json["snapshots"].as_array().unwrap().clone();
    let (taken, saving) = watching(|| call(&server, "POST", &path, Some(json!({}))), listed, "saving");
    assert_eq!(taken.status, 201, "{taken:?}");
    let snapshot = taken.json["snapshot_id"].as_str().unwrap().to_owned();
    assert!(
        saving.iter().any(|&(done, total)| done > 0 && total.is_some_and(|total| total >= 12 << 20)),
        "the save showed no progress with its expected size: {saving:?}"
    );
    assert_eq!(taken.json["transfers"], json!([]), "a finished save still shows a transfer");

    let one = || vec![call(&server, "GET", &format!("/v1/snapshots/{snapshot}"), None).json];
    let restore = json!({"snapshot": snapshot, "isolation": tier.name()});
    let (restored, restoring) = watching(|| call(&server, "POST", "/v1/sandboxes", Some(restore)), one, "restoring");
    assert_eq!(restored.status, 201, "{restored:?}");
    let size = taken.json["size_bytes"].as_u64().unwrap();
    assert!(
        restoring.iter().any(|&(done, total)| done > 0 && done <= size && total == Some(size)),
        "the restore showed no progress out of the snapshot's {size} bytes: {restoring:?}"
    );
    assert_eq!(one()[0]["transfers"], json!([]), "a finished restore still shows a transfer");
    let copy = restored.json["id"].as_str().unwrap().to_owned();
    for id in [copy, source] {
        assert_eq!(call(&server, "DELETE", &format!("/v1/sandboxes/{id}"), None).status, 204);
        assert_sandbox_gone_on(tier, &id);
    }
    assert_eq!(call(&server, "DELETE", &format!("/v1/snapshots/{snapshot}"), None).status, 204);
}

/// Every sandbox id of t1, in any state.
fn all_ids(server: &Server) -> Vec<String> {
    let listed = call(server, "GET", "/v1/sandboxes?state=all", None);
    listed.json["sandboxes"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_owned()).collect()
}

/// Every file under `dir`, recursively.
fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() { found.extend(files_under(&path)) } else { found.push(path) }
    }
    found.sort();
    found
}

fn kill_9_during_a_snapshot_upload_leaves_no_snapshot_that_lists_and_no_orphaned_chunk(tier: Tier) {
    // gc_grace_s = 0: the restart's GC removes every unreferenced chunk at once (the default keeps them an hour).
    let mut server = Server::start_with_on(tier, "[snapshots]\ngc_grace_s = 0\n");
    let id = server.create_on(tier, json!({"timeout_s": 600, "limits": {"disk_bytes": 512 << 20}}));
    assert_eq!(server.exec(&id, "echo kept > /workspace/kept").json["exit_code"], 0);
    let finished = snapshot_of(&server, &id);
    let store = server.database().parent().unwrap().join("snapshots");
    let chunks_of_finished = files_under(&store.join("chunks"));
    // Incompressible and large, so the upload takes seconds (the debug build moves a few MB/s).
    let big = server.exec(&id, "head -c 120M /dev/urandom > /workspace/big && echo ok");
    assert_eq!(big.json["stdout"], "ok\n", "{big:?}");
    let url = format!("{}/v1/sandboxes/{id}/snapshots", server.url);
    let agent = server.http().clone();
    let upload = std::thread::spawn(move || {
        agent.post(&url).header("Authorization", format!("Bearer {KEY_1}")).send_json(json!({})).map(|r| r.status())
    });
    // Wait until the upload is under way: its row is listed as saving and chunks of it are on disk.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let list = call(&server, "GET", "/v1/snapshots", None);
        let saving = list.json["snapshots"].as_array().unwrap().iter().any(|s| s["state"] == "saving");
        if saving && files_under(&store.join("chunks")).len() > chunks_of_finished.len() + 2 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the upload never got under way: {list:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    server.stop_with(libc::SIGKILL);
    let _ = upload.join();
    server.relaunch();
    let list = call(&server, "GET", "/v1/snapshots", None);
    let listed: Vec<&str> =
        list.json["snapshots"].as_array().unwrap().iter().map(|s| s["snapshot_id"].as_str().unwrap()).collect();
    assert_eq!(listed, vec![finished.as_str()], "after the crash: {list:?}");
    // `files_under` lists every file, so this also catches the `<hash>.zst#N` staging file object_store was writing
    // when the server died (object_store's own listing hides those; GC deletes them: snapshot-store's `staging`).
    let left = files_under(&store);
    let staging: Vec<_> = left.iter().filter(|path| path.to_string_lossy().contains('#')).collect();
    assert_eq!(staging, Vec::<&std::path::PathBuf>::new(), "the cut-off upload left staging files");
    assert_eq!(files_under(&store.join("chunks")), chunks_of_finished, "the cut-off upload left chunks");
    assert_eq!(files_under(&store.join("manifests")).len(), 1);
    // The sandbox died with the server (lost); the finished snapshot still restores.
    assert_sandbox_gone_on(tier, &id);
    let restored =
        call(&server, "POST", "/v1/sandboxes", Some(json!({"snapshot": finished, "isolation": tier.name()})));
    assert_eq!(restored.status, 201, "{restored:?}");
    let copy = restored.json["id"].as_str().unwrap().to_owned();
    assert_eq!(server.exec(&copy, "cat /workspace/kept; ls /workspace").json["stdout"], "kept\nkept\n");
    assert_eq!(call(&server, "DELETE", &format!("/v1/sandboxes/{copy}"), None).status, 204);
    assert_sandbox_gone_on(tier, &copy);
}

fn the_cli_snapshots_restores_forks_lists_and_removes(tier: Tier) {
    let server = Server::start_on(tier);
    let source = server.create_on(tier, json!({"timeout_s": 600}));
    assert_eq!(server.exec(&source, "echo from-cli > /workspace/note").json["exit_code"], 0);
    let cli = |args: &[&str]| {
        let output = std::process::Command::new(common::bin())
            .args(args)
            .args(["--url", &server.url])
            .env("SANDKASTEN_API_KEY", KEY_1)
            .output()
            .unwrap();
        (output.status.code(), String::from_utf8_lossy(&output.stdout).into_owned(), output)
    };
    let (code, snapshot, output) = cli(&["sandbox", "snapshot", &source, "--name", "cli"]);
    assert_eq!(code, Some(0), "{output:?}");
    let snapshot = snapshot.trim().to_owned();
    assert!(snapshot.starts_with("sn-"), "{output:?}");
    let (code, listed, output) = cli(&["snapshot", "list"]);
    assert_eq!(code, Some(0), "{output:?}");
    assert!(listed.contains(&snapshot) && listed.contains("ready") && listed.contains("cli"), "{listed}");
    let (code, restored, output) = cli(&["sandbox", "create", "--from", &snapshot]);
    assert_eq!(code, Some(0), "{output:?}");
    let restored = restored.trim().to_owned();
    assert_eq!(server.exec(&restored, "cat /workspace/note").json["stdout"], "from-cli\n");
    let (code, copies, output) = cli(&["sandbox", "fork", &source, "--count", "2"]);
    assert_eq!(code, Some(0), "{output:?}");
    let copies: Vec<&str> = copies.lines().collect();
    assert_eq!(copies.len(), 2, "{output:?}");
    for copy in &copies {
        assert_eq!(server.exec(copy, "cat /workspace/note").json["stdout"], "from-cli\n");
    }
    let (code, removed, output) = cli(&["snapshot", "rm", &snapshot]);
    assert_eq!((code, removed.trim()), (Some(0), snapshot.as_str()), "{output:?}");
    let (code, _, output) = cli(&["snapshot", "info", &snapshot]);
    assert_eq!(code, Some(2), "a removed snapshot is a 404, exit 2: {output:?}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("not found"), "{output:?}");
    for id in copies.iter().copied().chain([restored.as_str(), source.as_str()]) {
        assert_eq!(call(&server, "DELETE", &format!("/v1/sandboxes/{id}"), None).status, 204);
        assert_sandbox_gone_on(tier, id);
    }
}

fn snapshots_live_in_an_s3_store_when_one_is_configured(tier: Tier) {
    let moto = match moto::MotoServer::start() {
        Ok(moto) => moto,
        Err(reason) if std::env::var_os("CI").is_some() => panic!("{reason}"),
        Err(reason) => {
            println!("skipped: {reason}");
            return;
        }
    };
    let bucket = "sandkasten-server";
    moto.create_bucket(bucket);
    let prefix = format!("{tier}");
    let config = format!(
        "[snapshots]\nstore = \"s3://{bucket}/{prefix}\"\ns3_endpoint = \"{}\"\ns3_region = \"us-east-1\"\n\
         s3_access_key_id = \"testing\"\ns3_secret_access_key = \"testing\"\ns3_allow_http = true\ngc_grace_s = 0\n",
        moto.endpoint()
    );
    let server = Server::start_with_on(tier, &config);
    let source = server.create_on(tier, json!({"timeout_s": 600}));
    assert_eq!(server.exec(&source, PREPARE).json["exit_code"], 0);
    let snapshot = snapshot_of(&server, &source);
    assert_eq!(moto.keys(bucket, &format!("{prefix}/manifests/")), vec![format!("{prefix}/manifests/{snapshot}.json")]);
    let chunks = moto.keys(bucket, &format!("{prefix}/chunks/"));
    assert!(!chunks.is_empty());
    assert!(!server.database().parent().unwrap().join("snapshots").exists(), "an s3 store wrote to the local disk");
    let restored =
        call(&server, "POST", "/v1/sandboxes", Some(json!({"snapshot": snapshot, "isolation": tier.name()})));
    assert_eq!(restored.status, 201, "{restored:?}");
    let copy = restored.json["id"].as_str().unwrap().to_owned();
    assert_eq!(server.exec(&copy, CHECK).json["stdout"], EXPECTED);
    assert_eq!(call(&server, "DELETE", &format!("/v1/snapshots/{snapshot}"), None).status, 204);
    assert_eq!(moto.keys(bucket, &format!("{prefix}/")), Vec::<String>::new(), "the delete left objects");
    for id in [copy, source] {
        assert_eq!(call(&server, "DELETE", &format!("/v1/sandboxes/{id}"), None).status, 204);
        assert_sandbox_gone_on(tier, &id);
    }
}

/// The command limit of the sandboxes the ticker runs in: a background command is killed at it.
const TICKER_LIMIT_MS: u64 = 300_000;

/// A background loop that keeps a random token (made in its memory, never on disk before it runs) and a counter,
/// writing `token:count` to /tmp/tick every 50 ms.
const TICKER: &str = "/usr/bin/python3 -c 'import os, time\ntoken = os.urandom(8).hex()\ni = 0\nwhile True:\n    i += 1\n    open(\"/tmp/tick.new\", \"w\").write(f\"{token}:{i}\")\n    os.rename(\"/tmp/tick.new\", \"/tmp/tick\")\n    time.sleep(0.05)'";

fn tick(server: &Server, id: &str) -> (String, u64) {
    let read = server.exec(id, "cat /tmp/tick");
    let text = read.json["stdout"].as_str().unwrap_or_default().to_owned();
    let (token, count) = text.split_once(':').unwrap_or_else(|| panic!("no tick in {id}: {read:?}"));
    (token.to_owned(), count.parse().unwrap())
}

/// The ticker's first written tick in `id`, once there: Python starts in tens of milliseconds on a host CPU, in a
/// second or more in a guest under software emulation.
fn first_tick(server: &Server, id: &str) -> (String, u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while server.exec(id, "test -s /tmp/tick").json["exit_code"] != 0 {
        assert!(std::time::Instant::now() < deadline, "the ticker in {id} wrote nothing in 30 s");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    tick(server, id)
}

fn a_memory_snapshot_restores_running_processes_where_the_tier_can(tier: Tier) {
    let server = Server::start_with_on(tier, "[snapshots]\ngc_grace_s = 0\n");
    let source = server.create_on(tier, json!({"timeout_s": 600, "limits": {"timeout_ms": TICKER_LIMIT_MS}}));
    let path = format!("/v1/sandboxes/{source}/snapshots");
    if !tier.saves_memory() {
        let refused = call(&server, "POST", &path, Some(json!({"memory": true})));
        assert_eq!(refused.status, 409, "{refused:?}");
        let message = refused.json["error"]["message"].as_str().unwrap();
        assert!(message.contains("gvisor") && message.contains("\"memory\": false"), "{message}");
        assert_eq!(call(&server, "GET", "/v1/snapshots", None).json["snapshots"], json!([]));
        return;
    }
    let started = call(
        &server,
        "POST",
        &format!("/v1/sandboxes/{source}/exec"),
        Some(json!({"cmd": TICKER, "background": true})),
    );
    assert_eq!(started.status, 202, "{started:?}");
    let (token, before) = first_tick(&server, &source);
    let taken = call(&server, "POST", &path, Some(json!({"memory": true, "name": "ticking"})));
    assert_eq!(taken.status, 201, "{taken:?}");
    assert_eq!(taken.json["memory"], true);
    let snapshot = taken.json["snapshot_id"].as_str().unwrap().to_owned();
    // The source ran on through the snapshot.
    let (same, later) = tick(&server, &source);
    assert_eq!(same, token);
    assert!(later > before, "the source stopped ticking: {before} → {later}");
    // A memory snapshot restores with its sandbox's spec: asking for other limits is refused, and nothing is made.
    let refused = call(&server, "POST", "/v1/sandboxes", Some(json!({"snapshot": snapshot, "limits": {"pids": 64}})));
    assert_eq!(refused.status, 422, "{refused:?}");
    let restored = call(&server, "POST", "/v1/sandboxes", Some(json!({"snapshot": snapshot})));
    assert_eq!(restored.status, 201, "{restored:?}");
    let copy = restored.json["id"].as_str().unwrap().to_owned();
    assert_eq!(restored.json["isolation"]["tier"], tier.name());
    // The restored sandbox runs the same loop from where it was: the token only its memory held, the count going on.
    let (copied_token, at_restore) = tick(&server, &copy);
    assert_eq!(copied_token, token, "the restored loop is not the source's");
    assert!(at_restore >= before, "the count started over: {before} → {at_restore}");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (_, running) = tick(&server, &copy);
    assert!(running > at_restore, "the restored loop does not run: {at_restore} → {running}");
    // The copy is its own: a write there is not in the source.
    assert_eq!(server.exec(&copy, "echo mine > /tmp/only-copy").json["exit_code"], 0);
    assert_eq!(
        server.exec(&source, "ls /tmp/only-copy 2>&1 | head -c 0; test -e /tmp/only-copy; echo $?").json["stdout"],
        "1\n"
    );
    for id in [&copy, &source] {
        assert_eq!(call(&server, "DELETE", &format!("/v1/sandboxes/{id}"), None).status, 204);
        assert_sandbox_gone_on(tier, id);
    }
    assert_eq!(call(&server, "DELETE", &format!("/v1/snapshots/{snapshot}"), None).status, 204);
    let work = server.database().parent().unwrap().join("snapshot-work");
    assert_eq!(files_under(&work), Vec::<std::path::PathBuf>::new(), "a memory image was left on the host");
}

fn kill_9_during_a_restore_leaves_no_sandbox_running_and_the_snapshot_restorable(tier: Tier) {
    let mut server = Server::start_with_on(tier, "[snapshots]\ngc_grace_s = 0\n");
    let source = server.create_on(tier, json!({"timeout_s": 600, "limits": {"disk_bytes": 512 << 20}}));
    let big =
        server.exec(&source, "head -c 40M /dev/urandom > /workspace/big && echo kept > /workspace/kept && echo ok");
    assert_eq!(big.json["stdout"], "ok\n", "{big:?}");
    let snapshot = snapshot_of(&server, &source);
    assert_eq!(call(&server, "DELETE", &format!("/v1/sandboxes/{source}"), None).status, 204);
    let url = format!("{}/v1/sandboxes", server.url);
    let agent = server.http().clone();
    let body = json!({"snapshot": snapshot, "isolation": tier.name(), "limits": {"disk_bytes": 512 << 20}});
    let restore = std::thread::spawn(move || {
        agent.post(&url).header("Authorization", format!("Bearer {KEY_1}")).send_json(body).map(|r| r.status())
    });
    // Wait until the restore is under way: its sandbox is admitted (running) and receiving the files.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let restoring = loop {
        let list = call(&server, "GET", "/v1/sandboxes", None);
        if let Some(id) = list.json["sandboxes"].as_array().unwrap().first().and_then(|s| s["id"].as_str()) {
            let id = id.to_owned();
            std::thread::sleep(std::time::Duration::from_millis(300));
            break id;
        }
        assert!(std::time::Instant::now() < deadline, "the restore never got under way: {list:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    server.stop_with(libc::SIGKILL);
    let answered = restore.join().unwrap();
    assert!(answered.is_err(), "the restore finished before the kill, so this test proved nothing: {answered:?}");
    server.relaunch();
    // The half-restored sandbox died with the server: nothing of it runs, and it is not listed as running.
    assert_sandbox_gone_on(tier, &restoring);
    let running = call(&server, "GET", "/v1/sandboxes", None);
    assert_eq!(running.json["sandboxes"], json!([]), "after the crash: {running:?}");
    assert_ne!(call(&server, "GET", &format!("/v1/sandboxes/{restoring}"), None).json["state"], "running");
    // The snapshot is whole and restores.
    let again = call(
        &server,
        "POST",
        "/v1/sandboxes",
        Some(json!({"snapshot": snapshot, "isolation": tier.name(), "limits": {"disk_bytes": 512 << 20}})),
    );
    assert_eq!(again.status, 201, "{again:?}");
    let copy = again.json["id"].as_str().unwrap().to_owned();
    assert_eq!(server.exec(&copy, "cat /workspace/kept; stat -c %s /workspace/big").json["stdout"], "kept\n41943040\n");
    assert_eq!(call(&server, "DELETE", &format!("/v1/sandboxes/{copy}"), None).status, 204);
    assert_sandbox_gone_on(tier, &copy);
}
