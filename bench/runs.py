#!/usr/bin/python3
"""One-shot runs over HTTP: `POST /v1/run` of Python `print(2+2)` and Node `console.log(2+2)` with a fresh sandbox
(no pool), with a warm pool's sandbox, and with a warm pool's sandbox holding a Python or a Node zygote.

Starts one `sandkasten serve` (bench/warm.py's `Server`: temporary database and config, free loopback port, SIGTERM
at the end) with three pools, `min = 4`, `max = 8` each, told apart by their limits (a run takes a pool's sandbox
when its limits equal the pool's; the limits differ only in `pids`, which costs nothing): a plain pool (`pids =
127`), a Python zygote pool (`pids = 126`) and a Node zygote pool (`pids = 125`); runs with `pids = 124` match no
pool and create their sandbox. The configurations are interleaved, one run of each per round, so that they share the
machine's load (it is shared, and its load varies). Runs are sequential from one keep-alive client; before each run
the client waits until `GET /v1/pools` shows every pool full, so pooled runs measure the hit path (hits and misses
are recorded from the same endpoint). Latency is `time.perf_counter_ns()` around request and response; `duration_ms`
is the server's own figure for the run (the command, or the zygote from the code handed over to its end). A run
counts only if it answered 200 with stdout `4`.

Code contexts on the same server: a sandbox created from the plain pool or from a zygote pool (whose members hold a
spare kernel of the zygote's language), then `POST /v1/sandboxes/{id}/contexts` of that language timed (cold kernel
start vs adopting the spare), then a first cell `1+1` (must answer `2`) timed, then the sandbox deleted; the four
rows interleaved like the runs, each after the pools are full. Writes bench/results/runs.json and re-renders docs/benchmarks.md
(bench/render.py). Standard library only; run as root.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.dont_write_bytecode = True  # no bench/__pycache__
sys.path.insert(0, str(Path(__file__).resolve().parent))
import warm  # noqa: E402 - the shared server and client

ROOT = warm.ROOT
DEFAULT_JSON = ROOT / "bench" / "results" / "runs.json"
POOL_MIN, POOL_MAX = 4, 8
CODE = {"python": "print(2+2)", "node": "console.log(2+2)"}
# Pools: name, pids (their limits' only difference from the defaults), zygote.
POOLS = [("plain", 127, None), ("python-zygote", 126, "python"), ("node-zygote", 125, "node")]
UNPOOLED_PIDS = 124
# Rows: language, label, pids of its runs, pool name (None: no pool).
ROWS = [
    ("python", "no pool", UNPOOLED_PIDS, None),
    ("node", "no pool", UNPOOLED_PIDS, None),
    ("python", "pool", 127, "plain"),
    ("node", "pool", 127, "plain"),
    ("python", "pool + python zygote", 126, "python-zygote"),
    ("node", "pool + node zygote", 125, "node-zygote"),
]


# Context rows: language, label, pids of the sandbox (its pool).
CONTEXT_ROWS = [
    ("python", "pool (cold kernel)", 127),
    ("python", "pool + python zygote (spare kernel)", 126),
    ("javascript", "pool (cold kernel)", 127),
    ("javascript", "pool + node zygote (spare kernel)", 125),
]


def config_lines() -> list[str]:
    lines = []
    for name, pids, zygote in POOLS:
        lines += ["", "[[pools]]", f'name = "{name}"', f"min = {POOL_MIN}", f"max = {POOL_MAX}",
                  f"limits = {{ pids = {pids} }}"] + ([f'zygote = "{zygote}"'] if zygote else [])
    return lines


def pools(client: warm.Client) -> dict[str, dict]:
    _, body, _ = client.request("GET", "/v1/pools")
    return {p["name"]: p for p in (body.get("pools", []) if isinstance(body, dict) else [])}


def wait_full(client: warm.Client, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(p.get("ready", 0) >= POOL_MIN for p in pools(client).values()):
            return
        time.sleep(0.002)
    raise RuntimeError(f"the pools were not full after {timeout_s} s")


def measure(server: warm.Server, runs: int) -> list[dict]:
    client = warm.Client(server.port)
    samples = {i: ([], [], []) for i in range(len(ROWS))}  # latency, duration, errors
    zygote_runs = {i: 0.0 for i in range(len(ROWS))}
    before = pools(client)
    for round_ in range(runs + 3):
        # Rotate the order each round, so no row always follows the same one.
        order = [(round_ + k) % len(ROWS) for k in range(len(ROWS))]
        for i in order:
            language, _, pids, _ = ROWS[i]
            wait_full(client)
            z0 = client.metrics().get("sandkasten_zygote_runs_total", 0)
            body = {"language": language, "code": CODE[language], "limits": {"pids": pids}}
            status, resp, ns = client.request("POST", "/v1/run", body)
            zygote_runs[i] += client.metrics().get("sandkasten_zygote_runs_total", 0) - z0
            if round_ < 3:
                continue  # untimed warm-up
            ok = status == 200 and isinstance(resp, dict) and resp.get("stdout") == "4\n" and resp.get("exit_code") == 0
            lat, duration, errors = samples[i]
            if not ok:
                errors.append(f"HTTP {status}: {str(resp)[:200]}")
                continue
            lat.append(ns / 1e6)
            duration.append(float(resp["duration_ms"]))
    after = pools(client)
    rows = []
    for i, (language, label, pids, pool) in enumerate(ROWS):
        lat, duration, errors = samples[i]
        counts = {k: after[pool][k] - before[pool][k] for k in ("hits", "misses")} if pool else None
        rows.append({
            "language": language, "config": label, "pids": pids, "pool": pool, "ok": len(lat), "errors": len(errors),
            "error_samples": errors[:3], "latency_ms": warm.stats_ms(lat), "server_duration_ms": warm.stats_ms(duration),
            # Pool counts cover both languages of a shared pool (the plain one) and the warm-up runs.
            "pool_hits": counts["hits"] if counts else None, "pool_misses": counts["misses"] if counts else None,
            "zygote_runs": zygote_runs[i],
        })
    return rows


def measure_contexts(server: warm.Server, runs: int) -> list[dict]:
    client = warm.Client(server.port)
    samples = {i: ([], [], []) for i in range(len(CONTEXT_ROWS))}  # create, first cell, errors
    for round_ in range(runs + 3):
        order = [(round_ + k) % len(CONTEXT_ROWS) for k in range(len(CONTEXT_ROWS))]
        for i in order:
            language, _, pids = CONTEXT_ROWS[i]
            wait_full(client)
            status, sandbox, _ = client.request("POST", "/v1/sandboxes", {"limits": {"pids": pids}})
            if status != 201 or not isinstance(sandbox, dict):
                samples[i][2].append(f"create sandbox: HTTP {status}: {str(sandbox)[:200]}")
                continue
            sid = sandbox["id"]
            try:
                status, context, create_ns = client.request("POST", f"/v1/sandboxes/{sid}/contexts",
                                                            {"language": language})
                ok = status == 201 and isinstance(context, dict)
                cell_ns, answer = 0, None
                if ok:
                    status, answer, cell_ns = client.request("POST", f"/v1/sandboxes/{sid}/code",
                                                             {"context_id": context["id"], "code": "1+1"})
                    results = answer.get("results", []) if isinstance(answer, dict) else []
                    ok = status == 200 and any(r.get("text/plain") == "2" for r in results)
            finally:
                client.request("DELETE", f"/v1/sandboxes/{sid}")
            if round_ < 3:
                continue  # untimed warm-up
            create, cell, errors = samples[i]
            if not ok:
                errors.append(f"HTTP {status}: {str(answer if answer is not None else context)[:200]}")
                continue
            create.append(create_ns / 1e6)
            cell.append(cell_ns / 1e6)
    rows = []
    for i, (language, label, pids) in enumerate(CONTEXT_ROWS):
        create, cell, errors = samples[i]
        rows.append({"language": language, "config": label, "pids": pids, "ok": len(create), "errors": len(errors),
                     "error_samples": errors[:3], "create_ms": warm.stats_ms(create),
                     "first_cell_ms": warm.stats_ms(cell)})
    return rows


def main() -> int:
    args = warm.bench_args(__doc__, DEFAULT_JSON, "sandkasten serve needs it")
    if args is None:
        return 1
    binary = str(Path(args.sandkasten).resolve())
    runs = 30 if args.quick else 150
    results: dict = {"machine": warm.machine(binary), "params": {"quick": args.quick, "runs": runs,
                     "pool_min": POOL_MIN, "pool_max": POOL_MAX}, "rows": [], "context_rows": [], "errors": []}
    results["loadavg_before"] = [round(x, 2) for x in os.getloadavg()]
    started = time.monotonic()
    server = warm.Server(binary, False, config_lines(), max_sandboxes=200)
    try:
        warm.log("runs: one server, three pools; configurations interleaved")
        server.start()
        results["rows"] = measure(server, runs)
        for row in results["rows"]:
            s = row["latency_ms"] or {}
            warm.log(f"  {row['language']} / {row['config']}: p50 {s.get('p50', 0):.2f} ms p99 {s.get('p99', 0):.2f} "
                     f"ms, {row['ok']} ok / {row['errors']} errors, zygote runs {row['zygote_runs']:.0f}")
        warm.log("runs: code contexts created on pool sandboxes, cold kernel vs spare kernel; interleaved")
        results["context_rows"] = measure_contexts(server, runs)
        for row in results["context_rows"]:
            s = row["create_ms"] or {}
            warm.log(f"  context {row['language']} / {row['config']}: create p50 {s.get('p50', 0):.2f} ms "
                     f"p99 {s.get('p99', 0):.2f} ms, {row['ok']} ok / {row['errors']} errors")
    except Exception as e:  # noqa: BLE001 - recorded in the results and the doc
        results["errors"].append(f"{e!r}; server log: {server.log_tail()}")
    finally:
        server.stop()
        # Host-wide: other users of the machine's sandboxes count too, so this is recorded, not judged.
        results["leftovers"], _ = warm.wait_clean(15)
        server.cleanup()
    return warm.finish(results, started, args.json, not args.no_render)


if __name__ == "__main__":
    sys.exit(main())
