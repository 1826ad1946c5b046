//! Attacks against the gVisor tier (`sandkasten run --isolation gvisor`), each asserted on the host: host canary
//! files, the host's /tmp and environment, writing to /usr, the host's loopback listeners and external address, the
//! network without a policy, host processes (seeing and killing them), escapees that double-fork to outlive the
//! program or its timeout, and memory, fork, disk and output bombs. After every attack nothing of the sandbox is left
//! (record, cgroup, bundle, runsc state, runsc/Sentry/gofer process, mount).

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use std::net::{IpAddr, TcpListener};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

/// Python that tries to read each path (directly and through /proc indirections) and prints what happened.
fn read_attempts(paths: &[&Path]) -> String {
    let list: Vec<String> = paths.iter().map(|p| format!("{:?}", p.to_str().unwrap())).collect();
    format!(
        "import os\nfor p in [{}]:\n    for q in (p, '/proc/1/root' + p, '/proc/self/root' + p, '/proc/self/cwd/../..' + p):\n        try:\n            print('READ', q, open(q).read())\n        except OSError as e:\n            print('denied', q, type(e).__name__)\n",
        list.join(", ")
    )
}

#[test]
fn host_canary_files_in_root_and_tmp_are_not_readable() {
    require_runsc!();
    let name = unique_token("sandkasten-gvisor-canary-");
    let canaries = [
        Canary::create(format!("/root/{name}")),
        Canary::create(format!("/tmp/{name}")),
        Canary::create(format!("/var/tmp/{name}")),
    ];
    let paths: Vec<&Path> = canaries.iter().map(|c| c.path.as_path()).collect();
    let r = gvisor_code("python", &read_attempts(&paths), &[]).json();
    r.assert_exit(0);
    for canary in &canaries {
        assert!(!r.stdout().contains(&canary.secret), "{} was read\n{}", canary.path.display(), r.describe());
        assert!(!r.stderr().contains(&canary.secret), "{}", r.describe());
    }
    assert!(!r.stdout().contains("READ"), "{}", r.describe());
    assert_eq!(r.stdout().matches("denied").count(), 4 * paths.len(), "{}", r.describe());
    assert_no_gvisor_leaks(&r.id());
    // The same with cat and shell globs over the directories.
    let code = format!("cat /root/{name} /tmp/{name} /var/tmp/{name} 2>&1; cat /tmp/* /root/* /var/tmp/* 2>&1; true");
    let r = gvisor_code("bash", &code, &[]).json();
    for canary in &canaries {
        assert!(!r.stdout().contains(&canary.secret), "{} was read by cat\n{}", canary.path.display(), r.describe());
    }
    assert_no_gvisor_leaks(&r.id());
}

#[test]
fn tmp_inside_is_not_the_host_tmp() {
    require_runsc!();
    let canary = Canary::create(format!("/tmp/{}", unique_token("sandkasten-gvisor-hosttmp-")));
    let name = canary.path.file_name().unwrap().to_str().unwrap().to_owned();
    let inside = unique_token("sandkasten-gvisor-guesttmp-");
    let code = format!(
        "ls -A /tmp; echo ---; echo guest > /tmp/{inside} && echo wrote-tmp; ls /tmp/{name} 2>&1; \
         stat -f -c %T /tmp; true"
    );
    let r = gvisor_code("bash", &code, &[]).json();
    r.assert_exit(0);
    let listing = r.stdout().split("---").next().unwrap_or_default().to_owned();
    assert!(!listing.contains(&name), "the host's /tmp is visible inside\n{}", r.describe());
    assert!(listing.trim().is_empty(), "the guest's /tmp starts empty\n{}", r.describe());
    assert!(r.stdout().contains("wrote-tmp"), "positive control: the guest's /tmp is writable\n{}", r.describe());
    assert!(r.stdout().contains("tmpfs"), "the guest's /tmp is its own tmpfs\n{}", r.describe());
    assert!(!Path::new(&format!("/tmp/{inside}")).exists(), "the guest's /tmp file appeared in the host's /tmp");
    assert!(!Path::new(&format!("/var/tmp/{inside}")).exists(), "the guest's /tmp file appeared in /var/tmp");
    assert_no_gvisor_leaks(&r.id());
}

