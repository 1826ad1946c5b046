//! Commands on a pseudo-terminal against a real `sandkasten serve` (#14, item 1): `POST …/exec {"pty": {cols, rows}}`
//! gives the program a terminal of the sandbox's own devpts (`/dev/pts/0` for the sandbox's first, whatever the host
//! has), of the size asked for, as its controlling terminal (it is a session leader); typed input reaches it, a
//! resize is seen (SIGWINCH and the new size), `TIOCSTI` on it is refused by seccomp (EPERM), the host's `/dev/pts`
//! is untouched and (process tier, where the program is a host process) the program's stdin is a terminal of a
//! devpts other than the host's. A flood on the terminal is cut at `limits.output_bytes` (the program runs on); a
//! terminal survives pause and resume (gVisor: checkpoint and restore). Bad
//! sizes are 422 saying why; nothing is left after delete.
//!
//! Every test runs on each isolation tier (`process::NAME`, `gvisor::NAME` and `microvm::NAME`, see `per_tier!`).

#![allow(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod serve;

use std::collections::BTreeSet;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use common::Tier;
use serde_json::{Value, json};
use serve::{KEY_1, Server, assert_sandbox_gone_on};

per_tier!(
    a_pty_command_is_a_session_leader_on_a_terminal_of_the_sandboxs_own_devpts,
    typed_input_reaches_the_program_and_a_resize_is_seen,
    tiocsti_on_the_terminal_is_refused,
    the_host_dev_pts_is_untouched_and_nothing_is_left_after_delete,
    bad_sizes_and_resizing_a_command_without_a_terminal_are_refused,
    a_terminal_flood_is_cut_at_the_output_limit,
    a_terminal_survives_pause_and_resume,
);

fn exec(server: &Server, id: &str, body: Value) -> serve::Reply {
    server.call("POST", &format!("/v1/sandboxes/{id}/exec"), KEY_1, Some(body))
}

/// Starts `body` in the background and returns the command id.
fn start(server: &Server, id: &str, body: Value) -> String {
    let mut body = body;
    body["background"] = json!(true);
    let reply = exec(server, id, body);
    assert_eq!(reply.status, 202, "{reply:?}");
    reply.json["command_id"].as_str().unwrap().to_owned()
}

fn post(server: &Server, id: &str, command: &str, what: &str, body: Value) -> serve::Reply {
    server.call("POST", &format!("/v1/sandboxes/{id}/commands/{command}/{what}"), KEY_1, Some(body))
}

