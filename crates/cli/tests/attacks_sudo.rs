//! `sudo` inside a sandbox: the agent-served `sudo` gives the sandbox user the sandbox's root (uid 0 of the sandbox's
//! user namespace, no capabilities, the same jail) and nothing more. Through it, hostile code tries what the
//! sandbox's root is proven unable to do (`attacks_sandbox_root.rs`), and the host is checked from outside: its files
//! unchanged, no canary, its processes unseen, the root command an unprivileged host uid. Forged clients on the
//! agent's socket are refused without harming the agent, and what `sudo` started dies with its command and its
//! sandbox.
//!
//! Every test runs on each isolation tier (`process::NAME`, `gvisor::NAME` and `microvm::NAME`, see `per_tier!`).

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;
mod serve;

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use common::Tier;
use serde_json::json;
use serve::{KEY_1, Server, assert_sandbox_gone_on};

per_tier!(
    sudo_runs_commands_as_root_or_the_user_with_their_streams_status_and_signals,
    root_through_sudo_reaches_nothing_on_the_host,
    forged_clients_are_refused_and_the_agent_goes_on,
    what_sudo_started_dies_with_its_command_and_its_sandbox,
);

/// One `sandkasten run` of `script` under bash on `tier`; its stdout, after asserting it exited 0.
fn bash_on(tier: Tier, script: &str) -> String {
    let r = common::run_on(tier, ["--timeout", "60s", "--", "bash", "-c", script]).json();
    r.assert_exit(0);
    r.stdout()
}

fn sudo_runs_commands_as_root_or_the_user_with_their_streams_status_and_signals(tier: Tier) {
    let stdout = bash_on(
        tier,
        r#"
        echo "user $(id -u)"
        echo "root $(sudo id -u) $(sudo id -g)"
        echo "back $(sudo -u '#1000' id -u) $(sudo -u "$(id -un)" id -u)"
        echo "caps $(sudo grep CapEff /proc/self/status | tr -s ' \t' ' ')"
        sudo sh -c 'exit 7'; echo "status $?"
        sudo sh -c 'kill -TERM $$'; echo "signalled $?"
        echo piped | sudo cat | sed 's/^/stdin /'
        sudo sh -c 'echo to-stderr >&2' 2>&1 >/dev/null | sed 's/^/stderr /'
        (cd /tmp && echo "cwd $(sudo pwd)")
        echo "login $(sudo -i sh -c 'echo $HOME $USER')"
        SECRET_OF_CALLER=1 sudo env | grep -c SECRET_OF_CALLER | sed 's/^/reset /'
        SECRET_OF_CALLER=1 sudo -E env | grep -c SECRET_OF_CALLER | sed 's/^/preserved /'
        echo "assigned $(sudo GREETING=hi sh -c 'echo $GREETING $SUDO_UID')"
        sudo -u nobody true 2>/dev/null; echo "nobody $?"
        sudo -u nobody true 2>&1 | sed 's/^/why /'
        sudo -l >/dev/null; echo "list $?"
        sudo -v; echo "validate $?"
        sudo sleep 30 & p=$!; sleep 0.5; kill -INT $p; wait $p; echo "interrupted $?"
        "#,
    );
    println!("{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    for expected in [
        "user 1000",
        "root 0 0",
        "back 1000 1000",
        "caps CapEff: 0000000000000000",
        "status 7",
        "signalled 143",
        "stdin piped",
        "stderr to-stderr",
        "cwd /tmp",
        "login /root root",
        "reset 0",
        "preserved 1",
        "assigned hi 1000",
        "nobody 1",
        "list 0",
        "validate 0",
        "interrupted 130",
    ] {
        assert!(lines.contains(&expected), "missing {expected:?} on {tier}:\n{stdout}");
    }
    assert!(
        stdout.contains("why sudo: nobody (uid 65534) cannot be run as in a sandbox"),
        "an impossible target is refused with a reason:\n{stdout}"
    );
}

/// Python run through `sudo`: each attack prints `name rc errno`.
const ATTACKS: &str = r#"
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def report(name, rc):
    print(name, rc, errno.errorcode.get(ctypes.get_errno(), '0') if rc == -1 else '0', flush=True)
canary, secret, marker = sys.argv[1], sys.argv[2], os.environ['MARKER']
print('uid', os.getuid())
os.makedirs('/tmp/m', exist_ok=True)
report('mount_tmpfs', libc.syscall(165, b'x', b'/tmp/m', b'tmpfs', 0, 0))
report('unshare_user', libc.syscall(272, 0x10000000))
report('chmod_python', libc.chmod(b'/usr/bin/python3', 0o4777))
report('create_canary', libc.open(canary.encode(), os.O_WRONLY | os.O_CREAT, 0o644))
report('read_secret', libc.open(secret.encode(), os.O_RDONLY))
report('setuid_other', libc.setuid(1))
seen = []
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        if marker in open(f'/proc/{pid}/cmdline').read():
            seen.append(pid)
    except OSError:
        pass
