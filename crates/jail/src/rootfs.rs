//! The plan of a sandbox's root filesystem: an ordered list of `MountStep`s computed from a `RootfsSpec` and what the
//! host has. Planning is pure (unit-tested without root); `mounts::execute` carries the steps out.

use std::path::{Path, PathBuf};

/// What the planner needs to know about a host path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostEntry {
    /// A directory.
    Dir,
    /// A regular file or a device node.
    File,
    /// A symbolic link with its target.
    Symlink(PathBuf),
}

/// Read-only view of the host filesystem, replaceable by a test double.
pub trait HostFs {
    /// What is at `path` on the host (without following a final symlink), or `None`.
    fn entry(&self, path: &Path) -> Option<HostEntry>;
}

/// The real host filesystem.
pub struct RealHostFs;

impl HostFs for RealHostFs {
    fn entry(&self, path: &Path) -> Option<HostEntry> {
        let meta = std::fs::symlink_metadata(path).ok()?;
        if meta.file_type().is_symlink() {
            std::fs::read_link(path).ok().map(HostEntry::Symlink)
        } else if meta.is_dir() {
            Some(HostEntry::Dir)
        } else {
            Some(HostEntry::File)
        }
    }
}

pub use sandkasten_types::{SandboxFile, TemplateLayers};

/// The inputs of a root filesystem plan.
#[derive(Debug, Clone)]
pub struct RootfsSpec {
    /// Where the new root is assembled in the child's private mount namespace (a tmpfs is mounted over it).
    pub new_root: PathBuf,
    /// The sandbox user's home: a size-limited tmpfs it owns (`/workspace`; `/home/user` for E2B programs).
    pub home: PathBuf,
    /// Size of the home, `/tmp` and `/dev/shm`, each, in bytes.
    pub disk_bytes: u64,
    /// The sandbox user's uid and gid inside the user namespace.
    pub sandbox_uid: u32,
    /// See `sandbox_uid`.
    pub sandbox_gid: u32,
    /// Files created in the sandbox (synthesised `/etc` files, code under `/sandbox`, uploads under `/workspace`).
    pub files: Vec<SandboxFile>,
    /// Further host directories shown read-only at the same path (a VMM's jail: the guest kernel and images).
    pub host_read_only: Vec<PathBuf>,
    /// A built template's layers, mounted at `TEMPLATE_DIR` (and a build sandbox's capture as the overlay's upper).
    pub template: TemplateLayers,
    /// Mount the agent's run directory (`AGENT_RUN_DIR`): a sandbox's agent serves `sudo` there; a VMM's jail has none.
    pub agent_run_dir: bool,
}

/// The agent's run directory inside a sandbox: an empty tmpfs, root's (mode 0755), where the agent installs the
/// sandbox's `sudo` and listens for it (`sandkasten_agent::serve::sudo`). Every tier mounts it.
pub const AGENT_RUN_DIR: &str = "/.sandkasten/run";

/// Size of the agent's run directory (the `sudo` client is about 1.1 MiB).
pub const AGENT_RUN_DIR_BYTES: u64 = 4 << 20;

/// Where a built template's layers are mounted: everything a `host`-based template adds is beneath it.
pub const TEMPLATE_DIR: &str = "/opt";

/// The overlay lower directories of a built template's `layers` (bottom first, each holding `opt/…`), as every tier
/// mounts them at `TEMPLATE_DIR`: topmost first, each layer's `opt` where it has one.
pub fn template_lowers(layers: &[PathBuf], host: &dyn HostFs) -> Vec<PathBuf> {
    let inside = TEMPLATE_DIR.trim_start_matches('/');
    layers
        .iter()
        .rev()
        .map(|layer| layer.join(inside))
        .filter(|lower| host.entry(lower) == Some(HostEntry::Dir))
        .collect()
}

