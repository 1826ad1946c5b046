//! Filesystem and information-leak attacks, asserted on the host: reading host canary files, the host's environment,
//! host mounts, writing outside /workspace and /tmp, sensitive /proc and /sys paths, filling the disk.
//!
//! Every test runs on each isolation tier (`process::NAME`, `gvisor::NAME` and `microvm::NAME`, see `per_tier!`).

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
mod common;

use std::path::{Path, PathBuf};

use common::*;

per_tier!(
    host_canary_files_are_not_readable,
    host_env_is_not_visible,
    mountinfo_shows_no_host_paths,
    root_and_home_and_host_dirs_are_absent,
    etc_shadow_is_not_readable_and_etc_is_synthesised,
    writes_outside_workspace_and_tmp_fail,
    sandbox_files_do_not_appear_on_host,
    disk_fill_stays_off_host,
    proc_and_sys_sensitive_paths_are_masked,
    upload_path_traversal_is_refused,
);

/// Python that tries to read each path (directly and through a few indirections) and prints what happened.
fn read_attempts(paths: &[&Path]) -> String {
    let list: Vec<String> = paths.iter().map(|p| format!("{:?}", p.to_str().unwrap())).collect();
    format!(
        "import os\nfor p in [{}]:\n    for q in (p, '/proc/1/root' + p, '/proc/self/root' + p, '/proc/self/cwd/../..' + p):\n        try:\n            print('READ', q, open(q).read())\n        except OSError as e:\n            print('denied', q, type(e).__name__)\n",
        list.join(", ")
    )
}

fn host_canary_files_are_not_readable(tier: Tier) {
    let name = unique_token("sandkasten-canary-");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(".{name}"));
    let canaries = [
        Canary::create(format!("/root/{name}")),
        Canary::create(format!("/tmp/{name}")),
        Canary::create(format!("/var/tmp/{name}")),
        Canary::create(repo),
    ];
    let paths: Vec<&Path> = canaries.iter().map(|c| c.path.as_path()).collect();
    let r = code_on(tier, "python", &read_attempts(&paths), &[]).json();
    r.assert_exit(0);
    for canary in &canaries {
        assert!(!r.stdout().contains(&canary.secret), "{} was read\n{}", canary.path.display(), r.describe());
        assert!(!r.stderr().contains(&canary.secret), "{}", r.describe());
    }
    assert!(!r.stdout().contains("READ"), "{}", r.describe());
    assert_eq!(r.stdout().matches("denied").count(), 4 * paths.len(), "{}", r.describe());
    assert_gone(tier, &r.id());
    // The same reads with cat and through a shell glob.
    let shell: Vec<String> = paths.iter().map(|p| format!("cat {} 2>&1", p.display())).collect();
    let r =
        code_on(tier, "bash", &format!("{}; cat /tmp/sandkasten-canary-* /root/* 2>&1; true", shell.join("; ")), &[])
            .json();
    for canary in &canaries {
        assert!(!r.stdout().contains(&canary.secret), "{} was read by cat\n{}", canary.path.display(), r.describe());
    }
    assert_gone(tier, &r.id());
}

fn host_env_is_not_visible(tier: Tier) {
    let secret = unique_token("ENVCANARY");
    // Positive control: a host process started the same way does see it.
    let host = std::process::Command::new("/usr/bin/env").env("SANDKASTEN_TEST_CANARY", &secret).output().unwrap();
    assert!(String::from_utf8_lossy(&host.stdout).contains(&secret));
    let code = "env; echo; cat /proc/1/environ; echo; cat /proc/self/environ; echo\n\
                for f in /proc/[0-9]*/environ; do cat \"$f\" 2>/dev/null; echo; done\n\
                cat /proc/$PPID/environ 2>&1; echo";
    let r = code_on(tier, "bash", code, &[]).env("SANDKASTEN_TEST_CANARY", &secret).json();
    r.assert_exit(0);
    assert!(!r.stdout().contains(&secret), "host env leaked\n{}", r.describe());
    assert!(!r.stdout().contains("SANDKASTEN_TEST_CANARY"), "{}", r.describe());
    assert!(!r.stdout().contains("CARGO"), "cargo's env leaked\n{}", r.describe());
    assert!(r.stdout().contains("HOME=/workspace"), "positive control: env is printed\n{}", r.describe());
    assert_gone(tier, &r.id());
}

