//! Shared helpers for the `sandkasten run` integration and attack tests: running the binary with a watchdog, reading
//! its JSON result, host-side leak checks (records, cgroups, processes), canary files and unique tokens.
//!
//! Every helper asserts on the *host*: what a sandbox claims about itself is never trusted on its own.

#![allow(dead_code, unsafe_code, clippy::unwrap_used, clippy::expect_used)]

#[macro_use]
pub mod microvm;
pub mod venvs;

use std::collections::BTreeSet;
use std::fs;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Where the runtime keeps one durable record per sandbox.
pub const RECORD_DIR: &str = "/run/sandkasten/sandboxes";
/// cgroup v1 controllers a sandbox gets a directory in.
pub const V1_CONTROLLERS: [&str; 5] = ["memory", "pids", "cpu", "cpuacct", "freezer"];
/// Host uids sandbox processes run as: `[SANDBOX_UID_BASE, SANDBOX_UID_END)`, a range of 65536 per sandbox.
pub const SANDBOX_UID_BASE: u32 = 1_000_000_000;
/// The end of the sandboxes' host uid ranges (4096 ranges of 65536).
pub const SANDBOX_UID_END: u32 = SANDBOX_UID_BASE + 4096 * 65536;
/// How long the CLI may take before the watchdog kills it and the test fails.
pub const DEFAULT_WATCHDOG: Duration = Duration::from_secs(60);
/// A lock every sandbox-running test holds shared, and bad-input tests hold exclusively, so that "nothing was created"
/// can be checked by listing global directories even when tests run in parallel processes.
const SUITE_LOCK: &str = "/tmp/sandkasten-cli-tests.lock";

/// Path of the binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_sandkasten")
}

/// True when the tests run as root (the process tier needs it).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Returns from the test (skipping it) when not root.
macro_rules! require_root {
    () => {
        if !crate::common::is_root() {
            eprintln!("skipped: needs root (the process tier creates namespaces and cgroups)");
            return;
        }
    };
}

/// A token unique to this test run, safe to put in argv, file names and env values.
pub fn unique_token(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{:x}x{:x}x{n}", std::process::id(), nanos)
}

/// A whole-file advisory lock (flock) held until dropped.
pub struct SuiteLock {
    _file: fs::File,
}

/// Suite locks this process holds: a test that already holds one takes another without the turnstile (an exclusive
/// taker queued there waits for the first one, which would wait for the second: a deadlock).
static HELD_LOCKS: AtomicU64 = AtomicU64::new(0);

impl Drop for SuiteLock {
    fn drop(&mut self) {
        HELD_LOCKS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Opens `path` (created if missing) and flocks it in `mode`.
fn flock(path: &str, mode: libc::c_int) -> fs::File {
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {path}: {e}"));
    // SAFETY: the fd is valid for the lifetime of `file`; flock only takes the lock.
    let rc = unsafe { libc::flock(file.as_raw_fd(), mode) };
    assert_eq!(rc, 0, "flock {path}: {}", std::io::Error::last_os_error());
    file
}

/// The turnstile in front of the suite lock: an exclusive taker holds it while it waits, so shared takers arriving
/// meanwhile queue behind it instead of keeping the suite lock shared for ever (flock alone lets a stream of shared
/// holders — the microVM suites hold theirs for a boot and a run each — starve an exclusive taker).
fn turnstile() -> String {
    format!("{SUITE_LOCK}.turnstile")
}

/// Taken (shared) around every sandbox run.
pub fn shared_lock() -> SuiteLock {
    let gate = (HELD_LOCKS.load(Ordering::SeqCst) == 0).then(|| flock(&turnstile(), libc::LOCK_SH));
    let file = flock(SUITE_LOCK, libc::LOCK_SH);
    drop(gate);
    HELD_LOCKS.fetch_add(1, Ordering::SeqCst);
    SuiteLock { _file: file }
}

/// Taken (exclusive) by tests that compare global listings before/after.
pub fn exclusive_lock() -> SuiteLock {
    let gate = flock(&turnstile(), libc::LOCK_EX);
    let file = flock(SUITE_LOCK, libc::LOCK_EX);
    drop(gate);
    HELD_LOCKS.fetch_add(1, Ordering::SeqCst);
    SuiteLock { _file: file }
}

/// What one CLI invocation produced.
#[derive(Debug)]
pub struct Output {
    /// The CLI's exit code (`128+N` if the CLI itself died of signal N).
    pub code: i32,
    /// The CLI's stdout bytes.
    pub stdout: Vec<u8>,
    /// The CLI's stderr bytes.
    pub stderr: Vec<u8>,
    /// Wall time of the CLI.
    pub elapsed: Duration,
    /// The CLI's host pid (records name their owner by pid).
    pub pid: u32,
}

impl Output {
    /// stdout as (lossy) text.
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// stderr as (lossy) text.
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    /// A short description for assertion messages.
    pub fn describe(&self) -> String {
        format!(
            "exit {} after {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code,
            self.elapsed,
            excerpt(&self.stdout_text(), 3000),
            excerpt(&self.stderr_text(), 3000)
        )
    }
}

/// The first `max` characters of `text`, marked when cut.
pub fn excerpt(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        let head: String = text.chars().take(max).collect();
        format!("{head}… [{} chars total]", text.chars().count())
    }
}

/// A builder for one `sandkasten` invocation.
pub struct Cli {
    args: Vec<String>,
    stdin: Option<Vec<u8>>,
    envs: Vec<(String, String)>,
    watchdog: Duration,
}

impl Cli {
    /// `sandkasten <args...>`.
    pub fn new<I, S>(args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Cli {
            args: args.into_iter().map(Into::into).collect(),
            stdin: None,
            envs: Vec::new(),
            watchdog: DEFAULT_WATCHDOG,
        }
    }

