#!/usr/bin/python3
"""Snapshot benchmark: `sandkasten serve` over HTTP — pause → resume → first output, filesystem snapshot time and
size against the workspace's size (random and compressible bytes), restore-from-snapshot → first output, fork of 4
(time until all four run), and the chunk dedup of two snapshots of one sandbox a small edit apart; per tier, with the
host's own `tar | zstd -3` of the same bytes beside the snapshot as the floor (what archiving and compressing cost
with no sandbox, no chunking and no store). On gVisor also memory snapshots against the memory a process holds
(idle, 64 MiB, 256 MiB), and bare `runsc checkpoint` / `runsc restore` + `runsc exec echo` of a Python loop as the
floor under pause and resume.

Starts one server (temporary database, config and snapshot store; one tenant with a large quota) and runs each
measurement `--rounds` times per tier; latency is `time.perf_counter_ns()` around the requests. Writes
bench/results/snapshots.json and re-renders docs/benchmarks.md (bench/render.py) unless `--no-render`. Standard
library only; run as root.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from warm import ROOT, Client, Server, log, stats_ms  # noqa: E402

DEFAULT_JSON = ROOT / "bench" / "results" / "snapshots.json"
MiB = 1024 * 1024
# Workspace contents a snapshot is measured with: (label, shell command run inside, bytes).
WORKSPACES = [
    ("empty", "true", 0),
    ("16 MiB random", "head -c 16M /dev/urandom > /workspace/data", 16 * MiB),
    ("64 MiB random", "head -c 64M /dev/urandom > /workspace/data", 64 * MiB),
    ("64 MiB text", "yes 'a line of a log file that repeats' | head -c 64M > /workspace/data", 64 * MiB),
]
TIERS = ["process", "gvisor"]
# Memory a process in the sandbox holds (random bytes: nothing to compress) when a memory snapshot is taken.
MEMORY_IN_USE = [("idle", 0), ("64 MiB", 64), ("256 MiB", 256)]
HOLD_MS = 30 * 60 * 1000
# The program bare runsc checkpoints and restores: a Python loop, like the one the figures were taken with.
BARE_LOOP = "import time\nwhile True:\n    time.sleep(0.05)\n"


def ms_since(start: int) -> float:
    return (time.perf_counter_ns() - start) / 1e6


class Bench:
    def __init__(self, client: Client, tier: str):
        self.client, self.tier = client, tier

    def call(self, method: str, path: str, body: dict | None = None, ok: tuple[int, ...] = (200, 201, 204)) -> dict:
        status, parsed, _ = self.client.request(method, path, body)
        if status not in ok:
            raise RuntimeError(f"{method} {path} → {status}: {str(parsed)[:300]}")
        return parsed if isinstance(parsed, dict) else {}

    def create(self, body: dict | None = None) -> str:
        spec = {"isolation": self.tier, "timeout_s": 3600, "limits": {"disk_bytes": 256 * MiB}}
        spec.update(body or {})
        return self.call("POST", "/v1/sandboxes", spec)["id"]

    def exec(self, sandbox: str, cmd: str) -> dict:
        return self.call("POST", f"/v1/sandboxes/{sandbox}/exec", {"cmd": cmd})

    def delete(self, sandbox: str) -> None:
        self.call("DELETE", f"/v1/sandboxes/{sandbox}")

    def pause_resume(self, rounds: int, mode: str = "memory") -> dict:
        """Pause → resume → first output; `mode="filesystem"` with 4 MiB of files in the workspace (they are saved
        and unpacked each round)."""
        sandbox = self.create()
        body = {"mode": mode}
        if mode == "filesystem":
            self.exec(sandbox, "head -c 4194304 /dev/urandom > /workspace/fill")
        status, answer, _ = self.client.request("POST", f"/v1/sandboxes/{sandbox}/pause", body)
        if status != 200:
            self.delete(sandbox)
            return {"unavailable": answer["error"]["message"] if isinstance(answer, dict) else str(answer)}
        self.call("POST", f"/v1/sandboxes/{sandbox}/resume")
        pause_ms, resume_first_ms = [], []
        for _ in range(rounds):
            start = time.perf_counter_ns()
            self.call("POST", f"/v1/sandboxes/{sandbox}/pause", body)
            pause_ms.append(ms_since(start))
            start = time.perf_counter_ns()
            self.call("POST", f"/v1/sandboxes/{sandbox}/resume")
            self.exec(sandbox, "echo back")
            resume_first_ms.append(ms_since(start))
        self.delete(sandbox)
        return {"pause": stats_ms(pause_ms), "resume_to_first_output": stats_ms(resume_first_ms)}

    def snapshots(self, rounds: int) -> list[dict]:
        rows = []
        for label, fill, size in WORKSPACES:
            sandbox = self.create()
            self.exec(sandbox, fill)
            took, stored, logical, ids = [], 0, 0, []
            for _ in range(rounds):
                start = time.perf_counter_ns()
                snapshot = self.call("POST", f"/v1/sandboxes/{sandbox}/snapshots", {})
                took.append(ms_since(start))
                stored, logical = snapshot["stored_bytes"], snapshot["size_bytes"]
                ids.append(snapshot["snapshot_id"])
            restore_ms = []
            for _ in range(rounds):
                start = time.perf_counter_ns()
                copy = self.call("POST", "/v1/sandboxes", {"snapshot": ids[0], "isolation": self.tier})["id"]
                self.exec(copy, "echo restored")
                restore_ms.append(ms_since(start))
                self.delete(copy)
            for snapshot_id in ids:
                self.call("DELETE", f"/v1/snapshots/{snapshot_id}")
            self.delete(sandbox)
            rows.append({"workspace": label, "bytes": size, "snapshot": stats_ms(took), "size_bytes": logical,
                         "stored_bytes": stored, "restore_to_first_output": stats_ms(restore_ms),
                         "host_tar_zstd": host_tar_zstd(fill, rounds)})
        return rows

    def fork(self, rounds: int) -> dict:
        sandbox = self.create()
        self.exec(sandbox, "head -c 16M /dev/urandom > /workspace/data")
        took = []
        for _ in range(rounds):
            start = time.perf_counter_ns()
            copies = self.call("POST", f"/v1/sandboxes/{sandbox}/fork", {"count": 4})["sandboxes"]
            took.append(ms_since(start))
            for copy in copies:
                self.delete(copy["id"])
        self.delete(sandbox)
        create_ms = []
        for _ in range(rounds):
            start = time.perf_counter_ns()
            self.delete(self.create())
            create_ms.append(ms_since(start))
        return {"fork_of_4_with_16_MiB": stats_ms(took), "create_and_delete_one": stats_ms(create_ms)}

    def memory_snapshots(self, rounds: int) -> list[dict] | dict:
        """Memory snapshot time and size, and restore → first output, against the memory a process holds."""
        rows = []
        for label, mib in MEMORY_IN_USE:
            # The holder runs for the whole measurement: its command (and so the sandbox's) timeout is 30 min.
            limits = {"memory_bytes": 1024 * MiB, "disk_bytes": 256 * MiB, "timeout_ms": HOLD_MS}
            sandbox = self.create({"limits": limits})
            if mib:
                hold = (f"/usr/bin/python3 -c 'import os, time; b = os.urandom({mib} << 20); "
                        "open(\"/tmp/held\", \"w\").close(); time.sleep(3600)'")
                body = {"cmd": hold, "background": True, "timeout_ms": HOLD_MS}
                self.call("POST", f"/v1/sandboxes/{sandbox}/exec", body, ok=(202,))
                self.exec(sandbox, "for i in $(seq 600); do [ -e /tmp/held ] && exit 0; sleep 0.1; done; exit 1")
            status, answer, _ = self.client.request("POST", f"/v1/sandboxes/{sandbox}/snapshots", {"memory": True})
            if status != 201:
                self.delete(sandbox)
                return {"unavailable": answer["error"]["message"] if isinstance(answer, dict) else str(answer)}
            ids, took, size, stored = [answer["snapshot_id"]], [], answer["size_bytes"], answer["stored_bytes"]
            for _ in range(rounds):
                start = time.perf_counter_ns()
                snapshot = self.call("POST", f"/v1/sandboxes/{sandbox}/snapshots", {"memory": True})
                took.append(ms_since(start))
                ids.append(snapshot["snapshot_id"])
                size, stored = snapshot["size_bytes"], snapshot["stored_bytes"]
            if size < mib * MiB:
                raise RuntimeError(f"the {label} memory snapshot's image is {size} bytes: the holder is gone")
            restore_ms = []
            for _ in range(rounds):
                start = time.perf_counter_ns()
                copy = self.call("POST", "/v1/sandboxes", {"snapshot": ids[0]})["id"]
                self.exec(copy, "echo restored")
                restore_ms.append(ms_since(start))
                self.delete(copy)
            for snapshot_id in ids:
                self.call("DELETE", f"/v1/snapshots/{snapshot_id}")
            self.delete(sandbox)
            rows.append({"memory": label, "held_bytes": mib * MiB, "snapshot": stats_ms(took), "size_bytes": size,
                         "stored_bytes": stored, "restore_to_first_output": stats_ms(restore_ms)})
        return rows

    def dedup(self, store: Path) -> dict:
        sandbox = self.create()
        self.exec(sandbox, "head -c 32M /dev/urandom > /workspace/data && echo v1 > /workspace/notes")
        first = self.call("POST", f"/v1/sandboxes/{sandbox}/snapshots", {})
        on_disk_after_first = disk_bytes(store)
        self.exec(sandbox, "echo v2 >> /workspace/notes")
        second = self.call("POST", f"/v1/sandboxes/{sandbox}/snapshots", {})
        added = disk_bytes(store) - on_disk_after_first
        for snapshot in (first, second):
            self.call("DELETE", f"/v1/snapshots/{snapshot['snapshot_id']}")
        self.delete(sandbox)
        return {"second_stored_bytes": second["stored_bytes"], "second_added_to_store_bytes": added,
                "dedup_ratio": 1 - added / second["stored_bytes"] if second["stored_bytes"] else None}


def disk_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def host_tar_zstd(fill: str, rounds: int) -> dict | None:
    """The same bytes archived and compressed on the host, with no sandbox: `tar -c DIR | zstd -3 > FILE`."""
    with tempfile.TemporaryDirectory(prefix="sandkasten-bench-tar-") as work:
        workspace = Path(work) / "workspace"
        workspace.mkdir()
        subprocess.run(["/bin/bash", "-c", fill.replace("/workspace", str(workspace))], check=True)
        took = []
        for _ in range(rounds):
            start = time.perf_counter_ns()
            subprocess.run(["/bin/bash", "-c", f"tar -C {work} -cf - workspace | zstd -q -3 > {work}/out.zst"],
                           check=True)
            took.append(ms_since(start))
        return stats_ms(took)


def bare_runsc(rounds: int) -> dict:
    """The floor under a gVisor pause: bare `runsc checkpoint` of a Python loop (root filesystem the host's `/`,
    read-only, no network), and `runsc restore --detach` plus `runsc exec … echo` (restore → first output), with the
    platform the server uses. No cgroup, no bundle of ours, no agent."""
    with tempfile.TemporaryDirectory(prefix="sandkasten-bench-runsc-") as work:
        bundle, root, image = Path(work) / "bundle", Path(work) / "root", Path(work) / "image"
        bundle.mkdir()
        runsc = ["runsc", f"--root={root}", "--network=none", "--platform=systrap"]
        subprocess.run(["runsc", "spec", "--bundle", str(bundle), "--", "/usr/bin/python3", "-c", BARE_LOOP],
                       check=True)
        config = json.loads((bundle / "config.json").read_text())
        config["root"] = {"path": "/", "readonly": True}
        config["process"]["terminal"] = False
        config["linux"]["namespaces"] = [n for n in config["linux"]["namespaces"] if n["type"] != "network"]
        (bundle / "config.json").write_text(json.dumps(config))
        name = f"bench-{os.getpid()}"
        quiet = {"check": True, "stdout": subprocess.DEVNULL}
        subprocess.run(runsc + ["run", "--detach", "--bundle", str(bundle), name], **quiet)
        checkpoint_ms, restore_ms = [], []
        try:
            for _ in range(rounds):
                subprocess.run(["rm", "-rf", str(image)], check=True)
                image.mkdir()
                start = time.perf_counter_ns()
                subprocess.run(runsc + ["checkpoint", f"--image-path={image}", name], **quiet)
                checkpoint_ms.append(ms_since(start))
                subprocess.run(runsc + ["delete", "--force", name], **quiet)
                start = time.perf_counter_ns()
                subprocess.run(runsc + ["restore", "--detach", f"--image-path={image}", "--bundle", str(bundle), name],
                               **quiet)
                subprocess.run(runsc + ["exec", name, "/bin/echo", "back"], **quiet)
                restore_ms.append(ms_since(start))
        finally:
            subprocess.run(runsc + ["delete", "--force", name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return {"checkpoint": stats_ms(checkpoint_ms), "restore_to_first_output": stats_ms(restore_ms),
                "image_bytes": disk_bytes(image)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandkasten", default=str(ROOT / "target" / "release" / "sandkasten"))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="3 rounds (a smoke test; the doc says so)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--no-render", action="store_true")
    args = parser.parse_args(argv)
    rounds = 3 if args.quick else args.rounds
    server = Server(args.sandkasten, pooled=False, extra=["", "[snapshots]", "gc_grace_s = 0"], max_sandboxes=64)
    server.start()
    results: dict = {"method": {"rounds": rounds, "quick": args.quick, "nproc": os.cpu_count(),
                                "kernel": platform.release(),
                                "when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")},
                     "tiers": {}}
    failed = False
    try:
        client = Client(server.port)
        for tier in TIERS:
            bench = Bench(client, tier)
            row: dict = {}
            tier_runs = [("pause", lambda: bench.pause_resume(rounds)),
                         ("filesystem_pause", lambda: bench.pause_resume(rounds, "filesystem"))]
            if tier == "gvisor":
                tier_runs += [("bare_runsc", lambda: bare_runsc(rounds)),
                              ("memory_snapshots", lambda: bench.memory_snapshots(rounds))]
            tier_runs += [("snapshots", lambda: bench.snapshots(rounds)),
                          ("fork", lambda: bench.fork(rounds)),
                          ("dedup", lambda: bench.dedup(server.dir / "snapshots"))]
            for name, measure in tier_runs:
                log(f"{tier}: {name}")
                try:
                    row[name] = measure()
                except (RuntimeError, OSError, KeyError, subprocess.CalledProcessError) as error:
                    log(f"{tier}: {name} failed: {error}")
                    row[name] = {"error": str(error)}
                    failed = True
            results["tiers"][tier] = row
    finally:
        server.stop()
        server.cleanup()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    log(f"wrote {args.json}")
    if not args.no_render:
        subprocess.run([sys.executable, str(ROOT / "bench" / "render.py")], check=False)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
