//! One-shot runs on the gVisor tier (`sandkasten run --isolation gvisor`), asserted on the host: the guest really
//! runs on gVisor's kernel (not the host's), its processes are not host processes while gVisor's own are in the
//! sandbox's cgroup, each language runs and returns its exit code, stdin reaches the program, the timeout fires, and
//! nothing of the sandbox (record, cgroup, bundle, runsc state, runsc/Sentry/gofer process) is left afterwards.

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use std::time::Duration;

use common::*;

#[test]
fn guest_kernel_is_gvisor_not_the_host_kernel() {
    require_runsc!();
    let host_release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap().trim().to_owned();
    let host_version = std::fs::read_to_string("/proc/version").unwrap().trim().to_owned();
    // Positive control: the process tier shares the host kernel, and the test sees that.
    let shared = run(["--", "uname", "-r"]).json();
    shared.assert_exit(0);
    assert_eq!(shared.stdout().trim(), host_release, "positive control: the process tier shows the host kernel");
    assert_no_leaks(&shared.id());

    let code = "uname -r; echo ---; cat /proc/version; echo ---; awk '$5 == \"/\" { for (i = 6; i < NF; i++) if ($i == \"-\") { print $(i + 1); exit } }' /proc/self/mountinfo";
    let r = gvisor_code("bash", code, &[]).json();
    r.assert_exit(0);
    let stdout = r.stdout();
    let parts: Vec<&str> = stdout.split("---\n").map(str::trim).collect();
    assert_eq!(parts.len(), 3, "{}", r.describe());
    let (release, version, root_fs) = (parts[0], parts[1], parts[2]);
    assert_ne!(release, host_release, "the guest sees the host's kernel release\n{}", r.describe());
    assert_eq!(release, "4.4.0", "gVisor's Sentry reports 4.4.0\n{}", r.describe());
    assert!(!version.is_empty(), "{}", r.describe());
    assert_ne!(version, host_version, "the guest's /proc/version is the host's\n{}", r.describe());
    assert!(!version.contains(&host_release), "the guest's /proc/version names the host kernel\n{}", r.describe());
    assert_eq!(
        root_fs,
        "9p",
        "the guest's root is served by the gofer (9p/lisafs), not a host mount\n{}",
        r.describe()
    );
    assert_no_gvisor_leaks(&r.id());
}

#[test]
fn guest_processes_are_not_host_processes_and_gvisor_runs_in_the_sandbox_cgroup() {
    require_runsc!();
    // The guest starts a process with `token` in its argv (split in the CLI's argv so only the guest has it whole);
    // `marker` (whole in the code file) lets the host find the sandbox's bundle while it runs.
    let token = unique_token("GUESTPROC");
    let marker = unique_token("MARK");
    let (head, tail) = token.split_at(5);
    let code = format!(
        "# {marker}\n(exec -a \"{head}\"\"{tail}\" sleep 4) &\nsleep 0.5\ntr '\\0' ' ' < /proc/$!/cmdline; echo\nwait\n"
    );
    let handle = std::thread::spawn(move || {
        gvisor_code("bash", &code, &["--timeout", "15s"]).watchdog(Duration::from_secs(30)).json()
    });
    let id = gvisor_sandbox_with_code(&marker, Duration::from_secs(10));
    let mut seen = None;
    if let Some(id) = &id {
        // runsc's processes once the sandbox has started; then the host's processes, sampled until the run ends (the
        // guest's process lives for most of it).
        let runsc = wait_for_runsc_processes(id, Duration::from_secs(10));
        let cgroups: Vec<(u32, String, String)> = runsc
            .iter()
            .map(|(pid, line)| {
                (*pid, line.clone(), std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default())
            })
            .collect();
        let mut token_seen = Vec::new();
        while !handle.is_finished() {
            token_seen.extend(token_processes(&token));
            std::thread::sleep(Duration::from_millis(100));
        }
        seen = Some((runsc, cgroups, token_seen));
    }
    let r = handle.join().expect("run thread");
    r.assert_exit(0);
    assert!(
        r.stdout().contains(&token),
        "positive control: the guest ran a process carrying the token\n{}",
        r.describe()
    );
    let id = id.unwrap_or_else(|| panic!("no bundle under {GVISOR_BUNDLES} held the code\n{}", r.describe()));
    assert_eq!(id, r.id(), "the bundle found is this run's");
    let (runsc, cgroups, token_seen) = seen.unwrap();
    assert!(token_seen.is_empty(), "the guest's process is a host process: {token_seen:?}");
    let argv0s: Vec<String> =
        runsc.iter().filter_map(|(_, line)| line.split_whitespace().next().map(str::to_owned)).collect();
    assert!(argv0s.iter().any(|a| a.ends_with("runsc-sandbox")), "no Sentry (runsc-sandbox) on the host: {argv0s:?}");
    assert!(argv0s.iter().any(|a| a.ends_with("runsc-gofer")), "no gofer (runsc-gofer) on the host: {argv0s:?}");
    for (pid, line, cgroup) in &cgroups {
        for controller in ["memory", "pids"] {
            assert_eq!(
                cgroup_of(cgroup, controller).as_deref(),
                Some(format!("/sandkasten/{id}").as_str()),
                "runsc process {pid} ({}) is not in the sandbox's {controller} cgroup:\n{cgroup}",
                excerpt(line, 120)
            );
        }
    }
    assert_no_token_processes(&token);
    assert_no_gvisor_leaks(&id);
}

