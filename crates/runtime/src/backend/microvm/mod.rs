//! The `microvm` tier: each sandbox is a guest kernel of its own (Debian's cloud kernel) in QEMU's `microvm`
//! machine, and the VMM itself runs in a process-tier jail: the launcher clones a process-tier sandbox (user, mount,
//! pid, ipc, uts and network namespaces under the sandbox's unprivileged host ids, a root of read-only host system
//! directories, the sandbox's cgroup sized for the guest's RAM plus `VMM_OVERHEAD_BYTES`), whose agent, once in the
//! cgroup, becomes QEMU through the jail (no capabilities, no_new_privs, landlock, the sandbox seccomp filter; QEMU's
//! own `-sandbox` filter on top) instead of serving (`AgentPlan::vmm`). QEMU is PID 1 of that jail, so killing the
//! cgroup or the pid ends the VM; the VM's files reach it only as inherited descriptors (`qemu`).
//!
//! Inside, the initramfs loads the virtio modules, builds the root (an overlay over the template's read-only image)
//! and starts the same agent as every tier on a virtio-serial port; the host speaks to it over a socketpair that QEMU
//! bridges to that port. The egress door is a second port on a socketpair of its own, whose host end goes to
//! the runtime with the channel (`SandboxGuard::door`): the agent carries each connection to `127.0.0.1:3128` as a
//! stream of the door mux over it, and the host connects each stream to the egress proxy. Steps: record → cgroup →
//! disk → jail (`launch_keeping`) → QEMU → `GuestBooted` → plan → ready. The guest has no network device at all: its
//! traffic leaves only through the door, to the proxy.
//!
//! Each VMM has a QMP monitor (`qmp`) the spawner connects to for the lifecycle: a pause is `stop` under the cgroup
//! freeze, or a release of the VM (`pause`); memory snapshots, restores and forks are QEMU's migration to and from a
//! file (`memory`), started like a boot but with `-incoming`.

mod accel_choice;
mod files;
mod images;
mod memory;
mod pause;
mod qemu;
mod qmp;
mod speed_probe;
mod template_image;

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use sandkasten_protocol::{AgentPlan, Envelope, Message, SeccompPolicy, VmmPlan, read_frame, write_frame};
use sandkasten_types::{MicrovmAccel, SandboxFile, SandboxSpec, Tier};

pub use accel_choice::{AccelVerdict, CLEARLY_FASTER};
pub(crate) use files::MicrovmFiles;
pub(crate) use files::{leftover_candidates, panic_line, remove_leftovers};
pub use speed_probe::ProbeRun;

use super::{NotServing, TierBackend, wait_until_serving};
use crate::backend::process::launch::Launcher;
use crate::error::RuntimeError;
use crate::guard::SandboxGuard;

/// The name of the virtio-serial port of the egress door (the guest's agent carries its connections as streams of
/// the door mux over it; the host connects each to the egress proxy).
pub(crate) const DOOR_PORT: &str = "sandkasten.door";

/// The VMM's own memory beside the guest's RAM: QEMU's code and heap, the translation cache of software emulation
/// (`qemu::TCG_CACHE_MIB`), the device buffers. Charged to the sandbox's cgroup with the guest's RAM.
pub(crate) const VMM_OVERHEAD_BYTES: u64 = 160 << 20;

/// Host tasks of a microVM sandbox: QEMU's threads (one per vCPU, its I/O and RCU threads, the block layer's
/// workers). The guest's own processes are counted by the guest kernel (`RLIMIT_NPROC` in the agent).
pub(crate) const VMM_HOST_TASKS: u64 = 64;

/// The smallest guest the cloud kernel and the agent run in.
const MIN_GUEST_MEMORY: u64 = 128 << 20;

/// How long a guest may take from QEMU's start to the agent's greeting. Software emulation on a busy host boots in
/// seconds; a guest that says nothing for this long is reported with its console's last lines.
const BOOT_TIMEOUT: Duration = Duration::from_secs(90);

/// The microvm tier, as one owner sees it.
pub(crate) struct MicrovmTier<'a> {
    launcher: Launcher<'a>,
    agent: &'a Path,
    missing: Option<String>,
}

