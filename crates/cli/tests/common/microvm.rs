//! The microvm tier seen from the host: whether it can run here (root, QEMU, the boot files), its VMM processes
//! found by what they hold (the sandbox's cgroup, the sandbox's files under `<state_dir>/microvm/ID`), what a
//! sandbox leaves behind, and one-shot runs watched while they run (`Watched`: the sandbox's id from its record,
//! a marker the guest writes through to its disk image, the CLI's JSON result at the end).
//!
//! `per_tier!` runs the shared suites on it (their `microvm::` tests); the tier's own suites start each test with
//! `require_microvm!`.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{Cli, Output, RECORD_DIR, RunResult, SuiteLock, bin, cmdline, dir_names, host_pids, leftovers};

/// Where `scripts/setup-microvm.sh` puts the guest kernel, initramfs and root image.
pub const MICROVM_BOOT_DIR: &str = "/var/lib/sandkasten/microvm";
/// Where the tier keeps one directory per sandbox (its disk image, console and VMM logs).
pub const MICROVM_STATE_DIR: &str = "/run/sandkasten/microvm";
/// The VMM the tier runs (`[microvm] qemu`'s default), looked up on PATH.
pub const QEMU: &str = "qemu-system-x86_64";
/// The smallest memory limit the tier takes (its guest kernel's needs; the runtime refuses less).
pub const MICROVM_MIN_MEMORY_BYTES: u64 = 128 << 20;
/// The VMM's memory beside the guest's RAM that the tier charges to the sandbox's cgroup (the runtime's
/// `VMM_OVERHEAD_BYTES`).
pub const VMM_OVERHEAD_BYTES: u64 = 160 << 20;
/// How long a one-shot microVM run may take before the watchdog fails the test: boots take ~5 s under software
/// emulation, far more on a loaded 2-core host.
pub const VM_WATCHDOG: Duration = Duration::from_secs(240);

/// Why the microvm tier cannot run here (`None`: root, QEMU and the boot files are present).
pub fn microvm_unavailable() -> Option<String> {
    if !super::is_root() {
        return Some("needs root (the microvm tier creates cgroups and namespaces for its VMM)".to_owned());
    }
    let on_path =
        std::env::var_os("PATH").is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(QEMU).is_file()));
    if !on_path {
        return Some(format!("needs {QEMU} on PATH (the microvm tier's VMM; scripts/setup.sh installs it)"));
    }
    for file in ["vmlinuz", "initrd.img", "rootfs.ext4"] {
        let path = Path::new(MICROVM_BOOT_DIR).join(file);
        if !path.is_file() {
            return Some(format!("needs {} (scripts/setup-microvm.sh builds it)", path.display()));
        }
    }
    None
}

/// Returns from the test (skipping it, with the reason on stderr) when the microvm tier cannot run here.
#[allow(unused_macros)] // files without per-tier or microvm tests include this module too
macro_rules! require_microvm {
    () => {
        require_root!();
        if let Some(reason) = crate::common::microvm::microvm_unavailable() {
            eprintln!("skipped: {reason}");
            return;
        }
    };
}

/// `sandkasten run --isolation microvm <args...>`, with a watchdog long enough for a boot.
pub fn vm_run<I, S>(args: I) -> Cli
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut all: Vec<String> = vec!["run".into(), "--isolation".into(), "microvm".into()];
    all.extend(args.into_iter().map(Into::into));
    Cli::new(all).watchdog(VM_WATCHDOG)
}

/// The directory of microVM sandbox `id` on the host.
pub fn state_dir_of(id: &str) -> PathBuf {
    Path::new(MICROVM_STATE_DIR).join(id)
}

/// True when `pid` runs QEMU as the microvm tier starts it (its agent port on the command line).
pub fn is_vmm(pid: u32) -> bool {
    let line = cmdline(pid);
    let argv0 = line.split_whitespace().next().unwrap_or_default();
    argv0.rsplit('/').next().unwrap_or(argv0).starts_with("qemu-system") && line.contains("sandkasten.agent")
}

/// What `pid`'s open descriptors point at.
fn open_files(pid: u32) -> Vec<String> {
    let Ok(entries) = fs::read_dir(format!("/proc/{pid}/fd")) else { return Vec::new() };
    entries.flatten().filter_map(|e| Some(fs::read_link(e.path()).ok()?.to_string_lossy().into_owned())).collect()
}

/// The host's VMM processes of sandbox `id`: QEMU processes in its cgroup or holding one of its files (its disk
/// image, its logs), so that a VMM that left the cgroup is found too.
pub fn vmm_processes(id: &str) -> Vec<u32> {
    host_pids()
        .into_iter()
        .filter(|pid| is_vmm(*pid))
        .filter(|pid| {
            let cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            cgroup.contains(id) || open_files(*pid).iter().any(|file| file.contains(id))
        })
        .collect()
}

/// Waits (up to `limit`) for sandbox `id`'s VMM; its pid.
pub fn wait_for_vmm(id: &str, limit: Duration) -> u32 {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(pid) = vmm_processes(id).first() {
            return *pid;
        }
        assert!(Instant::now() < deadline, "no VMM of sandbox {id} appeared on the host within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// True while `pid` exists and is no zombie.
pub fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| !stat.contains(") Z"))
}