/// The cgroup path of `controller` in a `/proc/PID/cgroup` text (v1 `N:a,b:/path`; v2's `0::/path` as a fallback).
fn cgroup_of(text: &str, controller: &str) -> Option<String> {
    let mut unified = None;
    for line in text.lines() {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        if controllers.split(',').any(|c| c == controller) {
            return Some(path.to_owned());
        }
        if controllers.is_empty() {
            unified = Some(path.to_owned());
        }
    }
    unified
}

#[test]
fn python_one_shot_returns_its_exit_code() {
    require_runsc!();
    let r = gvisor_code("python", "import sys\nprint(sum(range(10)))\nsys.exit(3)", &[]).json();
    r.assert_exit(3);
    assert_eq!(r.stdout(), "45\n", "{}", r.describe());
    assert_eq!(r.cli_code(), 3, "{}", r.describe());
    assert_eq!(r.limit(), None, "{}", r.describe());
    assert_no_gvisor_leaks(&r.id());
}

#[test]
fn node_one_shot_returns_its_exit_code() {
    require_runsc!();
    let r = gvisor_code("node", "console.log([1, 2, 3].map(x => x * 2).join(','));\nprocess.exit(4);", &[]).json();
    r.assert_exit(4);
    assert_eq!(r.stdout(), "2,4,6\n", "{}", r.describe());
    assert_no_gvisor_leaks(&r.id());
}

#[test]
fn bash_one_shot_returns_its_exit_code_and_stderr() {
    require_runsc!();
    let r = gvisor_code("bash", "echo out; echo err >&2; exit 6", &[]).json();
    r.assert_exit(6);
    assert_eq!(r.stdout(), "out\n", "{}", r.describe());
    assert_eq!(r.stderr(), "err\n", "{}", r.describe());
    assert_no_gvisor_leaks(&r.id());
}

#[test]
fn c_one_shot_compiles_and_returns_its_exit_code() {
    require_runsc!();
    let code = "#include <stdio.h>\nint main(void) { printf(\"c says %d\\n\", 6 * 7); return 5; }\n";
    let r = gvisor_code("c", code, &["--timeout", "15s"]).json();
    r.assert_exit(5);
    assert_eq!(r.stdout(), "c says 42\n", "{}", r.describe());
    assert_no_gvisor_leaks(&r.id());
    // A compile error is reported as one, not as the program's failure.
    let bad = gvisor_code("c", "int main(void) { return undeclared; }\n", &["--timeout", "15s"]).json();
    assert_eq!(bad.error_code().as_deref(), Some("compile_error"), "{}", bad.describe());
    assert_eq!(bad.cli_code(), 123, "{}", bad.describe());
    assert!(bad.stderr().contains("undeclared"), "gcc's message is in stderr\n{}", bad.describe());
    assert_no_gvisor_leaks(&bad.id());
}

#[test]
fn raw_command_runs_and_one_not_on_path_is_exec_failed_127() {
    require_runsc!();
    let r = gvisor_run(["--", "sh", "-c", "echo raw $0", "arg0"]).json();
    r.assert_exit(0);
    assert_eq!(r.stdout(), "raw arg0\n", "{}", r.describe());
    assert_no_gvisor_leaks(&r.id());
    let missing = gvisor_run(["--", "sandkasten-no-such-program"]).json();
    assert_eq!(missing.exit_code(), Some(127), "{}", missing.describe());
    assert_eq!(missing.error_code().as_deref(), Some("exec_failed"), "{}", missing.describe());
    assert_no_gvisor_leaks(&missing.id());
}