#[test]
fn writing_to_usr_and_the_root_fails() {
    require_runsc!();
    let token = unique_token("gvisorwrite");
    let targets: Vec<String> = ["/usr", "/usr/bin", "/usr/lib", "/etc", "", "/sandbox", "/bin", "/lib"]
        .iter()
        .map(|d| format!("{d}/{token}"))
        .collect();
    let mut code = String::from("import os\n");
    for t in &targets {
        code.push_str(&format!(
            "try:\n    open({t:?}, 'w').write('pwned'); print('WROTE', {t:?})\nexcept OSError as e:\n    print('denied', {t:?}, type(e).__name__)\n"
        ));
    }
    code.push_str(
        "for p in ['/usr/bin/python3', '/usr/bin/env', '/etc/passwd']:\n    try:\n        f = open(p, 'r+b'); print('OPENED-W', p); f.close()\n    except OSError as e:\n        print('denied', p, type(e).__name__)\n\
         try:\n    os.mkdir('/usr/lib/' + 'd' + str(os.getpid())); print('MKDIR-USR')\nexcept OSError as e:\n    print('denied mkdir', type(e).__name__)\n\
         try:\n    os.chmod('/usr/bin/env', 0o777); print('CHMOD-USR')\nexcept OSError as e:\n    print('denied chmod', type(e).__name__)\n\
         try:\n    os.mkdir('/workspace/ok'); open('/tmp/ok', 'w').write('ok'); print('workspace-and-tmp-writable')\nexcept OSError as e:\n    print('WORKSPACE-DENIED', e)\n",
    );
    let env_mode = std::fs::metadata("/usr/bin/env").map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()));
    let r = gvisor_code("python", &code, &[]).json();
    r.assert_exit(0);
    let stdout = r.stdout();
    assert!(!stdout.contains("WROTE") && !stdout.contains("OPENED-W"), "{}", r.describe());
    assert!(!stdout.contains("MKDIR-USR") && !stdout.contains("CHMOD-USR"), "{}", r.describe());
    assert!(stdout.contains("workspace-and-tmp-writable"), "positive control\n{}", r.describe());
    for t in &targets {
        assert!(!Path::new(t).exists(), "{t} appeared on the host");
    }
    let env_mode_after =
        std::fs::metadata("/usr/bin/env").map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()));
    assert_eq!(env_mode.ok(), env_mode_after.ok(), "the host's /usr/bin/env changed mode");
    assert_no_gvisor_leaks(&r.id());
}

#[test]
fn host_env_canary_is_not_visible_inside() {
    require_runsc!();
    let secret = unique_token("GVISORENVCANARY");
    let code = "env; echo; for f in /proc/[0-9]*/environ; do cat \"$f\" 2>/dev/null; echo; done";
    let r = gvisor_code("bash", code, &[]).env("SANDKASTEN_TEST_CANARY", &secret).json();
    r.assert_exit(0);
    assert!(!r.stdout().contains(&secret), "host env leaked into the guest\n{}", r.describe());
    assert!(!r.stdout().contains("SANDKASTEN_TEST_CANARY"), "{}", r.describe());
    assert!(!r.stdout().contains("CARGO"), "cargo's env leaked into the guest\n{}", r.describe());
    assert!(r.stdout().contains("HOME=/workspace"), "positive control: env is printed\n{}", r.describe());
    assert_no_gvisor_leaks(&r.id());
}

#[test]
fn host_env_canary_does_not_reach_gvisor_host_processes() {
    require_runsc!();
    // runsc, its Sentry and its gofer are the sandbox boundary: code that breaks out of the guest lands in them, so the
    // CLI's (or server's) environment must not be handed to them either.
    let secret = unique_token("GVISORHOSTENV");
    let marker = unique_token("MARK");
    let code = format!("# {marker}\nsleep 3");
    let handle = std::thread::spawn({
        let secret = secret.clone();
        move || {
            gvisor_code("bash", &code, &["--timeout", "15s"])
                .env("SANDKASTEN_TEST_CANARY", &secret)
                .watchdog(Duration::from_secs(30))
                .json()
        }
    });
    let id = gvisor_sandbox_with_code(&marker, Duration::from_secs(10));
    let mut carriers = Vec::new();
    let mut looked_at = Vec::new();
    if let Some(id) = &id {
        for (pid, line) in wait_for_runsc_processes(id, Duration::from_secs(10)) {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let argv0 = line.split_whitespace().next().unwrap_or_default().to_owned();
            if String::from_utf8_lossy(&environ).contains(&secret) {
                carriers.push(format!("pid {pid} {argv0}"));
            }
            looked_at.push(argv0);
        }
    }
    let r = handle.join().expect("run thread");
    r.assert_exit(0);
    let id = id.unwrap_or_else(|| panic!("no bundle held the code\n{}", r.describe()));
    assert!(
        looked_at.iter().any(|a| a.ends_with("runsc-sandbox")),
        "positive control: the Sentry was found on the host: {looked_at:?}"
    );
    assert!(carriers.is_empty(), "gVisor's host processes carry the CLI's environment (canary found): {carriers:?}");
    assert_no_gvisor_leaks(&id);
}