fn mountinfo_shows_no_host_paths(tier: Tier) {
    let host_mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let host_root_source = host_mountinfo
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/"))
        .and_then(|l| l.split(" - ").nth(1)?.split_whitespace().nth(1).map(str::to_owned));
    let r = run_on(tier, ["--", "cat", "/proc/self/mountinfo"]).json();
    r.assert_exit(0);
    assert!(!r.stdout().is_empty(), "{}", r.describe());
    for line in r.stdout().lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (root, mount_point) = (fields.get(3).copied().unwrap_or(""), fields.get(4).copied().unwrap_or(""));
        let under = |path: &str, dir: &str| path == dir || path.starts_with(&format!("{dir}/"));
        for bad in ["/work", "/root", "/home", "/run/sandkasten", "/var/lib"] {
            assert!(
                !under(root, bad) && !under(mount_point, bad),
                "host path {bad} is mounted inside: {line}\n{}",
                r.describe()
            );
        }
        assert_ne!(root, "/tmp", "the host /tmp is bind-mounted inside: {line}");
        // The host's root filesystem must never be mounted whole (root "/" of the host's root device).
        let source = line.split(" - ").nth(1).and_then(|rest| rest.split_whitespace().nth(1)).unwrap_or("");
        if let Some(host_source) = &host_root_source {
            assert!(
                !(root == "/" && source == host_source),
                "the host root filesystem ({host_source}) is mounted whole at {mount_point}\n{}",
                r.describe()
            );
        }
    }
    assert_gone(tier, &r.id());
}

fn root_and_home_and_host_dirs_are_absent(tier: Tier) {
    let code = "import os\nfor p in ['/root', '/home', '/work', '/run/sandkasten', '/var/run/docker.sock', '/run/docker.sock', '/var/lib', '/boot', '/etc/shadow', '/etc/sudoers', '/etc/ssh']:\n    print(p, 'EXISTS' if os.path.lexists(p) else 'absent')\n";
    let r = code_on(tier, "python", code, &[]).json();
    r.assert_exit(0);
    assert!(!r.stdout().contains("EXISTS"), "{}", r.describe());
    assert_eq!(r.stdout().matches("absent").count(), 11, "{}", r.describe());
    assert_gone(tier, &r.id());
}

fn etc_shadow_is_not_readable_and_etc_is_synthesised(tier: Tier) {
    let host_shadow = std::fs::read_to_string("/etc/shadow").unwrap_or_default();
    let root_hash_line = host_shadow.lines().find(|l| l.starts_with("root:")).unwrap_or("").to_owned();
    let host_passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let r =
        code_on(tier, "bash", "cat /etc/shadow 2>&1; echo; cat /etc/passwd; echo; cat /etc/hostname 2>&1", &[]).json();
    if !root_hash_line.is_empty() {
        assert!(!r.stdout().contains(&root_hash_line), "host /etc/shadow read\n{}", r.describe());
    }
    assert!(r.stdout().contains("sandbox:x:1000:1000"), "synthesised passwd has the sandbox user\n{}", r.describe());
    // Host users other than root/sandbox must not appear (the host's passwd is not bound in).
    for line in host_passwd.lines() {
        let user = line.split(':').next().unwrap_or("");
        if user.is_empty() || ["root", "sandbox", "nobody"].contains(&user) {
            continue;
        }
        assert!(!r.stdout().contains(&format!("\n{user}:")), "host user {user} is visible\n{}", r.describe());
    }
    assert_gone(tier, &r.id());
}

fn writes_outside_workspace_and_tmp_fail(tier: Tier) {
    let token = unique_token("x");
    let targets: Vec<PathBuf> = ["/usr", "/etc", "", "/sandbox", "/bin", "/var", "/dev", "/lib"]
        .iter()
        .map(|d| PathBuf::from(format!("{d}/{token}")))
        .collect();
    let host_hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let mut code = String::from("import os\n");
    for t in &targets {
        code.push_str(&format!(
            "try:\n    open({:?}, 'w').write('pwned'); print('WROTE', {:?})\nexcept OSError as e:\n    print('denied', {:?}, type(e).__name__)\n",
            t, t, t
        ));
    }
    code.push_str(
        "for p in ['/proc/sys/kernel/hostname', '/proc/sys/vm/drop_caches', '/proc/sysrq-trigger', '/sys/kernel/mm/transparent_hugepage/enabled', '/usr/bin/python3']:\n    try:\n        f = open(p, 'w'); print('OPENED-W', p); f.close()\n    except OSError as e:\n        print('denied', p, type(e).__name__)\n\
         try:\n    os.mkdir('/workspace/ok'); open('/tmp/ok', 'w').write('ok'); print('workspace-and-tmp-writable')\nexcept OSError as e:\n    print('WORKSPACE-DENIED', e)\n",
    );
    let r = code_on(tier, "python", &code, &[]).json();
    r.assert_exit(0);
    assert!(!r.stdout().contains("WROTE"), "{}", r.describe());
    assert!(!r.stdout().contains("OPENED-W"), "{}", r.describe());
    assert!(r.stdout().contains("workspace-and-tmp-writable"), "positive control\n{}", r.describe());
    for t in &targets {
        assert!(!t.exists(), "{} appeared on the host", t.display());
    }
    assert_eq!(std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap(), host_hostname);
    assert_gone(tier, &r.id());
}