impl<'a> MicrovmTier<'a> {
    /// The tier of `launcher`'s config, booting `agent` in every guest; finds out whether QEMU and the boot files are
    /// there.
    pub(crate) fn new(launcher: Launcher<'a>, agent: &'a Path) -> MicrovmTier<'a> {
        let missing = unusable(&launcher.config.microvm);
        MicrovmTier { launcher, agent, missing }
    }
}

/// Why this host cannot run microVMs as configured, if it cannot.
pub fn unusable(settings: &sandkasten_types::MicrovmSettings) -> Option<String> {
    if resolve_qemu(settings).is_none() {
        return Some(format!(
            "isolation \"microvm\" needs QEMU, which is not installed ({} not found): scripts/setup.sh installs it (on \
             Debian 12: apt-get install -t bookworm-backports qemu-system-x86)",
            settings.qemu.display()
        ));
    }
    if let Err(missing) = images::BootFiles::find(settings) {
        return Some(missing);
    }
    let (accel, why) = accel_and_reason(settings);
    match accel {
        MicrovmAccel::Kvm if !Path::new("/dev/kvm").exists() => {
            Some("[microvm] accel = \"kvm\" but this host has no /dev/kvm: set accel = \"auto\"".to_owned())
        }
        MicrovmAccel::Tcg if !settings.allow_emulation => Some(format!(
            "isolation \"microvm\" would run under software emulation here ({why}), which [microvm] \
             allow_emulation = false forbids: allow emulation, or run microVMs on a host whose KVM runs guests at \
             hardware speed"
        )),
        _ => None,
    }
}

/// The acceleration guests get: `kvm` or `tcg` as configured; for `auto`, KVM only where the speed probe measured it
/// clearly faster than software emulation (on hosts whose KVM is emulated, such as `kvm_pvm` or nested KVM without
/// hardware support, guests run far slower on it than under TCG).
pub(crate) fn accel(settings: &sandkasten_types::MicrovmSettings) -> MicrovmAccel {
    accel_and_reason(settings).0
}

/// `accel`, and why in words (the configured value, or the speed probe's verdict for `auto`).
pub fn accel_and_reason(settings: &sandkasten_types::MicrovmSettings) -> (MicrovmAccel, String) {
    match settings.accel {
        MicrovmAccel::Kvm => (MicrovmAccel::Kvm, "[microvm] accel = \"kvm\"".to_owned()),
        MicrovmAccel::Tcg => (MicrovmAccel::Tcg, "[microvm] accel = \"tcg\"".to_owned()),
        MicrovmAccel::Auto => match resolve_qemu(settings) {
            Some(qemu) => {
                let verdict = accel_choice::verdict(settings, &qemu);
                (verdict.accel, verdict.reason)
            }
            None => (MicrovmAccel::Tcg, "QEMU is not installed".to_owned()),
        },
    }
}

/// What `accel = "auto"` measured on this host and picks (the speed probe's verdict, cached per host boot, kernel
/// and QEMU binary); `None` without QEMU.
pub fn accel_verdict(settings: &sandkasten_types::MicrovmSettings) -> Option<AccelVerdict> {
    resolve_qemu(settings).map(|qemu| accel_choice::verdict(settings, &qemu))
}

/// The QEMU to run: the configured path, or the configured name found on this process's PATH.
fn resolve_qemu(settings: &sandkasten_types::MicrovmSettings) -> Option<std::path::PathBuf> {
    super::resolve_program(&settings.qemu)
}

