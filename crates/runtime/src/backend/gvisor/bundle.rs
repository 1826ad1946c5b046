//! The OCI bundle of one gVisor sandbox: a small read-only root directory (the `/bin`-style links of the host, the
//! synthesised `/etc` files, the code, and the files that single-file binds mount over) and a `config.json` written
//! with `oci-spec` that binds the host's `/usr` read-only, mounts the size-limited home, `/tmp` and `/dev/shm`, and
//! starts the agent binary as the container's init. Directories that are only mount points are not created: the
//! Sentry makes a missing mount point of its own filesystems (`/proc`, `/dev`, `/tmp`, the home, the door) a synthetic
//! directory, and runsc's gofer creates those of directory binds (`/usr`, the bound `/etc` directories) itself. Every
//! directory left in the bundle costs its teardown an `rmdir` (3–5 ms each on an ext4 state directory).

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    Capability, LinuxBuilder, LinuxCapabilitiesBuilder, LinuxNamespaceBuilder, LinuxNamespaceType, Mount, MountBuilder,
    ProcessBuilder, RootBuilder, Spec, SpecBuilder, UserBuilder,
};
use sandkasten_jail::rootfs::{
    AGENT_RUN_DIR, AGENT_RUN_DIR_BYTES, DEVICES, HOST_ETC_PATHS, HOST_SYSTEM_PATHS, HostEntry, HostFs, SHM_MAX_BYTES,
    SandboxFile, TEMPLATE_DIR,
};

use crate::error::RuntimeError;

/// Where the agent binary is bound inside the sandbox.
pub(crate) const AGENT_PATH: &str = "/.sandkasten/agent";
/// The directory inside the sandbox that holds the egress door's socket (bound from the bundle's `door/`).
pub(crate) const DOOR_DIR: &str = "/.sandkasten/door";
/// The door socket's name in that directory.
pub(crate) const DOOR_SOCKET: &str = "proxy.sock";
/// `DOOR_DIR/DOOR_SOCKET`: where the agent connects.
pub(crate) const DOOR_SOCKET_INSIDE: &str = "/.sandkasten/door/proxy.sock";

/// What a bundle is made of.
pub(crate) struct BundleSpec<'a> {
    /// The sandbox user's home (a tmpfs of `disk_bytes`).
    pub home: &'a str,
    /// Size of the home, `/tmp` (each) and `/dev/shm` (at most 64 MiB).
    pub disk_bytes: u64,
    /// Files of the root: synthesised `/etc`, the code under `/sandbox`.
    pub files: &'a [SandboxFile],
    /// The sandbox user's ids (owner of its files).
    pub uid: u32,
    /// See `uid`.
    pub gid: u32,
    /// The host path of the agent binary.
    pub agent: &'a Path,
    /// Bind the bundle's `door/` directory at `DOOR_DIR` (the egress door's socket lives there).
    pub door: bool,
    /// Bind this directory of the bundle (where runsc's mount namespace mounts a built template's overlay) at
    /// `TEMPLATE_DIR`, read-only.
    pub template: Option<&'a Path>,
}

fn io(what: &str, path: &Path, source: std::io::Error) -> RuntimeError {
    RuntimeError::sys_owned(format!("{what} {}", path.display()), source)
}

fn oci(what: &str, error: oci_spec::OciSpecError) -> RuntimeError {
    RuntimeError::sys_owned(format!("building the OCI {what}"), std::io::Error::other(error.to_string()))
}

/// Writes `bundle/rootfs`, `bundle/door` and `bundle/config.json`; returns the host paths bound read-only into the
/// sandbox, which the caller must make read-only on the host side too (runsc's gofer opens files with the access the
/// guest asks for and enforces a bind's `ro` only in the Sentry: a guest `open(O_WRONLY)` of `/usr/bin/python3`
/// otherwise left the gofer holding the host file writable, and every exec of it on the host failed with ETXTBSY).
pub(crate) fn write(bundle: &Path, spec: &BundleSpec<'_>, host: &dyn HostFs) -> Result<Vec<PathBuf>, RuntimeError> {
    let rootfs = bundle.join("rootfs");
    let mut mounts = base_mounts(spec)?;
    let mut read_only = vec![spec.agent.to_path_buf()];
    // Only directories that hold files; mount points that are directories are left to the Sentry and the gofer.
    for dir in ["etc", "sandbox"] {
        make_dir(&rootfs.join(dir))?;
    }
    make_file(&rootfs.join(AGENT_PATH.trim_start_matches('/')))?;
    for path in HOST_SYSTEM_PATHS.iter().chain(HOST_ETC_PATHS) {
        let inside = rootfs.join(path.trim_start_matches('/'));
        match host.entry(Path::new(path)) {
            Some(HostEntry::Symlink(points_to)) => {
                symlink(&points_to, &inside).map_err(|e| io("linking", &inside, e))?;
            }
            Some(entry) => {
                if entry != HostEntry::Dir {
                    make_file(&inside)?
                }
                mounts.push(bind(path, Path::new(path), &["rbind", "ro"])?);
                read_only.push(PathBuf::from(path));
            }
            None => {}
        }
    }
    for file in spec.files {
        write_file(&rootfs, file, spec.uid, spec.gid)?;
    }
    if let Some(template) = spec.template {
        make_dir(template)?;
        mounts.push(bind(TEMPLATE_DIR, template, &["rbind", "ro"])?);
    }
    if spec.door {
        let door = bundle.join("door");
        make_dir(&door)?;
        mounts.push(bind(DOOR_DIR, &door, &["rbind", "rw"])?);
    }
    let config = config(mounts)?;
    config.save(bundle.join("config.json")).map_err(|e| oci("config.json", e))?;
    Ok(read_only)
}