/// What is left of microVM sandbox `id` on the host: `leftovers` (record, cgroups, processes in them), its
/// directory under the state dir, and any VMM process of it.
pub fn microvm_leftovers(id: &str) -> Vec<String> {
    let mut left = leftovers(id);
    let dir = state_dir_of(id);
    if dir.exists() {
        left.push(format!("its directory {} still exists: {:?}", dir.display(), dir_names(&dir.to_string_lossy())));
    }
    for pid in vmm_processes(id) {
        left.push(format!("VMM process {pid} still runs: {}", super::excerpt(&cmdline(pid), 200)));
    }
    left
}

/// Asserts microVM sandbox `id` left nothing on the host (see `microvm_leftovers`), allowing a short grace for
/// the kernel to reap.
pub fn assert_no_microvm_leaks(id: &str) {
    assert!(!id.is_empty(), "assert_no_microvm_leaks needs a sandbox id");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = microvm_leftovers(id);
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "microVM sandbox {id} leaked:\n  {}", left.join("\n  "));
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// True when the host's copy of sandbox `id`'s disk image holds `marker` (what the guest wrote and `sync`ed).
/// `grep` searches the image (a gigabyte, mostly holes) in a fraction of a second; a byte-window scan in a debug
/// build takes longer than a short command runs.
pub fn disk_holds(id: &str, marker: &str) -> bool {
    let image = state_dir_of(id).join("disk.ext4");
    Command::new("grep")
        .args(["-q", "-a", "-F", "--", marker])
        .arg(&image)
        .status()
        .is_ok_and(|status| status.success())
}

/// A one-shot `sandkasten run --isolation microvm --json` running in the background, for tests that look at the
/// host (or kill something) while the guest runs. The CLI is killed if the test ends first.
pub struct Watched {
    child: Option<Child>,
    started: Instant,
    stdout: Option<std::thread::JoinHandle<Vec<u8>>>,
    stderr: Option<std::thread::JoinHandle<Vec<u8>>>,
    _lock: SuiteLock,
}

impl Watched {
    /// Starts `sandkasten run --isolation microvm --json <args...>`, holding the suite lock shared.
    pub fn start(args: &[&str]) -> Watched {
        Watched::start_locked(args, super::shared_lock())
    }

    /// As `start`, holding `lock` (the suite lock exclusively: no other test's sandbox runs meanwhile) until the run
    /// ends.
    pub fn start_locked(args: &[&str], lock: SuiteLock) -> Watched {
        let mut child = Command::new(bin())
            .args(["run", "--isolation", "microvm", "--json"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sandkasten run");
        let drain = |mut pipe: Box<dyn Read + Send>| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let _ = pipe.read_to_end(&mut buf);
                buf
            })
        };
        let stdout = child.stdout.take().map(|p| drain(Box::new(p)));
        let stderr = child.stderr.take().map(|p| drain(Box::new(p)));
        Watched { child: Some(child), started: Instant::now(), stdout, stderr, _lock: lock }
    }

    /// The CLI's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The id of the sandbox whose record names this CLI as its owner, polled for up to `limit`.
    pub fn sandbox_id(&self, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let mine = dir_names(RECORD_DIR).into_iter().find_map(|name| {
                let id = name.strip_suffix(".json")?;
                (super::record_owner(id) == Some(u64::from(self.pid()))).then(|| id.to_owned())
            });
            if let Some(id) = mine {
                return id;
            }
            assert!(Instant::now() < deadline, "no sandbox record names the CLI {} within {limit:?}", self.pid());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (up to `limit`) until the guest has written `marker` through to sandbox `id`'s disk image: the
    /// guest booted and its command runs.
    pub fn wait_for_marker(&self, id: &str, marker: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        while !disk_holds(id, marker) {
            assert!(Instant::now() < deadline, "the guest of {id} did not write {marker} to its disk within {limit:?}");
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// True while the CLI has not exited.
    pub fn running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// Waits (up to `limit`) for the CLI to end; its parsed JSON result.
    pub fn finish(mut self, limit: Duration) -> RunResult {
        let mut child = self.child.take().expect("the CLI runs");
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for sandkasten run") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the CLI was still running {limit:?} after it was asked to finish; killed it");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let elapsed = self.started.elapsed();
        let stdout = self.stdout.take().map(|t| t.join().unwrap_or_default()).unwrap_or_default();
        let stderr = self.stderr.take().map(|t| t.join().unwrap_or_default()).unwrap_or_default();
        use std::os::unix::process::ExitStatusExt;
        let code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
        RunResult::parse(Output { code, stdout, stderr, elapsed, pid: child.id() })
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The processes `pid`'s threads started (its children, from `/proc/PID/task/*/children`).
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .flatten()
        .flat_map(|task| {
            let listed = fs::read_to_string(task.path().join("children")).unwrap_or_default();
            listed.split_whitespace().filter_map(|child| child.parse().ok()).collect::<Vec<u32>>()
        })
        .collect()
}

/// One field of `/proc/PID/status` (`Uid`, `CapEff`, `NSpid`, …), its words.
pub fn status_field(pid: u32, field: &str) -> Vec<String> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .map(|rest| rest.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}
