//! Each limit of `sandkasten run` fires with the documented exit code and result flags, and the sandbox is gone
//! afterwards: time, memory, output (stdout and stderr), pids, disk (/workspace and /tmp); plus timings and usage.
//!
//! Every test runs on each isolation tier (`process::NAME`, `gvisor::NAME` and `microvm::NAME`, see `per_tier!`).

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use std::time::Duration;

use common::*;

per_tier!(
    timeout_fires_and_kills_sleep,
    memory_limit_fires_as_oom,
    memory_limit_holds_for_c_malloc_touch,
    output_limit_truncates_stdout_at_exactly_the_limit,
    output_limit_truncates_stderr,
    pids_limit_fires_on_fork_loop,
    disk_limit_fires_on_workspace_fill,
    disk_limit_fires_on_many_small_files,
    disk_limit_applies_to_tmp,
    normal_run_reports_no_limit,
    phases_are_non_decreasing,
    usage_reports_cpu_for_busy_loop,
    cpus_limit_throttles_parallel_busy_loops,
);

fn timeout_fires_and_kills_sleep(tier: Tier) {
    let r = run_on(tier, ["--timeout", "1s", "--", "sleep", "100"]).watchdog(Duration::from_secs(20)).json();
    assert_eq!(r.cli_code(), 124, "{}", r.describe());
    assert!(r.flag("timed_out"), "{}", r.describe());
    assert_eq!(r.limit().as_deref(), Some("time"), "{}", r.describe());
    assert!(r.output.elapsed < Duration::from_secs(10), "took {:?}", r.output.elapsed);
    let duration = r.json["duration_ms"].as_f64().unwrap_or(0.0);
    assert!((900.0..10_000.0).contains(&duration), "duration_ms {duration}\n{}", r.describe());
    assert_gone(tier, &r.id());
    let plain = run_on(tier, ["--timeout", "1s", "--", "sleep", "100"]).watchdog(Duration::from_secs(20)).output();
    assert_eq!(plain.code, 124, "{}", plain.describe());
}

/// The memory limit these tests set on `tier` (`--memory` argument, bytes) and what the host may charge beyond it:
/// a microVM needs 128 MiB for its guest kernel and its cgroup also holds QEMU (`VMM_OVERHEAD_BYTES`); elsewhere the
/// cgroup's own accounting rounds a little past the limit.
fn memory_limit(tier: Tier) -> (&'static str, u64, u64) {
    match tier {
        Tier::Microvm => ("128MiB", common::microvm::MICROVM_MIN_MEMORY_BYTES, common::microvm::VMM_OVERHEAD_BYTES),
        _ => ("64MiB", 64 << 20, 16 << 20),
    }
}

fn memory_limit_fires_as_oom(tier: Tier) {
    let code = "a = []\nwhile True:\n    a.append(b'x' * (4 << 20))\n";
    let (limit, limit_bytes, beyond) = memory_limit(tier);
    let r = code_on(tier, "python", code, &["--memory", limit, "--timeout", "20s"]).json();
    assert_eq!(r.cli_code(), 122, "{}", r.describe());
    assert!(r.flag("oom_killed"), "{}", r.describe());
    assert_eq!(r.limit().as_deref(), Some("memory"), "{}", r.describe());
    assert!(!r.flag("timed_out"), "{}", r.describe());
    let peak = r.json["usage"]["memory_peak_bytes"].as_u64().unwrap_or(0);
    assert!(
        peak > limit_bytes / 2 && peak <= limit_bytes + beyond,
        "peak {peak} should be near the {limit} limit\n{}",
        r.describe()
    );
    assert_gone(tier, &r.id());
}

fn memory_limit_holds_for_c_malloc_touch(tier: Tier) {
    let code = "#include <stdlib.h>\n#include <string.h>\n#include <stdio.h>\nint main(void){for(int i=0;i<1024;i++){char*p=malloc(1<<20);if(!p){puts(\"malloc failed\");return 1;}memset(p,1,1<<20);}puts(\"ALLOCATED 1GiB\");return 0;}\n";
    let (limit, _, _) = memory_limit(tier);
    let r = code_on(tier, "c", code, &["--memory", limit, "--timeout", "20s"]).json();
    assert!(!r.stdout().contains("ALLOCATED 1GiB"), "touched 1GiB under a {limit} limit\n{}", r.describe());
    assert_eq!(r.limit().as_deref(), Some("memory"), "{}", r.describe());
    assert!(r.flag("oom_killed"), "{}", r.describe());
    assert_eq!(r.cli_code(), 122, "{}", r.describe());
    assert_gone(tier, &r.id());
}

