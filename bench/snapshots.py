#!/usr/bin/python3
"""Snapshot benchmark: `sandkasten serve` over HTTP — pause → resume → first output, filesystem snapshot time and
size against the workspace's size (random and compressible bytes), restore-from-snapshot → first output, fork of 4
(time until all four run), and the chunk dedup of two snapshots of one sandbox a small edit apart; per tier, with the
host's own `tar | zstd -3` of the same bytes beside the snapshot as the floor (what archiving and compressing cost
with no sandbox, no chunking and no store).

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

    def pause_resume(self, rounds: int) -> dict:
        sandbox = self.create()
        status, answer, _ = self.client.request("POST", f"/v1/sandboxes/{sandbox}/pause", None)
        if status != 200:
            self.delete(sandbox)
            return {"unavailable": answer["error"]["message"] if isinstance(answer, dict) else str(answer)}
        self.call("POST", f"/v1/sandboxes/{sandbox}/resume")
        pause_ms, resume_first_ms = [], []
        for _ in range(rounds):
            start = time.perf_counter_ns()
            self.call("POST", f"/v1/sandboxes/{sandbox}/pause")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandkasten", default=str(ROOT / "target" / "release" / "sandkasten"))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="3 rounds (a smoke test; the doc says so)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--no-render", action="store_true")
    args = parser.parse_args(argv)
    rounds = 3 if args.quick else args.rounds
    server = Server(args.sandkasten, pooled=False, extra=["", "[snapshots]", "gc_grace_s = 0"])
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
            for name, measure in [("pause", lambda: bench.pause_resume(rounds)),
                                  ("snapshots", lambda: bench.snapshots(rounds)),
                                  ("fork", lambda: bench.fork(rounds)),
                                  ("dedup", lambda: bench.dedup(server.dir / "snapshots"))]:
                log(f"{tier}: {name}")
                try:
                    row[name] = measure()
                except (RuntimeError, OSError, KeyError) as error:
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
