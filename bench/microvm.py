#!/usr/bin/python3
"""microVM benchmark: `sandkasten run --isolation microvm -- /bin/true` (record, cgroup, disk, the VMM's jail, QEMU,
guest boot, the agent, one command, destroy) against a bare `qemu-system-x86_64 -M microvm` boot of the same
kernel, initramfs modules and root image to a trivial init that runs the root's `/bin/true` and powers off: the
floor under the tier (no jail, no agent, no sandbox disk, no protocol). Interleaved rounds, wall time and CPU time
per operation (the children's user + system time: on a shared, noisy host CPU per operation is the steadier
figure), medians and p99; plus the host memory of an idle microVM sandbox (its cgroup's charge, QEMU's RSS and
QEMU's own share beside the guest's resident RAM) against the guest's RAM, and (through one `sandkasten serve`)
restore from a memory snapshot → first command and a pooled create → first command. The acceleration used (`tcg` or `kvm`) is recorded beside every figure.

Writes bench/results/microvm.json and re-renders docs/benchmarks.md unless `--no-render`. Standard library only;
run as root after scripts/setup.sh.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON = ROOT / "bench" / "results" / "microvm.json"
MICROVM_DIR = Path("/var/lib/sandkasten/microvm")
GUEST_MIB = 256
READY = "sandkasten-bench-ready"

# The bare guest's init: the same steps as resources/microvm/init up to the root, then the root's /bin/true.
BARE_INIT = f"""#!/bin/busybox sh
bb=/bin/busybox
$bb mount -t devtmpfs dev /dev
$bb mount -t proc proc /proc
$bb mount -t sysfs sys /sys
for m in virtio_ring virtio virtio_mmio virtio_blk virtio_console overlay; do $bb insmod /modules/$m.ko; done
until [ -e /dev/vda ]; do $bb usleep 10000; done
$bb mkdir -p /lower
$bb mount -t ext4 -o ro,noload /dev/vda /lower
$bb chroot /lower /bin/true && echo {READY} > /dev/ttyS0
$bb reboot -f
"""


def newc(entries: list[tuple[str, int, bytes]]) -> bytes:
    """A cpio `newc` archive of (path, mode, contents) plus its trailer (the kernel unpacks concatenated archives)."""
    out = bytearray()
    for ino, (name, mode, data) in enumerate(entries + [("TRAILER!!!", 0, b"")], start=1):
        encoded = name.encode() + b"\0"
        fields = [ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0]
        out += b"070701" + b"".join(f"{field:08x}".encode() for field in fields) + encoded
        out += b"\0" * (-len(out) % 4) + data + b"\0" * (-(len(out) + len(data)) % 4)
    return bytes(out)


def host_tsc_khz() -> int:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("cpu MHz"):
            return int(float(line.split(":")[1]) * 1000)
    return 2_000_000


def children_cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1000


def accel_args(accel: str) -> list[str]:
    """QEMU's `-accel`/`-cpu` as the tier passes them (crates/runtime/src/backend/microvm/qemu.rs `accel_args`)."""
    if accel == "kvm":
        return ["-accel", "kvm", "-cpu", "max,-arch-capabilities"]
    return ["-accel", "tcg,tb-size=32", "-cpu", "max"]


def bare_boot(initrd: Path, accel: str) -> tuple[float, float]:
    """One bare QEMU boot to READY and power-off: (wall ms until READY, CPU ms of the whole run)."""
    khz = host_tsc_khz()
    argv = [
        "qemu-system-x86_64", "-M", "microvm,acpi=on", *accel_args(accel),
        "-m", f"{GUEST_MIB}M", "-smp", "1", "-nodefaults", "-no-user-config", "-no-reboot", "-display", "none",
        "-kernel", str(MICROVM_DIR / "vmlinuz"), "-initrd", str(initrd),
        "-append", f"console=ttyS0 quiet loglevel=3 panic=-1 reboot=t no_timer_check tsc_early_khz={khz} "
                   f"lpj={khz * 4} rdinit=/bench-init 8250.nr_uarts=1 random.trust_cpu=on",
        "-drive", f"file={MICROVM_DIR / 'rootfs.ext4'},format=raw,if=none,id=root,readonly=on,file.locking=off",
        "-device", "virtio-blk-device,drive=root", "-serial", "stdio",
    ]
    cpu = children_cpu_ms()
    start = time.perf_counter_ns()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    ready = None
    assert process.stdout is not None
    for line in process.stdout:
        if READY.encode() in line and ready is None:
            ready = (time.perf_counter_ns() - start) / 1e6
    process.wait(timeout=120)
    if ready is None:
        raise RuntimeError("the bare guest never said it was ready")
    return ready, children_cpu_ms() - cpu