/// Python that tries a TCP connect and prints `CONNECTED` or the error class.
fn connect_code(host: &str, port: u16) -> String {
    format!(
        "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\ns.settimeout(2)\ntry:\n    s.connect(({host:?}, {port}))\n    s.sendall(b'SANDBOX-WAS-HERE')\n    print('CONNECTED')\nexcept OSError as e:\n    print('failed', type(e).__name__, e.errno)\n"
    )
}

#[test]
fn host_loopback_listener_is_unreachable() {
    require_runsc!();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let probe = std::net::TcpStream::connect(("127.0.0.1", port)).expect("host connects to its own listener");
    assert_eq!(accepted_within(&listener, Duration::from_millis(300)), 1, "positive control");
    drop(probe);
    let r = gvisor_code("python", &connect_code("127.0.0.1", port), &["--timeout", "10s"]).json();
    r.assert_exit(0);
    assert!(!r.stdout().contains("CONNECTED"), "{}", r.describe());
    assert!(r.stdout().contains("failed"), "{}", r.describe());
    assert_eq!(accepted_within(&listener, Duration::from_millis(500)), 0, "the host listener got a connection");
    assert_no_gvisor_leaks(&r.id());
}

fn host_external_ipv4() -> Option<IpAddr> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a linked list freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cursor = list;
    while !cursor.is_null() && found.is_none() {
        // SAFETY: `cursor` walks the list getifaddrs returned; each node stays valid until freeifaddrs.
        let entry = unsafe { &*cursor };
        // SAFETY: a non-null ifa_addr points to a sockaddr owned by the list.
        let family = if entry.ifa_addr.is_null() { -1 } else { i32::from(unsafe { (*entry.ifa_addr).sa_family }) };
        if family == libc::AF_INET {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let v4 = unsafe { &*(entry.ifa_addr as *const libc::sockaddr_in) };
            let ip = std::net::Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr));
            if !ip.is_loopback() && !ip.is_unspecified() {
                found = Some(IpAddr::V4(ip));
            }
        }
        cursor = entry.ifa_next;
    }
    // SAFETY: frees the list getifaddrs allocated; not used afterwards.
    unsafe { libc::freeifaddrs(list) };
    found
}

