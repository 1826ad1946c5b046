//! Process attacks, asserted on the host: fork bombs, escapees that double-fork and setsid,
//! background processes that outlive the program, `kill -9 -1` against host processes, and seeing host processes.
//!
//! Every test runs on each isolation tier (`process::NAME`, `gvisor::NAME` and `microvm::NAME`, see `per_tier!`),
//! except the host uid mapping, which only the process tier has.

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

per_tier!(
    fork_bomb_is_contained,
    classic_fork_bomb_one_liner_leaves_nothing,
    fork_bomb_with_default_pids_is_contained,
    double_fork_setsid_escapee_is_killed_when_program_exits,
    escapee_holding_stdout_does_not_hang_the_run,
    background_processes_die_with_the_sandbox_in_plain_mode,
    timeout_kills_the_whole_tree,
    kill_all_cannot_reach_host_processes,
    host_processes_are_not_visible,
    setuid_binaries_cannot_gain_root,
);

fn fork_bomb_is_contained(tier: Tier) {
    // The shell stays alive after starting the bomb, so the bomb runs until a limit stops the sandbox.
    let r = code_on(tier, "bash", ":(){ :|:& };:; sleep 30", &["--timeout", "3s", "--pids", "64"])
        .watchdog(Duration::from_secs(40))
        .json();
    assert!(
        matches!(r.limit().as_deref(), Some("time") | Some("pids")),
        "a fork bomb ends by the time or pids limit\n{}",
        r.describe()
    );
    assert!(r.output.elapsed < Duration::from_secs(30), "teardown took {:?}", r.output.elapsed);
    assert_gone(tier, &r.id());
    // The host can still start processes.
    let status = Command::new("/bin/true").status().expect("host can still fork");
    assert!(status.success());
}

fn classic_fork_bomb_one_liner_leaves_nothing(tier: Tier) {
    // The classic one-liner returns at once; the bomb's processes must die with the sandbox all the same.
    let r = code_on(tier, "bash", ":(){ :|:& };:", &["--timeout", "3s", "--pids", "64"])
        .watchdog(Duration::from_secs(40))
        .json();
    assert!(r.output.elapsed < Duration::from_secs(30), "teardown took {:?}", r.output.elapsed);
    assert_gone(tier, &r.id());
}

/// The default pids limit contains a fork bomb. Memory is raised well above what the default number of Python
/// processes holds (on gVisor they peak at 200–250 MiB of the default 256 MiB, so under load the memory limit could
/// fire first), so that the limit under test is the one that fires.
fn fork_bomb_with_default_pids_is_contained(tier: Tier) {
    let r = code_on(
        tier,
        "python",
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        &["--timeout", "2s", "--memory", "1g"],
    )
    .watchdog(Duration::from_secs(40))
    .json();
    assert!(matches!(r.limit().as_deref(), Some("time") | Some("pids")), "{}", r.describe());
    assert_gone(tier, &r.id());
}

fn double_fork_setsid_escapee_is_killed_when_program_exits(tier: Tier) {
    let token = unique_token("ESCAPEE");
    // The grandchild detaches (setsid, double fork, stdio to /dev/null) and sleeps with the token in its argv; the
    // program prints its pid once it is running, then exits 0 immediately.
    let code = format!(
        "import os, sys, time\n\
         r, w = os.pipe()\n\
         if os.fork() == 0:\n\
         \x20   os.setsid()\n\
         \x20   if os.fork() == 0:\n\
         \x20       fd = os.open('/dev/null', os.O_RDWR)\n\
         \x20       for n in (0, 1, 2): os.dup2(fd, n)\n\
         \x20       os.write(w, str(os.getpid()).encode()); os.close(w)\n\
         \x20       os.execv('/usr/bin/python3', ['python3', '-c', 'import time; time.sleep(600)', '{token}'])\n\
         \x20   os._exit(0)\n\
         os.close(w)\n\
         pid = int(os.read(r, 64))\n\
         time.sleep(0.3)\n\
         print('escapee', pid, '{token}' in open(f'/proc/{{pid}}/cmdline').read())\n"
    );
    let r = code_on(tier, "python", &code, &["--timeout", "20s"]).watchdog(Duration::from_secs(30)).json();
    assert!(r.stdout().contains("True"), "positive control: the escapee ran with the token\n{}", r.describe());
    r.assert_exit(0);
    // Waiting for the escapee would end the run at its 20 s timeout; a microVM's boot (seconds under TCG, not counted
    // by the timeout) makes the wall time no measure of that.
    assert!(!r.flag("timed_out") && r.limit().is_none(), "the run waited for the escapee\n{}", r.describe());
    assert!(r.output.elapsed < Duration::from_secs(15) || tier == Tier::Microvm, "{:?}", r.output.elapsed);
    assert_no_token_processes(&token);
    assert_gone(tier, &r.id());
}