impl TierBackend for MicrovmTier<'_> {
    fn tier(&self) -> Tier {
        Tier::Microvm
    }

    fn probe(&self) -> Option<String> {
        self.missing.clone()
    }

    fn spawn(
        &self,
        guard: &mut SandboxGuard,
        spec: &SandboxSpec,
        _files: &[SandboxFile],
        plan: &AgentPlan,
    ) -> Result<UnixStream, RuntimeError> {
        let files = self.prepare(guard, spec, plan)?;
        images::make_sandbox_disk(&files.disk(), spec.limits.disk_bytes)?;
        let shape = self.shape(spec);
        let mut vm = self.start_vm(guard, spec, plan, &files, shape, None)?;
        wait_for_boot(&mut vm.channel, &files)?;
        let booted_ns = sandkasten_protocol::monotonic_ns();
        guard.vm_boot = Some(crate::VmBoot { accel: shape.accel, booted_ns, launched_ns: vm.launched_ns });
        write_frame(&mut vm.channel, &Envelope::new(0, Message::Plan { plan: Box::new(plan.clone()) }))?;
        match wait_until_serving(&mut vm.channel) {
            Ok(()) => {
                guard.door = vm.door;
                Ok(vm.channel)
            }
            Err(NotServing::SetupFailed(message)) => vm_failed(format!("the guest's agent could not start: {message}")),
            Err(NotServing::Answered(msg)) => {
                vm_failed(format!("the guest's agent answered {msg} before it was ready"))
            }
            Err(NotServing::Silent) => vm_failed(lost_words("the VM stopped before its agent was ready", &files)),
        }
    }

    /// With `release_paused` (the default): the VM's memory is saved into the sandbox's directory and the VMM ends,
    /// its cgroup with it (`release`). Otherwise `stop` through the monitor (the vCPUs leave guest code and the
    /// guest's clocks stop with them, so a running command's timeout does not count the pause), then the cgroup
    /// freezer around the VMM, so that QEMU's own threads (its main loop, RCU and I/O workers) get no CPU either.
    fn pause(&self, guard: &mut SandboxGuard) -> Result<(), RuntimeError> {
        let files = files_of(guard)?;
        if files.released {
            return Err(RuntimeError::InvalidInput(format!("sandbox {} is paused already", guard.id)));
        }
        if self.launcher.config.microvm.release_paused {
            return pause::release(guard, &files);
        }
        monitor(&files)?.execute("stop", serde_json::Value::Null).map_err(|e| monitor_failed(&files, e))?;
        if let Err(error) = guard.cgroup()?.freeze() {
            let _ = monitor(&files)
                .and_then(|mut m| m.execute("cont", serde_json::Value::Null).map_err(|e| monitor_failed(&files, e)));
            return Err(error.into());
        }
        Ok(())
    }

    /// A released VM starts again from its saved memory in a new cgroup, behind new channels (returned); a stopped
    /// one is thawed and told `cont`. Either way the guest runs on where it stopped, its clocks too.
    fn resume(&self, guard: &mut SandboxGuard) -> Result<Option<UnixStream>, RuntimeError> {
        let files = files_of(guard)?;
        if files.released {
            return pause::restart(self, guard, &files).map(Some);
        }
        guard.cgroup()?.thaw()?;
        monitor(&files)?.execute("cont", serde_json::Value::Null).map_err(|e| monitor_failed(&files, e))?;
        Ok(None)
    }

    fn memory_snapshot_supported(&self) -> Result<(), RuntimeError> {
        Ok(())
    }

    /// `stop`, QEMU's migration into a file in `dir`, a copy of the writable disk, `cont` (`memory`).
    fn memory_snapshot(&self, guard: &SandboxGuard, dir: &Path) -> Result<(), RuntimeError> {
        let files = files_of(guard)?;
        memory::save(&files, dir, memory::AfterSave::Continue)
    }

    /// A new VMM that loads the snapshot in `dir` (its own copy of the disk), then `cont`.
    fn spawn_from_memory(
        &self,
        guard: &mut SandboxGuard,
        spec: &SandboxSpec,
        _files: &[SandboxFile],
        plan: &AgentPlan,
        dir: &Path,
    ) -> Result<UnixStream, RuntimeError> {
        let saved = memory::SavedVm::open(dir)?;
        saved.check_matches(&self.config_of(self.shape(spec), plan)?)?;
        let files = self.prepare(guard, spec, plan)?;
        saved.copy_disk_to(&files.disk())?;
        let memory_file = saved.memory_file()?;
        let shape = saved.config.shape;
        let mut vm = self.start_vm(guard, spec, plan, &files, shape, Some(&memory_file))?;
        drop(memory_file);
        memory::continue_loaded(&files)?;
        let booted_ns = sandkasten_protocol::monotonic_ns();
        guard.vm_boot = Some(crate::VmBoot { accel: shape.accel, booted_ns, launched_ns: vm.launched_ns });
        guard.door = vm.door.take();
        Ok(vm.channel)
    }
}

