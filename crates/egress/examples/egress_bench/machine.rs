//! Facts about the machine and the process for the report: CPUs, kernel, load, the current revision, the
//! date, and the CPU time all of this process's threads have used (to see what a transfer costs in CPU).

use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

/// The machine description written into the JSON (taken before the run; the load average again after).
pub fn describe() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
        s.lines().find_map(|l| l.strip_prefix("model name").map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned()))
    });
    json!({
        "nproc": std::thread::available_parallelism().map(usize::from).unwrap_or(1),
        "cpu": cpu,
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").ok().map(|s| s.trim().to_owned()),
        "date": utc_now(),
        "sandkasten": revision(),
        "cpu_busy_before_percent": cpu_busy_percent(Duration::from_secs(1)),
    })
}

/// The 1-, 5- and 15-minute load averages.
pub fn loadavg() -> Vec<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).filter_map(|v| v.parse().ok()).collect())
        .unwrap_or_default()
}

/// CPU time used so far by every thread of this process, nanoseconds (sum of `/proc/self/task/*/schedstat`).
pub fn process_cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0 };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()))
        .sum()
}

/// How busy all CPUs were over `window` (from `/proc/stat`), percent.
fn cpu_busy_percent(window: Duration) -> Option<f64> {
    let sample = || -> Option<(u64, u64)> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let fields: Vec<u64> = stat.lines().next()?.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
        let idle = fields.get(3)? + fields.get(4).copied().unwrap_or(0);
        Some((fields.iter().sum(), idle))
    };
    let (total0, idle0) = sample()?;
    std::thread::sleep(window);
    let (total1, idle1) = sample()?;
    let total = total1.checked_sub(total0)?;
    (total > 0).then(|| 100.0 * (1.0 - (idle1.saturating_sub(idle0)) as f64 / total as f64))
}

/// `git rev-parse --short HEAD`, marked when the tree has uncommitted changes.
fn revision() -> Option<String> {
    let out = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let head = out(&["rev-parse", "--short", "HEAD"])?;
    let dirty = out(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    Some(if dirty { format!("{head} (uncommitted changes)") } else { head })
}

/// Now as `YYYY-MM-DD HH:MM UTC`.
fn utc_now() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02} UTC", rem / 3600, rem % 3600 / 60)
}