    /// Bytes written to the CLI's stdin (then closed). Without it, stdin is /dev/null.
    pub fn stdin(mut self, bytes: impl Into<Vec<u8>>) -> Self {
        self.stdin = Some(bytes.into());
        self
    }

    /// An extra variable in the CLI's own environment.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.envs.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Kill the CLI and fail the test after this long.
    pub fn watchdog(mut self, limit: Duration) -> Self {
        self.watchdog = limit;
        self
    }

    /// Runs the CLI to completion (or the watchdog) and returns what it produced.
    pub fn output(self) -> Output {
        let _lock = shared_lock();
        self.output_unlocked()
    }

    /// Like `output`, for callers that already hold a suite lock.
    pub fn output_unlocked(self) -> Output {
        let mut command = Command::new(bin());
        command
            .args(&self.args)
            .stdin(if self.stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in &self.envs {
            command.env(k, v);
        }
        let start = Instant::now();
        let mut child = command.spawn().expect("spawn sandkasten");
        let pid = child.id();
        let stdin_thread = self.stdin.map(|bytes| {
            let mut pipe = child.stdin.take().expect("stdin pipe");
            std::thread::spawn(move || {
                // The program may not read its stdin: a broken pipe is fine.
                let _ = pipe.write_all(&bytes);
            })
        });
        let mut out_pipe = child.stdout.take().expect("stdout pipe");
        let mut err_pipe = child.stderr.take().expect("stderr pipe");
        let out_thread = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = out_pipe.read_to_end(&mut buf);
            buf
        });
        let err_thread = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = err_pipe.read_to_end(&mut buf);
            buf
        });
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait sandkasten") {
                break status;
            }
            if start.elapsed() > self.watchdog {
                let _ = child.kill();
                let _ = child.wait();
                let stdout = out_thread.join().unwrap_or_default();
                let stderr = err_thread.join().unwrap_or_default();
                panic!(
                    "watchdog: `sandkasten {}` still running after {:?}; killed it\n--- stdout ---\n{}\n--- stderr ---\n{}",
                    excerpt(&self.args.join(" "), 300),
                    self.watchdog,
                    excerpt(&String::from_utf8_lossy(&stdout), 2000),
                    excerpt(&String::from_utf8_lossy(&stderr), 2000)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let elapsed = start.elapsed();
        // Pipes stay open while any process holding them (possibly an escaped sandbox process) lives: do not wait forever.
        let stdout = join_with_deadline(out_thread, Duration::from_secs(10), "stdout");
        let stderr = join_with_deadline(err_thread, Duration::from_secs(10), "stderr");
        if let Some(t) = stdin_thread {
            let _ = t.join();
        }
        use std::os::unix::process::ExitStatusExt;
        let code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
        Output { code, stdout, stderr, elapsed, pid }
    }

    /// Runs with `--json` inserted after `run` and parses the single JSON object on stdout.
    pub fn json(mut self) -> RunResult {
        let position = self.args.iter().position(|a| a == "run").map(|p| p + 1).unwrap_or(0);
        self.args.insert(position, "--json".to_owned());
        let output = self.output();
        RunResult::parse(output)
    }
}

