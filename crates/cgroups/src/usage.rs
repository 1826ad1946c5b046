//! Resource usage read back from a cgroup's accounting files (what it consumed over its life, and the memory it holds
//! now); a missing file counts as 0.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::CgroupError;
use crate::fsops;

/// What a cgroup consumed, summed over its lifetime.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPU time in user mode, in nanoseconds.
    pub cpu_user_ns: u64,
    /// CPU time in kernel mode, in nanoseconds.
    pub cpu_system_ns: u64,
    /// Highest memory use seen, in bytes.
    pub memory_peak_bytes: u64,
    /// Processes the kernel OOM-killed inside the cgroup.
    pub oom_kills: u64,
    /// Forks refused because `pids.max` was reached.
    pub pids_limit_hits: u64,
}

/// v1: `cpuacct.usage_user`/`cpuacct.usage_sys` (ns), `memory.max_usage_in_bytes`,
/// the `oom_kill` line of `memory.oom_control`, the `max` line of `pids.events`.
pub(crate) fn read_v1(dirs: &BTreeMap<String, PathBuf>) -> Result<Usage, CgroupError> {
    let file = |controller: &str, name: &str| dirs.get(controller).map(|dir| dir.join(name));
    Ok(Usage {
        cpu_user_ns: single(file("cpuacct", "cpuacct.usage_user"))?,
        cpu_system_ns: single(file("cpuacct", "cpuacct.usage_sys"))?,
        memory_peak_bytes: single(file("memory", "memory.max_usage_in_bytes"))?,
        oom_kills: keyed(file("memory", "memory.oom_control"), "oom_kill")?,
        pids_limit_hits: keyed(file("pids", "pids.events"), "max")?,
    })
}

/// v2: `cpu.stat` `user_usec`/`system_usec` (×1000), `memory.peak`, `memory.events` `oom_kill`,
/// `pids.events` `max`.
pub(crate) fn read_v2(dir: &Path) -> Result<Usage, CgroupError> {
    let file = |name: &str| Some(dir.join(name));
    Ok(Usage {
        cpu_user_ns: keyed(file("cpu.stat"), "user_usec")?.saturating_mul(1000),
        cpu_system_ns: keyed(file("cpu.stat"), "system_usec")?.saturating_mul(1000),
        memory_peak_bytes: single(file("memory.peak"))?,
        oom_kills: keyed(file("memory.events"), "oom_kill")?,
        pids_limit_hits: keyed(file("pids.events"), "max")?,
    })
}

/// The memory a cgroup holds at this moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryNow {
    /// Charged memory that is not page cache (anonymous memory, kernel memory, tmpfs and shared memory), in bytes.
    pub used_bytes: u64,
    /// Page cache of files, in bytes (reclaimable; tmpfs files are not counted here but in `used_bytes`).
    pub cache_bytes: u64,
}

impl MemoryNow {
    /// `charged` bytes in all, of which `cache` are page cache (the rest counts as used).
    fn split(charged: u64, cache: u64) -> MemoryNow {
        let cache_bytes = cache.min(charged);
        MemoryNow { used_bytes: charged - cache_bytes, cache_bytes }
    }
}

/// v1: `memory.usage_in_bytes`, and of it the `total_inactive_file` + `total_active_file` lines of `memory.stat`
/// (file-backed pages; `total_cache` would count tmpfs and shared memory as cache too).
pub(crate) fn memory_now_v1(dirs: &BTreeMap<String, PathBuf>) -> Result<MemoryNow, CgroupError> {
    let stat = dirs.get("memory").map(|dir| dir.join("memory.stat"));
    let file_pages = keyed(stat.clone(), "total_inactive_file")?.saturating_add(keyed(stat, "total_active_file")?);
    let charged = single(dirs.get("memory").map(|dir| dir.join("memory.usage_in_bytes")))?;
    Ok(MemoryNow::split(charged, file_pages))
}

/// v2: `memory.current`, and of it the `file` line of `memory.stat` less its `shmem` line (tmpfs and shared memory
/// are in `file` on v2, but they are not reclaimable cache).
pub(crate) fn memory_now_v2(dir: &Path) -> Result<MemoryNow, CgroupError> {
    let stat = Some(dir.join("memory.stat"));
    let file_pages = keyed(stat.clone(), "file")?.saturating_sub(keyed(stat, "shmem")?);
    Ok(MemoryNow::split(single(Some(dir.join("memory.current")))?, file_pages))
}

/// A file holding one number; 0 when the controller or the file is missing.
fn single(path: Option<PathBuf>) -> Result<u64, CgroupError> {
    let Some(path) = path else { return Ok(0) };
    let Some(text) = fsops::read_optional(&path)? else {
        return Ok(0);
    };
    let trimmed = text.trim();
    trimmed.parse().map_err(|_| CgroupError::Parse { path, content: trimmed.to_owned() })
}