print('host_process_seen', len(seen))
"#;

fn root_through_sudo_reaches_nothing_on_the_host(tier: Tier) {
    if !cfg!(target_arch = "x86_64") {
        eprintln!("skipped: raw syscall numbers are x86_64");
        return;
    }
    let scratch = tempfile::tempdir_in("/var/tmp").expect("a host directory");
    let canary = scratch.path().join("canary-written-by-sudo");
    let secret = scratch.path().join("host-only-secret");
    std::fs::write(&secret, "host-only-secret-contents").unwrap();
    let marker = format!("sandkasten-sudo-host-marker-{}", std::process::id());
    let mut host_process = std::process::Command::new("/usr/bin/python3")
        .args(["-c", "import time; time.sleep(60)", &marker])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("a host process");
    let python = std::fs::metadata("/usr/bin/python3").unwrap();

    // The marker reaches the attacks through the environment (`-E`), so no command line inside holds it.
    let script = format!("sudo -E /usr/bin/python3 -c \"$ATTACKS\" {} {}", canary.display(), secret.display());
    let env = [format!("ATTACKS={ATTACKS}"), format!("MARKER={marker}")];
    let r = common::run_on(tier, ["--timeout", "60s", "--env", &env[0], "--env", &env[1], "--", "bash", "-c", &script])
        .json();
    let _ = host_process.kill();
    let _ = host_process.wait();
    let stdout = r.stdout();
    println!("{stdout}");
    r.assert_exit(0);
    assert!(stdout.contains("uid 0\n"), "the attacks must run as the sandbox's root:\n{stdout}");
    let refused = |name: &str, errnos: &[&str]| {
        let line = stdout.lines().find(|line| line.starts_with(&format!("{name} "))).unwrap_or("missing");
        let mut parts = line.split_whitespace().skip(1);
        let (rc, errno) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        assert!(rc == "-1" && errnos.contains(&errno), "{name} through sudo on {tier}: {line}\n{stdout}");
    };
    refused("mount_tmpfs", &["EPERM"]);
    refused("unshare_user", &["EPERM"]);
    refused("chmod_python", &["EROFS", "EPERM"]);
    refused("create_canary", &["ENOENT", "EROFS", "EACCES", "EPERM"]);
    refused("read_secret", &["ENOENT", "EACCES", "EPERM"]);
    refused("setuid_other", &["EPERM"]);
    assert!(stdout.contains("host_process_seen 0\n"), "root through sudo sees host processes:\n{stdout}");
    assert!(!stdout.contains("host-only-secret-contents"));

    // Host side: nothing happened.
    assert!(!canary.exists(), "sudo's root created a file on the host");
    let after = std::fs::metadata("/usr/bin/python3").unwrap();
    assert_eq!((after.mode(), after.uid(), after.mtime()), (python.mode(), python.uid(), python.mtime()));
    common::assert_gone(tier, &r.id());

    // Host side: a command started through sudo is no host root. On the process tier it is a process of the
    // sandbox's unprivileged host uid range; on gVisor no host process runs it at all (the Sentry does).
    let server = Server::start_on(tier);
    let id = server.create_on(tier, json!({}));
    let root_marker = format!("sandkasten-sudo-root-marker-{}", std::process::id());
    let started = server.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        KEY_1,
        Some(json!({ "cmd": format!("sudo sh -c 'sleep 30 # {root_marker}'"), "background": true })),
    );
    assert!(started.status < 300, "{started:?}");
    let inside = wait_for(|| {
        let reply = server.exec(&id, &format!("ps -eo user,args | grep '^root.*{root_marker}' | grep -v grep"));
        reply.json["stdout"].as_str().is_some_and(|out| out.contains(&root_marker))
    });
    assert!(inside, "the sudo command never ran as root inside");
    let host_pids = common::host_pids_with(&root_marker);
    match tier {
        Tier::Process => {
            assert!(!host_pids.is_empty(), "the sudo command is not a host process on the process tier");
            for pid in &host_pids {
                let uid = common::process_uid(*pid).expect("the command's host uid");
                assert!(uid >= common::SANDBOX_UID_BASE, "sudo's root is host uid {uid}, not the sandbox's range");
            }
        }
        _ => assert!(host_pids.is_empty(), "a sudo command on {tier} is a host process: {host_pids:?}"),
    }
    server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None);
    assert_sandbox_gone_on(tier, &id);
}