fn join_with_deadline(handle: std::thread::JoinHandle<Vec<u8>>, limit: Duration, what: &str) -> Vec<u8> {
    let start = Instant::now();
    while !handle.is_finished() {
        if start.elapsed() > limit {
            panic!(
                "the CLI exited but its {what} pipe is still open {limit:?} later: some process (an escaped sandbox \
                 process?) still holds it"
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    handle.join().unwrap_or_default()
}

/// `sandkasten run <args...>`.
pub fn run<I, S>(args: I) -> Cli
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut all = vec!["run".to_owned()];
    all.extend(args.into_iter().map(Into::into));
    Cli::new(all)
}

/// `sandkasten run --lang <lang> --code <code> <extra...>`.
pub fn run_code(lang: &str, code: &str, extra: &[&str]) -> Cli {
    let mut args: Vec<String> = vec!["--lang".into(), lang.into(), "--code".into(), code.into()];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    run(args)
}

/// Builds the template spec `toml` (no network: `run` steps and files only) into a new template cache, which the
/// returned directory holds (under /var/tmp: sandboxes assemble their root under /tmp).
pub fn build_template(toml: &str) -> tempfile::TempDir {
    let cache = tempfile::Builder::new().prefix("sk-test-templates-").tempdir_in("/var/tmp").expect("cache dir");
    let spec_dir = tempfile::tempdir().expect("spec dir");
    let spec = spec_dir.path().join("template.toml");
    std::fs::write(&spec, toml).expect("write spec");
    let cache_arg = cache.path().display().to_string();
    let built = Cli::new(["template", "--cache", &cache_arg, "build", &spec.display().to_string()])
        .watchdog(std::time::Duration::from_secs(120))
        .output();
    assert_eq!(built.code, 0, "{}", built.describe());
    cache
}

/// The parsed `--json` result of one run, with the raw CLI output kept for messages.
#[derive(Debug)]
pub struct RunResult {
    /// The JSON object.
    pub json: Value,
    /// The CLI invocation's raw output.
    pub output: Output,
}

impl RunResult {
    /// Parses the CLI's stdout as exactly one JSON object; panics with the raw output otherwise.
    pub fn parse(output: Output) -> Self {
        let text = output.stdout_text();
        let json: Value = match serde_json::from_str(text.trim()) {
            Ok(v) => v,
            Err(e) => panic!("--json output is not one JSON object ({e})\n{}", output.describe()),
        };
        assert!(json.is_object(), "--json output is not an object\n{}", output.describe());
        RunResult { json, output }
    }

    /// The sandbox id (panics if absent or empty).
    pub fn id(&self) -> String {
        let id = self.json["sandbox_id"].as_str().unwrap_or_default().to_owned();
        assert!(!id.is_empty(), "no sandbox_id in result\n{}", self.describe());
        id
    }

    /// `exit_code`, if a number.
    pub fn exit_code(&self) -> Option<i64> {
        self.json["exit_code"].as_i64()
    }

    /// `signal`, if a number.
    pub fn signal(&self) -> Option<i64> {
        self.json["signal"].as_i64()
    }

    /// The program's stdout text.
    pub fn stdout(&self) -> String {
        self.text("stdout")
    }

    /// The program's stderr text.
    pub fn stderr(&self) -> String {
        self.text("stderr")
    }

    /// A stream as text, as a client reads it: the text field, or for binary output (`<stream>_base64` set, the
    /// text empty) its bytes decoded lossily.
    fn text(&self, stream: &str) -> String {
        match self.json.get(format!("{stream}_base64")).and_then(Value::as_str) {
            Some(b64) => String::from_utf8_lossy(&base64_decode(b64)).into_owned(),
            None => self.json[stream].as_str().unwrap_or_default().to_owned(),
        }
    }

    /// Exact stdout bytes: `stdout_base64` decoded when present, else the text's bytes.
    pub fn stdout_bytes(&self) -> Vec<u8> {
        match self.json.get("stdout_base64").and_then(Value::as_str) {
            Some(b64) => base64_decode(b64),
            None => self.stdout().into_bytes(),
        }
    }

    /// `limit` as a string (`None` when null).
    pub fn limit(&self) -> Option<String> {
        self.json["limit"].as_str().map(str::to_owned)
    }

    /// `error.code` as a string (`None` when error is null).
    pub fn error_code(&self) -> Option<String> {
        self.json["error"]["code"].as_str().map(str::to_owned)
    }

    /// A boolean field (false when missing).
    pub fn flag(&self, key: &str) -> bool {
        self.json[key].as_bool().unwrap_or(false)
    }

    /// The CLI's own exit code.
    pub fn cli_code(&self) -> i32 {
        self.output.code
    }

    /// The JSON (program output cut short) and the CLI's stderr, for assertion messages.
    pub fn describe(&self) -> String {
        let mut shown = self.json.clone();
        for key in ["stdout", "stderr", "stdout_base64", "stderr_base64"] {
            if let Some(s) = shown.get(key).and_then(Value::as_str) {
                let cut = excerpt(s, 2000);
                shown[key] = Value::String(cut);
            }
        }
        format!(
            "cli exit {} after {:?}\n--- result ---\n{}\n--- cli stderr ---\n{}",
            self.output.code,
            self.output.elapsed,
            serde_json::to_string_pretty(&shown).unwrap_or_default(),
            excerpt(&self.output.stderr_text(), 2000)
        )
    }

    /// Asserts the program ran and exited normally with `code`.
    pub fn assert_exit(&self, code: i64) {
        assert_eq!(self.exit_code(), Some(code), "unexpected exit\n{}", self.describe());
    }
}

/// Standard base64 (with or without padding) to bytes; panics on invalid input.
pub fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let mut acc: u32 = 0;
    let mut bits = 0;
    for c in text.bytes().filter(|c| !c.is_ascii_whitespace() && *c != b'=') {
        let value = ALPHABET.iter().position(|a| *a == c).unwrap_or_else(|| panic!("invalid base64 {text:?}")) as u32;
        acc = (acc << 6) | value;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------------------------------
// Host-side leak checks
// ---------------------------------------------------------------------------------------------------------------------

/// Every host path that would hold a cgroup of sandbox `id` (v1 controllers and v2).
pub fn cgroup_paths(id: &str) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> =
        V1_CONTROLLERS.iter().map(|c| PathBuf::from(format!("/sys/fs/cgroup/{c}/sandkasten/{id}"))).collect();
    paths.push(PathBuf::from(format!("/sys/fs/cgroup/sandkasten/{id}")));
    paths.push(PathBuf::from(format!("/sys/fs/cgroup/unified/sandkasten/{id}")));
    paths
}

/// The record file of sandbox `id`.
pub fn record_path(id: &str) -> PathBuf {
    Path::new(RECORD_DIR).join(format!("{id}.json"))
}

/// Host pids whose `/proc/<pid>/cgroup` mentions `needle`, with their cgroup lines.
pub fn processes_in_cgroup_matching(needle: &str) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for pid in host_pids() {
        if let Ok(text) = fs::read_to_string(format!("/proc/{pid}/cgroup"))
            && text.contains(needle)
        {
            found.push((pid, text));
        }
    }
    found
}

/// All numeric entries of the host's /proc, without the test process itself.
pub fn host_pids() -> Vec<u32> {
    let me = std::process::id();
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()).filter(|pid| *pid != me).collect()
}

