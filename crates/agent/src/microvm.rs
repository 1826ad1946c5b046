//! The agent as a microVM guest's PID 1 (`sandkasten agent microvm`, started by the initramfs's `/init` once the
//! root is an overlay of the template image). Its channel to the host is a virtio-serial port (the guest has no
//! vsock here), which it bridges to a socketpair so that everything above speaks over a `UnixStream` as on the other
//! tiers. It says `GuestBooted` first (a port drops what the host wrote before the guest opened it), then takes the
//! host's plan like a gVisor agent and builds the few writable places itself: the sandbox's disk (the host's
//! `sandkasten-disk`, ext4) holds the home and `/tmp`; `/dev/pts`, `/dev/shm` and the synthesised `/etc` files are
//! the guest's own.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::IntoRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use rustix::mount::{MountFlags, mount, mount_bind};
use sandkasten_protocol::{AgentPlan, Envelope, Message, monotonic_ns, write_frame};

/// The name of the virtio-serial port the host's agent channel is bound to.
pub const AGENT_PORT: &str = "sandkasten.agent";
/// The serial number of the sandbox's writable disk.
pub const DISK_SERIAL: &str = "sandkasten-disk";
/// Where the sandbox's disk is mounted in the guest.
const DISK_MOUNT: &str = "/.sandkasten/disk";
/// The serial number of a built template's read-only disk, mounted at the template directory (`/opt`) when the plan
/// names a template.
pub const TEMPLATE_SERIAL: &str = "sandkasten-template";