#[test]
fn program_stdin_is_forwarded() {
    require_runsc!();
    let r = gvisor_code("python", "import sys\nprint(sys.stdin.read().upper())", &[]).stdin("abc\ndef").json();
    r.assert_exit(0);
    assert_eq!(r.stdout(), "ABC\nDEF\n", "{}", r.describe());
    assert_no_gvisor_leaks(&r.id());
    // Without stdin, the program reads end-of-file at once (no hang until the timeout).
    let r = gvisor_run(["--timeout", "10s", "--", "sh", "-c", "read line; echo status=$?"]).json();
    r.assert_exit(0);
    assert_eq!(r.stdout(), "status=1\n", "{}", r.describe());
    assert!(!r.flag("timed_out"), "{}", r.describe());
    assert_no_gvisor_leaks(&r.id());
}

#[test]
fn binary_stdin_reaches_the_program_byte_for_byte() {
    require_runsc!();
    let bytes: &[u8] = b"raw\x00\xff\xfe\x80bytes\n";
    // Positive control: the process tier passes these bytes through unchanged.
    let control = run(["--", "cat"]).stdin(bytes).json();
    control.assert_exit(0);
    assert_eq!(control.stdout_bytes(), bytes, "positive control (process tier)\n{}", control.describe());
    assert_no_leaks(&control.id());
    let r = gvisor_run(["--", "cat"]).stdin(bytes).json();
    r.assert_exit(0);
    assert_eq!(r.stdout_bytes(), bytes, "stdin bytes changed on the way into the gVisor sandbox\n{}", r.describe());
    assert_no_gvisor_leaks(&r.id());
}

#[test]
fn binary_stdout_is_kept_exactly() {
    require_runsc!();
    let r = gvisor_run(["--", "printf", "a\\377\\376\\000b"]).json();
    r.assert_exit(0);
    assert_eq!(r.stdout_bytes(), b"a\xff\xfe\x00b", "{}", r.describe());
    assert_no_gvisor_leaks(&r.id());
}

#[test]
fn timeout_fires_and_kills_sleep() {
    require_runsc!();
    let r = gvisor_run(["--timeout", "2s", "--", "sleep", "100"]).watchdog(Duration::from_secs(20)).json();
    assert_eq!(r.cli_code(), 124, "{}", r.describe());
    assert!(r.flag("timed_out"), "{}", r.describe());
    assert_eq!(r.limit().as_deref(), Some("time"), "{}", r.describe());
    assert!(r.output.elapsed < Duration::from_secs(10), "took {:?}", r.output.elapsed);
    let duration = r.json["duration_ms"].as_f64().unwrap_or(0.0);
    assert!((1900.0..10_000.0).contains(&duration), "duration_ms {duration}\n{}", r.describe());
    assert_no_gvisor_leaks(&r.id());
}

#[test]
fn normal_run_reports_no_limit_and_sane_usage() {
    require_runsc!();
    let r = gvisor_code(
        "python",
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\nprint('done')",
        &[],
    )
    .json();
    r.assert_exit(0);
    assert_eq!(r.limit(), None, "{}", r.describe());
    assert!(r.json["error"].is_null(), "{}", r.describe());
    assert!(!r.flag("timed_out") && !r.flag("oom_killed"), "{}", r.describe());
    assert!(!r.flag("stdout_truncated") && !r.flag("stderr_truncated"), "{}", r.describe());
    let cpu = r.json["usage"]["cpu_user_ms"].as_f64().unwrap_or(0.0)
        + r.json["usage"]["cpu_system_ms"].as_f64().unwrap_or(0.0);
    assert!(cpu >= 400.0, "a busy loop of 0.5 s of CPU reported {cpu} ms\n{}", r.describe());
    let phase = |k: &str| r.json["phases"][k].as_f64().unwrap_or(-1.0);
    let values = [phase("allocate"), phase("filesystem_ready"), phase("runtime_ready"), phase("first_command")];
    assert!(values[0] > 0.0, "{}", r.describe());
    for w in values.windows(2) {
        assert!(w[0] <= w[1], "phases decrease: {values:?}\n{}", r.describe());
    }
    assert!(values[3] <= r.json["duration_ms"].as_f64().unwrap_or(-1.0), "{}", r.describe());
    assert_no_gvisor_leaks(&r.id());
}