/// Host pids whose command line contains `marker`.
pub fn host_pids_with(marker: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(marker))
        })
        .collect()
}

/// A host process's argv joined with spaces (empty for kernel threads and vanished processes).
pub fn cmdline(pid: u32) -> String {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " ").trim().to_owned())
        .unwrap_or_default()
}

/// What is left of sandbox `id` on the host: an empty list means nothing.
pub fn leftovers(id: &str) -> Vec<String> {
    let mut left = Vec::new();
    let record = record_path(id);
    if record.exists() {
        left.push(format!("record file {} still exists", record.display()));
    }
    for path in cgroup_paths(id) {
        if path.exists() {
            left.push(format!("cgroup {} still exists", path.display()));
        }
    }
    for (pid, cgroup) in processes_in_cgroup_matching(id) {
        left.push(format!("process {pid} ({}) still in the sandbox's cgroup: {}", cmdline(pid), cgroup.trim()));
    }
    left
}

/// Asserts sandbox `id` left nothing behind: no record, no cgroup in any controller, no process in its cgroup.
///
/// The CLI returns only after teardown, so this allows just a short grace for the kernel to finish reaping.
pub fn assert_no_leaks(id: &str) {
    assert!(!id.is_empty(), "assert_no_leaks needs a sandbox id");
    let deadline = Instant::now() + Duration::from_millis(1500);
    loop {
        let left = leftovers(id);
        if left.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            panic!("sandbox {id} leaked after the CLI returned:\n  {}", left.join("\n  "));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Host pids whose argv contains `token`.
pub fn token_processes(token: &str) -> Vec<(u32, String)> {
    host_pids()
        .into_iter()
        .filter_map(|pid| {
            let line = cmdline(pid);
            line.contains(token).then_some((pid, line))
        })
        .collect()
}

/// Asserts no host process carries `token` in its argv (allowing a short grace for reaping).
pub fn assert_no_token_processes(token: &str) {
    let deadline = Instant::now() + Duration::from_millis(1500);
    loop {
        let found = token_processes(token);
        if found.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            let listing: Vec<String> =
                found.iter().map(|(pid, line)| format!("pid {pid} uid {:?}: {line}", process_uid(*pid))).collect();
            // Do not leave them running after the test.
            for (pid, _) in &found {
                // SAFETY: kill has no memory-safety preconditions; the pid was just seen carrying our token.
                unsafe { libc::kill(*pid as libc::pid_t, libc::SIGKILL) };
            }
            panic!("processes carrying token {token} outlived their sandbox:\n  {}", listing.join("\n  "));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The real uid of a host process.
pub fn process_uid(pid: u32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Names in a directory (empty when it does not exist).
pub fn dir_names(dir: &str) -> BTreeSet<String> {
    fs::read_dir(dir)
        .map(|entries| entries.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned())).collect())
        .unwrap_or_default()
}

/// Directory names (not control files) in a directory.
fn subdir_names(dir: &str) -> BTreeSet<String> {
    fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| {
                    let e = e.ok()?;
                    e.file_type().ok()?.is_dir().then(|| e.file_name().to_string_lossy().into_owned())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The ids of every sandbox with host state (a record or a cgroup in any controller), for before/after comparisons.
pub fn global_state() -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for c in V1_CONTROLLERS {
        ids.extend(subdir_names(&format!("/sys/fs/cgroup/{c}/sandkasten")));
    }
    ids.extend(subdir_names("/sys/fs/cgroup/sandkasten"));
    ids.extend(subdir_names("/sys/fs/cgroup/unified/sandkasten"));
    ids.extend(dir_names(RECORD_DIR).into_iter().filter_map(|n| n.strip_suffix(".json").map(str::to_owned)));
    ids
}

/// The owner pid named by sandbox `id`'s record, if the record exists and says.
pub fn record_owner(id: &str) -> Option<u64> {
    let text = fs::read_to_string(record_path(id)).ok()?;
    serde_json::from_str::<Value>(&text).ok()?["owner_pid"].as_u64()
}

/// Of the sandbox ids in `after` but not in `before`, those that belong to the CLI process `cli_pid` or to nobody:
/// ids whose record names another owner are other tests' sandboxes running at the same time.
pub fn created_by(cli_pid: u32, before: &BTreeSet<String>, after: &BTreeSet<String>) -> Vec<String> {
    let mut mine = Vec::new();
    for id in after.difference(before) {
        match record_owner(id) {
            Some(owner) if owner == u64::from(cli_pid) => mine.push(format!("{id} (record owned by the CLI)")),
            Some(_) => {}
            None => {
                // A cgroup without a record is either being torn down by its owner right now or an orphan.
                std::thread::sleep(Duration::from_millis(1500));
                if !leftovers(id).is_empty() && record_owner(id).is_none() {
                    mine.push(format!("{id} (orphan: {:?})", leftovers(id)));
                }
            }
        }
    }
    mine
}

// ---------------------------------------------------------------------------------------------------------------------
// Canaries
// ---------------------------------------------------------------------------------------------------------------------

/// A secret file on the host, removed when dropped.
pub struct Canary {
    /// Where it lives on the host.
    pub path: PathBuf,
    /// The secret it contains.
    pub secret: String,
}

impl Canary {
    /// Writes a fresh secret to `path` and checks (positive control) that the host can read it back.
    pub fn create(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        let secret = unique_token("SECRET");
        fs::write(&path, &secret).unwrap_or_else(|e| panic!("write canary {}: {e}", path.display()));
        let back = fs::read_to_string(&path).expect("read canary back");
        assert_eq!(back, secret, "positive control: the host reads its own canary");
        Canary { path, secret }
    }
}

impl Drop for Canary {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// A host file with `contents` in a fresh temp dir (for --file / --upload).
pub fn host_file(name: &str, contents: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(name);
    fs::write(&path, contents).expect("write host file");
    (dir, path)
}

/// A host process that must survive the test's sandbox; killed and reaped on drop.
pub struct HostVictim {
    /// The child process.
    pub child: std::process::Child,
}

impl HostVictim {
    /// Starts `sleep 300` on the host.
    pub fn sleep() -> Self {
        let child = Command::new("/bin/sleep").arg("300").spawn().expect("spawn host sleep");
        HostVictim { child }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// True while it has not exited.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for HostVictim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Free bytes of the filesystem holding `path`.
pub fn free_bytes(path: &str) -> u64 {
    let c_path = std::ffi::CString::new(path).expect("path");
    // SAFETY: statvfs is plain data; zeroed is a valid initial value.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c_path is NUL-terminated and stat is a valid out-pointer.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) };
    assert_eq!(rc, 0, "statvfs {path}");
    stat.f_bavail as u64 * stat.f_frsize as u64
}

/// Python source that calls raw syscalls and prints one `name rc=<rc> errno=<NAME>` line per call.
///
/// `calls` are `(name, python expression for the argument tuple)`; arguments may use the helpers `cstr(b"...")`
/// (a char* as int) and `buf(n)` (a zeroed n-byte buffer's address).
pub fn python_syscalls(calls: &[(&str, i64, &str)]) -> String {
    let mut code = String::from(
        "import ctypes, errno, os\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         libc.syscall.restype = ctypes.c_long\n\
         keep = []\n\
         def cstr(b):\n    s = ctypes.create_string_buffer(b); keep.append(s); return ctypes.addressof(s)\n\
         def buf(n):\n    s = ctypes.create_string_buffer(n); keep.append(s); return ctypes.addressof(s)\n\
         def call(name, nr, *args):\n    ctypes.set_errno(0)\n    rc = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])\n    e = ctypes.get_errno()\n    print(f'{name} rc={rc} errno={errno.errorcode.get(e, e) if rc == -1 else \"-\"}', flush=True)\n",
    );
    for (name, nr, args) in calls {
        code.push_str(&format!("call({name:?}, {nr}, *({args}))\n"));
    }
    code
}

/// Parses `python_syscalls` output into `name -> (rc, errno)`.
pub fn parse_syscall_lines(stdout: &str) -> std::collections::BTreeMap<String, (i64, String)> {
    let mut map = std::collections::BTreeMap::new();
    for line in stdout.lines() {
        let mut parts = line.split_whitespace();
        let (Some(name), Some(rc), Some(errno)) = (parts.next(), parts.next(), parts.next()) else { continue };
        let rc = rc.trim_start_matches("rc=").parse().unwrap_or(i64::MIN);
        map.insert(name.to_owned(), (rc, errno.trim_start_matches("errno=").to_owned()));
    }
    map
}

/// Accepts for `window` on a non-blocking listener; returns how many connections arrived.
pub fn accepted_within(listener: &std::net::TcpListener, window: Duration) -> usize {
    let start = Instant::now();
    let mut count = 0;
    while start.elapsed() < window {
        match listener.accept() {
            Ok(_) => count += 1,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("accept: {e}"),
        }
    }
    count
}

// ---------------------------------------------------------------------------------------------------------------------
// The gVisor tier
// ---------------------------------------------------------------------------------------------------------------------

/// The runsc binary the gvisor tier drives (Debian's package installs it here).
pub const RUNSC: &str = "/usr/bin/runsc";
/// Where the gvisor tier writes one OCI bundle per sandbox.
pub const GVISOR_BUNDLES: &str = "/run/sandkasten/gvisor";
/// runsc's `--root`: its state, lock and control socket per sandbox.
pub const RUNSC_ROOT: &str = "/run/sandkasten/runsc";
/// Where paused gVisor sandboxes keep their checkpoint images (one directory per sandbox).
pub const GVISOR_CHECKPOINTS: &str = "/run/sandkasten/checkpoints";

/// Why the gvisor tier cannot run here (`None`: root and runsc are present).
pub fn gvisor_unavailable() -> Option<String> {
    if !is_root() {
        return Some("needs root (the gvisor tier creates cgroups and runs runsc)".to_owned());
    }
    if !Path::new(RUNSC).is_file() {
        return Some(format!("needs {RUNSC} (the gvisor tier; scripts/setup.sh installs it)"));
    }
    None
}

/// Returns from the test (skipping it, with the reason on stderr) when root or runsc is missing.
#[allow(unused_macros)] // only the gVisor suites use it
macro_rules! require_runsc {
    () => {
        require_root!();
        if let Some(reason) = crate::common::gvisor_unavailable() {
            eprintln!("skipped: {reason}");
            return;
        }
    };
}

/// `sandkasten run --isolation gvisor <args...>`.
pub fn gvisor_run<I, S>(args: I) -> Cli
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut all: Vec<String> = vec!["--isolation".into(), "gvisor".into()];
    all.extend(args.into_iter().map(Into::into));
    run(all)
}

/// `sandkasten run --isolation gvisor --lang <lang> --code <code> <extra...>`.
pub fn gvisor_code(lang: &str, code: &str, extra: &[&str]) -> Cli {
    let mut args: Vec<String> = vec!["--lang".into(), lang.into(), "--code".into(), code.into()];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    gvisor_run(args)
}

/// Host processes of runsc itself (`runsc`, `runsc-sandbox` = the Sentry, `runsc-gofer`) whose argv names `needle`.
pub fn runsc_processes(needle: &str) -> Vec<(u32, String)> {
    host_pids()
        .into_iter()
        .filter_map(|pid| {
            let line = cmdline(pid);
            let runsc = line
                .split_whitespace()
                .next()
                .is_some_and(|argv0| argv0.rsplit('/').next().unwrap_or(argv0).starts_with("runsc"));
            (runsc && line.contains(needle)).then_some((pid, line))
        })
        .collect()
}

/// What is left of gVisor sandbox `id` on the host: everything `leftovers` looks for, plus its bundle, runsc's state
/// entries, any host process whose argv names it (runsc, its Sentry, its gofer) and any host mount naming it.
pub fn gvisor_leftovers(id: &str) -> Vec<String> {
    let mut left = leftovers(id);
    let bundle = Path::new(GVISOR_BUNDLES).join(id);
    if bundle.exists() {
        left.push(format!("bundle {} still exists", bundle.display()));
    }
    let image = Path::new(GVISOR_CHECKPOINTS).join(id);
    if image.exists() {
        left.push(format!("checkpoint image {} still exists", image.display()));
    }
    for name in dir_names(RUNSC_ROOT) {
        if name.contains(id) {
            left.push(format!("runsc state entry {RUNSC_ROOT}/{name} still exists"));
        }
    }
    for pid in host_pids() {
        let line = cmdline(pid);
        if line.contains(id) {
            left.push(format!("process {pid} still names the sandbox: {}", excerpt(&line, 200)));
        }
    }
    if let Ok(mounts) = fs::read_to_string("/proc/self/mountinfo") {
        for line in mounts.lines().filter(|l| l.contains(id)) {
            left.push(format!("host mount still names the sandbox: {line}"));
        }
    }
    left
}

/// Asserts gVisor sandbox `id` left nothing on the host (see `gvisor_leftovers`), allowing a short grace for reaping.
pub fn assert_no_gvisor_leaks(id: &str) {
    assert!(!id.is_empty(), "assert_no_gvisor_leaks needs a sandbox id");
    let deadline = Instant::now() + Duration::from_millis(2000);
    loop {
        let left = gvisor_leftovers(id);
        if left.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            panic!("gVisor sandbox {id} leaked after the CLI returned:\n  {}", left.join("\n  "));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The id of the running gVisor sandbox whose bundle holds a file (its code, under `rootfs/sandbox`) containing
/// `marker`, polled for up to `limit`.
pub fn gvisor_sandbox_with_code(marker: &str, limit: Duration) -> Option<String> {
    let start = Instant::now();
    while start.elapsed() < limit {
        for id in dir_names(GVISOR_BUNDLES) {
            let code_dir = Path::new(GVISOR_BUNDLES).join(&id).join("rootfs/sandbox");
            let Ok(entries) = fs::read_dir(&code_dir) else { continue };
            let found = entries
                .flatten()
                .any(|e| fs::read(e.path()).is_ok_and(|b| String::from_utf8_lossy(&b).contains(marker)));
            if found {
                return Some(id);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// runsc's host processes of sandbox `id` (`runsc_processes`) once its Sentry (`runsc-sandbox`) and gofer are among
/// them, polled for up to `limit`; what was last seen otherwise.
pub fn wait_for_runsc_processes(id: &str, limit: Duration) -> Vec<(u32, String)> {
    let start = Instant::now();
    loop {
        let found = runsc_processes(id);
        let has = |name: &str| {
            found.iter().any(|(_, line)| line.split_whitespace().next().is_some_and(|argv0| argv0.ends_with(name)))
        };
        if (has("runsc-sandbox") && has("runsc-gofer")) || start.elapsed() > limit {
            return found;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------------------------------------------------
// Per-tier suites
// ---------------------------------------------------------------------------------------------------------------------

pub use sandkasten_types::Tier;

/// Runs each listed test function (`fn name(tier: Tier)`, defined beside the invocation, without `#[test]`) once per
/// isolation tier, as the tests `process::name`, `gvisor::name` and `microvm::name`. The process variant skips
/// (saying why) without root, the gvisor variant without root or runsc (`require_runsc!`), the microvm variant
/// without root, QEMU or the boot files (`require_microvm!`). Use it once per file: it defines the modules
/// `process`, `gvisor` and `microvm`, each with a `TIER` constant. A listed function that does not exist fails to compile; one
/// that is written but not listed is dead code, which clippy refuses.
///
/// One `@tier` line per tier: `tier_coverage.rs` fails while these differ from `Tier::AVAILABLE`, and counts every
/// `#[test]` in a behaviour suite as a single-tier test that needs a reason in its allowlist.
#[allow(unused_macros)] // files without per-tier tests include this module too
macro_rules! per_tier {
    (@tier $module:ident, $variant:ident, $guard:ident, $($name:ident),*) => {
        mod $module {
            /// The tier every test in this module runs on.
            pub(crate) const TIER: $crate::common::Tier = $crate::common::Tier::$variant;
            $(
                #[test]
                fn $name() {
                    $guard!();
                    super::$name(TIER);
                }
            )*
        }
    };
    ($($name:ident),* $(,)?) => {
        per_tier!(@tier process, Process, require_root, $($name),*);
        per_tier!(@tier gvisor, Gvisor, require_runsc, $($name),*);
        per_tier!(@tier microvm, Microvm, require_microvm, $($name),*);
    };
}

/// `sandkasten run --isolation <tier> <args...>`.
pub fn run_on<I, S>(tier: Tier, args: I) -> Cli
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut all: Vec<String> = vec!["--isolation".into(), tier.name().into()];
    all.extend(args.into_iter().map(Into::into));
    match tier {
        Tier::Microvm => run(all).watchdog(microvm::VM_WATCHDOG),
        _ => run(all),
    }
}

/// `sandkasten run --isolation <tier> --lang <lang> --code <code> <extra...>`.
pub fn code_on(tier: Tier, lang: &str, code: &str, extra: &[&str]) -> Cli {
    let mut args: Vec<String> = vec!["--lang".into(), lang.into(), "--code".into(), code.into()];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    run_on(tier, args)
}

/// A small memory limit of `bytes` as `tier` takes it: a microVM needs `MICROVM_MIN_MEMORY_BYTES` for its guest
/// kernel, so a test that wants a small limit (a memory bomb that should fire soon) gets that there.
pub fn small_memory(tier: Tier, bytes: u64) -> u64 {
    match tier {
        Tier::Microvm => bytes.max(microvm::MICROVM_MIN_MEMORY_BYTES),
        _ => bytes,
    }
}

/// What is left of sandbox `id` of `tier` on the host (`leftovers`, plus `gvisor_leftovers` for gVisor).
pub fn leftovers_on(tier: Tier, id: &str) -> Vec<String> {
    match tier {
        Tier::Gvisor => gvisor_leftovers(id),
        Tier::Microvm => microvm::microvm_leftovers(id),
        _ => leftovers(id),
    }
}

/// Asserts sandbox `id` of `tier` left nothing on the host: `assert_no_leaks`, for gVisor `assert_no_gvisor_leaks`
/// (its bundle, runsc state, runsc/Sentry/gofer processes and mounts as well).
pub fn assert_gone(tier: Tier, id: &str) {
    match tier {
        Tier::Gvisor => assert_no_gvisor_leaks(id),
        Tier::Microvm => microvm::assert_no_microvm_leaks(id),
        _ => assert_no_leaks(id),
    }
}