fn sandbox_files_do_not_appear_on_host(tier: Tier) {
    let token = unique_token("ondisk");
    let code = format!("echo data > /workspace/{token}; echo data > /tmp/{token}; ls /workspace /tmp");
    let r = code_on(tier, "bash", &code, &[]).json();
    r.assert_exit(0);
    assert!(r.stdout().contains(&token), "positive control\n{}", r.describe());
    for dir in ["/tmp", "/var/tmp", "/dev/shm", "/run", "/workspace", "/root", "/work"] {
        assert!(!found_below(Path::new(dir), &token, 4), "{token} found on the host under {dir}");
    }
    assert_gone(tier, &r.id());
}

fn found_below(dir: &Path, name: &str, depth: u32) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else { return false };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().contains(name) {
            return true;
        }
        if depth > 0
            && entry.file_type().map(|t| t.is_dir()).unwrap_or(false)
            && found_below(&entry.path(), name, depth - 1)
        {
            return true;
        }
    }
    false
}

fn disk_fill_stays_off_host(tier: Tier) {
    let token = unique_token("fill");
    let before_root = free_bytes("/");
    let before_shm = free_bytes("/dev/shm");
    let code = format!(
        "dd if=/dev/zero of=/workspace/{token} bs=1M count=256; dd if=/dev/zero of=/tmp/{token} bs=1M count=256; true"
    );
    let r = code_on(tier, "bash", &code, &["--disk", "8MiB", "--timeout", "10s"]).json();
    let lost_root = before_root.saturating_sub(free_bytes("/"));
    let lost_shm = before_shm.saturating_sub(free_bytes("/dev/shm"));
    assert!(lost_root < 128 << 20, "host / lost {lost_root} bytes");
    assert!(lost_shm < 128 << 20, "host /dev/shm lost {lost_shm} bytes");
    for dir in ["/tmp", "/var/tmp", "/dev/shm", "/run"] {
        assert!(!found_below(Path::new(dir), &token, 4), "{token} found on the host under {dir}");
    }
    assert_gone(tier, &r.id());
    assert_eq!(r.limit().as_deref(), Some("disk"), "{}", r.describe());
}

fn proc_and_sys_sensitive_paths_are_masked(tier: Tier) {
    let code = "import os\n\
                for p in ['/proc/kcore', '/proc/keys', '/proc/timer_list', '/proc/sched_debug', '/proc/latency_stats', '/sys/firmware/dmi/tables/DMI', '/proc/1/mem']:\n\
                \x20   try:\n\
                \x20       with open(p, 'rb') as f: data = f.read(64)\n\
                \x20       print('READ' if data.strip(b'\\0 \\n') else 'empty', p)\n\
                \x20   except OSError as e:\n\
                \x20       print('denied', p, type(e).__name__)\n\
                print('net', sorted(os.listdir('/sys/class/net')) if os.path.isdir('/sys/class/net') else 'no-sys-class-net')\n\
                cg = '/sys/fs/cgroup'\n\
                found = [r for r, d, f in os.walk(cg) if 'sandkasten' in os.path.basename(r)] if os.path.isdir(cg) else []\n\
                print('cgroup-sandkasten-dirs', found)\n";
    let r = code_on(tier, "python", code, &[]).json();
    r.assert_exit(0);
    assert!(!r.stdout().contains("READ "), "sensitive kernel data readable\n{}", r.describe());
    assert!(r.stdout().contains("cgroup-sandkasten-dirs []"), "host cgroup tree visible\n{}", r.describe());
    let net_line = r.stdout().lines().find(|l| l.starts_with("net ")).unwrap_or("").to_owned();
    assert!(
        net_line == "net ['lo']" || net_line == "net no-sys-class-net" || net_line == "net []",
        "/sys/class/net shows host interfaces: {net_line}\n{}",
        r.describe()
    );
    assert_gone(tier, &r.id());
}

fn upload_path_traversal_is_refused(tier: Tier) {
    let (_dir, path) = host_file("f.txt", b"content");
    let token = unique_token("escape");
    for target in [format!("../../etc/{token}"), format!("/workspace/../etc/{token}"), format!("/etc/{token}")] {
        let out =
            run_on(tier, ["--lang", "bash", "--code", "true", "--upload", &format!("{}:{target}", path.display())])
                .output();
        assert!(!Path::new(&format!("/etc/{token}")).exists(), "upload {target} escaped to the host /etc");
        assert_eq!(out.code, 2, "upload target {target} is outside /workspace and /tmp: bad input\n{}", out.describe());
    }
    for dir in ["/tmp", "/var/tmp", "/run", "/etc", "/"] {
        assert!(
            !found_below(Path::new(dir), &token, if dir == "/" { 0 } else { 3 }),
            "{token} written under host {dir}"
        );
    }
}