/// The stdout a command's event stream carried until it ended.
fn streamed_stdout(server: &Server, id: &str, command: &str) -> String {
    let mut text = String::new();
    server
        .http()
        .get(format!("{}/v1/sandboxes/{id}/commands/{command}/stream", server.url))
        .header("Authorization", format!("Bearer {KEY_1}"))
        .call()
        .unwrap()
        .into_body()
        .into_reader()
        .read_to_string(&mut text)
        .unwrap();
    text.split("\n\n")
        .filter(|block| block.lines().any(|l| l == "event: stdout"))
        .filter_map(|block| block.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|data| serde_json::from_str::<Value>(data).unwrap()["data"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The stdout retained so far (the stream's replay, without waiting for the end), polled until it holds `needle`.
fn wait_for_output(server: &Server, id: &str, command: &str, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut reader = server
            .http()
            .get(format!("{}/v1/sandboxes/{id}/commands/{command}/stream", server.url))
            .header("Authorization", format!("Bearer {KEY_1}"))
            .call()
            .unwrap()
            .into_body()
            .into_reader();
        let mut seen = String::new();
        let mut buffer = [0u8; 4096];
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(500) && !seen.contains(needle) {
            match reader.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.push_str(&String::from_utf8_lossy(&buffer[..n])),
            }
        }
        if seen.contains(needle) {
            return seen;
        }
        assert!(Instant::now() < deadline, "{needle:?} never appeared in {command}'s output: {seen}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn lines(text: &str) -> Vec<String> {
    text.lines().map(|line| line.trim_end_matches('\r').to_owned()).collect()
}

fn a_pty_command_is_a_session_leader_on_a_terminal_of_the_sandboxs_own_devpts(tier: Tier) {
    let server = Server::start_on(tier);
    let id = server.create_on(tier, json!({}));
    let reply = exec(
        &server,
        &id,
        json!({"cmd": "tty; stty size; [ -t 1 ] && [ -t 2 ] && echo out-and-err-too", "pty": {"cols": 100, "rows": 30}}),
    );
    assert_eq!(reply.status, 200, "{reply:?}");
    let out = lines(reply.json["stdout"].as_str().unwrap());
    // The sandbox's first terminal: its devpts numbers its own terminals, whatever the host has open.
    assert_eq!(out[0], "/dev/pts/0", "{reply:?}");
    assert_eq!(out[1], "30 100", "{reply:?}");
    assert_eq!(out[2], "out-and-err-too", "{reply:?}");
    assert_eq!(reply.json["exit_code"], 0, "{reply:?}");

    let check = "import os; print(os.isatty(0), os.getsid(0) == os.getpid(), os.tcgetpgrp(0) == os.getpgrp())";
    let reply = exec(&server, &id, json!({"argv": ["/usr/bin/python3", "-c", check], "pty": {"cols": 80, "rows": 24}}));
    assert_eq!(reply.status, 200, "{reply:?}");
    // A terminal, the session's leader, and the terminal's foreground group: its controlling terminal.
    assert_eq!(lines(reply.json["stdout"].as_str().unwrap()), ["True True True"], "{reply:?}");

    // Programs may open terminals of their own (tmux, script, expect), from the sandbox's devpts too.
    let nested = "import os; leader, follower = os.openpty(); print(os.ttyname(follower))";
    let reply = exec(&server, &id, json!({"argv": ["/usr/bin/python3", "-c", nested]}));
    assert_eq!(reply.status, 200, "{reply:?}");
    assert!(reply.json["stdout"].as_str().unwrap().starts_with("/dev/pts/"), "{reply:?}");

    let plain = exec(&server, &id, json!({"cmd": "tty; [ -t 0 ] || echo no-terminal"}));
    assert_eq!(lines(plain.json["stdout"].as_str().unwrap()), ["not a tty", "no-terminal"], "{plain:?}");
    server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None);
    assert_sandbox_gone_on(tier, &id);
}

fn typed_input_reaches_the_program_and_a_resize_is_seen(tier: Tier) {
    let server = Server::start_on(tier);
    let id = server.create_on(tier, json!({}));
    let program = "import fcntl, signal, struct, sys, termios\n\
        winched = []\n\
        signal.signal(signal.SIGWINCH, lambda *_: winched.append(1))\n\
        print('ready', flush=True)\n\
        print('got', sys.stdin.readline().strip(), flush=True)\n\
        sys.stdin.readline()\n\
        rows, cols = struct.unpack('hh', fcntl.ioctl(0, termios.TIOCGWINSZ, bytes(4)))\n\
        print('winched' if winched else 'not-winched', rows, cols, flush=True)\n";
    let command =
        start(&server, &id, json!({"argv": ["/usr/bin/python3", "-c", program], "pty": {"cols": 80, "rows": 24}}));
    wait_for_output(&server, &id, &command, "ready");
    let typed = post(&server, &id, &command, "stdin", json!({"data": "hello there\n"}));
    assert_eq!(typed.status, 204, "{typed:?}");
    wait_for_output(&server, &id, &command, "got hello there");
    let resized = post(&server, &id, &command, "resize", json!({"cols": 132, "rows": 43}));
    assert_eq!(resized.status, 204, "{resized:?}");
    assert_eq!(post(&server, &id, &command, "stdin", json!({"data": "\n"})).status, 204);
    let out = streamed_stdout(&server, &id, &command);
    // The terminal echoes what was typed, as a terminal does.
    assert!(out.contains("hello there\r\n"), "{out:?}");
    assert!(lines(&out).contains(&"winched 43 132".to_owned()), "{out:?}");
    server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None);
    assert_sandbox_gone_on(tier, &id);
}

fn tiocsti_on_the_terminal_is_refused(tier: Tier) {
    let server = Server::start_on(tier);
    let id = server.create_on(tier, json!({}));
    // Pushing bytes into the terminal's input queue would type commands for whoever reads it next.
    let attack = "import fcntl, os, termios\n\
        print('tty', os.isatty(0), flush=True)\n\
        try:\n    fcntl.ioctl(0, termios.TIOCSTI, b'x')\n    print('injected')\n\
        except OSError as e:\n    print('refused', e.errno)\n";
    let reply =
        exec(&server, &id, json!({"argv": ["/usr/bin/python3", "-c", attack], "pty": {"cols": 80, "rows": 24}}));
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(
        lines(reply.json["stdout"].as_str().unwrap()),
        ["tty True", &format!("refused {}", libc::EPERM)],
        "{reply:?}"
    );
    server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None);
    assert_sandbox_gone_on(tier, &id);
}

fn host_pts() -> BTreeSet<String> {
    common::dir_names("/dev/pts")
}

fn the_host_dev_pts_is_untouched_and_nothing_is_left_after_delete(tier: Tier) {
    let server = Server::start_on(tier);
    let id = server.create_on(tier, json!({}));
    let before = host_pts();
    let token = common::unique_token("pty-sleeper");
    let command =
        start(&server, &id, json!({"cmd": format!("tty; exec -a {token} sleep 60"), "pty": {"cols": 80, "rows": 24}}));
    let second = start(&server, &id, json!({"cmd": "tty; sleep 60", "pty": {"cols": 80, "rows": 24}}));
    wait_for_output(&server, &id, &command, "/dev/pts/0");
    // Each terminal is the sandbox's: numbered in its own devpts.
    wait_for_output(&server, &id, &second, "/dev/pts/1");
    assert_eq!(host_pts(), before, "a sandbox's terminal appeared in the host's /dev/pts");
    if tier == Tier::Process {
        // The program is a host process here: its stdin is a terminal, of a devpts that is not the host's.
        let deadline = Instant::now() + Duration::from_secs(10);
        let pid = loop {
            if let Some((pid, _)) =
                common::token_processes(&token).into_iter().find(|(_, line)| line.starts_with(&token))
            {
                break pid;
            }
            assert!(Instant::now() < deadline, "the sleeper never appeared");
            std::thread::sleep(Duration::from_millis(50));
        };
        let stdin = std::fs::metadata(format!("/proc/{pid}/fd/0")).unwrap();
        let host_devpts = std::fs::metadata("/dev/pts").unwrap();
        assert_eq!(stdin.rdev() >> 8 & 0xfff, 136, "stdin is not a pseudo-terminal: rdev {:#x}", stdin.rdev());
        assert_ne!(stdin.dev(), host_devpts.dev(), "the sandbox's terminal lives on the host's devpts");
    }
    assert_eq!(server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None).status, 204);
    assert_sandbox_gone_on(tier, &id);
    common::assert_no_token_processes(&token);
    assert_eq!(host_pts(), before);
}

