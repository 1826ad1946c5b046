//! A timed KVM probe for the microvm tier: a one-page real-mode guest that loops on `out dx, al`, so every
//! `KVM_RUN` returns after exactly one VM exit. Hardware KVM does a round trip in ~1–5 µs; KVM on top of emulated
//! (not hardware-assisted) nested virtualisation takes milliseconds. The raw ioctls are declared here (numbers and
//! layouts from `<linux/kvm.h>`, x86_64); this file is the only one in doctor with more than a syscall of `unsafe`.
#![allow(unsafe_code)]

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

/// The device.
pub const KVM_DEVICE: &str = "/dev/kvm";
/// The only stable KVM API version.
const KVM_API_VERSION: i32 = 12;

// ioctl numbers: _IO/_IOR/_IOW(0xAE, nr, size), checked against <linux/kvm.h> on x86_64.
const KVM_GET_API_VERSION: libc::Ioctl = 0xAE00;
const KVM_CREATE_VM: libc::Ioctl = 0xAE01;
const KVM_GET_VCPU_MMAP_SIZE: libc::Ioctl = 0xAE04;
const KVM_CREATE_VCPU: libc::Ioctl = 0xAE41;
const KVM_SET_USER_MEMORY_REGION: libc::Ioctl = 0x4020_AE46_u32 as libc::Ioctl;
const KVM_SET_TSS_ADDR: libc::Ioctl = 0xAE47;
const KVM_RUN: libc::Ioctl = 0xAE80;
const KVM_GET_REGS: libc::Ioctl = 0x8090_AE81_u32 as libc::Ioctl;
const KVM_SET_REGS: libc::Ioctl = 0x4090_AE82_u32 as libc::Ioctl;
const KVM_GET_SREGS: libc::Ioctl = 0x8138_AE83_u32 as libc::Ioctl;
const KVM_SET_SREGS: libc::Ioctl = 0x4138_AE84_u32 as libc::Ioctl;

/// `kvm_run.exit_reason` for a port I/O exit.
const KVM_EXIT_IO: u32 = 2;
/// Offset of `exit_reason` in `struct kvm_run`.
const RUN_EXIT_REASON_OFFSET: usize = 8;
/// Offset of `io.port` in `struct kvm_run` (the exit union starts at 32; `direction`, `size` precede `port`).
const RUN_IO_PORT_OFFSET: usize = 34;

/// Guest-physical address (and real-mode linear address) of the code page.
const GUEST_CODE_ADDR: u64 = 0x1000;
/// The port the guest writes to.
const GUEST_PORT: u16 = 0x3f8;
/// `mov dx, 0x3f8; top: mov cx, bx; l: dec cx; jnz l; out dx, al; jmp top`: every KVM_RUN spins `bx` times
/// (bx = 1: effectively no work) and then exits once.
const GUEST_CODE: [u8; 12] = [
    0xBA, 0xF8, 0x03, // mov dx, 0x3f8
    0x89, 0xD9, // top: mov cx, bx
    0x49, // l: dec cx
    0x75, 0xFD, // jnz l
    0xEE, // out dx, al
    0xEB, 0xF8, // jmp top
    0xF4, // hlt (never reached)
];
/// Where the VMX TSS goes when the CPU needs one for real mode (top of the 32-bit space, as QEMU does).
const TSS_ADDR: libc::c_ulong = 0xfffb_d000;
const PAGE: usize = 4096;

/// `struct kvm_userspace_memory_region`.
#[repr(C)]
struct MemoryRegion {
    slot: u32,
    flags: u32,
    guest_phys_addr: u64,
    memory_size: u64,
    userspace_addr: u64,
}

/// `struct kvm_regs`.
#[repr(C)]
#[derive(Default)]
struct Regs {
    rax: u64,
    rbx: u64,
    rcx: u64,
    rdx: u64,
    rsi: u64,
    rdi: u64,
    rsp: u64,
    rbp: u64,
    r8: u64,
    r9: u64,
    r10: u64,
    r11: u64,
    r12: u64,
    r13: u64,
    r14: u64,
    r15: u64,
    rip: u64,
    rflags: u64,
}

/// `struct kvm_segment`.
#[repr(C)]
#[derive(Default)]
struct Segment {
    base: u64,
    limit: u32,
    selector: u16,
    type_: u8,
    present: u8,
    dpl: u8,
    db: u8,
    s: u8,
    l: u8,
    g: u8,
    avl: u8,
    unusable: u8,
    padding: u8,
}

/// `struct kvm_dtable`.
#[repr(C)]
#[derive(Default)]
struct DescriptorTable {
    base: u64,
    limit: u16,
    padding: [u16; 3],
}