def sandkasten_run(binary: Path) -> tuple[float, float, dict]:
    """One `sandkasten run --isolation microvm`: (wall ms to the result, CPU ms, the result's phases)."""
    cpu = children_cpu_ms()
    start = time.perf_counter_ns()
    done = subprocess.run(
        [str(binary), "run", "--isolation", "microvm", "--memory", f"{GUEST_MIB}MiB", "--timeout", "60s", "--json",
         "--", "/bin/true"],
        capture_output=True, text=True, timeout=180,
    )
    wall = (time.perf_counter_ns() - start) / 1e6
    result = json.loads(done.stdout or "{}")
    if result.get("exit_code") != 0:
        raise RuntimeError(f"sandkasten run failed: {done.stdout[:300]} {done.stderr[:300]}")
    phases = dict(result.get("phases", {}))
    phases["accel"] = (result.get("isolation") or {}).get("accel")
    return wall, children_cpu_ms() - cpu, phases


def memory_cgroups() -> tuple[list[Path], str]:
    """The sandboxes' memory cgroups and the file holding their charge (cgroup v1's memory controller or v2)."""
    v1 = Path("/sys/fs/cgroup/memory/sandkasten")
    if v1.is_dir():
        return list(v1.glob("sb-*")), "memory.usage_in_bytes"
    return list(Path("/sys/fs/cgroup/sandkasten").glob("sb-*")), "memory.current"


def qemu_memory(pid: str) -> tuple[int, int]:
    """(QEMU's RSS, the resident part of its guest-RAM mapping) from /proc/PID/smaps: the guest's RAM is the one
    mapping at least the guest's size; everything else resident is QEMU's own (heap, translation cache, libraries)."""
    rss = guest = 0
    size = resident = 0
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        field = line.split()
        if not field[0].endswith(":") or len(field) < 2:
            # A new mapping's header: settle the previous one.
            if size >= (GUEST_MIB << 10):
                guest += resident << 10
            size = resident = 0
        elif field[0] == "Size:":
            size = int(field[1])
        elif field[0] == "Rss:":
            resident = int(field[1])
            rss += resident << 10
    if size >= (GUEST_MIB << 10):
        guest += resident << 10
    return rss, guest


