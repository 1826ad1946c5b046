#!/usr/bin/python3
"""One-shot runs over HTTP: `POST /v1/run` of Python `print(2+2)` and Node `console.log(2+2)` on a server without a
pool, with a warm pool, and with a warm pool whose members hold a Python or a Node zygote.

Starts `sandkasten serve` once per configuration (bench/warm.py's `Server`: temporary database and config, free
loopback port, SIGTERM at the end). Pools are for the default limits, `min = 4`, `max = 8`. Runs are sequential from
one keep-alive client; before each run on a pooled server the client waits until `GET /v1/pools` shows the pool full
again, so every run measures the hit path (hits and misses are recorded from the same endpoint). Latency is
`time.perf_counter_ns()` around request and response; `duration_ms` is the server's own figure for the run (the
command, or the zygote from the code handed over to its end). A run counts only if it answered 200 with stdout `4`.
Writes bench/results/runs.json and re-renders docs/benchmarks.md (bench/render.py). Standard library only; run as
root.
"""

from __future__ import annotations

import argparse
import json
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
# (label, pool lines or None, languages measured)
CONFIGS = [
    ("no pool", None, ["python", "node"]),
    ("pool", [], ["python", "node"]),
    ("pool + python zygote", ['zygote = "python"'], ["python"]),
    ("pool + node zygote", ['zygote = "node"'], ["node"]),
]


def pool_lines(extra: list[str]) -> list[str]:
    return ["", "[[pools]]", 'name = "default"', f"min = {POOL_MIN}", f"max = {POOL_MAX}", *extra]


def pool_state(client: warm.Client) -> dict:
    _, body, _ = client.request("GET", "/v1/pools")
    pools = body.get("pools", []) if isinstance(body, dict) else []
    return pools[0] if pools else {}


def wait_full(client: warm.Client, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pool_state(client).get("ready", 0) >= POOL_MIN:
            return
        time.sleep(0.002)
    raise RuntimeError(f"the pool was not full after {timeout_s} s")


def measure(server: warm.Server, language: str, runs: int, pooled: bool) -> dict:
    client = warm.Client(server.port)
    lat, duration, errors = [], [], []
    before = pool_state(client) if pooled else {}
    metrics0 = client.metrics()
    for i in range(runs + 3):
        if pooled:
            wait_full(client)
        status, body, ns = client.request("POST", "/v1/run", {"language": language, "code": CODE[language]})
        ok = status == 200 and isinstance(body, dict) and body.get("stdout") == "4\n" and body.get("exit_code") == 0
        if i < 3:
            continue  # untimed warm-up
        if not ok:
            errors.append(f"HTTP {status}: {str(body)[:200]}")
            continue
        lat.append(ns / 1e6)
        duration.append(float(body["duration_ms"]))
    after = pool_state(client) if pooled else {}
    metrics1 = client.metrics()
    return {
        "language": language, "ok": len(lat), "errors": len(errors), "error_samples": errors[:3],
        "latency_ms": warm.stats_ms(lat), "server_duration_ms": warm.stats_ms(duration),
        "hits": after.get("hits", 0) - before.get("hits", 0) if pooled else None,
        "misses": after.get("misses", 0) - before.get("misses", 0) if pooled else None,
        "zygote_runs": metrics1.get("zygote_runs_total", 0) - metrics0.get("zygote_runs_total", 0),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandkasten", default=str(ROOT / "target" / "release" / "sandkasten"))
    parser.add_argument("--quick", action="store_true", help="fewer runs (a smoke test; the doc says so)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--no-render", action="store_true", help="do not re-render docs/benchmarks.md")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/runs.py must run as root (sandkasten serve needs it)", file=sys.stderr)
        return 1
    binary = str(Path(args.sandkasten).resolve())
    runs = 30 if args.quick else 200
    results: dict = {"machine": warm.machine(binary), "params": {"quick": args.quick, "runs": runs,
                     "pool_min": POOL_MIN, "pool_max": POOL_MAX}, "rows": [], "errors": []}
    results["loadavg_before"] = [round(x, 2) for x in os.getloadavg()]
    started = time.monotonic()
    for label, extra, languages in CONFIGS:
        server = warm.Server(binary, False, None if extra is None else pool_lines(extra))
        try:
            warm.log(f"runs: {label}")
            server.start()
            for language in languages:
                row = measure(server, language, runs, extra is not None)
                row["config"] = label
                results["rows"].append(row)
                s = row["latency_ms"] or {}
                warm.log(f"  {language}: p50 {s.get('p50', 0):.2f} ms p99 {s.get('p99', 0):.2f} ms, "
                         f"{row['ok']} ok / {row['errors']} errors, zygote runs {row['zygote_runs']:.0f}")
        except Exception as e:  # noqa: BLE001 - recorded in the results and the doc
            results["errors"].append(f"{label}: {e!r}; server log: {server.log_tail()}")
        finally:
            server.stop()
            # Host-wide: other users of the machine's sandboxes count too, so this is recorded, not judged.
            results.setdefault("leftovers", {})[label], _ = warm.wait_clean(15)
            server.cleanup()
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    results["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1) + "\n")
    warm.log(f"wrote {args.json} ({results['elapsed_s']} s)")
    if not args.no_render:
        import render
        render.main([])
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