fn escapee_holding_stdout_does_not_hang_the_run(tier: Tier) {
    let token = unique_token("HOLDER");
    let code = format!("setsid sh -c 'sleep 600; :' {token} &\nsleep 0.3\necho started");
    let r = code_on(tier, "bash", &code, &["--timeout", "20s"]).watchdog(Duration::from_secs(30)).json();
    r.assert_exit(0);
    assert_eq!(r.stdout(), "started\n", "{}", r.describe());
    assert!(!r.flag("timed_out") && r.limit().is_none(), "the run waited for the holder\n{}", r.describe());
    assert!(r.output.elapsed < Duration::from_secs(15) || tier == Tier::Microvm, "{:?}", r.output.elapsed);
    assert_no_token_processes(&token);
    assert_gone(tier, &r.id());
}

fn background_processes_die_with_the_sandbox_in_plain_mode(tier: Tier) {
    let token = unique_token("BGPLAIN");
    let code = format!("nohup sh -c 'sleep 600; :' {token} >/dev/null 2>&1 &\ndisown\nsleep 0.3\necho bye");
    let out = code_on(tier, "bash", &code, &["--timeout", "20s"]).watchdog(Duration::from_secs(30)).output();
    assert_eq!(out.code, 0, "{}", out.describe());
    assert_no_token_processes(&token);
}

fn timeout_kills_the_whole_tree(tier: Tier) {
    let token = unique_token("TREE");
    let code =
        format!("for i in 1 2 3; do setsid sh -c 'sleep 600; :' {token} </dev/null >/dev/null 2>&1 & done\nsleep 600");
    let r = code_on(tier, "bash", &code, &["--timeout", "1s"]).watchdog(Duration::from_secs(20)).json();
    assert_eq!(r.limit().as_deref(), Some("time"), "{}", r.describe());
    assert_eq!(r.cli_code(), 124, "{}", r.describe());
    assert_no_token_processes(&token);
    assert_gone(tier, &r.id());
}

