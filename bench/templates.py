#!/usr/bin/python3
"""Templates: the built-in `python-data` template's build time cold vs cached, and a first cell `import pandas` in it
cold vs from a warm pool whose Python zygote preloaded pandas (the template's `preload`).

Builds: `sandkasten template build --allow-registry-addresses templates/python-data.toml` into an empty cache
(`--cold` times, each a new cache: every wheel downloaded and installed again), then again into the last cache with
no change (`--cached` times: every step a cache hit, the `ready` check run again). Wall time and the CPU time of the
build's processes (the CLI and everything below it, as `getrusage(RUSAGE_CHILDREN)` counts them).

First cell: one `sandkasten serve` (bench/warm.py's `Server`) reading that cache, with one pool of `python-data`
(`min = 4`, `max = 8`, `zygote = "python"`, its preload `numpy` and `pandas`, limits `pids = 127`); `POST /v1/run`
of `import pandas; print(pandas.__version__)` with the template and `pids = 127` takes a pool member and forks from
its zygote, with `pids = 124` it creates its sandbox and a new Python imports pandas. The peer in the same rounds is
the host's bare `/usr/bin/python3 -c 'import pandas; …'` (Debian's pandas, no sandbox). The three interleave, one of
each per round; before each run the client waits until the pool is full. Latency is `time.perf_counter_ns()` around
the request (the output comes at the cell's end, so this is the time to the first output); CPU per run is the
host-wide busy time (`/proc/stat`) during the request, which also counts anything else the machine does then.
Writes bench/results/templates.json and re-renders docs/benchmarks.md. Standard library only; run as root.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.dont_write_bytecode = True  # no bench/__pycache__
sys.path.insert(0, str(Path(__file__).resolve().parent))
import warm  # noqa: E402 - the shared server and client

ROOT = warm.ROOT
DEFAULT_JSON = ROOT / "bench" / "results" / "templates.json"
SPEC = ROOT / "templates" / "python-data.toml"
CODE = "import pandas; print(pandas.__version__)"
POOL_MIN, POOL_MAX = 4, 8
POOLED_PIDS, UNPOOLED_PIDS = 127, 124


def busy_jiffies() -> int:
    """Host-wide CPU time spent not idle, in clock ticks (`/proc/stat`'s first line minus idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4]


def tick_ms() -> float:
    return 1000 / os.sysconf("SC_CLK_TCK")


def build(binary: str, cache: Path) -> dict:
    """One `template build` into `cache`: wall and CPU ms, and whether every step was a cache hit."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter_ns()
    done = subprocess.run([binary, "template", "--cache", str(cache), "build", "--json", "--allow-registry-addresses",
                           str(SPEC)], capture_output=True, text=True, check=False)
    wall = (time.perf_counter_ns() - started) / 1e6
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"template build exited {done.returncode}: {done.stderr[-2000:]}")
    cpu = ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) * 1000
    steps = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    cached = [s.get("cached") for s in steps if s.get("event") == "step"]
    return {"wall_ms": wall, "cpu_ms": cpu, "all_cached": bool(cached) and all(cached)}


def measure_builds(binary: str, cold: int, cached: int, keep: Path) -> dict:
    rows: dict = {"cold": [], "cached": []}
    for i in range(cold):
        cache = keep if i == cold - 1 else Path(tempfile.mkdtemp(prefix="sk-bench-templates-", dir="/var/tmp"))
        try:
            row = build(binary, cache)
        finally:
            if cache != keep:
                shutil.rmtree(cache, ignore_errors=True)
        warm.log(f"  cold build {i + 1}/{cold}: {row['wall_ms'] / 1000:.1f} s")
        rows["cold"].append(row)
    for i in range(cached):
        row = build(binary, keep)
        warm.log(f"  cached build {i + 1}/{cached}: {row['wall_ms'] / 1000:.2f} s (all cached: {row['all_cached']})")
        rows["cached"].append(row)
    return {
        kind: {"wall_ms": warm.stats_ms([r["wall_ms"] for r in runs]), "cpu_ms": warm.stats_ms([r["cpu_ms"] for r in runs]),
               "all_cached": all(r["all_cached"] for r in runs)}
        for kind, runs in rows.items()
    }


def wait_full(client: warm.Client, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _, body, _ = client.request("GET", "/v1/pools")
        pools = body.get("pools", []) if isinstance(body, dict) else []
        if pools and all(p.get("ready", 0) >= POOL_MIN for p in pools):
            return
        time.sleep(0.005)
    raise RuntimeError(f"the pool was not full after {timeout_s} s")


def measure_cells(server: warm.Server, runs: int) -> list[dict]:
    client = warm.Client(server.port)
    rows = [("bare /usr/bin/python3 (host's pandas)", None), ("sandbox, cold import", UNPOOLED_PIDS),
            ("pool + zygote, pandas preloaded", POOLED_PIDS)]
    samples = {i: ([], [], []) for i in range(len(rows))}  # latency, cpu, errors
    for round_ in range(runs + 2):
        for k in range(len(rows)):
            i = (round_ + k) % len(rows)
            pids = rows[i][1]
            if pids is not None:
                wait_full(client)
            busy = busy_jiffies()
            if pids is None:
                started = time.perf_counter_ns()
                done = subprocess.run(["/usr/bin/python3", "-c", CODE], capture_output=True, text=True, check=False)
                ns = time.perf_counter_ns() - started
                ok, said = done.returncode == 0 and done.stdout.strip() != "", done.stderr[-200:]
            else:
                body = {"template": "python-data", "language": "python", "code": CODE, "limits": {"pids": pids}}
                status, resp, ns = client.request("POST", "/v1/run", body)
                ok = status == 200 and isinstance(resp, dict) and resp.get("exit_code") == 0 and resp.get("stdout")
                said = f"HTTP {status}: {str(resp)[:200]}"
            cpu = (busy_jiffies() - busy) * tick_ms()
            if round_ < 2:
                continue  # untimed warm-up
            lat, cpus, errors = samples[i]
            if not ok:
                errors.append(said)
                continue
            lat.append(ns / 1e6)
            cpus.append(cpu)
    return [{"config": label, "pooled": pids == POOLED_PIDS, "ok": len(samples[i][0]), "errors": len(samples[i][2]),
             "error_samples": samples[i][2][:3], "latency_ms": warm.stats_ms(samples[i][0]),
             "host_cpu_ms": warm.stats_ms(samples[i][1])}
            for i, (label, pids) in enumerate(rows)]


def main() -> int:
    args = warm.bench_args(__doc__, DEFAULT_JSON, "template builds and sandkasten serve need it")
    if args is None:
        return 1
    binary = str(Path(args.sandkasten).resolve())
    cold, cached, runs = (1, 3, 10) if args.quick else (3, 5, 40)
    results: dict = {"machine": warm.machine(binary), "params": {"quick": args.quick, "cold_builds": cold,
                     "cached_builds": cached, "runs": runs, "pool_min": POOL_MIN, "pool_max": POOL_MAX},
                     "builds": {}, "cells": [], "errors": []}
    results["loadavg_before"] = [round(x, 2) for x in os.getloadavg()]
    started = time.monotonic()
    cache = Path(tempfile.mkdtemp(prefix="sk-bench-templates-", dir="/var/tmp"))
    server = None
    try:
        warm.log(f"templates: {cold} cold builds of python-data, then {cached} cached ones")
        results["builds"] = measure_builds(binary, cold, cached, cache)
        pool = ["", "[templates]", f'cache = "{cache}"', "", "[[pools]]", 'name = "python-data"',
                'template = "python-data"', f"min = {POOL_MIN}", f"max = {POOL_MAX}", 'zygote = "python"',
                f"limits = {{ pids = {POOLED_PIDS} }}"]
        server = warm.Server(binary, False, pool, max_sandboxes=64)
        server.start()
        warm.log(f"templates: first cell `import pandas`, bare / cold sandbox / pooled zygote, {runs} rounds")
        results["cells"] = measure_cells(server, runs)
        for row in results["cells"]:
            s = row["latency_ms"] or {}
            warm.log(f"  {row['config']}: p50 {s.get('p50', 0):.1f} ms p99 {s.get('p99', 0):.1f} ms, "
                     f"{row['ok']} ok / {row['errors']} errors")
    except Exception as e:  # noqa: BLE001 - recorded in the results and the doc
        results["errors"].append(f"{e!r}" + (f"; server log: {server.log_tail()}" if server else ""))
    finally:
        if server is not None:
            server.stop()
            results["leftovers"], _ = warm.wait_clean(15)
            server.cleanup()
        shutil.rmtree(cache, ignore_errors=True)
    return warm.finish(results, started, args.json, not args.no_render)


if __name__ == "__main__":
    sys.exit(main())