/// `struct kvm_sregs` (x86).
#[repr(C)]
#[derive(Default)]
struct Sregs {
    cs: Segment,
    ds: Segment,
    es: Segment,
    fs: Segment,
    gs: Segment,
    ss: Segment,
    tr: Segment,
    ldt: Segment,
    gdt: DescriptorTable,
    idt: DescriptorTable,
    cr0: u64,
    cr2: u64,
    cr3: u64,
    cr4: u64,
    cr8: u64,
    efer: u64,
    apic_base: u64,
    interrupt_bitmap: [u64; 4],
}

const _: () = assert!(size_of::<MemoryRegion>() == 32);
const _: () = assert!(size_of::<Regs>() == 144);
const _: () = assert!(size_of::<Sregs>() == 312);

/// Guest loop iterations per KVM_RUN in the compute phase (hardware: ~7 µs of work; emulated: ~35 ms).
pub const SPIN_ITERATIONS: u16 = 20_000;

/// How much to measure and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbePlan {
    /// Bare exits to time (the guest does no work between them).
    pub exits: u32,
    /// Runs of SPIN_ITERATIONS guest loop iterations to time.
    pub spins: u32,
    /// Time limit of each of the two phases; a phase stops early (after at least one run) when it is spent.
    pub phase_budget: Duration,
}

/// What the probe measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timings {
    /// KVM_CREATE_VM through the vCPU's registers being set.
    pub setup: Duration,
    /// The first KVM_RUN (first entry into the guest) until its exit.
    pub first_run: Duration,
    /// How many bare exits were timed (VM exit + return to user space + re-entry).
    pub exits: u32,
    /// The time those exits took together.
    pub exits_time: Duration,
    /// How many runs of SPIN_ITERATIONS guest instructions pairs (`dec`, `jnz`) were timed.
    pub spins: u32,
    /// The time those runs took together.
    pub spins_time: Duration,
}

/// Which step of the probe failed.
#[derive(Debug)]
pub enum ProbeError {
    /// `/dev/kvm` could not be opened read-write.
    Open(io::Error),
    /// The kernel speaks another KVM API version.
    ApiVersion(i32),
    /// An ioctl (or mmap) failed; `call` names it.
    Call {
        /// The failing call, e.g. `KVM_CREATE_VM`.
        call: &'static str,
        /// errno.
        source: io::Error,
    },
    /// The guest exited for something other than its `out` (reason and port from `kvm_run`).
    UnexpectedExit {
        /// `kvm_run.exit_reason`.
        reason: u32,
        /// `kvm_run.io.port` (meaningful for I/O exits only).
        port: u16,
    },
}

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeError::Open(e) => write!(f, "opening {KVM_DEVICE} read-write: {e}"),
            ProbeError::ApiVersion(v) => {
                write!(f, "KVM API version {v}, expected {KVM_API_VERSION}")
            }
            ProbeError::Call { call, source } => write!(f, "{call}: {source}"),
            ProbeError::UnexpectedExit { reason, port } => {
                write!(f, "unexpected guest exit (reason {reason}, port {port:#x})")
            }
        }
    }
}

impl std::error::Error for ProbeError {}

/// Opens the device read-write (the device check's test).
pub fn open_device() -> Result<File, ProbeError> {
    OpenOptions::new().read(true).write(true).open(KVM_DEVICE).map_err(ProbeError::Open)
}