fn make_dir(path: &Path) -> Result<(), RuntimeError> {
    std::fs::create_dir_all(path).map_err(|e| io("creating", path, e))
}

fn make_file(path: &Path) -> Result<(), RuntimeError> {
    if let Some(parent) = path.parent() {
        make_dir(parent)?;
    }
    std::fs::write(path, b"").map_err(|e| io("creating", path, e))
}

fn write_file(rootfs: &Path, file: &SandboxFile, uid: u32, gid: u32) -> Result<(), RuntimeError> {
    let path = rootfs.join(file.path.to_string_lossy().trim_start_matches('/'));
    if let Some(parent) = path.parent() {
        make_dir(parent)?;
    }
    std::fs::write(&path, &file.contents).map_err(|e| io("writing", &path, e))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(file.mode)).map_err(|e| io("chmod", &path, e))?;
    if file.owned_by_sandbox_user {
        std::os::unix::fs::chown(&path, Some(uid), Some(gid)).map_err(|e| io("chown", &path, e))?;
    }
    Ok(())
}

fn mount(destination: &str, typ: &str, source: &str, options: &[String]) -> Result<Mount, RuntimeError> {
    MountBuilder::default()
        .destination(destination)
        .typ(typ)
        .source(source)
        .options(options.to_vec())
        .build()
        .map_err(|e| oci("mount", e))
}

fn bind(destination: &str, source: &Path, options: &[&str]) -> Result<Mount, RuntimeError> {
    MountBuilder::default()
        .destination(destination)
        .typ("bind")
        .source(source)
        .options(options.iter().map(|o| (*o).to_owned()).collect::<Vec<_>>())
        .build()
        .map_err(|e| oci("bind mount", e))
}

fn base_mounts(spec: &BundleSpec<'_>) -> Result<Vec<Mount>, RuntimeError> {
    let disk = spec.disk_bytes;
    let flags = |extra: &str| -> Vec<String> {
        ["nosuid", "nodev"].iter().map(|s| (*s).to_owned()).chain(extra.split(',').map(str::to_owned)).collect()
    };
    let _ = DEVICES; // gVisor's /dev tmpfs is populated with the same devices (null, zero, full, random, urandom, tty).
    Ok(vec![
        mount("/proc", "proc", "proc", &flags("noexec"))?,
        mount("/dev", "tmpfs", "tmpfs", &["nosuid".into(), "noexec".into(), "mode=0755".into()])?,
        // The sandbox's own terminals (gVisor's devpts; `/dev/ptmx` in the Sentry's /dev leads to it).
        mount(
            "/dev/pts",
            "devpts",
            "devpts",
            &["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"].map(str::to_owned),
        )?,
        mount("/dev/shm", "tmpfs", "shm", &flags(&format!("noexec,mode=1777,size={}", disk.min(SHM_MAX_BYTES))))?,
        mount(spec.home, "tmpfs", "tmpfs", &flags(&format!("mode=0755,size={disk}")))?,
        mount("/tmp", "tmpfs", "tmpfs", &flags(&format!("mode=1777,size={disk}")))?,
        // The agent's own: it installs the sandbox's `sudo` there and listens for it.
        mount(AGENT_RUN_DIR, "tmpfs", "tmpfs", &flags(&format!("mode=0755,size={AGENT_RUN_DIR_BYTES}")))?,
        bind(AGENT_PATH, spec.agent, &["bind", "ro"])?,
    ])
}