/// A started VMM: the host ends of the agent's channel and of the egress door's.
struct StartedVm {
    channel: UnixStream,
    door: Option<std::os::fd::OwnedFd>,
    /// When the VMM was launched (CLOCK_MONOTONIC ns; `VmBoot::launched_ns`).
    launched_ns: u64,
}

impl MicrovmTier<'_> {
    /// Checks the spec and makes the sandbox's directory (0700), recorded in `guard` first so that a failure from
    /// here on removes it.
    fn prepare(
        &self,
        guard: &mut SandboxGuard,
        spec: &SandboxSpec,
        plan: &AgentPlan,
    ) -> Result<MicrovmFiles, RuntimeError> {
        if spec.limits.memory_bytes < MIN_GUEST_MEMORY {
            return Err(RuntimeError::InvalidInput(format!(
                "a microVM needs at least {} of memory for its guest kernel: raise the memory limit",
                sandkasten_types::units::format_bytes(MIN_GUEST_MEMORY)
            )));
        }
        let mut files = MicrovmFiles::new(self.launcher.config, &guard.id);
        files.launch = Some(std::sync::Arc::new((spec.clone(), plan.clone())));
        guard.microvm = Some(files.clone());
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&files.dir)
            .map_err(|e| RuntimeError::sys_owned(format!("creating {}", files.dir.display()), e))?;
        Ok(files)
    }

    /// The guest's size and acceleration for `spec`.
    fn shape(&self, spec: &SandboxSpec) -> qemu::VmShape {
        qemu::VmShape {
            accel: accel(&self.launcher.config.microvm),
            memory_mib: spec.limits.memory_bytes >> 20,
            vcpus: (spec.limits.cpus.ceil() as u32).max(1),
            tsc_khz: qemu::host_tsc_khz(),
        }
    }

    /// What a VM of `shape` for `plan` is, as a memory snapshot records it.
    fn config_of(&self, shape: qemu::VmShape, plan: &AgentPlan) -> Result<memory::SavedConfig, RuntimeError> {
        let settings = &self.launcher.config.microvm;
        let agent_disk = images::agent_disk(settings, self.agent)?;
        let boot = images::BootFiles::find(settings).map_err(RuntimeError::HostUnsupported)?;
        let rootfs = std::fs::metadata(&boot.rootfs)
            .map_err(|e| RuntimeError::sys_owned(format!("reading {}", boot.rootfs.display()), e))?;
        Ok(memory::SavedConfig {
            shape,
            door: plan.door.is_some(),
            agent_disk: agent_disk.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            rootfs: format!(
                "{}-{}",
                rootfs.len(),
                rootfs
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_nanos())
            ),
        })
    }

    /// Starts QEMU in the sandbox's jail with its disks, channels and monitor (booting the kernel, or loading the
    /// memory file `incoming`), and waits until the jail has become QEMU.
    fn start_vm(
        &self,
        guard: &mut SandboxGuard,
        spec: &SandboxSpec,
        plan: &AgentPlan,
        files: &MicrovmFiles,
        shape: qemu::VmShape,
        incoming: Option<&File>,
    ) -> Result<StartedVm, RuntimeError> {
        let settings = &self.launcher.config.microvm;
        let boot = images::BootFiles::find(settings).map_err(RuntimeError::HostUnsupported)?;
        let agent_disk = images::agent_disk(settings, self.agent)?;
        memory::write_config(&files.config(), &self.config_of(shape, plan)?)?;
        let read = |path: &Path| {
            File::open(path).map_err(|e| RuntimeError::sys_owned(format!("opening {}", path.display()), e))
        };
        let append = |path: &Path| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| RuntimeError::sys_owned(format!("opening {}", path.display()), e))
        };
        let rootfs = read(&boot.rootfs)?;
        let agent_image = read(&agent_disk)?;
        let template = match template_image::template_image(settings, &spec.layers)? {
            Some(image) => Some(read(&image)?),
            None => None,
        };
        let disk = OpenOptions::new()
            .read(true)
            .write(true)
            .open(files.disk())
            .map_err(|e| RuntimeError::sys("opening the sandbox disk", e))?;
        let disk_read_only = read(&files.disk())?;
        let console = append(&files.console())?;
        let vmm_log = append(&files.vmm_log())?;
        let monitor = bind_monitor(files)?;
        let (channel, guest_end) = UnixStream::pair().map_err(|e| RuntimeError::sys("socketpair", e))?;
        // The egress door's channel, where the agent opens a door (every long-lived sandbox; the policy decides on the
        // host whether its streams lead anywhere).
        let door = match plan.door {
            Some(_) => Some(UnixStream::pair().map_err(|e| RuntimeError::sys("socketpair for the door", e))?),
            None => None,
        };
        let fds = qemu::VmDescriptors {
            rootfs: rootfs.as_raw_fd(),
            agent_disk: agent_image.as_raw_fd(),
            disk: disk.as_raw_fd(),
            disk_read_only: disk_read_only.as_raw_fd(),
            channel: guest_end.as_raw_fd(),
            console: console.as_raw_fd(),
            door: door.as_ref().map(|(_, guest)| guest.as_raw_fd()),
            monitor: monitor.as_raw_fd(),
            incoming: incoming.map(AsRawFd::as_raw_fd),
            template: template.as_ref().map(AsRawFd::as_raw_fd),
        };
        let qemu_path = resolve_qemu(settings).ok_or_else(|| RuntimeError::HostUnsupported("QEMU is gone".into()))?;
        let argv = qemu::command_line(&qemu_path.to_string_lossy(), &shape, &boot, &fds, &settings.kernel_args);
        let mut keep = fds.all();
        keep.push(vmm_log.as_raw_fd());
        let boot_dir = settings.dir.to_string_lossy().into_owned();
        let jail_plan = vmm_jail_plan(plan, spec, argv, keep.clone(), vmm_log.as_raw_fd(), vec![boot_dir]);

        let launched_ns = sandkasten_protocol::monotonic_ns();
        let mut jail = self.launcher.launch_keeping(guard, &jail_plan, &keep)?;
        // The jail holds its copies now; the host's go, so that the guest's end of the channel lives in QEMU only.
        let door_host_end = door.map(|(host, guest)| {
            drop(guest);
            std::os::fd::OwnedFd::from(host)
        });
        drop((rootfs, agent_image, template, disk, disk_read_only, console, vmm_log, guest_end, monitor));
        wait_for_vmm(&mut jail, files)?;
        Ok(StartedVm { channel, door: door_host_end, launched_ns })
    }
}