/// Builds the VM, then times `plan.exits` bare exits and `plan.spins` runs of guest compute (each phase stopping
/// early once its budget is spent). A single KVM_RUN cannot be interrupted here; callers wanting a hard deadline
/// run this on its own thread.
pub fn probe(plan: ProbePlan) -> Result<Timings, ProbeError> {
    let kvm = open_device()?;
    let version = ioctl_arg(kvm.as_raw_fd(), KVM_GET_API_VERSION, 0, "KVM_GET_API_VERSION")?;
    if version != KVM_API_VERSION {
        return Err(ProbeError::ApiVersion(version));
    }
    // Declared before the VM so that it is unmapped only after the VM is gone.
    let memory = Mapping::anonymous(PAGE)?;
    let started = Instant::now();
    let vm = new_fd(ioctl_arg(kvm.as_raw_fd(), KVM_CREATE_VM, 0, "KVM_CREATE_VM")?);
    // Only needed on Intel CPUs without unrestricted guest; harmless elsewhere, so failures are ignored.
    let _ = ioctl_arg(vm.as_raw_fd(), KVM_SET_TSS_ADDR, TSS_ADDR, "KVM_SET_TSS_ADDR");

    // SAFETY: `memory` is a fresh, writable, page-sized private mapping and GUEST_CODE is shorter than a page.
    unsafe {
        std::ptr::copy_nonoverlapping(GUEST_CODE.as_ptr(), memory.ptr.as_ptr().cast::<u8>(), GUEST_CODE.len());
    }
    let region = MemoryRegion {
        slot: 0,
        flags: 0,
        guest_phys_addr: GUEST_CODE_ADDR,
        memory_size: PAGE as u64,
        userspace_addr: memory.ptr.as_ptr() as u64,
    };
    set_memory_region(&vm, &region)?;

    let vcpu = new_fd(ioctl_arg(vm.as_raw_fd(), KVM_CREATE_VCPU, 0, "KVM_CREATE_VCPU")?);
    let run_size = ioctl_arg(kvm.as_raw_fd(), KVM_GET_VCPU_MMAP_SIZE, 0, "KVM_GET_VCPU_MMAP_SIZE")?;
    let run = Mapping::vcpu_run(vcpu.as_raw_fd(), usize::try_from(run_size).unwrap_or(0))?;

    let mut sregs = Sregs::default();
    get_sregs(&vcpu, &mut sregs)?;
    sregs.cs.base = 0;
    sregs.cs.selector = 0;
    set_sregs(&vcpu, &sregs)?;
    let regs = Regs {
        rbx: 1, // no spinning in the first phase
        rip: GUEST_CODE_ADDR,
        rflags: 0x2, // bit 1 is reserved and must be set
        ..Regs::default()
    };
    set_regs(&vcpu, &regs)?;
    let setup = started.elapsed();

    let first = Instant::now();
    run_once(&vcpu, &run)?;
    let first_run = first.elapsed();

    let (exits, exits_time) = timed_runs(&vcpu, &run, plan.exits, plan.phase_budget)?;

    // The guest is stopped right after its `out`; it re-reads bx at `top`.
    let mut regs = Regs::default();
    get_regs(&vcpu, &mut regs)?;
    regs.rbx = u64::from(SPIN_ITERATIONS);
    set_regs(&vcpu, &regs)?;
    let (spins, spins_time) = timed_runs(&vcpu, &run, plan.spins, plan.phase_budget)?;

    Ok(Timings { setup, first_run, exits, exits_time, spins, spins_time })
}

/// Up to `max` KVM_RUNs (at least one), stopping once `budget` is spent; how many ran and how long they took.
fn timed_runs(vcpu: &OwnedFd, run: &Mapping, max: u32, budget: Duration) -> Result<(u32, Duration), ProbeError> {
    let started = Instant::now();
    let mut runs = 0;
    while runs < max.max(1) && (runs == 0 || started.elapsed() < budget) {
        run_once(vcpu, run)?;
        runs += 1;
    }
    Ok((runs, started.elapsed()))
}

/// One KVM_RUN, which must end in the guest's `out` to GUEST_PORT.
fn run_once(vcpu: &OwnedFd, run: &Mapping) -> Result<(), ProbeError> {
    ioctl_arg(vcpu.as_raw_fd(), KVM_RUN, 0, "KVM_RUN")?;
    let base = run.ptr.as_ptr().cast::<u8>();
    // SAFETY: `run` maps at least one page (checked in `vcpu_run`), so both offsets are inside it; the mapping is
    // page-aligned, so the u32 at offset 8 is aligned (the u16 is read unaligned anyway). The kernel writes the page
    // only during KVM_RUN, which has returned.
    let (reason, port) = unsafe {
        (
            base.add(RUN_EXIT_REASON_OFFSET).cast::<u32>().read_volatile(),
            base.add(RUN_IO_PORT_OFFSET).cast::<u16>().read_unaligned(),
        )
    };
    if reason == KVM_EXIT_IO && port == GUEST_PORT { Ok(()) } else { Err(ProbeError::UnexpectedExit { reason, port }) }
}

/// An ioctl taking an integer argument; returns its non-negative result.
fn ioctl_arg(fd: RawFd, request: libc::Ioctl, arg: libc::c_ulong, call: &'static str) -> Result<i32, ProbeError> {
    // SAFETY: every request passed here (API version, create VM/vCPU, mmap size, TSS address, run) takes an integer
    // argument, not a pointer; an invalid fd only makes the call fail with EBADF.
    let ret = unsafe { libc::ioctl(fd, request, arg) };
    if ret < 0 { Err(ProbeError::Call { call, source: io::Error::last_os_error() }) } else { Ok(ret) }
}

/// An ioctl taking a pointer to a `#[repr(C)]` struct; `Err` names `call`.
///
/// # Safety
/// `arg` must point to a live value of exactly the struct (and size) that `request` encodes, writable when the
/// kernel writes it (`_IOR`).
unsafe fn ioctl_struct<T>(
    fd: RawFd,
    request: libc::Ioctl,
    arg: *const T,
    call: &'static str,
) -> Result<(), ProbeError> {
    // SAFETY: upheld by the caller (see `# Safety`); a bad fd only makes the call fail with EBADF.
    let ret = unsafe { libc::ioctl(fd, request, arg) };
    if ret < 0 { Err(ProbeError::Call { call, source: io::Error::last_os_error() }) } else { Ok(()) }
}