/// Opens the agent's port, bridges it to a socketpair whose other end becomes descriptor 0 (where every agent finds
/// its channel), says `GuestBooted` and returns; the caller then reads the plan as any agent does.
pub(crate) fn open_channel() -> Result<(), String> {
    let port = find_port(AGENT_PORT)?;
    let device = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&port)
        .map_err(|e| format!("opening the agent port {}: {e}", port.display()))?;
    let (agent_end, bridge_end) = UnixStream::pair().map_err(|e| format!("socketpair: {e}"))?;
    bridge(device, bridge_end)?;
    let mut channel = agent_end;
    write_frame(&mut channel, &Envelope::new(0, Message::GuestBooted { at_ns: monotonic_ns() }))
        .map_err(|e| format!("greeting the host: {e}"))?;
    let fd = channel.into_raw_fd();
    // SAFETY: dup2 onto descriptor 0 of this process from a descriptor it owns; integers only.
    if unsafe { libc::dup2(fd, 0) } < 0 {
        return Err(format!("dup2 of the channel: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` came from `into_raw_fd` above and is closed exactly once here (descriptor 0 is its copy).
    unsafe { libc::close(fd) };
    Ok(())
}

/// Opens the virtio-serial port named `name` for reading and writing.
pub(crate) fn open_port(name: &str) -> Result<File, String> {
    let port = find_port(name)?;
    OpenOptions::new().read(true).write(true).open(&port).map_err(|e| format!("opening {}: {e}", port.display()))
}

/// The device of the virtio-serial port named `name` (`/sys/class/virtio-ports/vportNpM/name`); there is no udev in
/// the guest to make `/dev/virtio-ports/NAME`.
fn find_port(name: &str) -> Result<PathBuf, String> {
    find_device("/sys/class/virtio-ports", "name", name).map_err(|e| format!("{e} (virtio-serial port {name})"))
}

/// The `/dev` node of the entry of the sysfs directory `class` whose file `attribute` holds `value`.
fn find_device(class: &str, attribute: &str, value: &str) -> Result<PathBuf, String> {
    let entries = std::fs::read_dir(class).map_err(|e| format!("listing {class}: {e}"))?;
    for entry in entries.flatten() {
        if std::fs::read_to_string(entry.path().join(attribute)).is_ok_and(|found| found.trim() == value) {
            return Ok(Path::new("/dev").join(entry.file_name()));
        }
    }
    Err(format!("the VM has no device whose {attribute} is {value}"))
}

/// Copies bytes both ways between the port and the socket, each way on its own thread, until either side ends; the
/// end of the host's side (the port reads nothing more) ends the agent, as a closed channel does on every tier.
fn bridge(device: File, socket: UnixStream) -> Result<(), String> {
    let clone = |what: &str| format!("duplicating the {what}");
    let device_out = device.try_clone().map_err(|_| clone("port"))?;
    let socket_in = socket.try_clone().map_err(|_| clone("socket"))?;
    spawn_pump("port→agent", device, socket_in)?;
    spawn_pump("agent→port", socket, device_out)?;
    Ok(())
}

fn spawn_pump<R, W>(name: &str, mut from: R, mut to: W) -> Result<(), String>
where
    R: Read + Send + 'static,
    W: Write + Send + 'static,
{
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            block_all_signals();
            let mut buffer = vec![0u8; 64 * 1024];
            loop {
                match from.read(&mut buffer) {
                    Ok(0) => break,
                    Ok(n) => {
                        if to.write_all(&buffer[..n]).is_err() {
                            break;
                        }
                    }
                    Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            // One way ended: the host went away or the agent closed its channel. Either ends the VM.
            // SAFETY: _exit from a helper thread ends the agent (PID 1) at once, and with it the guest.
            unsafe { libc::_exit(0) }
        })
        .map(drop)
        .map_err(|e| format!("starting the {name} bridge: {e}"))
}

/// Blocks every signal in the calling thread: the agent's signals (SIGCHLD above all, which it reads from a
/// signalfd) must reach its main thread, never a bridge thread that would drop them.
fn block_all_signals() {
    // SAFETY: sigset_t is plain data; sigfillset initialises it and pthread_sigmask reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Builds the writable parts of the guest's root for `plan`: the disk holds the home and `/tmp`, a built template's
/// disk is `/opt` (read-only), the guest's own devpts and `/dev/shm`, the agent's run directory, the plan's root files
/// (the synthesised `/etc`), the hostname and the loopback; then the root is made read-only.
pub(crate) fn build_root(plan: &AgentPlan) -> Result<(), String> {
    let mkdir = |path: &str| std::fs::create_dir_all(path).map_err(|e| format!("creating {path}: {e}"));
    let disk = find_disk(DISK_SERIAL)?;
    mkdir(DISK_MOUNT)?;
    let nosuid_nodev = MountFlags::NOSUID | MountFlags::NODEV;
    // `noinit_itable`: the host made the disk with lazy inode tables in a new sparse file, which reads as zeros
    // already; the kernel's background zeroing (ext4lazyinit) would only burn the guest's emulated CPU and turn the
    // sparse file's holes into host disk blocks.
    mount(&disk, DISK_MOUNT, "ext4", nosuid_nodev, Some(c"noinit_itable"))
        .map_err(|e| format!("mounting the sandbox's disk {}: {e}", disk.display()))?;
    // Mountinfo shows a bind's source path as the mount's root: the disk's directories are named so that none reads
    // as a host directory (`/home`, `/tmp`) bound in.
    for (inside, on_disk, mode) in [(plan.home.as_str(), "workspace", 0o755), ("/tmp", "scratch", 0o1777)] {
        let source = format!("{DISK_MOUNT}/{on_disk}");
        mkdir(&source)?;
        mkdir(inside)?;
        set_mode(&source, mode)?;
        mount_bind(source.as_str(), inside).map_err(|e| format!("binding {inside} to the disk: {e}"))?;
    }
    if !plan.template.is_empty() {
        let template = find_disk(TEMPLATE_SERIAL)?;
        let at = sandkasten_jail::rootfs::TEMPLATE_DIR;
        mkdir(at)?;
        mount(&template, at, "ext4", nosuid_nodev | MountFlags::RDONLY, Some(c"noload"))
            .map_err(|e| format!("mounting the template's disk {} at {at}: {e}", template.display()))?;
    }
    mkdir("/dev/pts")?;
    mount(
        "devpts",
        "/dev/pts",
        "devpts",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        Some(c"newinstance,ptmxmode=0666,mode=0620"),
    )
    .map_err(|e| format!("mounting /dev/pts: {e}"))?;
    replace_with_symlink("/dev/ptmx", "pts/ptmx")?;
    for (link, points_to) in [
        ("/dev/fd", "/proc/self/fd"),
        ("/dev/stdin", "/proc/self/fd/0"),
        ("/dev/stdout", "/proc/self/fd/1"),
        ("/dev/stderr", "/proc/self/fd/2"),
    ] {
        replace_with_symlink(link, points_to)?;
    }
    mkdir("/dev/shm")?;
    let shm_size = CString::new(format!("size={},mode=1777", plan.disk_bytes.min(64 << 20))).unwrap_or_default();
    mount("shm", "/dev/shm", "tmpfs", nosuid_nodev | MountFlags::NOEXEC, Some(shm_size.as_c_str()))
        .map_err(|e| format!("mounting /dev/shm: {e}"))?;
    let run_dir = sandkasten_jail::rootfs::AGENT_RUN_DIR;
    mkdir(run_dir)?;
    let run_options =
        CString::new(format!("size={},mode=0755", sandkasten_jail::rootfs::AGENT_RUN_DIR_BYTES)).unwrap_or_default();
    mount("agent", run_dir, "tmpfs", nosuid_nodev, Some(run_options.as_c_str()))
        .map_err(|e| format!("mounting {run_dir}: {e}"))?;
    sandkasten_jail::mounts::write_files(&plan.root_files, plan.uid, plan.gid).map_err(|e| e.to_string())?;
    sandkasten_jail::namespaces::set_hostname("sandbox").map_err(|e| e.to_string())?;
    // The guest kernel is this sandbox's alone: its OOM kills are the sandbox's memory limit firing.
    crate::serve::guest_oom::own_the_kernel();
    sandkasten_jail::net::bring_up_loopback().map_err(|e| e.to_string())?;
    // Built: the root is read-only from here on, as on the other tiers (the writable places are the mounts above).
    // Its overlay's upper layer is guest RAM, so a write there would touch nothing of the host, but a sandbox that
    // can rewrite `/usr` behaves unlike every other tier, and whatever runs next in it would run what was written.
    rustix::mount::mount_remount("/", MountFlags::RDONLY, "").map_err(|e| format!("making the root read-only: {e}"))
}

/// The block device whose virtio serial number is `serial`.
fn find_disk(serial: &str) -> Result<PathBuf, String> {
    find_device("/sys/block", "serial", serial)
}

fn set_mode(path: &str, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|e| format!("chmod {path}: {e}"))
}

fn replace_with_symlink(link: &str, points_to: &str) -> Result<(), String> {
    let _ = std::fs::remove_file(link);
    std::os::unix::fs::symlink(points_to, link).map_err(|e| format!("linking {link} to {points_to}: {e}"))
}