/// The files of a microVM sandbox, or why there are none.
fn files_of(guard: &SandboxGuard) -> Result<MicrovmFiles, RuntimeError> {
    guard
        .microvm
        .clone()
        .ok_or_else(|| RuntimeError::InvalidInput(format!("sandbox {} is not a microVM sandbox", guard.id)))
}

/// Binds the VMM's monitor socket in the sandbox's directory, 0600 (the socket's mode is what `connect` checks).
fn bind_monitor(files: &MicrovmFiles) -> Result<std::os::unix::net::UnixListener, RuntimeError> {
    let path = files.monitor();
    let _ = std::fs::remove_file(&path);
    let listener = std::os::unix::net::UnixListener::bind(&path)
        .map_err(|e| RuntimeError::sys_owned(format!("binding {}", path.display()), e))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| RuntimeError::sys_owned(format!("restricting {}", path.display()), e))?;
    Ok(listener)
}

/// A connection to the sandbox's VMM monitor.
fn monitor(files: &MicrovmFiles) -> Result<qmp::Qmp, RuntimeError> {
    qmp::Qmp::connect(&files.monitor()).map_err(|e| monitor_failed(files, e))
}

/// A monitor step that failed, with what the VMM said last.
fn monitor_failed(files: &MicrovmFiles, error: qmp::QmpError) -> RuntimeError {
    RuntimeError::TierFailed(lost_words(&error.to_string(), files))
}

