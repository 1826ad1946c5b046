//! Bad input is refused before anything is created: exit code 2, a one-line message on stderr, no record and no
//! cgroup. Each test holds the suite lock exclusively (so this suite's other tests do not run sandboxes meanwhile) and
//! attributes any new sandbox by its record's owner pid (tests outside the lock may still run sandboxes).

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use common::*;

/// Runs `sandkasten run <args>` and asserts exit 2, one line on stderr mentioning `hint`, nothing created.
fn assert_bad_input(args: &[&str], stdin: Option<Vec<u8>>, hint: &str) {
    let _lock = exclusive_lock();
    let before = global_state();
    let mut cli = run(args.iter().copied());
    if let Some(bytes) = stdin.clone() {
        cli = cli.stdin(bytes);
    }
    let out = cli.output_unlocked();
    let after = global_state();
    assert_eq!(out.code, 2, "bad input must exit 2\n{}", out.describe());
    let stderr = out.stderr_text();
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one-line error expected on stderr\n{}", out.describe());
    assert!(
        stderr.to_lowercase().contains(&hint.to_lowercase()),
        "the message should mention {hint:?}\n{}",
        out.describe()
    );
    assert!(out.stdout.is_empty(), "nothing on stdout in plain mode\n{}", out.describe());
    let created = created_by(out.pid, &before, &after);
    assert!(created.is_empty(), "bad input created host state: {created:?}");
    // The same in --json mode: still exit 2 and nothing created.
    let mut json_args = vec!["--json"];
    json_args.extend_from_slice(args);
    let before = global_state();
    let mut cli = run(json_args.iter().copied());
    if let Some(bytes) = stdin {
        cli = cli.stdin(bytes);
    }
    let out = cli.output_unlocked();
    let after = global_state();
    assert_eq!(out.code, 2, "bad input must exit 2 with --json too\n{}", out.describe());
    let created = created_by(out.pid, &before, &after);
    assert!(created.is_empty(), "bad input (--json) created host state: {created:?}");
}

#[test]
fn unknown_language_is_refused() {
    require_root!();
    assert_bad_input(&["--lang", "cobol", "--code", "x"], None, "cobol");
}

#[test]
fn malformed_memory_is_refused() {
    require_root!();
    assert_bad_input(&["--lang", "bash", "--code", "true", "--memory", "lots"], None, "lots");
}

#[test]
fn timeout_without_unit_is_refused() {
    require_root!();
    assert_bad_input(&["--lang", "bash", "--code", "true", "--timeout", "10"], None, "10");
}

#[test]
fn missing_code_file_is_refused() {
    require_root!();
    let missing = format!("/nonexistent/{}.py", unique_token("missing"));
    assert_bad_input(&["--lang", "python", "--file", &missing], None, &missing);
}

#[test]
fn missing_upload_file_is_refused() {
    require_root!();
    let missing = format!("/nonexistent/{}.txt", unique_token("missing"));
    let upload = format!("{missing}:in.txt");
    assert_bad_input(&["--lang", "bash", "--code", "true", "--upload", &upload], None, &missing);
}

#[test]
fn upload_target_outside_workspace_and_tmp_is_refused() {
    require_root!();
    let (_dir, path) = host_file("f.txt", b"x");
    let upload = format!("{}:/etc/passwd", path.display());
    assert_bad_input(&["--lang", "bash", "--code", "true", "--upload", &upload], None, "/etc/passwd");
}

#[test]
fn oversized_code_file_is_refused() {
    require_root!();
    let big = vec![b'#'; (1 << 20) + 1];
    let (_dir, path) = host_file("big.py", &big);
    assert_bad_input(&["--lang", "python", "--file", path.to_str().unwrap()], None, "code");
}

#[test]
fn oversized_code_on_stdin_is_refused() {
    require_root!();
    let big = vec![b'#'; (1 << 20) + 1];
    assert_bad_input(&["--lang", "python"], Some(big), "code");
}

#[test]
fn both_code_and_file_are_refused() {
    require_root!();
    let (_dir, path) = host_file("p.py", b"print(1)");
    assert_bad_input(&["--lang", "python", "--code", "print(1)", "--file", path.to_str().unwrap()], None, "--file");
}

#[test]
fn malformed_env_is_refused() {
    require_root!();
    assert_bad_input(&["--lang", "bash", "--code", "true", "--env", "NOEQUALSSIGN"], None, "NOEQUALSSIGN");
}

#[test]
fn not_root_is_refused_with_a_hint_and_nothing_created() {
    require_root!();
    use std::os::unix::process::CommandExt;
    let _lock = exclusive_lock();
    let before = global_state();
    let output = std::process::Command::new(common::bin())
        .args(["run", "--lang", "python", "--code", "print(1)"])
        .uid(65534)
        .gid(65534)
        .output()
        .expect("run as nobody");
    let stderr = String::from_utf8_lossy(&output.stderr);
    if stderr.contains("Permission denied") && output.status.code() != Some(2) {
        eprintln!("skipped: the test binary is not executable by uid 65534 ({stderr})");
        return;
    }
    assert_eq!(output.status.code(), Some(2), "not root must exit 2: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("root"), "the message must say to run as root: {stderr}");
    assert_eq!(global_state(), before, "nothing may be created");
}

/// The host's cap on one sandbox's processes (a quarter of `kernel.pid_max`, at most 65,536).
fn host_pids_cap() -> u64 {
    let pid_max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max").unwrap().trim().parse().unwrap();
    (pid_max / 4).min(65_536)
}

#[test]
fn more_pids_than_one_sandbox_may_have_on_this_host_is_refused_naming_the_cap() {
    require_root!();
    let cap = host_pids_cap();
    if cap >= 65_536 {
        eprintln!("skipped: kernel.pid_max allows every pids value a spec may ask for");
        return;
    }
    let over = (cap + 1).to_string();
    assert_bad_input(&["--pids", &over, "--", "true"], None, "kernel.pid_max");
    // Positive control: the cap itself is allowed.
    let r = run(["--pids", &cap.to_string(), "--", "true"]).json();
    r.assert_exit(0);
}
