//! Attacks on what the sandbox's owner (the CLI) holds: its standard input (a file or terminal of the host), and
//! process attributes the agent has for its own sake (an OOM score of -1000) that the program must not inherit.
//!
//! Every test runs on each isolation tier (`process::NAME`, `gvisor::NAME` and `microvm::NAME`, see `per_tier!`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use std::io::{Seek, SeekFrom};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};

use common::{Tier, bin, host_file};

per_tier!(
    program_cannot_write_to_the_owners_stdin_file,
    program_cannot_move_the_owners_read_position,
    program_runs_with_the_owners_oom_score_not_the_agents,
    dev_shm_fill_is_capped_and_reported_as_the_disk_limit,
);

fn program_cannot_write_to_the_owners_stdin_file(tier: Tier) {
    let _lock = common::shared_lock();
    let (_dir, path) = host_file("stdin-secret.txt", b"hostsecret\n");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let stdin = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    let script = "cat <&0; echo OVERWRITTEN-FROM-SANDBOX >&0; readlink /proc/self/fd/0";
    let output = Command::new(bin())
        .args(["run", "--isolation", tier.name(), "--", "sh", "-c", script])
        .stdin(stdin)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    // Positive control: the data itself was forwarded.
    assert!(stdout.contains("hostsecret"), "stdin data must still reach the program: {stdout}");
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "hostsecret\n",
        "the sandbox wrote into the owner's stdin file"
    );
    assert!(stdout.contains("pipe:"), "the program's stdin must be a pipe, not the owner's file: {stdout}");
    assert!(!stdout.contains(path.to_str().unwrap()), "the host path of the owner's stdin leaked: {stdout}");
}

fn program_cannot_move_the_owners_read_position(tier: Tier) {
    let _lock = common::shared_lock();
    let contents = b"line 1\nline 2\nline 3\n";
    let (_dir, path) = host_file("stdin-lines.txt", contents);
    let file = std::fs::File::open(&path).unwrap();
    let mut ours = file.try_clone().unwrap();
    let code = "import os, sys\nsys.stdin.buffer.read()\nos.lseek(0, 0, os.SEEK_SET)\n";
    let output = Command::new(bin())
        .args(["run", "--isolation", tier.name(), "--lang", "python", "--code", code])
        .stdin(file)
        .output()
        .unwrap();
    let position = ours.stream_position().unwrap();
    assert_eq!(position, contents.len() as u64, "the sandbox moved the owner's read position");
    assert!(String::from_utf8_lossy(&output.stderr).contains("Illegal seek"), "lseek on stdin must fail (ESPIPE)");
    assert_eq!(ours.seek(SeekFrom::End(0)).unwrap(), contents.len() as u64);
}

fn program_runs_with_the_owners_oom_score_not_the_agents(tier: Tier) {
    if tier == Tier::Gvisor {
        // gVisor's /proc/self/oom_score_adj is the Sentry's own bookkeeping (0), not the host's: the host's OOM
        // killer sees runsc's processes, so those must have the owner's score, not the agent's -1000.
        return gvisor_processes_have_the_owners_oom_score();
    }
    let _lock = common::shared_lock();
    let script = format!(
        "echo 500 > /proc/self/oom_score_adj; exec {} run --isolation {tier} -- cat /proc/self/oom_score_adj",
        bin()
    );
    let output = Command::new("/bin/sh").args(["-c", &script]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "500", "{}", String::from_utf8_lossy(&output.stderr));
}

/// Runs a gVisor sandbox from a CLI whose OOM score is 500 and reads the scores of the sandbox's host processes.
fn gvisor_processes_have_the_owners_oom_score() {
    let marker = common::unique_token("OOMSCORE");
    let script = format!(
        "echo 500 > /proc/self/oom_score_adj; exec {} run --isolation gvisor --lang bash --code 'sleep 3 # {marker}'",
        bin()
    );
    let cli = std::thread::spawn(move || {
        let _lock = common::shared_lock();
        Command::new("/bin/sh").args(["-c", &script]).stdin(Stdio::null()).output().unwrap()
    });
    let id = common::gvisor_sandbox_with_code(&marker, std::time::Duration::from_secs(10));
    std::thread::sleep(std::time::Duration::from_millis(500));
    let scores: Vec<(u32, String, String)> = id
        .iter()
        .flat_map(|id| common::runsc_processes(id))
        .map(|(pid, line)| {
            let score = std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).unwrap_or_default();
            (pid, common::excerpt(&line, 60), score.trim().to_owned())
        })
        .collect();
    let output = cli.join().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let id = id.expect("the sandbox's bundle was never seen");
    assert!(scores.iter().any(|(_, line, _)| line.starts_with("runsc-sandbox")), "no Sentry found: {scores:?}");
    for (pid, line, score) in &scores {
        // runsc's own short-lived children may be gone already; every one still there has the owner's score.
        assert!(score.is_empty() || score == "500", "host process {pid} ({line}) has OOM score {score}: {scores:?}");
    }
    common::assert_gone(Tier::Gvisor, &id);
}

fn dev_shm_fill_is_capped_and_reported_as_the_disk_limit(tier: Tier) {
    let result = common::run_on(
        tier,
        [
            "--disk",
            "8MiB",
            "--",
            "sh",
            "-c",
            "dd if=/dev/zero of=/dev/shm/fill bs=1M count=100 2>/dev/null; df -k /dev/shm | tail -1",
        ],
    )
    .json();
    assert_eq!(result.limit().as_deref(), Some("disk"), "{}", result.describe());
    common::assert_gone(tier, &result.id());
}