/// KVM_SET_USER_MEMORY_REGION.
fn set_memory_region(vm: &OwnedFd, region: &MemoryRegion) -> Result<(), ProbeError> {
    // SAFETY: the request takes a `struct kvm_userspace_memory_region`, which `MemoryRegion` mirrors (size checked
    // at compile time); the kernel only reads it. The memory it names stays mapped while the VM exists.
    unsafe { ioctl_struct(vm.as_raw_fd(), KVM_SET_USER_MEMORY_REGION, region, "KVM_SET_USER_MEMORY_REGION") }
}

/// KVM_GET_REGS.
fn get_regs(vcpu: &OwnedFd, regs: &mut Regs) -> Result<(), ProbeError> {
    // SAFETY: the request writes a `struct kvm_regs`, which `Regs` mirrors (size checked); `regs` is exclusive.
    unsafe { ioctl_struct(vcpu.as_raw_fd(), KVM_GET_REGS, &raw mut *regs, "KVM_GET_REGS") }
}

/// KVM_SET_REGS.
fn set_regs(vcpu: &OwnedFd, regs: &Regs) -> Result<(), ProbeError> {
    // SAFETY: the request reads a `struct kvm_regs`, which `Regs` mirrors (size checked).
    unsafe { ioctl_struct(vcpu.as_raw_fd(), KVM_SET_REGS, regs, "KVM_SET_REGS") }
}

/// KVM_GET_SREGS.
fn get_sregs(vcpu: &OwnedFd, sregs: &mut Sregs) -> Result<(), ProbeError> {
    // SAFETY: the request writes a `struct kvm_sregs`, which `Sregs` mirrors (size checked); `sregs` is exclusive.
    unsafe { ioctl_struct(vcpu.as_raw_fd(), KVM_GET_SREGS, &raw mut *sregs, "KVM_GET_SREGS") }
}

/// KVM_SET_SREGS.
fn set_sregs(vcpu: &OwnedFd, sregs: &Sregs) -> Result<(), ProbeError> {
    // SAFETY: the request reads a `struct kvm_sregs`, which `Sregs` mirrors (size checked).
    unsafe { ioctl_struct(vcpu.as_raw_fd(), KVM_SET_SREGS, sregs, "KVM_SET_SREGS") }
}

/// Takes ownership of a file descriptor returned by a KVM ioctl (always ≥ 0 here).
fn new_fd(fd: i32) -> OwnedFd {
    // SAFETY: `fd` is a descriptor KVM just created for us (ioctl_arg returned it, so it is ≥ 0) and nothing else
    // owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// An mmap'd region, unmapped on drop.
struct Mapping {
    ptr: NonNull<libc::c_void>,
    len: usize,
}

impl Mapping {
    /// Private anonymous read-write memory (the guest's RAM).
    fn anonymous(len: usize) -> Result<Mapping, ProbeError> {
        Mapping::map(len, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, "mmap guest memory")
    }

    /// The vCPU's shared `struct kvm_run`.
    fn vcpu_run(vcpu: RawFd, len: usize) -> Result<Mapping, ProbeError> {
        if len < PAGE {
            return Err(ProbeError::Call {
                call: "KVM_GET_VCPU_MMAP_SIZE",
                source: io::Error::other(format!("size {len} is smaller than a page")),
            });
        }
        Mapping::map(len, libc::MAP_SHARED, vcpu, "mmap kvm_run")
    }

    fn map(len: usize, flags: i32, fd: RawFd, call: &'static str) -> Result<Mapping, ProbeError> {
        // SAFETY: a fresh mapping at a kernel-chosen address (null hint) aliases no Rust object; the result is
        // checked against MAP_FAILED before use.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, fd, 0) };
        if ptr == libc::MAP_FAILED {
            return Err(ProbeError::Call { call, source: io::Error::last_os_error() });
        }
        NonNull::new(ptr)
            .map(|ptr| Mapping { ptr, len })
            .ok_or(ProbeError::Call { call, source: io::Error::other("mmap returned null") })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned and nothing borrows the region past this point.
        unsafe {
            libc::munmap(self.ptr.as_ptr(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_runs_the_guest_when_kvm_is_usable() {
        if open_device().is_err() {
            return;
        }
        let plan = ProbePlan { exits: 10, spins: 2, phase_budget: Duration::from_millis(200) };
        match probe(plan) {
            Ok(timings) => assert!(timings.exits >= 1 && timings.spins >= 1, "{timings:?}"),
            Err(e) => panic!("probe failed: {e}"),
        }
    }
}
