#!/usr/bin/python3
"""Cold-start benchmark: how long `print(2+2)` takes, end to end, bare and in each sandbox.

Times the wall clock of the whole command (fork to exit: `time.perf_counter_ns` around `subprocess.run`, stdout and
stderr captured) for each contender, interleaved: every round runs each contender once, in an order rotated by one
each round, so drift of the machine (frequency, caches, other load) hits all contenders alike. A run counts only if it
exits 0 and prints exactly `4`. Then a separate loop of `sandkasten run --json` collects the result's phase timings
to show where sandkasten's time goes.

Writes bench/results/cold_start.json and renders docs/benchmarks.md from it and bench/results/warm.json, when present,
through bench/render.py (`--render-only` re-renders the doc from an existing JSON file). Standard library only.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.dont_write_bytecode = True  # no bench/__pycache__ from importing render
sys.path.insert(0, str(Path(__file__).resolve().parent))
import render  # noqa: E402 - bench/render.py, the one place the markdown is produced
from render import GOAL_RATIO, PHASES  # noqa: E402,F401 - the goal and the phase names are shared with the doc

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON = ROOT / "bench" / "results" / "cold_start.json"
DEFAULT_DOC = ROOT / "docs" / "benchmarks.md"

PYTHON = "/usr/bin/python3"
CODE = "print(2+2)"
EXPECTED = b"4"
RUN_TIMEOUT_S = 30
WARMUP_RUNS = 3


def contenders(sandkasten: str) -> list[dict]:
    """Every contender with its command line; `runnable` is decided later by a preflight run."""
    bwrap = shutil.which("bwrap") or "bwrap"
    runsc = shutil.which("runsc") or "runsc"
    return [
        {"name": "bare", "argv": [PYTHON, "-c", CODE], "required": True},
        {
            "name": "sandkasten",
            "argv": [sandkasten, "run", "--lang", "python", "--code", CODE],
            "required": False,
        },
        {
            "name": "bwrap",
            "argv": [
                bwrap, "--unshare-all", "--die-with-parent",
                "--ro-bind", "/usr", "/usr",
                "--symlink", "usr/lib", "/lib",
                "--symlink", "usr/lib64", "/lib64",
                "--symlink", "usr/bin", "/bin",
                "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
                PYTHON, "-c", CODE,
            ],
            "required": False,
        },
        {
            "name": "sandkasten-gvisor",
            "argv": [sandkasten, "run", "--isolation", "gvisor", "--lang", "python", "--code", CODE],
            "required": False,
        },
        {
            # The gvisor tier's floor: the same runsc, platform and network mode, no orchestration.
            "name": "runsc",
            "argv": [runsc, "--rootless=false", "--network=none", "--platform=systrap", "do", PYTHON, "-c", CODE],
            "required": False,
        },
    ]


# ---------------------------------------------------------------------------------------------------------------
# Running and timing


def run_once(argv: list[str]) -> tuple[int, str | None]:
    """One timed run: (elapsed ns, None) when it printed 4 and exited 0, else (elapsed ns, error text)."""
    start = time.perf_counter_ns()
    try:
        proc = subprocess.run(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=RUN_TIMEOUT_S
        )
    except FileNotFoundError as e:
        return time.perf_counter_ns() - start, f"not installed: {e.filename}"
    except subprocess.TimeoutExpired:
        return time.perf_counter_ns() - start, f"timed out after {RUN_TIMEOUT_S} s"
    elapsed = time.perf_counter_ns() - start
    if proc.returncode != 0 or proc.stdout.strip() != EXPECTED:
        return elapsed, describe_failure(proc)
    return elapsed, None


def describe_failure(proc: subprocess.CompletedProcess) -> str:
    stderr = proc.stderr.decode(errors="replace").strip().splitlines()
    tail = " | ".join(stderr[-3:]) if stderr else "(no stderr)"
    stdout = proc.stdout.decode(errors="replace").strip()[:80]
    return f"exit {proc.returncode}, stdout {stdout!r}: {tail}"[:400]


def preflight(contender: dict) -> str | None:
    """Why a contender cannot run here, or None when it prints 4."""
    if contender["name"] == "runsc" and os.geteuid() != 0:
        return "needs root (--rootless=false)"
    _, error = run_once(contender["argv"])
    return error


def interleaved(active: list[dict], runs: int) -> None:
    """Round-robin: each round runs every contender once, order rotated by one per round."""
    for contender in active:
        for _ in range(WARMUP_RUNS):
            run_once(contender["argv"])
    for round_index in range(runs):
        shift = round_index % len(active)
        for contender in active[shift:] + active[:shift]:
            elapsed, error = run_once(contender["argv"])
            if error is None:
                contender["samples_ns"].append(elapsed)
            else:
                contender["errors"] += 1
                if len(contender["error_examples"]) < 3:
                    contender["error_examples"].append(error)
        if (round_index + 1) % 50 == 0:
            print(f"  round {round_index + 1}/{runs}", file=sys.stderr)


def phase_loop(sandkasten: str, runs: int) -> dict:
    """`sandkasten run --json` `runs` times; medians of the phases, duration_ms and the outer wall clock."""
    argv = [sandkasten, "run", "--json", "--lang", "python", "--code", CODE]
    phases: dict[str, list[float]] = {name: [] for name in PHASES + ["duration_ms", "wall_ms"]}
    errors: list[str] = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        try:
            proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            errors.append(f"timed out after {RUN_TIMEOUT_S} s")
            continue
        wall_ms = (time.perf_counter_ns() - start) / 1e6
        try:
            result = json.loads(proc.stdout)
        except json.JSONDecodeError:
            errors.append(describe_failure(proc))
            continue
        if proc.returncode != 0 or result.get("stdout", "").strip() != "4":
            errors.append(describe_failure(proc))
            continue
        for name in PHASES:
            phases[name].append(float(result["phases"][name]))
        phases["duration_ms"].append(float(result["duration_ms"]))
        phases["wall_ms"].append(wall_ms)
    medians = {name: statistics.median(values) for name, values in phases.items() if values}
    return {"runs": runs, "ok": len(phases["wall_ms"]), "errors": len(errors), "error_examples": errors[:3],
            "median_ms": medians}


# ---------------------------------------------------------------------------------------------------------------
# Statistics


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); `q` in [0, 1]."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    position = (len(sorted_values) - 1) * q
    low = int(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def summarize(samples_ns: list[int]) -> dict | None:
    if not samples_ns:
        return None
    ms = sorted(s / 1e6 for s in samples_ns)
    return {
        "n": len(ms),
        "median": statistics.median(ms),
        "p90": percentile(ms, 0.90),
        "p99": percentile(ms, 0.99),
        "min": ms[0],
        "max": ms[-1],
        "mean": statistics.fmean(ms),
    }


# ---------------------------------------------------------------------------------------------------------------
# Machine description


def command_output(argv: list[str]) -> str | None:
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (proc.stdout or proc.stderr).decode(errors="replace").strip()
    return text.splitlines()[0] if text else None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine(sandkasten: str) -> dict:
    head = command_output(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    dirty = command_output(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"])
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": cpu_model(),
        "kernel": platform.release(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": command_output([PYTHON, "--version"]),
        "bwrap": command_output(["bwrap", "--version"]),
        "runsc": command_output(["runsc", "--version"]),
        "sandkasten": f"{head}{' (uncommitted changes)' if dirty else ''}" if head else None,
        "sandkasten_binary": sandkasten,
    }


# ---------------------------------------------------------------------------------------------------------------
# Load


def cpu_busy_percent(seconds: float = 1.0) -> float | None:
    """Share of CPU time not idle over a short sample of /proc/stat (all CPUs), in percent."""
    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields), idle

    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    total = total1 - total0
    return None if total <= 0 else 100.0 * (1 - (idle1 - idle0) / total)


def default_note(runs: int) -> str | None:
    if runs >= 200:
        return None
    return (f"Only {runs} rounds (the default is 200; `--quick` uses 30), so p99 is close to the maximum and the "
            "tails are rough.")


# ---------------------------------------------------------------------------------------------------------------
# Main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandkasten", default=str(ROOT / "target" / "release" / "sandkasten"))
    parser.add_argument("--runs", type=int, default=200, help="interleaved rounds (and phase-loop runs)")
    parser.add_argument("--only", nargs="*", help="benchmark only these contenders (bare is always included)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write the results")
    parser.add_argument("--doc", type=Path, default=DEFAULT_DOC, help="where to render the markdown")
    parser.add_argument("--note", help="a sentence to print under the method (e.g. why fewer runs)")
    parser.add_argument("--render-only", action="store_true", help="re-render --doc from an existing --json")
    args = parser.parse_args()

    if args.render_only:
        results = json.loads(args.json.read_text())
        render.write(results, render.load(render.WARM_JSON), args.doc)
        return 0
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    sandkasten = str(Path(args.sandkasten).resolve()) if os.sep in args.sandkasten else args.sandkasten

    all_contenders = contenders(sandkasten)
    if args.only is not None:
        all_contenders = [c for c in all_contenders if c["required"] or c["name"] in args.only]
    for contender in all_contenders:
        contender.update(samples_ns=[], errors=0, error_examples=[])
        contender["preflight_error"] = preflight(contender)
        contender["runnable"] = contender["preflight_error"] is None
        state = "ok" if contender["runnable"] else f"NOT RUNNABLE: {contender['preflight_error']}"
        print(f"preflight {contender['name']}: {state}", file=sys.stderr)
        if contender["required"] and not contender["runnable"]:
            print(f"cannot benchmark without {contender['name']}", file=sys.stderr)
            return 1
    active = [c for c in all_contenders if c["runnable"]]

    busy_before = cpu_busy_percent()
    load_before = os.getloadavg()
    started = time.monotonic()
    print(f"timing {len(active)} contenders, {args.runs} interleaved rounds", file=sys.stderr)
    interleaved(active, args.runs)
    sk = next((c for c in active if c["name"] == "sandkasten"), None)
    phases = None
    if sk is not None:
        print(f"phase loop: {args.runs} runs of sandkasten run --json", file=sys.stderr)
        phases = phase_loop(sandkasten, args.runs)

    rows: dict[str, dict] = {}
    for contender in all_contenders:
        rows[contender["name"]] = {
            "argv": contender["argv"],
            "runnable": contender["runnable"],
            "preflight_error": contender["preflight_error"],
            "errors": contender["errors"],
            "error_examples": contender["error_examples"],
            "stats": summarize(contender["samples_ns"]),
            "samples_ms": [round(s / 1e6, 4) for s in contender["samples_ns"]],
        }
    bare_median = rows["bare"]["stats"]["median"] if rows["bare"]["stats"] else None
    for row in rows.values():
        row["ratio_vs_bare"] = (
            row["stats"]["median"] / bare_median if row["stats"] and bare_median else None
        )
    sk_ratio = rows.get("sandkasten", {}).get("ratio_vs_bare")
    results = {
        "machine": machine(sandkasten),
        "method": {
            "runs": args.runs,
            "warmup": WARMUP_RUNS,
            "order": "interleaved, rotated by one per round",
            "timer": "time.perf_counter_ns around subprocess.run, stdout/stderr captured",
            "program": CODE,
            "elapsed_s": round(time.monotonic() - started, 1),
            "note": args.note or default_note(args.runs),
            "cpu_busy_before_percent": None if busy_before is None else round(busy_before, 1),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        },
        "goal": {
            "ratio_max": GOAL_RATIO,
            "ratio": sk_ratio,
            "met": None if sk_ratio is None else sk_ratio <= GOAL_RATIO,
        },
        "contenders": rows,
        "phases": phases,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    render.write(results, render.load(render.WARM_JSON), args.doc)

    print(f"\nwrote {args.json} and {args.doc} ({results['method']['elapsed_s']} s)", file=sys.stderr)
    for name, row in rows.items():
        stats = row["stats"]
        if stats:
            ratio = row["ratio_vs_bare"]
            print(f"{name:<11} median {stats['median']:7.2f} ms  p90 {stats['p90']:7.2f}  p99 {stats['p99']:7.2f}  "
                  f"min {stats['min']:7.2f}  {ratio:.2f}x bare  errors {row['errors']}")
        else:
            print(f"{name:<11} {'not runnable: ' + str(row['preflight_error']) if not row['runnable'] else 'no samples'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
