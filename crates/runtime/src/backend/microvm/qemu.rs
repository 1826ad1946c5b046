//! QEMU's command line for one microVM (and its monitor, `-mon` on an inherited listening socket; a restored one's
//! `-incoming` memory file): the `microvm` machine with ACPI (Debian's cloud kernel finds virtio-mmio
//! devices only through ACPI: it lacks `VIRTIO_MMIO_CMDLINE_DEVICES`), no PCI, no NIC, no display; three virtio-blk
//! disks named by serial (the template's root read-only, the agent read-only, the sandbox's disk), two
//! virtio-serial ports (the agent's channel; the egress door's, when the sandbox has one), the 8250 serial console into a log. Every file is a descriptor the
//! jail passed in (`-add-fd`, `/dev/fdset/N`), but the kernel and initramfs, which QEMU's loader opens by path (the
//! jail shows the boot directory read-only): the VMM's root holds no path to any sandbox's disk. QEMU's own seccomp (`-sandbox on`, everything denied) comes on top of the jail's.

use std::os::fd::RawFd;

use sandkasten_types::MicrovmAccel;

use super::images::BootFiles;

/// The descriptor numbers the VMM inherits, each for one file or channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct VmDescriptors {
    pub(crate) rootfs: RawFd,
    pub(crate) agent_disk: RawFd,
    pub(crate) disk: RawFd,
    /// The same disk opened read-only: QEMU opens an image read-only before it reopens it for writing, and an fdset
    /// answers each open only with a descriptor of the same access mode.
    pub(crate) disk_read_only: RawFd,
    pub(crate) channel: RawFd,
    pub(crate) console: RawFd,
    /// The guest's end of the egress door's channel (its `sandkasten.door` port), when the sandbox has a door.
    pub(crate) door: Option<RawFd>,
    /// The monitor's listening socket (`qmp`: the spawner connects to its path in the sandbox's directory).
    pub(crate) monitor: RawFd,
    /// A memory snapshot to start from (read-only), instead of booting the kernel (`memory`).
    pub(crate) incoming: Option<RawFd>,
    /// A built template's image (read-only), when the sandbox has one (`template_image`).
    pub(crate) template: Option<RawFd>,
}

impl VmDescriptors {
    /// Every descriptor, for the jail to keep.
    pub(crate) fn all(&self) -> Vec<RawFd> {
        let mut all = vec![
            self.rootfs,
            self.agent_disk,
            self.disk,
            self.disk_read_only,
            self.channel,
            self.console,
            self.monitor,
        ];
        all.extend(self.door);
        all.extend(self.incoming);
        all.extend(self.template);
        all
    }
}

/// The guest's size and how it runs.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct VmShape {
    pub(crate) accel: MicrovmAccel,
    pub(crate) memory_mib: u64,
    pub(crate) vcpus: u32,
    /// The host's TSC frequency: the guest kernel cannot calibrate its clock on a machine with no PIT or HPET, so it
    /// is told (`tsc_early_khz`).
    pub(crate) tsc_khz: u64,
}

/// Software emulation's translation cache, in MiB (QEMU's default is 1 GiB, far more than a sandbox's VMM may use).
pub(crate) const TCG_CACHE_MIB: u64 = 32;

/// The fdset of a memory snapshot being loaded (`-incoming`), and of one being saved (`migrate`).
pub(crate) const INCOMING_FDSET: u32 = 5;
pub(crate) const OUTGOING_FDSET: u32 = 6;
/// The fdset of a built template's image.
pub(crate) const TEMPLATE_FDSET: u32 = 7;

/// The guest kernel's command line: the tier's own parameters, then the operator's (`[microvm] kernel_args`, checked
/// by `MicrovmSettings::kernel_args_problem`), which come later so that they win.
pub(crate) fn kernel_command_line(shape: &VmShape, operator_args: &[String]) -> String {
    // lpj: loops per jiffy for HZ=250 at the TSC's rate, so the kernel does not spend a second measuring it.
    let lpj = shape.tsc_khz.saturating_mul(4);
    let mut line = format!(
        "console=ttyS0 quiet loglevel=3 panic=-1 reboot=t no_timer_check tsc_early_khz={} lpj={lpj} rdinit=/init \
         8250.nr_uarts=1 i8042.noaux i8042.nomux i8042.nopnp i8042.dumbkbd random.trust_cpu=on",
        shape.tsc_khz
    );
    for arg in operator_args {
        line.push(' ');
        line.push_str(arg);
    }
    line
}

/// `-accel` and `-cpu` for `accel` (`auto` reads as TCG): the same for every VM and for the speed probe's guest, so
/// the probe measures what sandboxes get. Under KVM the guest gets every host feature but `arch-capabilities`: KVM on
/// emulated nested virtualisation (`kvm_pvm`) refuses that MSR, and without it a guest kernel only assumes its CPU
/// vulnerable (its mitigations on).
pub(crate) fn accel_args(accel: MicrovmAccel) -> [String; 4] {
    let (accel, cpu) = match accel {
        MicrovmAccel::Kvm => ("kvm".to_owned(), "max,-arch-capabilities"),
        MicrovmAccel::Tcg | MicrovmAccel::Auto => (format!("tcg,tb-size={TCG_CACHE_MIB}"), "max"),
    };
    ["-accel".to_owned(), accel, "-cpu".to_owned(), cpu.to_owned()]
}