/// The plan of the process-tier jail that becomes the VMM: the sandbox's ids, the VMM's seccomp policy (the
/// sandbox's, with page-cache drops allowed for QEMU's migration: `SeccompPolicy::Vmm`), a tiny root, the
/// VMM's command line and descriptors. Files the VMM writes (its disk) may grow to the disk image's size.
fn vmm_jail_plan(
    plan: &AgentPlan,
    spec: &SandboxSpec,
    argv: Vec<String>,
    keep_fds: Vec<i32>,
    stderr_fd: i32,
    host_read_only: Vec<String>,
) -> AgentPlan {
    AgentPlan {
        tier: Tier::Process,
        home: plan.home.clone(),
        uid: plan.uid,
        gid: plan.gid,
        env: Default::default(),
        disk_bytes: images::disk_image_bytes(spec.limits.disk_bytes),
        processes: None,
        writable_dirs: vec!["/tmp".to_owned()],
        writable_files: vec!["/dev/null".to_owned()],
        seccomp: SeccompPolicy::Vmm,
        root_files: Vec::new(),
        oom_score_adj: plan.oom_score_adj,
        door: None,
        vmm: Some(VmmPlan { argv, keep_fds, stderr_fd, host_read_only }),
        template: Default::default(),
        home_files: Vec::new(),
    }
}

/// Waits until the jail's agent has become QEMU: its channel ends at the execve (close-on-exec), after
/// `FilesystemReady`; `SetupFailed` says why it could not.
fn wait_for_vmm(jail: &mut UnixStream, files: &MicrovmFiles) -> Result<(), RuntimeError> {
    match wait_until_serving(jail) {
        Ok(()) => {}
        Err(NotServing::SetupFailed(message)) => {
            return vm_failed(format!("the VMM's jail could not be built: {message}"));
        }
        Err(NotServing::Answered(msg)) => return vm_failed(format!("the VMM's jail answered {msg}")),
        Err(NotServing::Silent) => return vm_failed("the VMM's jail exited before it was built".to_owned()),
    }
    jail.set_read_timeout(Some(super::READY_TIMEOUT)).map_err(|e| RuntimeError::sys("setting a read timeout", e))?;
    match read_frame(jail) {
        Ok(None) => Ok(()),
        Ok(Some(Envelope { msg: Message::SetupFailed { message }, .. })) => vm_failed(format!(
            "{message}{}",
            files::last_lines(&files.vmm_log(), 3).map(|l| format!(" ({l})")).unwrap_or_default()
        )),
        Ok(Some(other)) => vm_failed(format!("the VMM's jail answered {:?}", other.msg)),
        Err(_) => vm_failed(lost_words("the VMM did not start", files)),
    }
}

/// Waits for the guest agent's greeting, or says what the VMM and the console said.
fn wait_for_boot(channel: &mut UnixStream, files: &MicrovmFiles) -> Result<(), RuntimeError> {
    channel.set_read_timeout(Some(BOOT_TIMEOUT)).map_err(|e| RuntimeError::sys("setting a read timeout", e))?;
    let first = read_frame(channel);
    channel.set_read_timeout(None).map_err(|e| RuntimeError::sys("clearing a read timeout", e))?;
    match first {
        Ok(Some(Envelope { msg: Message::GuestBooted { .. }, .. })) => Ok(()),
        Ok(Some(other)) => vm_failed(format!("the guest's agent answered {:?} before it booted", other.msg)),
        Ok(None) | Err(_) => vm_failed(lost_words("the VM did not boot", files)),
    }
}

/// `what`, with the last words of the VMM and of the guest's console (its kernel's panic line, if it panicked).
fn lost_words(what: &str, files: &MicrovmFiles) -> String {
    let mut message = what.to_owned();
    if let Some(vmm) = files::last_lines(&files.vmm_log(), 3) {
        message.push_str(&format!("; QEMU said: {vmm}"));
    }
    // A panic's last lines are its stack: its first line says what happened.
    if let Some(panic) = files::panic_line(&files.console()) {
        message.push_str(&format!("; {panic}"));
    } else if let Some(console) = files::last_lines(&files.console(), 4) {
        message.push_str(&format!("; the guest's console: {console}"));
    }
    message
}

fn vm_failed<T>(why: String) -> Result<T, RuntimeError> {
    Err(RuntimeError::TierFailed(format!("microVM start failed: {why}")))
}