/// The value of the `key value` line of a file; 0 when the controller, the file or the line is missing.
fn keyed(path: Option<PathBuf>, key: &str) -> Result<u64, CgroupError> {
    let Some(path) = path else { return Ok(0) };
    let Some(text) = fsops::read_optional(&path)? else {
        return Ok(0);
    };
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if words.next() == Some(key) {
            let value = words.next().unwrap_or("");
            return value.parse().map_err(|_| CgroupError::Parse { path, content: line.to_owned() });
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::fs;

    use super::*;

    #[test]
    fn v1_usage_is_read_from_each_controller() {
        let tmp = tempfile::tempdir().unwrap();
        let mut dirs = BTreeMap::new();
        for controller in ["cpuacct", "memory", "pids"] {
            let dir = tmp.path().join(controller);
            fs::create_dir(&dir).unwrap();
            dirs.insert(controller.to_owned(), dir);
        }
        fs::write(tmp.path().join("cpuacct/cpuacct.usage_user"), "1500\n").unwrap();
        fs::write(tmp.path().join("cpuacct/cpuacct.usage_sys"), "700\n").unwrap();
        fs::write(tmp.path().join("memory/memory.max_usage_in_bytes"), "4096\n").unwrap();
        fs::write(tmp.path().join("memory/memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
            .unwrap();
        fs::write(tmp.path().join("pids/pids.events"), "max 3\n").unwrap();
        let usage = read_v1(&dirs).unwrap();
        assert_eq!(
            usage,
            Usage { cpu_user_ns: 1500, cpu_system_ns: 700, memory_peak_bytes: 4096, oom_kills: 2, pids_limit_hits: 3 }
        );
    }

    #[test]
    fn v2_usage_converts_microseconds() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        fs::write(dir.join("cpu.stat"), "usage_usec 30\nuser_usec 20\nsystem_usec 10\n").unwrap();
        fs::write(dir.join("memory.peak"), "8192\n").unwrap();
        fs::write(dir.join("memory.events"), "low 0\nhigh 0\nmax 5\noom 1\noom_kill 1\noom_group_kill 0\n").unwrap();
        fs::write(dir.join("pids.events"), "max 4\n").unwrap();
        let usage = read_v2(dir).unwrap();
        assert_eq!(
            usage,
            Usage {
                cpu_user_ns: 20_000,
                cpu_system_ns: 10_000,
                memory_peak_bytes: 8192,
                oom_kills: 1,
                pids_limit_hits: 4
            }
        );
    }

    #[test]
    fn memory_now_separates_file_cache_from_what_is_used() {
        let tmp = tempfile::tempdir().unwrap();
        let memory = tmp.path().join("memory");
        fs::create_dir(&memory).unwrap();
        fs::write(memory.join("memory.usage_in_bytes"), "10000\n").unwrap();
        fs::write(memory.join("memory.stat"), "cache 9000\ntotal_inactive_file 3000\ntotal_active_file 1000\n")
            .unwrap();
        let dirs = BTreeMap::from([("memory".to_owned(), memory)]);
        assert_eq!(memory_now_v1(&dirs).unwrap(), MemoryNow { used_bytes: 6000, cache_bytes: 4000 });

        let v2 = tmp.path().join("v2");
        fs::create_dir(&v2).unwrap();
        fs::write(v2.join("memory.current"), "10000\n").unwrap();
        fs::write(v2.join("memory.stat"), "anon 2000\nfile 7000\nshmem 5000\n").unwrap();
        assert_eq!(memory_now_v2(&v2).unwrap(), MemoryNow { used_bytes: 8000, cache_bytes: 2000 });
        // Cache larger than the charge (the counters are read one after the other): never more used than charged.
        fs::write(v2.join("memory.current"), "1000\n").unwrap();
        assert_eq!(memory_now_v2(&v2).unwrap(), MemoryNow { used_bytes: 0, cache_bytes: 1000 });
    }

    #[test]
    fn missing_files_and_controllers_count_as_zero() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(read_v2(tmp.path()).unwrap(), Usage::default());
        assert_eq!(read_v1(&BTreeMap::new()).unwrap(), Usage::default());
    }

    #[test]
    fn garbage_is_a_parse_error_naming_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("memory.peak"), "lots\n").unwrap();
        match read_v2(tmp.path()) {
            Err(CgroupError::Parse { path, content }) => {
                assert_eq!(path, tmp.path().join("memory.peak"));
                assert_eq!(content, "lots");
            }
            other => panic!("expected parse error, got {other:?}"),
        }
    }
}