#[test]
fn host_external_address_is_unreachable() {
    require_runsc!();
    let Some(ip) = host_external_ipv4() else {
        eprintln!("skipped: the host has no non-loopback IPv4 address");
        return;
    };
    let listener = TcpListener::bind((ip, 0)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let r = gvisor_code("python", &connect_code(&ip.to_string(), port), &["--timeout", "10s"]).json();
    r.assert_exit(0);
    assert!(!r.stdout().contains("CONNECTED"), "{}", r.describe());
    assert!(r.stdout().contains("failed"), "{}", r.describe());
    assert_eq!(accepted_within(&listener, Duration::from_millis(500)), 0, "the host listener on {ip} got a connection");
    assert_no_gvisor_leaks(&r.id());
}

#[test]
fn no_network_without_a_policy_only_loopback() {
    require_runsc!();
    let code = "import os, socket\n\
                names = [l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]]\n\
                print('proc-net-dev', sorted(names))\n\
                print('sys-class-net', sorted(os.listdir('/sys/class/net')) if os.path.isdir('/sys/class/net') else [])\n\
                try:\n\
                \x20   print('if_nameindex', sorted(n for _, n in socket.if_nameindex()))\n\
                except OSError as e:\n\
                \x20   print('if_nameindex failed', e.errno)\n\
                try:\n\
                \x20   routes = open('/proc/net/route').read().splitlines()[1:]\n\
                except OSError:\n\
                \x20   routes = []\n\
                print('ipv4-routes', len(routes))\n\
                s = socket.socket(); s.settimeout(2)\n\
                try:\n\
                \x20   s.connect(('192.0.2.1', 80)); print('CONNECTED')\n\
                except OSError as e:\n\
                \x20   print('tcp failed', e.errno)\n\
                u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
                try:\n\
                \x20   u.sendto(b'x', ('192.0.2.1', 53)); print('SENT-UDP')\n\
                except OSError as e:\n\
                \x20   print('udp failed', e.errno)\n\
                try:\n\
                \x20   print('RESOLVED', socket.getaddrinfo('sandkasten-test.invalid', 80)[0][4])\n\
                except OSError as e:\n\
                \x20   print('dns failed')\n\
                srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen(1)\n\
                c = socket.create_connection(srv.getsockname(), timeout=2); conn, _ = srv.accept(); c.sendall(b'ping')\n\
                print('loopback', conn.recv(4).decode())\n";
    let r = gvisor_code("python", code, &["--timeout", "15s"]).json();
    r.assert_exit(0);
    let stdout = r.stdout();
    assert!(stdout.contains("proc-net-dev ['lo']"), "{}", r.describe());
    assert!(
        stdout.contains("sys-class-net ['lo']") || stdout.contains("sys-class-net []"),
        "/sys/class/net shows more than lo\n{}",
        r.describe()
    );
    assert!(stdout.contains("if_nameindex ['lo']") || stdout.contains("if_nameindex failed"), "{}", r.describe());
    assert!(stdout.contains("ipv4-routes 0"), "the sandbox has a route out\n{}", r.describe());
    assert!(stdout.contains("tcp failed") && stdout.contains("udp failed"), "{}", r.describe());
    assert!(!stdout.contains("CONNECTED") && !stdout.contains("SENT-UDP"), "{}", r.describe());
    assert!(!stdout.contains("RESOLVED"), "{}", r.describe());
    assert!(stdout.contains("loopback ping"), "positive control: the sandbox's own loopback works\n{}", r.describe());
    assert_no_gvisor_leaks(&r.id());
}

#[test]
fn double_fork_setsid_escapee_dies_when_the_program_exits() {
    require_runsc!();
    let token = unique_token("GVESCAPEE");
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
    let r = gvisor_code("python", &code, &["--timeout", "20s"]).watchdog(Duration::from_secs(30)).json();
    assert!(r.stdout().contains("True"), "positive control: the escapee ran with the token\n{}", r.describe());
    r.assert_exit(0);
    assert!(r.output.elapsed < Duration::from_secs(15), "the run waited for the escapee ({:?})", r.output.elapsed);
    assert_no_token_processes(&token);
    assert_no_gvisor_leaks(&r.id());
}

#[test]
fn double_fork_escapee_does_not_outlive_the_timeout() {
    require_runsc!();
    let token = unique_token("GVOUTLIVE");
    // Detached grandchildren (setsid, double fork, stdio closed) ignore SIGTERM/SIGHUP and sleep past the timeout;
    // the program itself keeps running until the timeout fires.
    let code = format!(
        "for i in 1 2 3; do setsid bash -c 'trap \"\" TERM HUP INT; (exec -a {token} sleep 600) & wait' \
         </dev/null >/dev/null 2>&1 & done\n\
         sleep 0.5; ps -eo args | grep -c '^{token}'\n\
         sleep 600"
    );
    let r = gvisor_code("bash", &code, &["--timeout", "3s"]).watchdog(Duration::from_secs(30)).json();
    assert_eq!(r.limit().as_deref(), Some("time"), "{}", r.describe());
    assert!(r.flag("timed_out"), "{}", r.describe());
    assert_eq!(r.cli_code(), 124, "{}", r.describe());
    let running: usize = r.stdout().lines().next().and_then(|l| l.trim().parse().ok()).unwrap_or(0);
    assert!(running >= 3, "positive control: the escapees were running inside\n{}", r.describe());
    assert!(r.output.elapsed < Duration::from_secs(15), "teardown took {:?}", r.output.elapsed);
    assert_no_token_processes(&token);
    assert_no_gvisor_leaks(&r.id());
}

#[test]
fn host_processes_are_invisible_and_kill_all_reaches_none() {
    require_runsc!();
    let mut victim = HostVictim::sleep();
    let pid = victim.pid();
    let test_pid = std::process::id();
    let code = format!(
        "ls -d /proc/[0-9]* | wc -l; test -e /proc/{pid}/cmdline && echo VICTIM-VISIBLE || echo victim-hidden\n\
         kill -9 -1; echo kill-all=$?\n\
         kill -9 {pid}; echo kill-victim=$?\n\
         kill -9 {test_pid}; echo kill-test=$?\n"
    );
    let r = gvisor_code("bash", &code, &["--timeout", "10s"]).json();
    std::thread::sleep(Duration::from_millis(200));
    assert!(victim.alive(), "host process {pid} was killed from inside the gVisor sandbox\n{}", r.describe());
    let count: usize = r.stdout().lines().next().and_then(|l| l.trim().parse().ok()).unwrap_or(999);
    assert!(count < 10, "the guest sees {count} processes\n{}", r.describe());
    assert!(r.stdout().contains("victim-hidden"), "{}", r.describe());
    assert!(r.stdout().contains("kill-victim=1") && r.stdout().contains("kill-test=1"), "{}", r.describe());
    assert_no_gvisor_leaks(&r.id());
}

#[test]
fn memory_bomb_is_stopped_by_the_memory_limit() {
    require_runsc!();
    let code = "a = []\nwhile True:\n    a.append(b'x' * (4 << 20))\n";
    let r = gvisor_code("python", code, &["--memory", "128MiB", "--timeout", "20s"])
        .watchdog(Duration::from_secs(40))
        .json();
    assert!(r.flag("oom_killed"), "{}", r.describe());
    assert_eq!(r.limit().as_deref(), Some("memory"), "{}", r.describe());
    assert!(!r.flag("timed_out"), "the bomb is stopped by the memory limit, not the timeout\n{}", r.describe());
    assert_eq!(r.cli_code(), 122, "{}", r.describe());
    // The host-side cgroup peak (the Sentry, the gofer and the guest together) stays at the limit.
    let peak = r.json["usage"]["memory_peak_bytes"].as_u64().unwrap_or(0);
    assert!(
        peak > 64 << 20 && peak <= (128 << 20) + (4 << 20),
        "peak {peak} should be at the 128MiB limit\n{}",
        r.describe()
    );
    assert_no_gvisor_leaks(&r.id());
}

#[test]
fn c_malloc_touch_bomb_is_stopped_by_the_memory_limit() {
    require_runsc!();
    let code = "#include <stdlib.h>\n#include <string.h>\n#include <stdio.h>\nint main(void){for(int i=0;i<1024;i++){char*p=malloc(1<<20);if(!p){puts(\"malloc failed\");return 1;}memset(p,1,1<<20);}puts(\"ALLOCATED 1GiB\");return 0;}\n";
    let r =
        gvisor_code("c", code, &["--memory", "128MiB", "--timeout", "20s"]).watchdog(Duration::from_secs(40)).json();
    assert!(!r.stdout().contains("ALLOCATED 1GiB"), "touched 1GiB under a 128MiB limit\n{}", r.describe());
    assert!(r.flag("oom_killed"), "{}", r.describe());
    assert_eq!(r.limit().as_deref(), Some("memory"), "{}", r.describe());
    assert_no_gvisor_leaks(&r.id());
}

#[test]
fn fork_bomb_is_contained() {
    require_runsc!();
    // The shell stays alive after starting the bomb, so the bomb runs until a limit stops the sandbox.
    let r = gvisor_code("bash", ":(){ :|:& };:; sleep 30", &["--timeout", "3s", "--pids", "128"])
        .watchdog(Duration::from_secs(40))
        .json();
    assert!(
        matches!(r.limit().as_deref(), Some("time") | Some("pids")),
        "a fork bomb ends by the time or pids limit\n{}",
        r.describe()
    );
    assert!(r.output.elapsed < Duration::from_secs(20), "teardown took {:?}", r.output.elapsed);
    assert_no_gvisor_leaks(&r.id());
    // The same with a Python fork loop and the default pids limit.
    let r = gvisor_code(
        "python",
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        &["--timeout", "3s"],
    )
    .watchdog(Duration::from_secs(40))
    .json();
    // A guest process costs the Sentry more memory than a host process does, so 128 Python processes may reach the
    // default memory limit before the pids limit: either way a limit stopped the bomb, not the host.
    assert!(
        matches!(r.limit().as_deref(), Some("time") | Some("pids") | Some("memory")),
        "a fork loop ends by the time, pids or memory limit\n{}",
        r.describe()
    );
    assert!(r.output.elapsed < Duration::from_secs(20), "teardown took {:?}", r.output.elapsed);
    assert_no_gvisor_leaks(&r.id());
    let status = Command::new("/bin/true").status().expect("host can still fork");
    assert!(status.success());
}

#[test]
fn fork_loop_fails_with_eagain_at_the_pids_limit_and_the_sandbox_survives() {
    require_runsc!();
    // As on the process tier: past the limit fork fails with EAGAIN inside, the program goes on and exits normally,
    // and the result says the pids limit fired (not that sandkasten failed).
    let code = "import os, errno, signal, time\nkids = []\ntry:\n    for i in range(200):\n        pid = os.fork()\n        if pid == 0:\n            time.sleep(30)\n            os._exit(0)\n        kids.append(pid)\n    print('NO LIMIT', len(kids))\nexcept OSError as e:\n    print('fork failed', errno.errorcode.get(e.errno), len(kids))\nfor k in kids:\n    os.kill(k, signal.SIGKILL)\nfor k in kids:\n    os.waitpid(k, 0)\nprint('survived')\n";
    let r = gvisor_code("python", code, &["--pids", "32", "--timeout", "20s"]).watchdog(Duration::from_secs(40)).json();
    assert_no_gvisor_leaks(&r.id());
    assert!(r.stdout().contains("fork failed EAGAIN"), "{}", r.describe());
    assert!(r.stdout().contains("survived"), "the sandbox died instead of refusing the fork\n{}", r.describe());
    let forked: usize = r
        .stdout()
        .lines()
        .find_map(|l| l.strip_prefix("fork failed EAGAIN "))
        .and_then(|n| n.parse().ok())
        .unwrap_or(999);
    // Every mismatch with the process tier at once, for one clear report.
    let mut wrong = Vec::new();
    if forked >= 32 {
        wrong.push(format!("{forked} children and their parent ran under --pids 32"));
    }
    if r.exit_code() != Some(0) {
        wrong.push(format!("exit {:?} instead of 0", r.exit_code()));
    }
    if !r.json["error"].is_null() {
        wrong.push(format!("error {} (a pids limit is not a sandbox error)", r.json["error"]));
    }
    // Known gap (docs/threat-model.md, gvisor tier): the limit holds inside (RLIMIT_NPROC, checked above), but no
    // counter says a fork was refused (the host cgroup counts the Sentry's threads, gVisor's pids controller has no
    // pids.events), so the result cannot name it; it must never name another limit.
    if r.limit().is_some_and(|limit| limit != "pids") {
        wrong.push(format!("limit {:?} instead of \"pids\" or none", r.limit()));
    }
    assert!(wrong.is_empty(), "{}\n{}", wrong.join("; "), r.describe());
}

#[test]
fn pids_limit_counts_guest_processes_not_gvisor_threads() {
    require_runsc!();
    // `--pids 16` accepted by the process tier must mean the same here: a program with 8 children runs.
    let code = "import os, time\nkids = []\nfor i in range(8):\n    pid = os.fork()\n    if pid == 0:\n        time.sleep(1)\n        os._exit(0)\n    kids.append(pid)\nfor k in kids:\n    os.waitpid(k, 0)\nprint('children', len(kids))\n";
    let control = run_code("python", code, &["--pids", "16", "--timeout", "20s"]).json();
    control.assert_exit(0);
    assert_eq!(control.stdout(), "children 8\n", "positive control (process tier)\n{}", control.describe());
    assert_no_leaks(&control.id());
    let r = gvisor_code("python", code, &["--pids", "16", "--timeout", "20s"]).watchdog(Duration::from_secs(40)).json();
    r.assert_exit(0);
    assert_eq!(r.stdout(), "children 8\n", "{}", r.describe());
    assert_no_gvisor_leaks(&r.id());
}

#[test]
fn disk_bomb_stops_at_the_disk_limit() {
    require_runsc!();
    let token = unique_token("gvfill");
    let before_root = free_bytes("/");
    let before_run = free_bytes("/run");
    let code = format!(
        "dd if=/dev/zero of=/workspace/{token} bs=1M count=64 2>/dev/null; echo dd-workspace=$?\n\
         dd if=/dev/zero of=/tmp/{token} bs=1M count=64 2>/dev/null; echo dd-tmp=$?\n\
         for i in $(seq 1 32); do head -c 1048576 /dev/zero > /workspace/small$i 2>/dev/null || {{ echo full-at $i; break; }}; done\n\
         du -sk /workspace /tmp; df -k /workspace /tmp"
    );
    let r = gvisor_code("bash", &code, &["--disk", "8MiB", "--timeout", "15s"]).json();
    let stdout = r.stdout();
    assert!(!stdout.contains("dd-workspace=0") && !stdout.contains("dd-tmp=0"), "64MiB fit in 8MiB\n{}", r.describe());
    assert!(stdout.contains("full-at"), "32 small files fit in 8MiB\n{}", r.describe());
    for line in stdout.lines().filter(|l| l.ends_with("/workspace") || l.ends_with("/tmp")) {
        let kib: u64 = line.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0);
        assert!(kib <= 8 * 1024 + 64, "{line}: more than the 8MiB disk limit\n{}", r.describe());
    }
    let lost_root = before_root.saturating_sub(free_bytes("/"));
    let lost_run = before_run.saturating_sub(free_bytes("/run"));
    assert!(lost_root < 48 << 20, "host / lost {lost_root} bytes");
    assert!(lost_run < 48 << 20, "host /run lost {lost_run} bytes");
    assert_no_gvisor_leaks(&r.id());
}