/// QEMU's argv (program first, as a path inside the VMM's jail); `kernel_args` are the operator's guest kernel
/// parameters.
pub(crate) fn command_line(
    qemu: &str,
    shape: &VmShape,
    boot: &BootFiles,
    fds: &VmDescriptors,
    kernel_args: &[String],
) -> Vec<String> {
    let mut argv: Vec<String> = vec![qemu.to_owned()];
    let mut push = |items: &[&str]| argv.extend(items.iter().map(|item| (*item).to_owned()));
    push(&["-M", "microvm,acpi=on"]);
    argv.extend(accel_args(shape.accel));
    let mut push = |items: &[&str]| argv.extend(items.iter().map(|item| (*item).to_owned()));
    push(&["-m", &format!("{}M", shape.memory_mib), "-smp", &shape.vcpus.to_string()]);
    push(&["-nodefaults", "-no-user-config", "-no-reboot", "-display", "none"]);
    push(&["-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"]);
    push(&["-kernel", &boot.kernel.to_string_lossy(), "-initrd", &boot.initrd.to_string_lossy()]);
    push(&["-append", &kernel_command_line(shape, kernel_args)]);
    for (set, fd, serial, read_only) in [
        (1, fds.rootfs, "sandkasten-root", true),
        (2, fds.agent_disk, "sandkasten-agent", true),
        (3, fds.disk, "sandkasten-disk", false),
    ] {
        let mode = if read_only { ",readonly=on" } else { "" };
        push(&["-add-fd", &format!("fd={fd},set={set}")]);
        if !read_only {
            push(&["-add-fd", &format!("fd={},set={set}", fds.disk_read_only)]);
        }
        push(&[
            "-drive",
            &format!("file=/dev/fdset/{set},format=raw,if=none,id=disk{set},cache=unsafe,file.locking=off{mode}"),
        ]);
        push(&["-device", &format!("virtio-blk-device,drive=disk{set},serial={serial}")]);
    }
    if let Some(template) = fds.template {
        push(&["-add-fd", &format!("fd={template},set={TEMPLATE_FDSET}")]);
        push(&[
            "-drive",
            &format!(
                "file=/dev/fdset/{TEMPLATE_FDSET},format=raw,if=none,id=template,cache=unsafe,file.locking=off,\
                 readonly=on"
            ),
        ]);
        push(&["-device", &format!("virtio-blk-device,drive=template,serial={}", sandkasten_agent::TEMPLATE_SERIAL)]);
    }
    push(&["-device", "virtio-serial-device,max_ports=3"]);
    push(&["-chardev", &format!("socket,id=agent,fd={}", fds.channel)]);
    push(&["-device", "virtserialport,chardev=agent,name=sandkasten.agent"]);
    if let Some(door) = fds.door {
        push(&["-chardev", &format!("socket,id=door,fd={door}")]);
        push(&["-device", &format!("virtserialport,chardev=door,name={}", super::DOOR_PORT)]);
    }
    push(&["-add-fd", &format!("fd={},set=4", fds.console)]);
    push(&["-chardev", "file,id=console,path=/dev/fdset/4", "-serial", "chardev:console"]);
    push(&["-chardev", &format!("socket,id=monitor,fd={},server=on,wait=off", fds.monitor)]);
    push(&["-mon", "chardev=monitor,mode=control"]);
    if let Some(incoming) = fds.incoming {
        // The guest's memory and devices come from the file (QEMU's migration stream); it stays stopped once loaded
        // (it was stopped when saved) until the spawner says `cont`.
        push(&["-add-fd", &format!("fd={incoming},set={INCOMING_FDSET}")]);
        push(&["-incoming", &format!("file:/dev/fdset/{INCOMING_FDSET}")]);
    }
    argv
}