fn output_limit_truncates_stdout_at_exactly_the_limit(tier: Tier) {
    let code = "import sys\nfor _ in range(64):\n    sys.stdout.write('a' * 16384)\n    sys.stdout.flush()\n";
    let r = code_on(tier, "python", code, &["--output-limit", "64KiB", "--timeout", "10s"]).json();
    assert_eq!(r.cli_code(), 121, "{}", r.describe());
    assert_eq!(r.limit().as_deref(), Some("output"), "{}", r.describe());
    assert!(r.flag("stdout_truncated"), "{}", r.describe());
    assert!(!r.flag("stderr_truncated"), "{}", r.describe());
    assert_eq!(r.stdout().len(), 65536, "kept bytes == limit\n{}", r.describe());
    assert_gone(tier, &r.id());
    let plain = code_on(tier, "python", code, &["--output-limit", "64KiB", "--timeout", "10s"]).output();
    assert_eq!(plain.code, 121, "{}", plain.describe());
    assert!(plain.stdout.len() <= 65536, "plain mode streamed {} bytes past a 64KiB limit", plain.stdout.len());
}

fn output_limit_truncates_stderr(tier: Tier) {
    let r = code_on(tier, "bash", "yes err-line >&2", &["--output-limit", "64KiB", "--timeout", "10s"]).json();
    assert_eq!(r.cli_code(), 121, "{}", r.describe());
    assert_eq!(r.limit().as_deref(), Some("output"), "{}", r.describe());
    assert!(r.flag("stderr_truncated"), "{}", r.describe());
    assert_eq!(r.stderr().len(), 65536, "{}", r.describe());
    assert!(!r.flag("timed_out"), "the flood is stopped by the output limit, not the timeout\n{}", r.describe());
    assert_gone(tier, &r.id());
}

fn pids_limit_fires_on_fork_loop(tier: Tier) {
    let code = "import os, errno, signal, time\nkids = []\ntry:\n    for i in range(64):\n        pid = os.fork()\n        if pid == 0:\n            time.sleep(30)\n            os._exit(0)\n        kids.append(pid)\n    print('NO LIMIT', len(kids))\nexcept OSError as e:\n    print('fork failed', errno.errorcode.get(e.errno), len(kids))\nfor k in kids:\n    os.kill(k, signal.SIGKILL)\nfor k in kids:\n    os.waitpid(k, 0)\n";
    let r = code_on(tier, "python", code, &["--pids", "16", "--timeout", "20s"]).json();
    assert!(r.stdout().contains("fork failed EAGAIN"), "{}", r.describe());
    let forked: usize = r.stdout().split_whitespace().last().and_then(|n| n.parse().ok()).unwrap_or(999);
    assert!(forked < 16, "forked {forked} children under --pids 16\n{}", r.describe());
    match tier {
        // Known gap (docs/threat-model.md, gvisor and microvm tiers): the limit holds (checked above), but nothing
        // counts refused forks there (the Sentry; the guest's `RLIMIT_NPROC`), so the result cannot name the limit;
        // it must not name another one.
        Tier::Gvisor | Tier::Microvm => assert!(r.limit().is_none_or(|limit| limit == "pids"), "{}", r.describe()),
        _ => assert_eq!(r.limit().as_deref(), Some("pids"), "{}", r.describe()),
    }
    assert_gone(tier, &r.id());
}

fn disk_limit_fires_on_workspace_fill(tier: Tier) {
    let r = code_on(
        tier,
        "bash",
        "dd if=/dev/zero of=/workspace/fill bs=1M count=64; echo dd=$?",
        &["--disk", "8MiB", "--timeout", "10s"],
    )
    .json();
    assert_eq!(r.limit().as_deref(), Some("disk"), "{}", r.describe());
    let enospc = r.stderr().contains("No space left on device");
    let sigxfsz = r.signal() == Some(25) || r.stderr().contains("File size limit exceeded");
    assert!(enospc || sigxfsz, "dd must hit ENOSPC or SIGXFSZ\n{}", r.describe());
    assert!(!r.stdout().contains("dd=0"), "{}", r.describe());
    assert_gone(tier, &r.id());
}

fn disk_limit_fires_on_many_small_files(tier: Tier) {
    let r = code_on(tier,
        "bash",
        "for i in $(seq 1 16); do dd if=/dev/zero of=/workspace/f$i bs=1M count=1 2>/dev/null || { echo full at $i; df -k /workspace >&2; exit 1; }; done; echo all-written",
        &["--disk", "8MiB", "--timeout", "10s"],
    )
    .json();
    assert!(r.stdout().contains("full at"), "16MiB fit in an 8MiB /workspace\n{}", r.describe());
    assert_eq!(r.limit().as_deref(), Some("disk"), "{}", r.describe());
    assert_gone(tier, &r.id());
}