fn bad_sizes_and_resizing_a_command_without_a_terminal_are_refused(tier: Tier) {
    let server = Server::start_on(tier);
    let id = server.create_on(tier, json!({}));
    for size in [json!({"cols": 0, "rows": 24}), json!({"cols": 80, "rows": 1001})] {
        let reply = exec(&server, &id, json!({"cmd": "true", "pty": size}));
        assert_eq!(reply.status, 422, "{reply:?}");
        let message = reply.json["error"]["message"].as_str().unwrap();
        assert!(message.contains("between 1 and 1000"), "{reply:?}");
    }
    let plain = start(&server, &id, json!({"cmd": "sleep 30"}));
    let reply = post(&server, &id, &plain, "resize", json!({"cols": 80, "rows": 24}));
    assert_eq!(reply.status, 409, "{reply:?}");
    assert!(reply.json["error"]["message"].as_str().unwrap().contains("no pseudo-terminal"), "{reply:?}");
    let on_terminal = start(&server, &id, json!({"cmd": "sleep 30", "pty": {"cols": 80, "rows": 24}}));
    let reply = post(&server, &id, &on_terminal, "resize", json!({"cols": 0, "rows": 0}));
    assert_eq!(reply.status, 422, "{reply:?}");
    server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None);
    assert_sandbox_gone_on(tier, &id);
}

fn a_terminal_flood_is_cut_at_the_output_limit(tier: Tier) {
    let server = Server::start_on(tier);
    let limit = 64u64 << 10;
    let id = server.create_on(tier, json!({"limits": {"output_bytes": limit}}));
    let flood = "head -c 20000000 /dev/zero | tr '\\0' x; echo; echo flood-done";
    let reply = exec(&server, &id, json!({"cmd": flood, "pty": {"cols": 80, "rows": 24}}));
    assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body[..reply.body.len().min(300)]));
    let stdout = reply.json["stdout"].as_str().unwrap();
    assert!(stdout.len() as u64 <= limit, "{} bytes kept past the {limit}-byte limit", stdout.len());
    assert!(stdout.starts_with("xxxx"), "{}", &stdout[..stdout.len().min(80)]);
    assert_eq!(reply.json["stdout_truncated"], true);
    // The program was not stopped by the cut: it ran to its end.
    assert_eq!(reply.json["exit_code"], 0, "{}", reply.json);
    server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None);
    assert_sandbox_gone_on(tier, &id);
}

fn a_terminal_survives_pause_and_resume(tier: Tier) {
    let server = Server::start_on(tier);
    let id = server.create_on(tier, json!({}));
    let script = "echo waiting; read a; echo got-$a; read b; stty size";
    let command = start(&server, &id, json!({"cmd": script, "pty": {"cols": 80, "rows": 24}}));
    wait_for_output(&server, &id, &command, "waiting");
    // gVisor checkpoints the whole sandbox (its devpts and the terminal with it) and restores it.
    for what in ["pause", "resume"] {
        let reply = server.call("POST", &format!("/v1/sandboxes/{id}/{what}"), KEY_1, None);
        assert_eq!(reply.status, 200, "{what}: {reply:?}");
    }
    assert_eq!(post(&server, &id, &command, "stdin", json!({"data": "after\n"})).status, 204);
    assert_eq!(post(&server, &id, &command, "resize", json!({"cols": 101, "rows": 51})).status, 204);
    assert_eq!(post(&server, &id, &command, "stdin", json!({"data": "\n"})).status, 204);
    let out = lines(&streamed_stdout(&server, &id, &command));
    assert!(out.contains(&"got-after".to_owned()) && out.contains(&"51 101".to_owned()), "{out:?}");
    server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None);
    assert_sandbox_gone_on(tier, &id);
}