/// Overlay's mount options for a read-only overlay of `lowers` (topmost first) above `bottom` (an empty directory:
/// an overlay without an upper layer needs two lowers). `userxattr`: a build's capture layers mark opaque directories
/// with `user.overlay.opaque` (it runs in a user namespace). A path that overlay options cannot name (holding `:`,
/// `,` or `\\`) is returned as the error.
pub fn read_only_overlay_options(lowers: &[PathBuf], bottom: &Path) -> Result<String, PathBuf> {
    let all: Vec<&Path> = lowers.iter().map(PathBuf::as_path).chain(std::iter::once(bottom)).collect();
    if let Some(bad) = all.iter().find(|path| path.to_string_lossy().contains([':', ',', '\\'])) {
        return Err(bad.to_path_buf());
    }
    let named: Vec<String> = all.iter().map(|path| path.to_string_lossy().into_owned()).collect();
    Ok(format!("userxattr,lowerdir={}", named.join(":")))
}

/// Kind of a bind mount's target, created before the bind (`mounts` falls back to binds of host paths).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindKind {
    /// Create an empty directory as mount point.
    Dir,
    /// Create an empty file as mount point.
    File,
}

/// One step of building the root filesystem. Paths are absolute in the child's mount namespace before pivot_root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountStep {
    /// Make every mount private (recursively), so nothing propagates back to the host.
    MakeEverythingPrivate,
    /// Mount a tmpfs at `target` (created if missing) with `options` and extra mount flags.
    Tmpfs {
        /// Mount point.
        target: PathBuf,
        /// tmpfs options, e.g. `size=1048576,mode=0755`.
        options: String,
        /// Extra MS_* flags (nosuid, nodev, noexec).
        flags: u64,
    },
    /// Create the directory `target` and mount there a read-only overlay whose only content is the host directory
    /// `source` (the empty `target` itself is the second, lower layer an overlay without an upper one needs). The
    /// files are the host's, page cache included, but their inodes belong to this sandbox's overlay: inotify on them
    /// sees this sandbox's own accesses only, where a bind shares the host's inodes and shows every open by the host
    /// and by neighbouring sandboxes. Mounts beneath `source` on the host are bound read-only on top; where overlayfs
    /// cannot be mounted (no overlay in user namespaces, before Linux 5.11) the directory is bound instead.
    OverlayReadOnly {
        /// Host directory.
        source: PathBuf,
        /// Mount point.
        target: PathBuf,
    },
    /// Copy the small host file `source` to `target` (mode 0444, root's), so the sandbox never holds the host's
    /// inode (inotify on a bound `/etc/ld.so.cache` shows every dynamically linked program the host starts). Files
    /// larger than `COPY_MAX_BYTES` and anything but a regular file are bound read-only instead.
    CopyReadOnly {
        /// Host file.
        source: PathBuf,
        /// Where the copy goes.
        target: PathBuf,
    },
    /// Create `target` and bind the host device node `source` there (read-write).
    BindDevice {
        /// Host device node.
        source: PathBuf,
        /// Mount point.
        target: PathBuf,
    },
    /// Create a directory.
    Mkdir {
        /// The directory.
        path: PathBuf,
        /// Permission bits.
        mode: u32,
    },
    /// Create a symlink at `link` pointing to `points_to`.
    Symlink {
        /// The link.
        link: PathBuf,
        /// Its target.
        points_to: PathBuf,
    },
    /// Write a file (creating parent directories owned by the same user).
    WriteFile(SandboxFile),
    /// Mount a fresh procfs for the new pid namespace.
    Proc {
        /// Mount point.
        target: PathBuf,
    },
    /// Hide a procfs file behind `/dev/null`.
    MaskFile {
        /// The file.
        target: PathBuf,
    },
    /// Hide a procfs directory behind an empty read-only tmpfs.
    MaskDir {
        /// The directory.
        target: PathBuf,
    },
    /// Bind a path onto itself read-only (skipped when it does not exist).
    MakeReadOnly {
        /// The path.
        target: PathBuf,
    },
    /// Mount a devpts instance of the sandbox's own at `target` (`newinstance`: its terminals and their numbers are
    /// the sandbox's, never the host's); `/dev/ptmx` links to its `ptmx`.
    Devpts {
        /// Mount point.
        target: PathBuf,
    },
    /// Mount an overlay of a built template's layers at `target`: `lowers` topmost first (each a layer's
    /// `TEMPLATE_DIR`), above the empty `target` itself; read-only, or — for a build sandbox — with `capture`'s
    /// `upper/opt` and `work` as upper and work directories, so what the step writes lands there. `userxattr`: the
    /// overlay is mounted in the sandbox's user namespace, where only `user.` attributes mark opaque directories.
    TemplateOverlay {
        /// Mount point.
        target: PathBuf,
        /// Host layer directories, topmost first.
        lowers: Vec<PathBuf>,
        /// A build sandbox's capture directory (holding `upper/opt` and `work`).
        capture: Option<PathBuf>,
    },
    /// Remount an existing mount read-only.
    RemountReadOnly {
        /// The mount point.
        target: PathBuf,
    },
}