fn config(mounts: Vec<Mount>) -> Result<Spec, RuntimeError> {
    // The agent (the container's init) needs these to hand the home to the sandbox user, take its identity for file
    // operations, set the commands' rlimits and start them as it; every command drops all of them (`contain` in the jail).
    let caps: std::collections::HashSet<Capability> = [
        Capability::Chown,
        Capability::DacOverride,
        Capability::DacReadSearch,
        Capability::Fowner,
        Capability::Fsetid,
        Capability::Kill,
        Capability::Setgid,
        Capability::Setuid,
        Capability::Setpcap,
        Capability::SysResource,
    ]
    .into_iter()
    .collect();
    let capabilities = LinuxCapabilitiesBuilder::default()
        .bounding(caps.clone())
        .inheritable(std::collections::HashSet::new())
        .ambient(std::collections::HashSet::new())
        .effective(caps.clone())
        .permitted(caps)
        .build()
        .map_err(|e| oci("capabilities", e))?;
    let process = ProcessBuilder::default()
        .terminal(false)
        .user(UserBuilder::default().uid(0u32).gid(0u32).build().map_err(|e| oci("user", e))?)
        .args(vec![AGENT_PATH.to_owned(), "agent".to_owned()])
        .env(vec!["PATH=/usr/bin:/bin".to_owned()])
        .cwd("/")
        .capabilities(capabilities)
        .no_new_privileges(false)
        .build()
        .map_err(|e| oci("process", e))?;
    let namespaces = [
        LinuxNamespaceType::Pid,
        LinuxNamespaceType::Network,
        LinuxNamespaceType::Ipc,
        LinuxNamespaceType::Uts,
        LinuxNamespaceType::Mount,
    ]
    .into_iter()
    .map(|typ| LinuxNamespaceBuilder::default().typ(typ).build().map_err(|e| oci("namespace", e)))
    .collect::<Result<Vec<_>, _>>()?;
    let linux = LinuxBuilder::default().namespaces(namespaces).build().map_err(|e| oci("linux section", e))?;
    SpecBuilder::default()
        .version("1.0.2")
        .root(RootBuilder::default().path(PathBuf::from("rootfs")).readonly(true).build().map_err(|e| oci("root", e))?)
        .hostname("sandbox")
        .mounts(mounts)
        .process(process)
        .linux(linux)
        .build()
        .map_err(|e| oci("spec", e))
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

    #[test]
    fn the_bundle_binds_usr_read_only_limits_the_writable_mounts_and_starts_the_agent() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let host = FakeHost(HashMap::from([
            ("/usr", HostEntry::Dir),
            ("/bin", HostEntry::Symlink("usr/bin".into())),
            ("/etc/ld.so.cache", HostEntry::File),
        ]));
        let files = [SandboxFile {
            path: "/etc/passwd".into(),
            contents: b"x".to_vec(),
            mode: 0o644,
            owned_by_sandbox_user: false,
        }];
        let spec = BundleSpec {
            home: "/workspace",
            disk_bytes: 1 << 20,
            files: &files,
            uid: 1000,
            gid: 1000,
            agent: Path::new("/usr/bin/true"),
            door: false,
            template: None,
        };
        let read_only = write(dir.path(), &spec, &host).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read_only, [PathBuf::from("/usr/bin/true"), "/usr".into(), "/etc/ld.so.cache".into()]);
        let config = std::fs::read_to_string(dir.path().join("config.json")).unwrap_or_default();
        let json: serde_json::Value = serde_json::from_str(&config).unwrap_or_default();
        assert_eq!(json["root"]["readonly"], true);
        assert_eq!(json["process"]["args"][0], AGENT_PATH);
        let mounts = json["mounts"].as_array().cloned().unwrap_or_default();
        let find = |dest: &str| mounts.iter().find(|m| m["destination"] == dest).cloned().unwrap_or_default();
        assert_eq!(find("/usr")["options"], serde_json::json!(["rbind", "ro"]));
        assert!(find("/workspace")["options"].to_string().contains("size=1048576"));
        assert!(find("/tmp")["options"].to_string().contains("size=1048576"));
        assert!(find(DOOR_DIR).is_null(), "no door without a policy");
        assert_eq!(DOOR_SOCKET_INSIDE, format!("{DOOR_DIR}/{DOOR_SOCKET}"));
        assert!(dir.path().join("rootfs/bin").is_symlink());
        for mount_point in ["usr", "proc", "dev", "tmp", "workspace", ".sandkasten/door"] {
            assert!(!dir.path().join("rootfs").join(mount_point).exists(), "{mount_point} is the Sentry's to make");
        }
        assert!(dir.path().join("rootfs/etc/ld.so.cache").is_file(), "a single-file bind needs its file");
        assert!(dir.path().join("rootfs/.sandkasten/agent").is_file());
        assert_eq!(std::fs::read(dir.path().join("rootfs/etc/passwd")).unwrap_or_default(), b"x");
        assert!(json["linux"]["namespaces"].to_string().contains("network"));
    }

    #[test]
    fn a_template_is_its_mount_point_bound_read_only_at_opt() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let point = dir.path().join("template");
        let spec = BundleSpec {
            home: "/workspace",
            disk_bytes: 1 << 20,
            files: &[],
            uid: 1000,
            gid: 1000,
            agent: Path::new("/usr/bin/true"),
            door: false,
            template: Some(&point),
        };
        write(dir.path(), &spec, &FakeHost(HashMap::new())).unwrap_or_else(|e| panic!("{e}"));
        assert!(point.is_dir(), "the mount point (and the overlay's bottom layer) is made");
        let config = std::fs::read_to_string(dir.path().join("config.json")).unwrap_or_default();
        let json: serde_json::Value = serde_json::from_str(&config).unwrap_or_default();
        let mounts = json["mounts"].as_array().cloned().unwrap_or_default();
        let opt = mounts.iter().find(|m| m["destination"] == TEMPLATE_DIR).cloned().unwrap_or_default();
        assert_eq!(opt["source"], point.display().to_string());
        assert_eq!(opt["options"], serde_json::json!(["rbind", "ro"]));
    }
}
