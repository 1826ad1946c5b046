//! Parsing of `/proc/self/mountinfo` down to the cgroup (v1) and cgroup2 mounts.

use std::path::PathBuf;

/// One cgroup or cgroup2 mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CgroupMount {
    /// Where it is mounted (escapes such as `\040` decoded).
    pub(crate) mount_point: PathBuf,
    /// True for `cgroup2`, false for a v1 `cgroup` mount.
    pub(crate) unified: bool,
    /// v1 only: the controllers bound to this mount (`cpu`, `cpuacct`, ...); named hierarchies excluded.
    pub(crate) controllers: Vec<String>,
}

/// Super options of a v1 cgroup mount that are not controller names.
const NON_CONTROLLER_OPTIONS: [&str; 7] =
    ["rw", "ro", "noprefix", "xattr", "clone_children", "cpuset_v2_mode", "favordynmods"];

/// The cgroup mounts of a mountinfo text, in file order; lines that do not parse are skipped.
pub(crate) fn parse(text: &str) -> Vec<CgroupMount> {
    text.lines().filter_map(parse_line).collect()
}

/// Parses one line: `id parent maj:min root mount_point options [optional...] - fstype source super_options`.
fn parse_line(line: &str) -> Option<CgroupMount> {
    let fields: Vec<&str> = line.split(' ').collect();
    let mount_point = *fields.get(4)?;
    let separator = fields.iter().skip(6).position(|f| *f == "-")? + 6;
    let fstype = *fields.get(separator + 1)?;
    let super_options = fields.get(separator + 3).copied().unwrap_or("");
    let unified = match fstype {
        "cgroup2" => true,
        "cgroup" => false,
        _ => return None,
    };
    let controllers = if unified {
        Vec::new()
    } else {
        super_options
            .split(',')
            .filter(|opt| !opt.is_empty() && !opt.contains('=') && !NON_CONTROLLER_OPTIONS.contains(opt))
            .map(str::to_owned)
            .collect()
    };
    if !unified && controllers.is_empty() {
        return None;
    }
    Some(CgroupMount { mount_point: PathBuf::from(unescape(mount_point)), unified, controllers })
}

/// Decodes the octal escapes (`\040` space, `\011` tab, `\012` newline, `\134` backslash) of a mountinfo field.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(digits)) => {
                let value = digits.iter().fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                out.push(u8::try_from(value).unwrap_or(b'?'));
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 28 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 23 0:28 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
32 31 0:29 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
33 31 0:30 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
34 31 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:12 - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,memory
36 31 0:33 /docker/abc /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
37 31 0:34 / /mnt/my\\040cgroups rw,relatime - cgroup cgroup rw,freezer
garbage line
";

    #[test]
    fn sample_with_co_mounted_cpu_cpuacct_and_cgroup2() {
        let mounts = parse(SAMPLE);
        let summary: Vec<(String, bool, Vec<String>)> =
            mounts.iter().map(|m| (m.mount_point.display().to_string(), m.unified, m.controllers.clone())).collect();
        let owned = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            summary,
            vec![
                ("/sys/fs/cgroup/unified".to_owned(), true, vec![]),
                ("/sys/fs/cgroup/cpu,cpuacct".to_owned(), false, owned(&["cpu", "cpuacct"])),
                ("/sys/fs/cgroup/memory".to_owned(), false, owned(&["memory"])),
                ("/sys/fs/cgroup/pids".to_owned(), false, owned(&["pids"])),
                ("/mnt/my cgroups".to_owned(), false, owned(&["freezer"])),
            ]
        );
    }

    #[test]
    fn pure_v2_host() {
        let text = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
        let mounts = parse(text);
        assert_eq!(mounts.len(), 1);
        assert!(mounts[0].unified);
        assert_eq!(mounts[0].mount_point, PathBuf::from("/sys/fs/cgroup"));
    }

    #[test]
    fn octal_escapes_are_decoded() {
        assert_eq!(unescape(r"a\040b\134c\011d"), "a b\\c\td");
        assert_eq!(unescape(r"trailing\04"), r"trailing\04");
    }
}