#[test]
fn disk_bomb_is_reported_as_the_disk_limit() {
    require_runsc!();
    // As on the process tier: the shell goes on after dd hits the limit, and the result names the disk limit.
    let r = gvisor_code(
        "bash",
        "dd if=/dev/zero of=/workspace/fill bs=1M count=64; echo dd=$?",
        &["--disk", "8MiB", "--timeout", "10s"],
    )
    .json();
    assert!(!r.stdout().contains("dd=0"), "{}", r.describe());
    assert_eq!(r.limit().as_deref(), Some("disk"), "{}", r.describe());
    assert_no_gvisor_leaks(&r.id());
    let r = gvisor_code(
        "bash",
        "for i in $(seq 1 16); do head -c 1048576 /dev/zero > /tmp/f$i 2>/dev/null || { echo full at $i; exit 1; }; done",
        &["--disk", "8MiB", "--timeout", "10s"],
    )
    .json();
    assert!(r.stdout().contains("full at"), "{}", r.describe());
    assert_eq!(r.limit().as_deref(), Some("disk"), "{}", r.describe());
    assert_no_gvisor_leaks(&r.id());
}

#[test]
fn output_flood_is_capped() {
    require_runsc!();
    let r = gvisor_code("bash", "yes flood", &["--output-limit", "64KiB", "--timeout", "10s"]).json();
    assert_eq!(r.cli_code(), 121, "{}", r.describe());
    assert_eq!(r.limit().as_deref(), Some("output"), "{}", r.describe());
    assert!(r.flag("stdout_truncated"), "{}", r.describe());
    assert_eq!(r.stdout().len(), 65536, "kept bytes == limit\n{}", r.describe());
    assert!(!r.flag("timed_out"), "the flood is stopped by the output limit, not the timeout\n{}", r.describe());
    assert_no_gvisor_leaks(&r.id());
    let r = gvisor_code("bash", "yes err-line >&2", &["--output-limit", "64KiB", "--timeout", "10s"]).json();
    assert_eq!(r.limit().as_deref(), Some("output"), "{}", r.describe());
    assert!(r.flag("stderr_truncated"), "{}", r.describe());
    assert_eq!(r.stderr().len(), 65536, "{}", r.describe());
    assert_no_gvisor_leaks(&r.id());
    // Plain mode streams no more than the limit to the terminal.
    let plain = gvisor_code("bash", "yes flood", &["--output-limit", "64KiB", "--timeout", "10s"]).output();
    assert_eq!(plain.code, 121, "{}", plain.describe());
    assert!(plain.stdout.len() <= 65536, "plain mode streamed {} bytes past a 64KiB limit", plain.stdout.len());
}