/// Process tier only (tier_coverage.rs says why): gVisor's guest processes are not host processes at all.
#[test]
fn sandbox_processes_run_as_unprivileged_host_uid() {
    require_root!();
    let tier = Tier::Process;
    let token = unique_token("UIDPROBE");
    // While the sandbox runs, look at it from the host: its processes must be mapped into the sandbox uid range.
    // The token is split in the CLI's argv so that only the sandboxed process carries it whole.
    let (head, tail) = token.split_at(4);
    let code = format!("exec -a \"{head}\"\"{tail}\" sleep 3");
    let handle = std::thread::spawn(move || code_on(tier, "bash", &code, &["--timeout", "10s"]).json());
    let mut seen = Vec::new();
    for _ in 0..100 {
        seen = token_processes(&token);
        if !seen.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let uids: Vec<Option<u32>> = seen.iter().map(|(pid, _)| process_uid(*pid)).collect();
    let r = handle.join().expect("run thread");
    assert!(!seen.is_empty(), "positive control: the host sees the sandboxed process\n{}", r.describe());
    for uid in &uids {
        let uid = uid.unwrap_or(0);
        assert!(
            (SANDBOX_UID_BASE..SANDBOX_UID_END).contains(&uid),
            "sandbox process runs as host uid {uid}, outside the sandbox ranges"
        );
        assert_eq!(
            (uid - SANDBOX_UID_BASE) % 65536,
            1000,
            "inside uid 1000 maps to host uid {uid}, not a range's 1000"
        );
    }
    assert_no_token_processes(&token);
    assert_gone(tier, &r.id());
}

fn kill_all_cannot_reach_host_processes(tier: Tier) {
    let mut victim = HostVictim::sleep();
    let pid = victim.pid();
    let test_pid = std::process::id();
    let code = format!(
        "kill -9 -1; echo kill-all=$?\n\
         kill -9 {pid}; echo kill-victim=$?\n\
         kill -9 {test_pid}; echo kill-test=$?\n\
         python3 -c 'import os\nfor p in ({pid}, {test_pid}):\n  try:\n    os.kill(p, 9); print(\"KILLED\", p)\n  except OSError as e: print(\"failed\", p, type(e).__name__)'\n"
    );
    let r = code_on(tier, "bash", &code, &["--timeout", "10s"]).json();
    std::thread::sleep(Duration::from_millis(200));
    assert!(victim.alive(), "host process {pid} was killed from inside the sandbox\n{}", r.describe());
    assert!(!r.stdout().contains("KILLED"), "{}", r.describe());
    assert!(r.stdout().contains("kill-victim=1"), "{}", r.describe());
    assert_gone(tier, &r.id());
}

fn host_processes_are_not_visible(tier: Tier) {
    let victim = HostVictim::sleep();
    let code = format!(
        "import os\ndef cmdline(p):\n    try:\n        return open('/proc/%s/cmdline' % p).read()\n    except OSError:\n        return ''\npids = [p for p in os.listdir('/proc') if p.isdigit() and cmdline(p)]\nprint(len(pids))\nprint('VISIBLE' if os.path.exists('/proc/{}/cmdline') else 'hidden')\nprint(open('/proc/1/cmdline').read().replace('\\0', ' '))\n",
        victim.pid()
    );
    let r = code_on(tier, "python", &code, &[]).json();
    r.assert_exit(0);
    // Processes with a command line: a microVM's guest kernel has threads of its own (empty command lines), which
    // are the guest's, not the host's.
    let count: usize = r.stdout().lines().next().and_then(|l| l.parse().ok()).unwrap_or(999);
    assert!(count < 10, "the sandbox sees {count} processes: not its own pid namespace\n{}", r.describe());
    assert!(r.stdout().contains("hidden"), "{}", r.describe());
    assert!(!r.stdout().contains("systemd") && !r.stdout().contains("/sbin/init"), "{}", r.describe());
    assert_gone(tier, &r.id());
}

/// The host's setuid programs (`su`, a setuid `sudo` where the host has one) raise nothing under no_new_privs. The
/// sandbox's own `sudo` (on `PATH`, served by the agent) is the sandbox's root by design: `attacks_sudo`.
fn setuid_binaries_cannot_gain_root(tier: Tier) {
    let code = "su -c 'id -u' root </dev/null; echo su=$?\n\
                [ -u /usr/bin/sudo ] && { /usr/bin/sudo -n id -u </dev/null; echo sudo=$?; }\n\
                python3 -c 'import os\ntry:\n  os.setuid(0); print(\"SETUID-OK\")\nexcept OSError as e: print(\"setuid\", e.errno)'\n\
                grep -E '^(CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status\n";
    let r = code_on(tier, "bash", code, &["--timeout", "10s"]).json();
    let out = r.stdout();
    assert!(!out.lines().any(|l| l.trim() == "0"), "something printed uid 0\n{}", r.describe());
    assert!(!out.contains("SETUID-OK"), "{}", r.describe());
    assert!(!out.contains("su=0"), "{}", r.describe());
    assert!(!out.contains("sudo=0"), "{}", r.describe());
    // gVisor's /proc/self/status has no CapAmb and no NoNewPrivs line: the ambient set cannot hold more than the
    // (empty) permitted one, and no_new_privs is asked of the kernel (prctl) below.
    let caps: &[&str] = if tier == Tier::Gvisor { &["CapEff", "CapPrm"] } else { &["CapEff", "CapPrm", "CapAmb"] };
    for cap in caps {
        assert!(out.contains(&format!("{cap}:\t0000000000000000")), "{cap} not empty\n{}", r.describe());
    }
    if tier == Tier::Gvisor {
        let nnp = code_on(tier, "python", "import ctypes\nprint(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))", &[]).json();
        assert_eq!(nnp.stdout(), "1\n", "no_new_privs not set (PR_GET_NO_NEW_PRIVS)\n{}", nnp.describe());
        assert_gone(tier, &nnp.id());
    } else {
        assert!(out.contains("NoNewPrivs:\t1"), "no_new_privs not set\n{}", r.describe());
    }
    assert!(out.contains("Seccomp:\t2"), "seccomp filter not active\n{}", r.describe());
    assert_gone(tier, &r.id());
}