def idle_memory(binary: Path) -> dict:
    """The host memory of an idle microVM sandbox, a few seconds after boot: its cgroup's charge, QEMU's RSS, and how
    much of that RSS is the guest's RAM (touched pages) and how much QEMU's own."""
    process = subprocess.Popen(
        [str(binary), "run", "--isolation", "microvm", "--memory", f"{GUEST_MIB}MiB", "--timeout", "60s", "--",
         "/bin/sh", "-c", "echo up; sleep 20"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    assert process.stdout is not None
    process.stdout.readline()
    time.sleep(5)
    charged = rss = guest = None
    cgroups, charge_file = memory_cgroups()
    for cgroup in cgroups:
        charged = int((cgroup / charge_file).read_text())
        for pid in (cgroup / "cgroup.procs").read_text().split():
            if "qemu" in Path(f"/proc/{pid}/comm").read_text():
                rss, guest = qemu_memory(pid)
    process.kill()
    process.wait()
    return {"guest_ram_bytes": GUEST_MIB << 20, "cgroup_charge_bytes": charged, "qemu_rss_bytes": rss,
            "guest_resident_bytes": guest, "qemu_own_bytes": None if rss is None else rss - (guest or 0)}


def restore_from_memory(binary: Path, rounds: int) -> dict:
    """Through one `sandkasten serve`: a memory snapshot of an idle microVM sandbox, then `rounds` creates from it,
    each timed until its first command answers (QEMU loads the migration file, `cont`, the agent serves on)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from warm import Client, Server  # noqa: E402

    server = Server(str(binary), pooled=False, extra=["", "[snapshots]", "gc_grace_s = 0"], max_sandboxes=64)
    server.start()
    try:
        client = Client(server.port)

        def call(method: str, path: str, body: dict | None = None) -> dict:
            status, answer, _ = client.request(method, path, body)
            if status not in (200, 201, 204):
                raise RuntimeError(f"{method} {path}: {status} {answer}")
            return answer if isinstance(answer, dict) else {}

        limits = {"memory_bytes": GUEST_MIB << 20, "timeout_ms": 60_000}
        source = call("POST", "/v1/sandboxes", {"isolation": "microvm", "timeout_s": 3600, "limits": limits})["id"]
        start = time.perf_counter_ns()
        snapshot = call("POST", f"/v1/sandboxes/{source}/snapshots", {"memory": True})
        snapshot_ms = (time.perf_counter_ns() - start) / 1e6
        walls = []
        for _ in range(rounds):
            start = time.perf_counter_ns()
            copy = call("POST", "/v1/sandboxes", {"snapshot": snapshot["snapshot_id"]})["id"]
            call("POST", f"/v1/sandboxes/{copy}/exec", {"cmd": "true"})
            walls.append((time.perf_counter_ns() - start) / 1e6)
            call("DELETE", f"/v1/sandboxes/{copy}")
        call("DELETE", f"/v1/snapshots/{snapshot['snapshot_id']}")
        call("DELETE", f"/v1/sandboxes/{source}")
        return {"snapshot_ms": snapshot_ms, "size_bytes": snapshot.get("size_bytes"), "wall_ms": stats(walls)}
    finally:
        server.stop()
        server.cleanup()


def pooled_create(binary: Path, rounds: int) -> dict:
    """Through one `sandkasten serve` with a pool of one booted microVM: `rounds` creates, each timed until its first
    command answers (the pool hands over a booted VM), the pool refilled before the next round."""
    sys.path.insert(0, str(ROOT / "bench"))
    from warm import Client, Server  # noqa: E402

    pool = ["", "[[pools]]", 'name = "vm"', 'isolation = "microvm"', "min = 1", "max = 1"]
    server = Server(str(binary), pooled=False, extra=pool, max_sandboxes=64)
    server.start()
    try:
        client = Client(server.port)

        def pool_size() -> float:
            _, text, _ = client.request("GET", "/metrics")
            for line in str(text).splitlines():
                if line.startswith('sandkasten_pool_size{class="vm"}'):
                    return float(line.split()[-1])
            return 0.0

        def wait_full() -> None:
            deadline = time.monotonic() + 180
            while pool_size() < 1:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the microVM pool did not fill in 180 s: {server.log_tail()}")
                time.sleep(0.2)

        def call(method: str, path: str, body: dict | None = None) -> dict:
            status, answer, _ = client.request(method, path, body)
            if status not in (200, 201, 204):
                raise RuntimeError(f"{method} {path}: {status} {answer}")
            return answer if isinstance(answer, dict) else {}

        walls, boots = [], []
        for _ in range(rounds):
            wait_full()
            time.sleep(1)  # the refilled VM's guest settles, as a pool's members do between claims
            start = time.perf_counter_ns()
            created = call("POST", "/v1/sandboxes", {"isolation": "microvm"})
            call("POST", f"/v1/sandboxes/{created['id']}/exec", {"cmd": "true"})
            walls.append((time.perf_counter_ns() - start) / 1e6)
            boots.append(created.get("vm_boot_ms") or 0.0)
            call("DELETE", f"/v1/sandboxes/{created['id']}")
        return {"wall_ms": stats(walls), "vm_boot_ms_reported": stats(boots)}
    finally:
        server.stop()
        server.cleanup()


def stats(values: list[float]) -> dict:
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"n": len(ordered), "p50": pick(0.5), "p99": pick(0.99), "min": ordered[0], "max": ordered[-1]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", type=Path, default=ROOT / "target" / "release" / "sandkasten")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--no-render", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        initrd = Path(scratch) / "bench-initrd.img"
        initrd.write_bytes((MICROVM_DIR / "initrd.img").read_bytes() + newc([("bench-init", 0o100755, BARE_INIT.encode())]))
        bare_wall, bare_cpu, sk_wall, sk_cpu, phases = [], [], [], [], []
        # Warm-up, not recorded: the first run of a build makes the agent's disk image; the first boot fills the
        # host's page cache with the kernel and images.
        # The bare boot uses the acceleration sandkasten chose (its speed probe's verdict), so the two compare.
        accel = sandkasten_run(args.binary)[2].get("accel") or "tcg"
        bare_boot(initrd, accel)
        for round_ in range(args.rounds):
            wall, cpu = bare_boot(initrd, accel)
            bare_wall.append(wall)
            bare_cpu.append(cpu)
            wall, cpu, phase = sandkasten_run(args.binary)
            sk_wall.append(wall)
            sk_cpu.append(cpu)
            phases.append(phase)
            print(f"round {round_ + 1}/{args.rounds}: bare {bare_wall[-1]:.0f} ms, sandkasten {wall:.0f} ms", file=sys.stderr)
        memory = idle_memory(args.binary)
        restore = restore_from_memory(args.binary, args.rounds)
        pooled = pooled_create(args.binary, args.rounds)
    accels = sorted({str(phase.pop("accel", None)) for phase in phases})
    phase_names = sorted({name for phase in phases for name in phase})
    results = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "kernel": platform.release(), "load": os.getloadavg()},
        "accel": "/".join(accels),
        "guest_mib": GUEST_MIB,
        "bare_qemu": {"wall_ms": stats(bare_wall), "cpu_ms": stats(bare_cpu)},
        "sandkasten": {
            "wall_ms": stats(sk_wall),
            "cpu_ms": stats(sk_cpu),
            "phases_ms": {name: stats([phase[name] for phase in phases if name in phase]) for name in phase_names},
        },
        "idle_memory": memory,
        "restore_from_memory_snapshot": restore,
        "pooled_create": pooled,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.json}", file=sys.stderr)
    if not args.no_render:
        sys.path.insert(0, str(ROOT / "bench"))
        import render  # noqa: E402

        render.main([])
    return 0


if __name__ == "__main__":
    sys.exit(main())
