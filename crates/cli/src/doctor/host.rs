//! Reading host facts: fields of `/proc/self/status`, the `/proc/filesystems` list, programs on `PATH`, and error
//! chains flattened to one line. Everything here except the readers is pure and unit-tested.

use std::collections::BTreeSet;
use std::error::Error;
use std::path::{Path, PathBuf};

/// The calling process's status file.
pub const PROC_SELF_STATUS: &str = "/proc/self/status";

/// Directories searched after `PATH` (root's usual sbin dirs, in case `PATH` is minimal).
const EXTRA_DIRS: [&str; 4] = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin"];

/// The value of `key` in a `/proc/<pid>/status` text (`Seccomp:\t2` → `"2"`), trimmed; `None` if absent.
pub fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        (name == key).then(|| value.trim())
    })
}

/// The effective uid from a status text (`Uid:` is real, effective, saved, filesystem).
pub fn effective_uid(status: &str) -> Option<u32> {
    status_field(status, "Uid")?.split_whitespace().nth(1)?.parse().ok()
}

/// Whether capability number `cap` is in the effective set (`CapEff:` is a hex mask).
pub fn has_effective_capability(status: &str, cap: u32) -> Option<bool> {
    let mask = u64::from_str_radix(status_field(status, "CapEff")?, 16).ok()?;
    Some(cap < 64 && mask & (1u64 << cap) != 0)
}

/// Filesystem type names from a `/proc/filesystems` text (`nodev\ttmpfs` and `\text4` lines).
pub fn parse_filesystems(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|line| line.split_whitespace().last())
        .filter(|name| *name != "nodev")
        .map(str::to_owned)
        .collect()
}

/// The first executable file named `program` in `PATH`, then in the usual bin/sbin directories.
pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(EXTRA_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    path.metadata().map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
}

/// An error and its sources as one line: `outer: inner: innermost`.
pub fn error_chain(error: &dyn Error) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        line.push_str(": ");
        line.push_str(&cause.to_string());
        source = cause.source();
    }
    line
}

/// The last non-empty line of a program's stderr (where tools put the reason), at most 200 characters.
pub fn last_line(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let line = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
    line.chars().take(200).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str =
        "Name:\tcat\nUid:\t1000\t0\t0\t0\nCapEff:\t000001ffffffffff\nSeccomp:\t0\nSeccomp_filters:\t0\n";

    #[test]
    fn status_fields_are_found_by_exact_key() {
        assert_eq!(status_field(STATUS, "Seccomp"), Some("0"));
        assert_eq!(status_field(STATUS, "Seccomp_filters"), Some("0"));
        assert_eq!(status_field(STATUS, "NoSuch"), None);
    }

    #[test]
    fn effective_uid_is_the_second_uid_field() {
        assert_eq!(effective_uid(STATUS), Some(0));
        assert_eq!(effective_uid("Uid:\t1000\t1000\t1000\t1000\n"), Some(1000));
        assert_eq!(effective_uid("Name:\tx\n"), None);
    }

    #[test]
    fn effective_capabilities_are_read_from_the_hex_mask() {
        assert_eq!(has_effective_capability(STATUS, 21), Some(true));
        assert_eq!(has_effective_capability("CapEff:\t0000000000000000\n", 21), Some(false));
        assert_eq!(has_effective_capability("CapEff:\tzz\n", 21), None);
    }

    #[test]
    fn filesystems_list_keeps_names_and_drops_nodev_markers() {
        let text = "nodev\tsysfs\nnodev\ttmpfs\n\text4\nnodev\toverlay\n\n";
        let names = parse_filesystems(text);
        assert!(names.contains("tmpfs"));
        assert!(names.contains("overlay"));
        assert!(names.contains("ext4"));
        assert!(!names.contains("nodev"));
        assert_eq!(names.len(), 4);
    }

    #[test]
    fn last_line_skips_trailing_blank_lines() {
        assert_eq!(last_line(b"warning\nunshare: Operation not permitted\n\n"), "unshare: Operation not permitted");
        assert_eq!(last_line(b""), "");
    }

    #[test]
    fn error_chain_joins_sources() {
        let outer = OuterError(std::io::Error::other("inner"));
        assert_eq!(error_chain(&outer), "outer: inner");
    }

    #[derive(Debug)]
    struct OuterError(std::io::Error);
    impl std::fmt::Display for OuterError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("outer")
        }
    }
    impl Error for OuterError {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }
}
