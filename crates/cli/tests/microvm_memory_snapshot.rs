//! Memory snapshots of microVMs at the runtime level (`SandboxRuntime::memory_snapshot` / `create_from_memory`),
//! through a real `LiveRuntime` and its spawner (QEMU's migration to a file, #13 item 5): the source runs on after
//! the snapshot; two sandboxes restored from one snapshot (a fork) each have the source's memory (a process started
//! before the snapshot counts on in both, with a token only its memory held) and its disk, and share nothing
//! afterwards; the snapshot's directory and files are root's alone; a truncated memory file is refused with a clear
//! error leaving nothing; nothing of any sandbox is left once destroyed.
//!
//! The microvm tier is not in `Tier::AVAILABLE` yet: a plain test that skips when QEMU or the boot files are
//! missing. It boots one VM and restores it three times, so it is one test asserting several things.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::microvm::{assert_no_microvm_leaks, vmm_processes};
use sandkasten_runtime::SandboxRuntime;
use sandkasten_runtime::config::RuntimeConfig;
use sandkasten_runtime::live::LiveRuntime;
use sandkasten_types::{CommandSpec, SandboxSpec, Tier};

fn spec() -> SandboxSpec {
    SandboxSpec { isolation: Some(Tier::Microvm), ..SandboxSpec::default() }
}

/// Runs `cmd` in sandbox `id`: its exit code and stdout.
async fn run(runtime: &dyn SandboxRuntime, id: &str, cmd: &str) -> (Option<i32>, String) {
    let command = CommandSpec { cmd: Some(cmd.to_owned()), timeout_ms: Some(60_000), ..CommandSpec::default() };
    let (output, mut chunks) = tokio::sync::mpsc::channel::<sandkasten_types::OutputChunk>(64);
    let collect = tokio::spawn(async move {
        let mut stdout = Vec::new();
        while let Some(chunk) = chunks.recv().await {
            if chunk.stream == sandkasten_types::StreamKind::Stdout {
                stdout.extend_from_slice(&chunk.data);
            }
        }
        String::from_utf8_lossy(&stdout).into_owned()
    });
    let exit = runtime.exec(id, command, 1 << 20, output).await.unwrap();
    (exit.exit_code, collect.await.unwrap())
}

async fn sh(runtime: &dyn SandboxRuntime, id: &str, cmd: &str) -> String {
    let (code, stdout) = run(runtime, id, cmd).await;
    assert_eq!(code, Some(0), "{cmd} in {id}: {stdout}");
    stdout
}

/// The ticker's token and count (`/tmp/tick`: `TOKEN:COUNT`), once it has ticked.
async fn tick(runtime: &dyn SandboxRuntime, id: &str) -> (String, u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let text = loop {
        match run(runtime, id, "cat /tmp/tick").await {
            (Some(0), text) => break text,
            (_, text) => assert!(std::time::Instant::now() < deadline, "no tick in {id}: {text:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (token, count) = text.trim().split_once(':').unwrap_or_else(|| panic!("no tick in {id}: {text:?}"));
    (token.to_owned(), count.parse().unwrap())
}

/// Waits until the ticker of `id` has counted past `after`; the count then.
async fn ticks_past(runtime: &dyn SandboxRuntime, id: &str, after: u64) -> u64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, now) = tick(runtime, id).await;
        if now > after {
            return now;
        }
        assert!(std::time::Instant::now() < deadline, "the ticker of {id} stopped at {now}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn id(n: u8) -> String {
    format!("sb-{:012x}{n:04x}", std::process::id())
}

#[test]
fn a_microvm_memory_snapshot_forks_into_sandboxes_that_go_on_from_it_and_share_nothing() {
    require_microvm!();
    let live = LiveRuntime::start(std::path::Path::new(common::bin()), RuntimeConfig::default()).unwrap();
    let runtime: &dyn SandboxRuntime = &live;
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let images = tempfile::tempdir().unwrap();
    let dir = images.path().join("memory");
    let (source, first, second, damaged) = (id(1), id(2), id(3), id(4));
    tokio.block_on(async {
        runtime.create(&source, &spec()).await.unwrap();
        sh(runtime, &source, "echo on-disk > /workspace/note").await;
        // A process of the guest's own, with a token only its memory holds, ticking into the disk.
        sh(
            runtime,
            &source,
            "(sh -c 't=$(head -c 6 /dev/urandom | od -An -tx1 | tr -d \" \\n\"); i=0; while :; do \
             i=$((i+1)); echo $t:$i > /tmp/tick.new; mv /tmp/tick.new /tmp/tick; sleep 0.1; done' \
             </dev/null >/dev/null 2>&1 &)",
        )
        .await;
        let (token, before) = tick(runtime, &source).await;

        runtime.memory_snapshot(&source, &dir).await.unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "the snapshot's directory is root's alone");
        for name in ["vm.qemu", "disk.qcow2", "vm.json"] {
            let file = std::fs::metadata(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(file.permissions().mode() & 0o777, 0o600, "{name} is root's alone");
        }
        let (same, _) = tick(runtime, &source).await;
        assert_eq!(same, token);
        ticks_past(runtime, &source, before).await;

        // A fork: two sandboxes from one snapshot, each with its own disk copy, VMM and id.
        for copy in [&first, &second] {
            runtime.create_from_memory(copy, &spec(), &dir).await.unwrap();
            assert_eq!(vmm_processes(copy).len(), 1, "{copy} has a VMM of its own");
            let (copied, at_restore) = tick(runtime, copy).await;
            assert_eq!(copied, token, "the ticker in {copy} is not the source's");
            assert!(at_restore >= before, "the count in {copy} started over: {before} → {at_restore}");
            ticks_past(runtime, copy, at_restore).await;
            assert_eq!(sh(runtime, copy, "cat /workspace/note").await, "on-disk\n", "the disk came with it");
        }
        sh(runtime, &first, "echo mine > /workspace/only-first").await;
        for other in [&second, &source] {
            let seen = sh(runtime, other, "cat /workspace/only-first 2>/dev/null || echo absent").await;
            assert_eq!(seen, "absent\n", "{other} sees a file written in {first}");
        }

        // A truncated memory file: refused with what QEMU said, and nothing of the sandbox is left.
        let broken = images.path().join("broken");
        std::fs::create_dir(&broken).unwrap();
        for name in ["disk.qcow2", "vm.json"] {
            std::fs::copy(dir.join(name), broken.join(name)).unwrap();
        }
        let memory = std::fs::read(dir.join("vm.qemu")).unwrap();
        std::fs::write(broken.join("vm.qemu"), &memory[..memory.len() / 2]).unwrap();
        let refused = runtime.create_from_memory(&damaged, &spec(), &broken).await.unwrap_err();
        assert!(refused.message.contains("memory snapshot"), "{}", refused.message);
        assert_no_microvm_leaks(&damaged);

        for id in [&source, &first, &second] {
            runtime.destroy(id).await.unwrap();
        }
    });
    for id in [&source, &first, &second] {
        assert_no_microvm_leaks(id);
    }
    assert!(dir.join("vm.qemu").is_file(), "the snapshot is the caller's: the runtime leaves it");
}