/// Host directories bound read-only into every `host`-template sandbox (or recreated as symlinks when the host has
/// them as symlinks, as merged-/usr systems do).
pub const HOST_SYSTEM_PATHS: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"];

/// Host `/etc` entries a program may need and that carry no secrets: TLS roots, the dynamic linker's cache,
/// alternatives (e.g. `cc`), time zone, protocol/service names, fontconfig and matplotlib's defaults (plots), the
/// JDK's configuration (Debian's JDK links `conf/security/java.security` there; a JVM does not start without it), and
/// R's (Debian's `/usr/lib/R/etc` links `Renviron`, `ldpaths` and `Rprofile.site` there; `R` does not start without
/// them).
pub const HOST_ETC_PATHS: &[&str] = &[
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/pki",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/localtime",
    "/etc/protocols",
    "/etc/services",
    "/etc/mime.types",
    "/etc/gai.conf",
    "/etc/fonts",
    "/etc/matplotlibrc",
    "/etc/java-17-openjdk",
    "/etc/java-21-openjdk",
    "/etc/R",
];

/// Options of the sandbox's devpts: a new instance (not the host's terminals), whose `ptmx` anyone in the sandbox may
/// open, and whose terminals are their owner's only (the agent hands each to the user of its command).
pub const DEVPTS_OPTIONS: &str = "newinstance,ptmxmode=0666,mode=0620";

/// A host file larger than this is bound (sharing its inode) rather than copied into the sandbox's root tmpfs.
pub const COPY_MAX_BYTES: u64 = 1 << 20;

/// Device nodes bound from the host.
pub const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// procfs files hidden behind `/dev/null`: Docker's default masked paths, plus the kernel log, the host's kernel
/// command line and its boot id (which would tell sandboxes apart from the host's and link them to one boot).
pub const PROC_MASKED_FILES: &[&str] = &[
    "sys/kernel/random/boot_id",
    "kcore",
    "kmsg",
    "cmdline",
    "keys",
    "latency_stats",
    "timer_list",
    "timer_stats",
    "sched_debug",
    "kallsyms",
    "kpageflags",
    "kpagecount",
    "kpagecgroup",
    "sysrq-trigger",
    "config.gz",
    "slabinfo",
    "pagetypeinfo",
    "vmallocinfo",
    "buddyinfo",
    "zoneinfo",
];

/// procfs directories hidden behind an empty tmpfs.
pub const PROC_MASKED_DIRS: &[&str] = &["acpi", "asound", "scsi", "firmware", "driver"];

/// procfs paths made read-only.
pub const PROC_READ_ONLY: &[&str] = &["bus", "fs", "irq", "sys"];

/// `/dev/shm` gets at most this much (and never more than the disk limit): shared memory is for IPC, not storage.
pub const SHM_MAX_BYTES: u64 = 64 << 20;

const MS_NOSUID: u64 = 0x2;
const MS_NODEV: u64 = 0x4;
const MS_NOEXEC: u64 = 0x8;