fn disk_limit_applies_to_tmp(tier: Tier) {
    let r = code_on(tier,
        "bash",
        "for i in $(seq 1 16); do dd if=/dev/zero of=/tmp/f$i bs=1M count=1 2>/dev/null || { echo full at $i; exit 1; }; done; echo all-written",
        &["--disk", "8MiB", "--timeout", "10s"],
    )
    .json();
    assert!(r.stdout().contains("full at"), "16MiB fit in an 8MiB /tmp\n{}", r.describe());
    assert_gone(tier, &r.id());
}

fn normal_run_reports_no_limit(tier: Tier) {
    let r = code_on(tier, "bash", "echo fine", &["--timeout", "10s", "--memory", "128MiB", "--pids", "32"]).json();
    r.assert_exit(0);
    assert_eq!(r.limit(), None, "{}", r.describe());
    assert!(!r.flag("timed_out") && !r.flag("oom_killed"), "{}", r.describe());
    assert!(!r.flag("stdout_truncated") && !r.flag("stderr_truncated"), "{}", r.describe());
    assert_gone(tier, &r.id());
}

fn phases_are_non_decreasing(tier: Tier) {
    let r = code_on(tier, "python", "print('x')", &[]).json();
    r.assert_exit(0);
    let phase = |k: &str| r.json["phases"][k].as_f64().unwrap_or(-1.0);
    let values = [phase("allocate"), phase("filesystem_ready"), phase("runtime_ready"), phase("first_command")];
    assert!(values[0] >= 0.0, "{}", r.describe());
    for w in values.windows(2) {
        assert!(w[0] <= w[1], "phases decrease: {values:?}\n{}", r.describe());
    }
    let duration = r.json["duration_ms"].as_f64().unwrap_or(-1.0);
    assert!(values[3] <= duration, "first_command {} > duration_ms {duration}", values[3]);
    assert_gone(tier, &r.id());
}

fn usage_reports_cpu_for_busy_loop(tier: Tier) {
    let r = code_on(tier, "python", "import time\nt=time.time()\nwhile time.time()-t<0.7: pass\n", &[]).json();
    r.assert_exit(0);
    let user = r.json["usage"]["cpu_user_ms"].as_f64().unwrap_or(0.0);
    let system = r.json["usage"]["cpu_system_ms"].as_f64().unwrap_or(0.0);
    assert!(user > 0.0, "{}", r.describe());
    assert!(user + system >= 300.0, "0.7s busy loop reported {user}+{system} ms\n{}", r.describe());
    assert!(r.json["usage"]["memory_peak_bytes"].as_u64().unwrap_or(0) > 1 << 20, "{}", r.describe());
    assert_gone(tier, &r.id());
}

fn cpus_limit_throttles_parallel_busy_loops(tier: Tier) {
    let code = "import os, time\nfor _ in range(2):\n    if os.fork() == 0:\n        t = time.time()\n        while time.time() - t < 1.5: pass\n        os._exit(0)\nfor _ in range(2): os.wait()\n";
    let r = code_on(tier, "python", code, &["--cpus", "0.5", "--timeout", "20s"]).json();
    r.assert_exit(0);
    let cpu = r.json["usage"]["cpu_user_ms"].as_f64().unwrap_or(0.0)
        + r.json["usage"]["cpu_system_ms"].as_f64().unwrap_or(0.0);
    // The quota covers the sandbox's whole life, not just the loops: on gVisor the sentry's own start (~1 s of CPU)
    // is charged to the same cgroup and the sandbox lives ~2.8 s; a microVM's boot under TCG is ~8 s of throttled CPU.
    // So the bound is half a CPU of its life plus what CFS lets through: the quota is enforced per 100 ms period and
    // each CPU may run up to a scheduler tick (4 ms at Debian's HZ=250) past it in each period before it is throttled
    // (84 ms over in a 17 s microVM life, 891 ms in a 1.57 s process-tier life were seen), plus two periods of slack.
    // Unthrottled, two loops of 1.5 s alone would be ~3 s of CPU, more than the whole life of a process or gVisor
    // sandbox, and a microVM's boot would run at a whole CPU. That life is the CLI's run: the cgroup exists only
    // within it, and its CPU is read as the sandbox is destroyed, after `duration_ms` stopped counting (a microVM's
    // VMM runs on until then).
    let life = r.output.elapsed.as_secs_f64() * 1000.0;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let overrun_per_ms = cpus * 4.0 / 100.0;
    let bound = (0.5 + overrun_per_ms) * life + 200.0;
    assert!(cpu > 0.0 && cpu <= bound, "cpu {cpu} ms in {life} ms under --cpus 0.5 (bound {bound})\n{}", r.describe());
    assert_gone(tier, &r.id());
}