/// The host's TSC frequency in kHz (what a TCG guest's TSC runs at), from the kernel's cpu MHz; 2 GHz when unknown.
pub(crate) fn host_tsc_khz() -> u64 {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("cpu MHz")?.split(':').nth(1)?.trim().parse::<f64>().ok())
        .map_or(2_000_000, |mhz| (mhz * 1000.0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fds() -> VmDescriptors {
        VmDescriptors {
            rootfs: 5,
            agent_disk: 6,
            disk: 7,
            disk_read_only: 10,
            channel: 8,
            console: 9,
            door: None,
            monitor: 12,
            incoming: None,
            template: None,
        }
    }

    fn boot() -> BootFiles {
        BootFiles { kernel: "/vm/vmlinuz".into(), initrd: "/vm/initrd.img".into(), rootfs: "/vm/rootfs.ext4".into() }
    }

    #[test]
    fn the_vm_has_disks_by_serial_a_channel_and_no_network_device() {
        let shape = VmShape { accel: MicrovmAccel::Tcg, memory_mib: 256, vcpus: 1, tsc_khz: 2_000_000 };
        let argv = command_line("/usr/bin/qemu-system-x86_64", &shape, &boot(), &fds(), &[]).join(" ");
        for expected in [
            "-m 256M",
            "tcg,tb-size=32",
            "-kernel /vm/vmlinuz -initrd /vm/initrd.img",
            "-add-fd fd=5,set=1",
            "file=/dev/fdset/1,format=raw,if=none,id=disk1,cache=unsafe,file.locking=off,readonly=on",
            "serial=sandkasten-disk",
            "socket,id=agent,fd=8",
            "name=sandkasten.agent",
            "-nodefaults",
            "-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
        ] {
            assert!(argv.contains(expected), "{expected} missing from {argv}");
        }
        assert!(!argv.contains("netdev") && !argv.contains("-nic") && !argv.contains("pci"), "{argv}");
        assert!(!argv.contains("file=/dev/fdset/3,format=raw,if=none,id=disk3,cache=unsafe,readonly"), "{argv}");
        assert!(!argv.contains("sandkasten.door"), "no door port without a door: {argv}");
        assert!(argv.contains("-chardev socket,id=monitor,fd=12,server=on,wait=off -mon chardev=monitor,mode=control"));
        assert!(!argv.contains("-incoming"), "a booted VM loads no memory: {argv}");
        assert!(!argv.contains("sandkasten-template"), "no template disk without a built template: {argv}");
    }

    #[test]
    fn a_built_template_is_a_read_only_disk_of_its_own() {
        let shape = VmShape { accel: MicrovmAccel::Tcg, memory_mib: 256, vcpus: 1, tsc_khz: 2_000_000 };
        let with = VmDescriptors { template: Some(14), ..fds() };
        let argv = command_line("q", &shape, &boot(), &with, &[]).join(" ");
        for expected in [
            "-add-fd fd=14,set=7",
            "file=/dev/fdset/7,format=raw,if=none,id=template,cache=unsafe,file.locking=off,readonly=on",
            "virtio-blk-device,drive=template,serial=sandkasten-template",
        ] {
            assert!(argv.contains(expected), "{expected} missing from {argv}");
        }
        assert!(with.all().contains(&14), "the jail keeps the template's descriptor");
    }

    #[test]
    fn a_restored_vm_loads_its_memory_from_a_descriptor() {
        let shape = VmShape { accel: MicrovmAccel::Tcg, memory_mib: 256, vcpus: 1, tsc_khz: 2_000_000 };
        let restored = VmDescriptors { incoming: Some(13), ..fds() };
        let argv = command_line("q", &shape, &boot(), &restored, &[]).join(" ");
        assert!(argv.contains("-add-fd fd=13,set=5 -incoming file:/dev/fdset/5"), "{argv}");
        assert!(restored.all().contains(&13) && restored.all().contains(&12), "the jail keeps both");
    }

    #[test]
    fn the_door_is_a_second_serial_port_and_still_no_network_device() {
        let shape = VmShape { accel: MicrovmAccel::Tcg, memory_mib: 256, vcpus: 1, tsc_khz: 2_000_000 };
        let with_door = VmDescriptors { door: Some(11), ..fds() };
        let argv = command_line("q", &shape, &boot(), &with_door, &[]).join(" ");
        assert!(argv.contains("-chardev socket,id=door,fd=11"), "{argv}");
        assert!(argv.contains("virtserialport,chardev=door,name=sandkasten.door"), "{argv}");
        assert!(argv.contains("max_ports=3"), "port 0 is reserved for a console: {argv}");
        assert!(!argv.contains("netdev") && !argv.contains("-nic") && !argv.contains("pci"), "{argv}");
        assert!(with_door.all().contains(&11), "the jail keeps the door's descriptor");
    }

    #[test]
    fn the_kernel_is_told_its_clock() {
        let shape = VmShape { accel: MicrovmAccel::Kvm, memory_mib: 128, vcpus: 2, tsc_khz: 2_500_000 };
        let line = kernel_command_line(&shape, &[]);
        assert!(line.contains("tsc_early_khz=2500000") && line.contains("lpj=10000000"), "{line}");
        assert!(command_line("q", &shape, &boot(), &fds(), &[]).iter().any(|arg| arg == "kvm"));
    }

    #[test]
    fn the_operator_s_kernel_parameters_come_last() {
        let shape = VmShape { accel: MicrovmAccel::Tcg, memory_mib: 256, vcpus: 1, tsc_khz: 2_000_000 };
        let operator = ["sysctl.vm.panic_on_oom=1".to_owned(), "loglevel=7".to_owned()];
        let line = kernel_command_line(&shape, &operator);
        assert!(line.ends_with(" random.trust_cpu=on sysctl.vm.panic_on_oom=1 loglevel=7"), "{line}");
        let argv = command_line("q", &shape, &boot(), &fds(), &operator);
        let append = argv.iter().position(|arg| arg == "-append").map(|at| &argv[at + 1]);
        assert_eq!(append, Some(&line));
    }
}