/// Computes the ordered steps that build the sandbox root at `spec.new_root`.
pub fn plan_rootfs(spec: &RootfsSpec, host: &dyn HostFs) -> Vec<MountStep> {
    let root = &spec.new_root;
    let at = |path: &str| root.join(path.trim_start_matches('/'));
    let mut steps = vec![
        MountStep::MakeEverythingPrivate,
        MountStep::Tmpfs { target: root.clone(), options: "size=16m,mode=0755".into(), flags: MS_NOSUID | MS_NODEV },
    ];

    for path in HOST_SYSTEM_PATHS.iter().chain(HOST_ETC_PATHS) {
        match host.entry(Path::new(path)) {
            Some(HostEntry::Symlink(points_to)) => steps.push(MountStep::Symlink { link: at(path), points_to }),
            Some(HostEntry::Dir) => steps.push(MountStep::OverlayReadOnly { source: path.into(), target: at(path) }),
            Some(HostEntry::File) => steps.push(MountStep::CopyReadOnly { source: path.into(), target: at(path) }),
            None => {}
        }
    }

    for path in &spec.host_read_only {
        if host.entry(path) == Some(HostEntry::Dir) {
            steps.push(MountStep::OverlayReadOnly { source: path.clone(), target: at(&path.to_string_lossy()) });
        }
    }

    if !spec.template.is_empty() {
        steps.push(MountStep::TemplateOverlay {
            target: at(TEMPLATE_DIR),
            lowers: template_lowers(&spec.template.layers, host),
            capture: spec.template.capture.clone(),
        });
    }

    let disk = spec.disk_bytes;
    let (uid, gid) = (spec.sandbox_uid, spec.sandbox_gid);
    steps.push(MountStep::Tmpfs {
        target: at(&spec.home.to_string_lossy()),
        options: format!("size={disk},mode=0755,uid={uid},gid={gid}"),
        flags: MS_NOSUID | MS_NODEV,
    });
    steps.push(MountStep::Tmpfs {
        target: at("/tmp"),
        options: format!("size={disk},mode=1777"),
        flags: MS_NOSUID | MS_NODEV,
    });

    steps.push(MountStep::Tmpfs {
        target: at("/dev"),
        options: "size=64k,mode=0755".into(),
        flags: MS_NOSUID | MS_NOEXEC,
    });
    for device in DEVICES {
        steps.push(MountStep::BindDevice { source: Path::new("/dev").join(device), target: at("/dev").join(device) });
    }
    for (link, points_to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        steps.push(MountStep::Symlink { link: at("/dev").join(link), points_to: points_to.into() });
    }
    steps.push(MountStep::Devpts { target: at("/dev/pts") });
    steps.push(MountStep::Symlink { link: at("/dev/ptmx"), points_to: "pts/ptmx".into() });
    steps.push(MountStep::Tmpfs {
        target: at("/dev/shm"),
        options: format!("size={},mode=1777", disk.min(SHM_MAX_BYTES)),
        flags: MS_NOSUID | MS_NODEV | MS_NOEXEC,
    });
    steps.push(MountStep::RemountReadOnly { target: at("/dev") });

    steps.push(MountStep::Proc { target: at("/proc") });
    for file in PROC_MASKED_FILES {
        steps.push(MountStep::MaskFile { target: at("/proc").join(file) });
    }
    for dir in PROC_MASKED_DIRS {
        steps.push(MountStep::MaskDir { target: at("/proc").join(dir) });
    }
    for path in PROC_READ_ONLY {
        steps.push(MountStep::MakeReadOnly { target: at("/proc").join(path) });
    }

    if spec.agent_run_dir {
        steps.push(MountStep::Tmpfs {
            target: at(AGENT_RUN_DIR),
            options: format!("size={AGENT_RUN_DIR_BYTES},mode=0755"),
            flags: MS_NOSUID | MS_NODEV,
        });
    }
    steps.push(MountStep::Mkdir { path: at("/sandbox"), mode: 0o755 });
    for file in &spec.files {
        let mut placed = file.clone();
        placed.path = at(&file.path.to_string_lossy());
        steps.push(MountStep::WriteFile(placed));
    }
    steps.push(MountStep::RemountReadOnly { target: root.clone() });
    steps
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    struct FakeHost(HashMap<&'static str, HostEntry>);

    impl HostFs for FakeHost {
        fn entry(&self, path: &Path) -> Option<HostEntry> {
            self.0.get(path.to_str()?).cloned()
        }
    }

    fn merged_usr_host() -> FakeHost {
        FakeHost(HashMap::from([
            ("/usr", HostEntry::Dir),
            ("/bin", HostEntry::Symlink("usr/bin".into())),
            ("/lib", HostEntry::Symlink("usr/lib".into())),
            ("/lib64", HostEntry::Symlink("usr/lib64".into())),
            ("/etc/ssl", HostEntry::Dir),
            ("/etc/ld.so.cache", HostEntry::File),
            ("/etc/localtime", HostEntry::Symlink("/usr/share/zoneinfo/Etc/UTC".into())),
            ("/etc/shadow", HostEntry::File),
            ("/home", HostEntry::Dir),
            ("/root", HostEntry::Dir),
        ]))
    }

    fn spec() -> RootfsSpec {
        RootfsSpec {
            new_root: "/tmp".into(),
            home: "/workspace".into(),
            disk_bytes: 1 << 20,
            sandbox_uid: 1000,
            sandbox_gid: 1000,
            files: vec![SandboxFile {
                path: "/sandbox/main.py".into(),
                contents: b"print(1)".to_vec(),
                mode: 0o444,
                owned_by_sandbox_user: false,
            }],
            host_read_only: Vec::new(),
            template: TemplateLayers::default(),
            agent_run_dir: true,
        }
    }

    #[test]
    fn template_layers_are_one_overlay_at_opt_topmost_first() {
        let mut host = merged_usr_host();
        host.0.insert("/cache/layers/a/opt", HostEntry::Dir);
        host.0.insert("/cache/layers/b/opt", HostEntry::Dir);
        let template = TemplateLayers {
            layers: vec!["/cache/layers/a".into(), "/cache/layers/b".into(), "/cache/layers/empty".into()],
            capture: Some("/cache/build/x".into()),
            ..TemplateLayers::default()
        };
        let steps = plan_rootfs(&RootfsSpec { template, ..spec() }, &host);
        assert!(steps.contains(&MountStep::TemplateOverlay {
            target: "/tmp/opt".into(),
            lowers: vec!["/cache/layers/b/opt".into(), "/cache/layers/a/opt".into()],
            capture: Some("/cache/build/x".into()),
        }));
        let plain = plan_rootfs(&spec(), &host);
        assert!(!plain.iter().any(|s| matches!(s, MountStep::TemplateOverlay { .. })), "no template, no /opt");
    }

    #[test]
    fn further_host_directories_are_read_only_overlays_at_their_path() {
        let mut host = merged_usr_host();
        host.0.insert("/var/lib/sandkasten/microvm", HostEntry::Dir);
        let steps =
            plan_rootfs(&RootfsSpec { host_read_only: vec!["/var/lib/sandkasten/microvm".into()], ..spec() }, &host);
        assert!(steps.contains(&MountStep::OverlayReadOnly {
            source: "/var/lib/sandkasten/microvm".into(),
            target: "/tmp/var/lib/sandkasten/microvm".into(),
        }));
        let missing = plan_rootfs(&RootfsSpec { host_read_only: vec!["/nonexistent".into()], ..spec() }, &host);
        assert!(!format!("{missing:?}").contains("/nonexistent"));
    }

    #[test]
    fn merged_usr_links_are_recreated_not_bound() {
        let steps = plan_rootfs(&spec(), &merged_usr_host());
        assert!(steps.contains(&MountStep::Symlink { link: "/tmp/bin".into(), points_to: "usr/bin".into() }));
    }

    #[test]
    fn host_directories_are_overlays_and_host_files_copies() {
        let steps = plan_rootfs(&spec(), &merged_usr_host());
        assert!(steps.contains(&MountStep::OverlayReadOnly { source: "/usr".into(), target: "/tmp/usr".into() }));
        assert!(
            steps.contains(&MountStep::OverlayReadOnly { source: "/etc/ssl".into(), target: "/tmp/etc/ssl".into() })
        );
        assert!(steps.contains(&MountStep::CopyReadOnly {
            source: "/etc/ld.so.cache".into(),
            target: "/tmp/etc/ld.so.cache".into(),
        }));
    }

    #[test]
    fn the_agent_s_run_directory_is_a_tmpfs_mounted_before_the_root_is_sealed_and_a_vmm_jail_has_none() {
        let steps = plan_rootfs(&spec(), &merged_usr_host());
        let run_dir = |s: &MountStep| {
            matches!(s, MountStep::Tmpfs { target, options, .. }
            if target.as_path() == Path::new("/tmp/.sandkasten/run") && options.contains("mode=0755"))
        };
        let mounted = steps.iter().position(run_dir);
        let sealed = steps.iter().rposition(|s| *s == MountStep::RemountReadOnly { target: "/tmp".into() });
        assert!(matches!((mounted, sealed), (Some(mounted), Some(sealed)) if mounted < sealed), "{steps:?}");
        let vmm = plan_rootfs(&RootfsSpec { agent_run_dir: false, ..spec() }, &merged_usr_host());
        assert!(!vmm.iter().any(run_dir));
    }

    #[test]
    fn secrets_and_home_directories_are_never_planned() {
        let steps = plan_rootfs(&spec(), &merged_usr_host());
        let text = format!("{steps:?}");
        for forbidden in ["/etc/shadow", "/home", "/root", "/var/run", "\"/sys"] {
            assert!(!text.contains(forbidden), "{forbidden} must not be in the plan");
        }
    }

    #[test]
    fn the_home_is_where_the_spec_puts_it() {
        let steps = plan_rootfs(&RootfsSpec { home: "/home/user".into(), ..spec() }, &merged_usr_host());
        let homes: Vec<_> = steps
            .iter()
            .filter_map(|step| match step {
                MountStep::Tmpfs { target, options, .. } if options.contains("uid=1000") => Some(target.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(homes, vec![PathBuf::from("/tmp/home/user")]);
    }

    #[test]
    fn root_is_sealed_last_and_private_first() {
        let steps = plan_rootfs(&spec(), &merged_usr_host());
        assert_eq!(steps.first(), Some(&MountStep::MakeEverythingPrivate));
        assert_eq!(steps.last(), Some(&MountStep::RemountReadOnly { target: "/tmp".into() }));
        let proc_at = steps.iter().position(|s| matches!(s, MountStep::Proc { .. }));
        let first_mask = steps.iter().position(|s| matches!(s, MountStep::MaskFile { .. }));
        assert!(proc_at < first_mask, "masks must come after procfs is mounted");
    }

    #[test]
    fn terminals_come_from_a_devpts_of_the_sandboxs_own_never_the_hosts() {
        let steps = plan_rootfs(&spec(), &merged_usr_host());
        let devpts = steps.iter().position(|s| *s == MountStep::Devpts { target: "/tmp/dev/pts".into() });
        let ptmx = MountStep::Symlink { link: "/tmp/dev/ptmx".into(), points_to: "pts/ptmx".into() };
        let sealed = steps.iter().position(|s| *s == MountStep::RemountReadOnly { target: "/tmp/dev".into() });
        assert!(devpts.is_some() && devpts < sealed, "devpts is mounted before /dev is sealed: {steps:?}");
        assert!(steps.contains(&ptmx), "/dev/ptmx leads to the sandbox's own ptmx");
        assert!(DEVPTS_OPTIONS.split(',').any(|option| option == "newinstance"), "a new instance, not the host's");
        let binds_host_pts = steps.iter().any(|s| {
            matches!(s, MountStep::BindDevice { source, .. } | MountStep::OverlayReadOnly { source, .. }
                | MountStep::CopyReadOnly { source, .. }
                if source.starts_with("/dev/pts") || source == Path::new("/dev/ptmx"))
        });
        assert!(!binds_host_pts, "no host terminal is bound in");
    }

    #[test]
    fn writable_filesystems_are_size_limited() {
        let steps = plan_rootfs(&spec(), &merged_usr_host());
        for dir in ["/tmp/workspace", "/tmp/tmp"] {
            let found = steps.iter().any(|s| {
                matches!(s, MountStep::Tmpfs { target, options, .. }
                    if target == Path::new(dir) && options.contains("size=1048576"))
            });
            assert!(found, "{dir} must be a tmpfs of the disk size");
        }
    }

    #[test]
    fn files_are_placed_under_the_new_root() {
        let steps = plan_rootfs(&spec(), &merged_usr_host());
        assert!(
            steps.iter().any(|s| matches!(s, MountStep::WriteFile(f) if f.path == Path::new("/tmp/sandbox/main.py")))
        );
    }
}
