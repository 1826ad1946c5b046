//! Memory snapshots at the runtime level (`SandboxRuntime::memory_snapshot` / `create_from_memory`, gVisor only),
//! driven through a real `LiveRuntime` and its spawner: a snapshot of a running sandbox leaves it running, and a new
//! sandbox started from it has the source's files in memory and its processes running on, while the two share
//! nothing afterwards; the image directory is 0700; the process tier refuses naming the gvisor tier; nothing of
//! either sandbox is left once both are destroyed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use sandkasten_runtime::SandboxRuntime;
use sandkasten_runtime::config::RuntimeConfig;
use sandkasten_runtime::live::LiveRuntime;
use sandkasten_types::{CommandSpec, FailureKind, SandboxSpec, Tier};

fn spec(tier: Tier) -> SandboxSpec {
    SandboxSpec { isolation: Some(tier), ..SandboxSpec::default() }
}

/// Runs `cmd` in sandbox `id` and returns its stdout.
async fn sh(runtime: &dyn SandboxRuntime, id: &str, cmd: &str) -> String {
    let command = CommandSpec { cmd: Some(cmd.to_owned()), timeout_ms: Some(30_000), ..CommandSpec::default() };
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
    assert_eq!(exit.exit_code, Some(0), "{cmd}: {exit:?}");
    collect.await.unwrap()
}

fn id(n: u8) -> String {
    format!("sb-{:012x}{n:04x}", std::process::id())
}

#[test]
fn a_memory_snapshot_leaves_the_source_running_and_starts_a_copy_that_goes_on_from_it() {
    require_runsc!();
    let live = LiveRuntime::start(std::path::Path::new(common::bin()), RuntimeConfig::default()).unwrap();
    // As the server holds it.
    let runtime: &dyn SandboxRuntime = &live;
    let tokio = tokio::runtime::Runtime::new().unwrap();
    let images = tempfile::tempdir().unwrap();
    let dir = images.path().join("memory");
    let (source, copy, process) = (id(1), id(2), id(3));
    tokio.block_on(async {
        runtime.create(&source, &spec(Tier::Gvisor)).await.unwrap();
        sh(runtime, &source, "echo in-memory > /tmp/note").await;
        // A process of the sandbox's own, unknown to the host, that ticks into a tmpfs file.
        sh(
            runtime,
            &source,
            "setsid sh -c 'while :; do echo t >> /tmp/ticks; sleep 0.05; done' </dev/null >/dev/null 2>&1 &",
        )
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;

        runtime.memory_snapshot(&source, &dir).await.unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "the image directory is root's alone");
        assert!(dir.join("checkpoint.img").is_file());
        assert_eq!(sh(runtime, &source, "cat /tmp/note").await, "in-memory\n", "the source runs on");

        runtime.create_from_memory(&copy, &spec(Tier::Gvisor), &dir).await.unwrap();
        assert_eq!(sh(runtime, &copy, "cat /tmp/note").await, "in-memory\n", "the copy has the source's memory");
        let ticks =
            |id: String| async move { sh(runtime, &id, "wc -l < /tmp/ticks").await.trim().parse::<u64>().unwrap() };
        let first = ticks(copy.clone()).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(ticks(copy.clone()).await > first, "the source's own process runs on in the copy");
        // Two sandboxes from here on: what one writes, the other does not see.
        sh(runtime, &copy, "echo copy > /tmp/mine").await;
        assert_eq!(sh(runtime, &source, "cat /tmp/mine 2>/dev/null || echo absent").await, "absent\n");

        // The process tier cannot, and says which tier can.
        runtime.create(&process, &spec(Tier::Process)).await.unwrap();
        let refused = runtime.memory_snapshot(&process, &images.path().join("p")).await.unwrap_err();
        assert_eq!(refused.kind, FailureKind::Conflict, "{refused:?}");
        assert!(refused.message.contains("gvisor"), "{}", refused.message);
        let refused = runtime.create_from_memory(&id(4), &spec(Tier::Process), &dir).await.unwrap_err();
        assert!(refused.message.contains("gvisor"), "{}", refused.message);

        for id in [&source, &copy, &process] {
            runtime.destroy(id).await.unwrap();
        }
    });
    for id in [&source, &copy] {
        common::assert_no_gvisor_leaks(id);
    }
    common::assert_no_leaks(&process);
    assert!(dir.join("checkpoint.img").is_file(), "the image is the caller's: the runtime leaves it");
}
