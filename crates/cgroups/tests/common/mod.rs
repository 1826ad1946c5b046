//! Shared helpers of the real-kernel tests: skip checks, a cleanup guard, and processes that wait at a
//! gate (`read x`) until they are inside the cgroup.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sandkasten_cgroups::{Cgroup, Hierarchy};

/// Whether we run as root (the owner of `/proc/self` is our effective uid).
pub fn is_root() -> bool {
    fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false)
}

/// The first cgroup2 mount point of this process, if any.
pub fn cgroup2_mount() -> Option<PathBuf> {
    let text = fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let sep = fields.iter().position(|f| *f == "-")?;
        (fields.get(sep + 1) == Some(&"cgroup2")).then(|| PathBuf::from(fields[4]))
    })
}

/// A unique parent name per test.
pub fn unique_parent(test: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("sandkasten-test-{test}-{}-{nanos}", std::process::id())
}

/// Owns a test's parent cgroup and its child processes; on drop (also on panic) kills the children,
/// removes every cgroup under the parent, then the parent itself.
pub struct Guard {
    pub hierarchy: Hierarchy,
    pub parent: String,
    children: BTreeMap<u32, Child>,
}

impl Guard {
    pub fn new(hierarchy: Hierarchy, test: &str) -> Guard {
        Guard { hierarchy, parent: unique_parent(test), children: BTreeMap::new() }
    }

    /// Spawns `sh -c 'read x; <script>'`: it blocks until `open_gate` so it can be put in a cgroup first.
    pub fn spawn_gated(&mut self, script: &str) -> (u32, ChildStdin) {
        let mut child = Command::new("/bin/sh")
            .arg("-c")
            .arg(format!("read x; {script}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let pid = child.id();
        self.children.insert(pid, child);
        (pid, stdin)
    }

    /// Reaps a direct child (blocking).
    pub fn reap(&mut self, pid: u32) -> ExitStatus {
        self.children.remove(&pid).unwrap().wait().unwrap()
    }

    /// Reaps every direct child.
    pub fn reap_all(&mut self) -> Vec<ExitStatus> {
        std::mem::take(&mut self.children).into_values().map(|mut c| c.wait().unwrap()).collect()
    }

    /// Cleans up now and asserts nothing is left: none of `created`, no parent directory in any controller.
    pub fn finish(mut self, created: &[PathBuf]) {
        self.cleanup();
        for path in created {
            assert!(!path.exists(), "{} left behind", path.display());
        }
        let top_level = self.hierarchy.list("").unwrap();
        assert!(!top_level.contains(&self.parent), "parent {} left behind", self.parent);
    }

    fn cleanup(&mut self) {
        for child in self.children.values_mut() {
            let _ = child.kill();
        }
        for (_, mut child) in std::mem::take(&mut self.children) {
            let _ = child.wait();
        }
        for name in self.hierarchy.list(&self.parent).unwrap_or_default() {
            if let Ok(Some(cgroup)) = self.hierarchy.open(&self.parent, &name)
                && let Err(err) = cgroup.remove()
            {
                eprintln!("cleanup: removing {name}: {err}");
            }
        }
        if let Err(err) = self.hierarchy.remove_parent(&self.parent) {
            eprintln!("cleanup: removing parent {}: {err}", self.parent);
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// Lets a gated process go on.
pub fn open_gate(mut stdin: ChildStdin) {
    stdin.write_all(b"go\n").unwrap();
}

/// Polls until `cgroup` holds at least `count` processes (5 s at most); returns them.
pub fn wait_for_pids(cgroup: &Cgroup, count: usize) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let pids = cgroup.pids().unwrap();
        if pids.len() >= count || Instant::now() > deadline {
            assert!(pids.len() >= count, "only {pids:?} in the cgroup, expected {count}");
            return pids;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Whether `pid` is dead: gone from /proc, or a zombie not reaped yet (PID 1 on this host reaps orphans only lazily).
pub fn is_dead(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => {
            // The state follows the parenthesised command name.
            let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next());
            matches!(state, Some('Z' | 'X'))
        }
    }
}

/// Polls until every pid is dead (2 s at most).
pub fn assert_all_dead(pids: &[u32]) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while !pids.iter().all(|pid| is_dead(*pid)) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
    let alive: Vec<u32> = pids.iter().copied().filter(|pid| !is_dead(*pid)).collect();
    assert!(alive.is_empty(), "still alive: {alive:?}");
}

/// CPU time (user + system) the process `pid` has used, in clock ticks (10 ms), from `/proc/PID/stat`.
pub fn cpu_ticks(pid: u32) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let Some(close) = stat.rfind(')') else { return 0 };
    let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|t| t.parse::<u64>().ok()).unwrap_or(0);
    field(11) + field(12)
}

/// With the busy process `pid` in `cgroup`: frozen, it gets no CPU for a second (measured on the host from its own
/// CPU time); thawed, it runs again.
pub fn assert_freeze_stops_cpu_and_thaw_resumes(cgroup: &Cgroup, pid: u32) {
    let spins = |within: Duration| {
        let before = cpu_ticks(pid);
        thread::sleep(within);
        cpu_ticks(pid) - before
    };
    assert!(spins(Duration::from_millis(500)) > 0, "the busy loop does not run");
    cgroup.freeze().unwrap();
    thread::sleep(Duration::from_millis(100));
    let frozen = spins(Duration::from_secs(1));
    assert!(frozen <= 1, "a frozen busy loop used {frozen} ticks of CPU in 1 s");
    cgroup.thaw().unwrap();
    let thawed = spins(Duration::from_secs(1));
    assert!(thawed >= 5, "the thawed busy loop used only {thawed} ticks of CPU in 1 s");
}