fn wait_for(mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// Python speaking to the agent's socket directly, as hostile code would: every forged request must get a refusal
/// (`!…`) and the connection closed.
const FORGERIES: &str = r#"
import array, os, socket, time
PATH = '/.sandkasten/run/sudo.sock'
def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(PATH)
    s.settimeout(10)
    return s
def answer(s):
    try:
        reply = s.recv(4096)
    except OSError as e:
        reply = ('error ' + type(e).__name__).encode()
    return reply.decode(errors='replace').replace('\n', ' ')
def attempt(name, payload, fds=True):
    s = connect()
    try:
        if fds:
            s.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', [0, 1, 2]))])
        else:
            s.send(payload)
        print(name, answer(s), flush=True)
    except OSError as e:
        print(name, 'send refused', type(e).__name__, flush=True)
    s.close()
attempt('garbage', b'hello agent')
attempt('no_fds', b'sandkasten-sudo 1\0aid\0', fds=False)
attempt('wrong_version', b'sandkasten-sudo 9\0aid\0')
attempt('unknown_field', b'sandkasten-sudo 1\0zid\0')
attempt('no_command', b'sandkasten-sudo 1\0c/\0')
attempt('bad_user', b'sandkasten-sudo 1\0unobody\0aid\0')
attempt('oversized', b'sandkasten-sudo 1\0a' + b'x' * (200 << 10) + b'\0')
s = connect()
s.sendmsg([b'sandkasten-sudo 1\0aid\0'], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', [0, 1, 2, 0, 1]))])
print('five_fds', answer(s), flush=True)
s.close()
held = [connect() for _ in range(16)]
extra = connect()
print('seventeenth', answer(extra), flush=True)
start = time.monotonic()
print('silent', answer(held[0]), round(time.monotonic() - start), flush=True)
"#;

fn forged_clients_are_refused_and_the_agent_goes_on(tier: Tier) {
    let server = Server::start_on(tier);
    let id = server.create_on(tier, json!({}));
    let upload =
        server.put_bytes(&format!("/v1/sandboxes/{id}/files?path=/workspace/forge.py"), KEY_1, FORGERIES.as_bytes());
    assert!(upload.status < 300, "{upload:?}");
    let reply = server.exec(&id, "/usr/bin/python3 forge.py");
    let stdout = reply.json["stdout"].as_str().unwrap_or_default().to_owned();
    println!("{stdout}\n{}", reply.json["stderr"]);
    assert_eq!(reply.json["exit_code"], 0, "{reply:?}");
    let line = |name: &str| stdout.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or("missing").to_owned();
    for (name, why) in [
        ("garbage", "!the request is not NUL-terminated fields"),
        ("no_fds", "!the request passed 0 descriptors, not 3"),
        ("wrong_version", "!not a sandkasten-sudo 1 request"),
        ("unknown_field", "!unknown request field"),
        ("no_command", "!no command given"),
        ("bad_user", "!nobody (uid 65534) cannot be run as"),
        ("five_fds", "!the request passed "),
        ("seventeenth", "!16 sudo sessions are open already"),
        ("silent", "!no request came in time"),
    ] {
        assert!(line(name).contains(why), "{name} on {tier}: {}\n{stdout}", line(name));
    }
    // Too large for the socket (refused by the kernel) or for the agent (refused by it): never taken.
    let oversized = line("oversized");
    assert!(
        oversized.contains("send refused") || oversized.contains("more than the 131072 taken"),
        "an oversized request on {tier}: {oversized}"
    );
    // The agent is unharmed: the same sandbox runs commands and sudo again.
    let after = server.exec(&id, "sudo id -u");
    assert_eq!(after.json["stdout"], "0\n", "after the forgeries: {after:?}");
    server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None);
    assert_sandbox_gone_on(tier, &id);
}

fn what_sudo_started_dies_with_its_command_and_its_sandbox(tier: Tier) {
    let server = Server::start_on(tier);
    let id = server.create_on(tier, json!({}));
    // A command that times out is killed with its process group: its sudo client. The root command the agent
    // started for that client goes too (its own session, so only the agent can end it).
    let timed_out = server.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        KEY_1,
        Some(json!({ "cmd": "sudo sleep 300", "timeout_ms": 1000 })),
    );
    assert_eq!(timed_out.json["timed_out"], true, "{timed_out:?}");
    let gone = wait_for(|| {
        let left = server.exec(&id, "ps -eo args | grep '^sleep 300' | grep -vc grep");
        left.json["stdout"] == "0\n"
    });
    assert!(gone, "the root command outlived its timed-out sudo");
    // A root command still running when the sandbox is deleted leaves nothing on the host.
    let started = server.call(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        KEY_1,
        Some(json!({ "cmd": "sudo sleep 300", "background": true })),
    );
    assert!(started.status < 300, "{started:?}");
    assert!(wait_for(|| server.exec(&id, "ps -eo user,args | grep -c '^root *sleep 300'").json["stdout"] == "1\n"));
    server.call("DELETE", &format!("/v1/sandboxes/{id}"), KEY_1, None);
    assert_sandbox_gone_on(tier, &id);
}
