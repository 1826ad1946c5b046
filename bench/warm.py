#!/usr/bin/python3
"""Warm benchmark: `sandkasten serve` over HTTP — warm exec and code latency, execution throughput, creation rate,
warm-pool hits and refill, idle memory per sandbox, and how many idle sandboxes run at once.

Starts `sandkasten serve` three times on a free loopback port, each time with a temporary database and TOML config
(one tenant with a large quota): first without a pool (exec, code, throughput, creation rate, memory, 1,000
sandboxes; and the gvisor tier's warm exec, right after the process tier's, and its unpooled create+delete), then with
a `[[pools]]` entry for the default limits (min 16, max 32) for pool hits and refill, then with a gvisor pool
(`isolation = "gvisor"`, min 8, max 16) for gvisor pool hits and refill (results under `gvisor`; ~30 s in all,
`--no-gvisor` skips them, and a host without runsc records the tier as unavailable). Clients are Python
threads, one `http.client.HTTPConnection` (keep-alive) each; latency is `time.perf_counter_ns()` around request and
response. The server is always stopped with SIGTERM. Writes bench/results/warm.json and re-renders
docs/benchmarks.md (bench/render.py). Standard library only; run as root.
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON = ROOT / "bench" / "results" / "warm.json"
API_KEY = "bench-warm-key-0123456789abcdef"
AGENT_UID = 1_000_000_000  # the first sandbox's root; each sandbox has its own range of RANGE ids above it
RANGE = 65_536
CGROUP_ROOTS = [Path("/sys/fs/cgroup/memory/sandkasten"), Path("/sys/fs/cgroup/sandkasten"),
                Path("/sys/fs/cgroup/unified/sandkasten")]
POOL_MIN, POOL_MAX = 16, 32
# The gVisor tier (`{"isolation": "gvisor"}`): a member costs a runsc sandbox (~0.2 s of CPU), so its pool is smaller.
GVISOR = {"isolation": "gvisor"}
GV_POOL_MIN, GV_POOL_MAX = 8, 16
GV_POOL_LINES = ["", "[[pools]]", 'name = "gvisor"', 'isolation = "gvisor"', f"min = {GV_POOL_MIN}",
                 f"max = {GV_POOL_MAX}"]
MiB = 1024 * 1024


def log(msg: str) -> None:
    print(f"[warm {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


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


def stats_ms(values_ms: list[float]) -> dict | None:
    if not values_ms:
        return None
    ms = sorted(values_ms)
    return {"n": len(ms), "p50": statistics.median(ms), "p90": percentile(ms, 0.90), "p99": percentile(ms, 0.99),
            "min": ms[0], "max": ms[-1], "mean": statistics.fmean(ms)}


# ---------------------------------------------------------------------------------------------------------------
# The server


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`sandkasten serve` with a temp config and database; `stop()` sends SIGTERM (SIGKILL after 30 s)."""

    def __init__(self, binary: str, pooled: bool, extra: list[str] | None = None, max_sandboxes: int = 2000):
        self.binary, self.pooled, self.extra, self.max_sandboxes = binary, pooled, extra or [], max_sandboxes
        self.dir = Path(tempfile.mkdtemp(prefix="sandkasten-warm-"))
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0

    def start(self) -> None:
        config = [
            f'listen = "127.0.0.1:{self.port}"',
            f'database = "{self.dir / "sandkasten.db"}"',
            "",
            "[[tenants]]",
            'name = "bench"',
            f'api_keys = ["{API_KEY}"]',
            f"max_sandboxes = {self.max_sandboxes}",
            f"max_memory_bytes = {1 << 40}",
            "max_pids = 1000000000",
            "",
            # Few clients and no egress: the default connection caps plus 2000 sandboxes' descriptors would not fit a
            # 20 000 descriptor limit, which the server refuses at start.
            "[http]",
            "max_connections = 1024",
            "",
            "[egress]",
            "max_total_connections = 1024",
        ]
        if self.pooled:
            config += ["", "[[pools]]", 'name = "default"', f"min = {POOL_MIN}", f"max = {POOL_MAX}"]
        config += self.extra
        (self.dir / "config.toml").write_text("\n".join(config) + "\n")
        self.log = open(self.dir / "server.log", "wb")
        env = dict(os.environ, SANDKASTEN_LOG="warn")
        self.proc = subprocess.Popen([self.binary, "serve", "--config", str(self.dir / "config.toml")],
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.started_at = time.monotonic()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                status, _, _ = Client(self.port).request("GET", "/healthz")
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"server not healthy after 30 s: {self.log_tail()}")

    def log_tail(self) -> str:
        try:
            return " | ".join((self.dir / "server.log").read_text(errors="replace").strip().splitlines()[-3:])
        except OSError:
            return ""

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            log("server did not stop within 30 s of SIGTERM: SIGKILL")
            self.proc.kill()
            code = self.proc.wait()
        self.log.close()
        return code

    def cleanup(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


class Client:
    """One keep-alive connection; reconnects after an error."""

    def __init__(self, port: int):
        self.port = port
        self.conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, object, int]:
        """(status, parsed JSON body or text, elapsed ns)."""
        headers = {"Authorization": f"Bearer {API_KEY}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            start = time.perf_counter_ns()
            try:
                self.conn.request(method, path, body=data, headers=headers)
                resp = self.conn.getresponse()
                raw = resp.read()
            except (http.client.HTTPException, OSError):
                self.conn.close()
                self.conn = None
                if attempt == 1:
                    raise
                continue
            elapsed = time.perf_counter_ns() - start
            if resp.getheader("connection", "").lower() == "close":
                self.conn.close()
                self.conn = None
            ctype = resp.getheader("content-type", "")
            parsed: object = raw.decode(errors="replace")
            if "json" in ctype and raw:
                try:
                    parsed = json.loads(raw)
                except json.JSONDecodeError:
                    pass
            return resp.status, parsed, elapsed
        raise AssertionError("unreachable")

    def create(self, spec: dict | None = None) -> tuple[str | None, int, object]:
        """`POST /v1/sandboxes` with `spec` (default `{}`); a create answered with another tier than the one asked
        for counts as a failure."""
        status, body, ns = self.request("POST", "/v1/sandboxes", spec or {})
        if status in (200, 201) and isinstance(body, dict) and "id" in body:
            want = (spec or {}).get("isolation")
            if want and body.get("isolation") != want:
                return None, ns, f"asked for isolation {want!r}, got {body.get('isolation')!r}"
            return body["id"], ns, None
        return None, ns, f"HTTP {status}: {str(body)[:300]}"

    def delete(self, sid: str) -> tuple[bool, int, object]:
        status, body, ns = self.request("DELETE", f"/v1/sandboxes/{sid}")
        return status in (200, 204), ns, None if status in (200, 204) else f"HTTP {status}: {str(body)[:300]}"

    def metrics(self) -> dict[str, float]:
        _, text, _ = self.request("GET", "/metrics")
        out: dict[str, float] = {}
        for line in str(text).splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                try:
                    out[name] = float(value)
                except ValueError:
                    pass
        return out


# ---------------------------------------------------------------------------------------------------------------
# Measurements


def run_threads(n: int, target) -> list:
    """Runs target(i) in n threads, started together; returns their results in order."""
    results: list = [None] * n
    barrier = threading.Barrier(n)

    def wrap(i: int) -> None:
        barrier.wait()
        try:
            results[i] = target(i)
        except Exception as e:  # noqa: BLE001 - reported, not raised
            results[i] = e

    threads = [threading.Thread(target=wrap, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def request_load(port: int, sandboxes: list[str], path: str, body: dict, total: int, check, warmup: int = 5,
                 max_s: float | None = None) -> dict:
    """`total` requests spread over one thread per sandbox; client latency and server-reported duration_ms. The
    threads wait for each other after their `warmup` untimed requests, so `wall_s` (and the throughput) covers the
    timed requests only. With `max_s`, each thread stops sending `max_s` seconds after the warm-up even if its share
    is not done."""
    conc = len(sandboxes)
    per_thread = max(1, total // conc)
    capped = [False] * conc
    warmed = threading.Barrier(conc)

    def worker(i: int) -> dict:
        c = Client(port)
        url = f"/v1/sandboxes/{sandboxes[i]}{path}"
        try:
            for _ in range(warmup):
                c.request("POST", url, body)
        except BaseException:
            warmed.abort()  # the others' wait raises instead of blocking
            raise
        warmed.wait(timeout=300)
        t_start = time.perf_counter()
        lat, server, errors = [], [], []
        deadline = None if max_s is None else t_start + max_s
        for _ in range(per_thread):
            if deadline is not None and time.perf_counter() > deadline:
                capped[i] = True
                break
            status, resp, ns = c.request("POST", url, body)
            problem = check(status, resp)
            if problem:
                errors.append(problem)
            else:
                lat.append(ns / 1e6)
                if isinstance(resp, dict) and "duration_ms" in resp:
                    server.append(float(resp["duration_ms"]))
        return {"lat": lat, "server": server, "errors": errors, "start": t_start, "end": time.perf_counter()}

    parts = run_threads(conc, worker)
    spans = [p for p in parts if not isinstance(p, Exception)]
    wall = max(p["end"] for p in spans) - min(p["start"] for p in spans) if spans else 0.0
    lat, server, errors = [], [], []
    for p in parts:
        if isinstance(p, Exception):
            errors.append(repr(p))
            continue
        lat += p["lat"]
        server += p["server"]
        errors += p["errors"]
    s = stats_ms(lat) or {}
    out = {"concurrency": conc, "requests": per_thread * conc, "ok": len(lat), "errors": len(errors),
            "error_examples": errors[:3], "wall_s": wall, "throughput_per_s": len(lat) / wall if wall else None,
            "latency_ms": s, "server_duration_ms": stats_ms(server),
            "samples_ms": [round(x, 4) for x in lat]}
    if max_s is not None:
        out.update(warmup_per_client=warmup, max_s=max_s, stopped_by_time_cap=any(capped))
    return out


def check_exec(expect_stdout: str | None = None):
    def check(status: int, resp: object) -> str | None:
        if status != 200 or not isinstance(resp, dict):
            return f"HTTP {status}: {str(resp)[:200]}"
        if resp.get("exit_code") != 0:
            return f"exit {resp.get('exit_code')}: {str(resp.get('stderr'))[:200]}"
        if expect_stdout is not None and resp.get("stdout") != expect_stdout:
            return f"stdout {resp.get('stdout')!r}"
        return None
    return check


def check_code(status: int, resp: object) -> str | None:
    if status != 200 or not isinstance(resp, dict):
        return f"HTTP {status}: {str(resp)[:200]}"
    if resp.get("error"):
        return f"error: {str(resp['error'])[:200]}"
    texts = [r.get("text/plain") for r in resp.get("results", []) if isinstance(r, dict)]
    return None if "2" in texts else f"results {texts!r}"


def create_many(port: int, count: int, conc: int, stop_on_failure: bool = True, spec: dict | None = None) -> dict:
    """Creates up to `count` sandboxes (`spec`, default `{}`) with `conc` threads; stops at the first failure."""
    lock = threading.Lock()
    state = {"issued": 0, "failed": None}
    ids: list[str] = []
    lat: list[float] = []

    def worker(_: int) -> None:
        c = Client(port)
        while True:
            with lock:
                if state["issued"] >= count or (stop_on_failure and state["failed"]):
                    return
                state["issued"] += 1
            try:
                sid, ns, err = c.create(spec)
            except Exception as e:  # noqa: BLE001
                sid, ns, err = None, 0, repr(e)
            with lock:
                if sid:
                    ids.append(sid)
                    lat.append(ns / 1e6)
                elif state["failed"] is None:
                    state["failed"] = {"after": len(ids), "error": err}

    t0 = time.perf_counter()
    run_threads(conc, worker)
    return {"ids": ids, "elapsed_s": time.perf_counter() - t0, "failure": state["failed"], "latency_ms": stats_ms(lat)}


def delete_many(port: int, ids: list[str], conc: int) -> dict:
    queue = list(ids)
    lock = threading.Lock()
    errors: list[str] = []
    lat: list[float] = []

    def worker(_: int) -> None:
        c = Client(port)
        while True:
            with lock:
                if not queue:
                    return
                sid = queue.pop()
            try:
                ok, ns, err = c.delete(sid)
            except Exception as e:  # noqa: BLE001
                ok, ns, err = False, 0, repr(e)
            with lock:
                (lat.append(ns / 1e6) if ok else errors.append(f"{sid}: {err}"))

    t0 = time.perf_counter()
    run_threads(conc, worker)
    return {"deleted": len(lat), "errors": len(errors), "error_examples": errors[:3],
            "elapsed_s": time.perf_counter() - t0, "latency_ms": stats_ms(lat)}


def create_delete_loop(port: int, conc: int, cycles: int, max_s: float, spec: dict | None = None) -> dict:
    """Each thread: create (`spec`, default `{}`), delete, repeat; stops after `cycles` in all or `max_s` seconds."""
    lock = threading.Lock()
    state = {"issued": 0}
    deadline = time.perf_counter() + max_s
    create_lat: list[float] = []
    delete_lat: list[float] = []
    errors: list[str] = []

    def worker(_: int) -> None:
        c = Client(port)
        while time.perf_counter() < deadline:
            with lock:
                if state["issued"] >= cycles:
                    return
                state["issued"] += 1
            sid, ns, err = c.create(spec)
            if not sid:
                errors.append(err)
                continue
            ok, dns, derr = c.delete(sid)
            with lock:
                create_lat.append(ns / 1e6)
                (delete_lat.append(dns / 1e6) if ok else errors.append(derr))

    t0 = time.perf_counter()
    run_threads(conc, worker)
    wall = time.perf_counter() - t0
    n = len(create_lat)
    return {"concurrency": conc, "cycles": n, "wall_s": wall, "cycles_per_s": n / wall if wall else None,
            "create_ms": stats_ms(create_lat), "delete_ms": stats_ms(delete_lat),
            "creates_per_s_create_time_only": (conc * 1000 / statistics.fmean(create_lat)) if create_lat else None,
            "errors": len(errors), "error_examples": errors[:3]}


# ---------------------------------------------------------------------------------------------------------------
# Host-side accounting


def proc_status(pid: str) -> dict | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    out: dict = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "Uid":
            out["uid"] = int(value.split()[0])
        elif key == "VmRSS":
            out["rss_kb"] = int(value.split()[0])
    return out


def sandbox_processes(min_uid: int = AGENT_UID, exact: bool = False) -> list[dict]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        st = proc_status(entry)
        if not st or "uid" not in st:
            continue
        # exact: a sandbox's root (its agent), the first id of one of the ranges.
        if (st["uid"] >= min_uid and (st["uid"] - min_uid) % RANGE == 0) if exact else (st["uid"] >= min_uid):
            st["pid"] = entry
            found.append(st)
    return found


def smaps_rollup(pid: str) -> dict:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("Pss", "Private_Clean", "Private_Dirty") and value.strip().endswith("kB"):
                out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


def cgroup_memory(sid: str) -> int | None:
    for root in CGROUP_ROOTS:
        for name in ("memory.usage_in_bytes", "memory.current"):
            try:
                return int((root / sid / name).read_text())
            except (OSError, ValueError):
                continue
    return None


def cgroup_kind() -> str:
    for root in CGROUP_ROOTS:
        if (root / "memory.usage_in_bytes").exists() or root.name == "sandkasten" and (root / "cgroup.procs").exists():
            return f"{root} ({'v1 memory.usage_in_bytes' if 'memory' in root.parts else 'v2 memory.current'})"
    return "none found"


MEMINFO_KEYS = ("MemAvailable", "MemFree", "Cached", "Slab", "SUnreclaim", "PageTables", "KernelStack", "Shmem")


def meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in MEMINFO_KEYS:
            out[key] = int(value.split()[0]) * 1024
    return out


def server_rss(server: "Server") -> int:
    """RSS of the server and its direct children that are not sandboxes (the spawner), in bytes."""
    pids = [str(server.proc.pid)]
    try:
        pids += Path(f"/proc/{server.proc.pid}/task/{server.proc.pid}/children").read_text().split()
    except OSError:
        pass
    total = 0
    for pid in pids:
        st = proc_status(pid)
        if st and st.get("uid", 0) < AGENT_UID:
            total += st.get("rss_kb", 0) * 1024
    return total


def settle(max_s: float = 10.0) -> float:
    """Waits until MemFree moves by less than 512 KiB over 1 s (asynchronous teardown of earlier sandboxes — network
    namespaces, RCU-freed objects — releases memory for a while); returns the seconds waited."""
    t0 = time.perf_counter()
    prev = meminfo()["MemFree"]
    while time.perf_counter() - t0 < max_s:
        time.sleep(1)
        cur = meminfo()["MemFree"]
        if abs(cur - prev) < 512 * 1024:
            break
        prev = cur
    return time.perf_counter() - t0


def memory_accounting(server: "Server", ids: list[str], info0: dict, srss0: int) -> dict:
    """Host-side accounting of `ids` (idle sandboxes) against a baseline taken before they were created."""
    info1, srss1 = meminfo(), server_rss(server)
    agents = sandbox_processes(AGENT_UID, exact=True)
    rss = sum(a.get("rss_kb", 0) for a in agents) * 1024
    smaps = [smaps_rollup(a["pid"]) for a in agents]
    pss = sum(x.get("Pss", 0) for x in smaps) * 1024
    private = sum(x.get("Private_Clean", 0) + x.get("Private_Dirty", 0) for x in smaps) * 1024
    cg = [cgroup_memory(sid) for sid in ids]
    cg_known = [x for x in cg if x is not None]
    md = {key: info1[key] - info0[key] for key in info0}
    kernel = md["Slab"] + md["PageTables"] + md["KernelStack"]
    n, na = max(1, len(ids)), max(1, len(agents))
    total = pss + kernel + md["Shmem"] + (srss1 - srss0)
    return {
        "sandboxes": len(ids), "agents_found": len(agents),
        "other_sandbox_processes": len(sandbox_processes()) - len(agents),
        "agent_rss_bytes_total": rss, "agent_pss_bytes_total": pss, "agent_private_bytes_total": private,
        "cgroup_bytes_total": sum(cg_known), "cgroups_read": len(cg_known), "cgroup_source": cgroup_kind(),
        "memavailable_delta_bytes": -md["MemAvailable"], "memfree_delta_bytes": -md["MemFree"],
        "meminfo_delta_bytes": md, "server_rss_delta_bytes": srss1 - srss0, "accounted_total_bytes": total,
        "per_sandbox_bytes": {
            "accounted_total": total / n,
            "agent_rss": rss / na, "agent_pss": pss / na, "agent_private": private / na,
            "cgroup": sum(cg_known) / max(1, len(cg_known)),
            "kernel_slab_pagetables_stacks": kernel / n, "shmem": md["Shmem"] / n,
            "server_and_spawner_rss": (srss1 - srss0) / n,
            "memavailable_delta": -md["MemAvailable"] / n, "memfree_delta": -md["MemFree"] / n,
        },
    }


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable")


def leftovers() -> dict:
    dirs = []
    for base in Path("/sys/fs/cgroup").iterdir():
        for root in (base / "sandkasten", base):
            if root.is_dir():
                try:
                    dirs += [str(p) for p in root.iterdir() if p.name.startswith("sb-") and p.is_dir()]
                except OSError:
                    pass
    procs = sandbox_processes()
    return {"cgroup_dirs": len(set(dirs)), "cgroup_examples": sorted(set(dirs))[:3], "processes": len(procs),
            "process_examples": [f"pid {p['pid']} uid {p['uid']}" for p in procs[:3]]}


def wait_clean(timeout_s: float = 15) -> tuple[dict, float]:
    t0 = time.perf_counter()
    while True:
        left = leftovers()
        if (left["cgroup_dirs"] == 0 and left["processes"] == 0) or time.perf_counter() - t0 > timeout_s:
            return left, time.perf_counter() - t0
        time.sleep(0.1)


# ---------------------------------------------------------------------------------------------------------------
# Phases


def spawn_floor(n: int) -> dict:
    """Reference: posix_spawn + waitpid of /bin/true from this Python process, no sandbox, no HTTP."""
    lat = []
    for i in range(n + 5):
        t0 = time.perf_counter_ns()
        pid = os.posix_spawn("/bin/true", ["/bin/true"], {})
        os.waitpid(pid, 0)
        if i >= 5:
            lat.append((time.perf_counter_ns() - t0) / 1e6)
    return stats_ms(lat)


def unpooled_phase(server: Server, p: dict, results: dict) -> None:
    port = server.port
    c = Client(port)
    before = leftovers()
    results["preexisting"] = before
    if before["processes"] or before["cgroup_dirs"]:
        log(f"WARNING: sandbox processes/cgroups exist before the run: {before}")

    log("creating 16 sandboxes for warm exec")
    made = create_many(port, 16, 4)
    if len(made["ids"]) < 16:
        raise RuntimeError(f"could not create 16 sandboxes: {made['failure']}")
    sbs = made["ids"]
    m0 = c.metrics()

    warm: dict = {}
    exec_body = {"argv": ["/bin/true"]}
    code_body = {"language": "python", "code": "1+1"}
    for name, path, body, check, conc, total in [
        ("exec_c1", "/exec", exec_body, check_exec(""), 1, p["n_c1"]),
        ("exec_c16", "/exec", exec_body, check_exec(""), 16, p["n_c16"]),
        ("code_c1", "/code", code_body, check_code, 1, p["n_c1"]),
        ("code_c16", "/code", code_body, check_code, 16, p["n_c16"]),
    ]:
        log(f"{name}: {total} requests at concurrency {conc}")
        warm[name] = request_load(port, sbs[:conc], path, body, total, check)
        w = warm[name]
        log(f"  p50 {w['latency_ms'].get('p50', 0):.2f} ms p99 {w['latency_ms'].get('p99', 0):.2f} ms "
            f"{w['throughput_per_s'] or 0:.0f}/s errors {w['errors']}")
    m1 = c.metrics()
    results["warm"] = warm
    results["spawn_floor_ms"] = spawn_floor(200)
    log(f"reference posix_spawn(/bin/true) p50 {results['spawn_floor_ms']['p50']:.2f} ms")
    results["exec_metrics"] = {k: m1.get(k, 0) - m0.get(k, 0) for k in m1 if k.startswith("sandkasten_exec_phase_seconds_sum")
                               or k.startswith("sandkasten_exec_phase_seconds_count") or k.startswith("sandkasten_exec_duration_seconds_sum")
                               or k.startswith("sandkasten_exec_duration_seconds_count")}
    if p["gvisor"]:
        gvisor_part(results, "exec", lambda gv: gvisor_exec(port, p, gv, exec_body, sbs[0]))

    log(f"python throughput: {p['n_py']} x python3 -c 'print(1)' at concurrency 16")
    py = request_load(port, sbs, "/exec", {"argv": ["python3", "-c", "print(1)"]}, p["n_py"], check_exec("1\n"),
                      warmup=1)
    py.pop("samples_ms")
    results["python_throughput"] = py
    log(f"  {py['throughput_per_s'] or 0:.1f} executions/s, p50 {py['latency_ms'].get('p50', 0):.1f} ms")

    d = delete_many(port, sbs, 4)
    if d["errors"]:
        log(f"deleting the exec sandboxes: {d['error_examples']}")
    wait_clean(10)

    # Idle memory
    k = p["k_idle"]
    waited = settle()
    log(f"idle memory: {k} idle sandboxes (settled {waited:.0f} s)")
    info0, srss0 = meminfo(), server_rss(server)
    made = create_many(port, k, 4)
    ids = made["ids"]
    time.sleep(2)
    results["idle_memory"] = memory_accounting(server, ids, info0, srss0)
    results["idle_memory"]["create_failure"] = made["failure"]
    results["idle_memory"]["settle_s"] = waited
    per = results["idle_memory"]["per_sandbox_bytes"]
    log("  per sandbox: " + ", ".join(f"{k2} {v / 1024:.0f} KiB" for k2, v in per.items()))
    d = delete_many(port, ids, 8)
    wait_clean(15)

    creates: dict = {}
    for conc in (1, 4):
        log(f"create+delete loop at concurrency {conc}")
        m0 = c.metrics()
        r = create_delete_loop(port, conc, p["cycles"], p["loop_max_s"])
        m1 = c.metrics()
        cnt = m1.get("sandkasten_sandbox_create_seconds_count", 0) - m0.get("sandkasten_sandbox_create_seconds_count", 0)
        r["server_create_mean_ms"] = ((m1.get("sandkasten_sandbox_create_seconds_sum", 0) - m0.get("sandkasten_sandbox_create_seconds_sum", 0))
                                      / cnt * 1000) if cnt else None
        creates[f"unpooled_c{conc}"] = r
        log(f"  {r['cycles_per_s'] or 0:.1f} create+delete cycles/s, create p50 {r['create_ms']['p50']:.1f} ms, "
            f"delete p50 {r['delete_ms']['p50']:.1f} ms, errors {r['errors']}")
    if p["gvisor"]:
        gvisor_part(results, "unpooled_create", lambda gv: gvisor_unpooled_creates(port, p, gv))
    for conc in (1, 4):
        log(f"burst: {p['burst']} creates at concurrency {conc}, then delete")
        m0 = c.metrics()
        made = create_many(port, p["burst"], conc)
        m1 = c.metrics()
        cnt = m1.get("sandkasten_sandbox_create_seconds_count", 0) - m0.get("sandkasten_sandbox_create_seconds_count", 0)
        creates[f"burst_c{conc}"] = {
            "concurrency": conc, "created": len(made["ids"]), "wall_s": made["elapsed_s"],
            "creates_per_s": len(made["ids"]) / made["elapsed_s"], "create_ms": made["latency_ms"],
            "failure": made["failure"],
            "server_create_mean_ms": ((m1.get("sandkasten_sandbox_create_seconds_sum", 0) - m0.get("sandkasten_sandbox_create_seconds_sum", 0))
                                      / cnt * 1000) if cnt else None}
        log(f"  {creates[f'burst_c{conc}']['creates_per_s']:.0f} creates/s")
        delete_many(port, made["ids"], 4)
        wait_clean(10)
    results["creates"] = creates
    wait_clean(10)

    # Concurrent idle sandboxes
    target = p["concurrent"]
    waited = settle()
    log(f"concurrent: creating up to {target} sandboxes at concurrency 8 (settled {waited:.0f} s)")
    info0, srss0 = meminfo(), server_rss(server)
    made = create_many(port, target, 8)
    reached = len(made["ids"])
    time.sleep(2)
    memory_at_peak = memory_accounting(server, made["ids"], info0, srss0)
    agents_at_peak = memory_at_peak["agents_found"]
    healthy = c.request("GET", "/healthz")[0] == 200
    probe = None
    if made["ids"]:
        st, resp, ns = c.request("POST", f"/v1/sandboxes/{made['ids'][-1]}/exec", {"argv": ["/bin/true"]})
        probe = {"status": st, "ms": ns / 1e6, "ok": check_exec("")(st, resp) is None}
    log(f"  reached {reached} in {made['elapsed_s']:.1f} s; failure: {made['failure']}")
    log(f"deleting {reached} sandboxes at concurrency 8")
    d = delete_many(port, made["ids"], 8)
    left, waited = wait_clean(20)
    results["concurrent"] = {
        "target": target, "reached": reached, "concurrency": 8, "elapsed_s": made["elapsed_s"],
        "creates_per_s": reached / made["elapsed_s"] if made["elapsed_s"] else None,
        "create_latency_ms": made["latency_ms"], "failure": made["failure"], "healthz_at_peak": healthy,
        "exec_probe_at_peak": probe, "agents_at_peak": agents_at_peak,
        "memory_at_peak": memory_at_peak,
        "delete": d, "leftovers_after_delete": left, "cleanup_wait_s": waited,
    }
    log(f"  deleted {d['deleted']} in {d['elapsed_s']:.1f} s (errors {d['errors']}); leftovers {left}")


def wait_pool_full(c: "Client", name: str, size: int, t0: float, timeout_s: float = 60) -> float:
    """Polls `sandkasten_pool_size{class=name}` every 5 ms until it reaches `size` (or `timeout_s` passed); seconds since t0."""
    key = f'sandkasten_pool_size{{class="{name}"}}'
    while True:
        ready = c.metrics().get(key, 0)
        now = time.perf_counter()
        if ready >= size or now - t0 > timeout_s:
            return now - t0
        time.sleep(0.005)


def measure_pool(server: Server, name: str, pool_min: int, pool_max: int, n_rounds: int,
                 spec: dict | None = None) -> dict:
    """The pool `name` of a server that has just answered `/healthz`: its initial fill from empty, then `n_rounds`
    rounds of `pool_min` creates (`spec`) back to back on a full pool (the hit latency; a round with a miss is left
    out) and the refill after each round."""
    port = server.port
    c = Client(port)
    key = f'sandkasten_pool_size{{class="{name}"}}'

    # Initial fill from empty: from the first /healthz answer (server.start returns right after it).
    t_health = time.perf_counter()
    m_h = c.metrics()
    size_at_health = m_h.get(key, 0)
    fill_s = wait_pool_full(c, name, pool_min, t_health)
    m_f = c.metrics()
    since_start_s = time.monotonic() - server.started_at
    log(f"pool {name}: {size_at_health:.0f} ready at /healthz, full ({pool_min}) {fill_s * 1000:.1f} ms later, "
        f"{since_start_s:.2f} s after exec")

    hit_lat, rounds = [], []
    m0 = c.metrics()
    for r in range(n_rounds):
        wait_pool_full(c, name, pool_min, time.perf_counter())
        time.sleep(0.2)
        claimed = []
        mb = c.metrics()
        lat = []
        for _ in range(pool_min):
            sid, ns, err = c.create(spec)
            if not sid:
                raise RuntimeError(f"pooled create failed: {err}")
            claimed.append(sid)
            lat.append(ns / 1e6)
        m_empty = c.metrics()
        if m_empty.get("sandkasten_pool_misses_total", 0) == mb.get("sandkasten_pool_misses_total", 0):
            hit_lat += lat  # all hits (a round with a miss is left out of the hit latencies)
        t_empty = time.perf_counter()
        size_empty = m_empty.get(key, 0)
        dur = wait_pool_full(c, name, pool_min, t_empty)
        m_full = c.metrics()
        cnt = m_full.get("sandkasten_pool_refill_seconds_count", 0) - m_empty.get("sandkasten_pool_refill_seconds_count", 0)
        sm = m_full.get("sandkasten_pool_refill_seconds_sum", 0) - m_empty.get("sandkasten_pool_refill_seconds_sum", 0)
        rounds.append({"size_after_claims": size_empty, "refill_s": dur,
                       "members_per_s": (pool_min - size_empty) / dur if dur > 0 else None,
                       "refill_build_mean_ms": sm / cnt * 1000 if cnt else None, "builds": cnt})
        delete_many(port, claimed, 4)
    m1 = c.metrics()
    rates = [r["members_per_s"] for r in rounds if r["members_per_s"]]
    builds = [r["refill_build_mean_ms"] for r in rounds if r["refill_build_mean_ms"]]
    out = {
        "min": pool_min, "max": pool_max, "rounds": rounds, "ready_at_healthz": size_at_health,
        "initial_fill_s": fill_s, "initial_members_per_s": (pool_min - size_at_health) / fill_s if fill_s > 0 else None,
        "initial_build_mean_ms": (m_f.get("sandkasten_pool_refill_seconds_sum", 0) / m_f["sandkasten_pool_refill_seconds_count"] * 1000)
        if m_f.get("sandkasten_pool_refill_seconds_count") else None,
        "hit_create_ms": stats_ms(hit_lat), "hit_samples_ms": [round(x, 4) for x in hit_lat],
        "hits": m1.get("sandkasten_pool_hits_total", 0) - m0.get("sandkasten_pool_hits_total", 0),
        "misses": m1.get("sandkasten_pool_misses_total", 0) - m0.get("sandkasten_pool_misses_total", 0),
        "refill_members_per_s_median": statistics.median(rates) if rates else None,
        "refill_build_mean_ms": statistics.fmean(builds) if builds else None,
    }
    h = out["hit_create_ms"] or {}
    log(f"  hit create p50 {h.get('p50', 0):.2f} ms p99 {h.get('p99', 0):.2f} ms; refill "
        f"{out['refill_members_per_s_median'] or 0:.1f} members/s; hits {out['hits']:.0f} misses {out['misses']:.0f}")
    return out


def gvisor_part(results: dict, what: str, measure) -> None:
    """Runs `measure(results["gvisor"])` unless the tier was found unavailable; a failure is recorded (in
    `results["errors"]` and `gvisor["errors"]`) and does not stop the process-tier measurements. Adds the part's
    wall time to `gvisor["elapsed_s"]`."""
    gv = results.setdefault("gvisor", {"errors": [], "elapsed_s": {}})
    if gv.get("unavailable"):
        return
    t0 = time.monotonic()
    try:
        measure(gv)
    except Exception as e:  # noqa: BLE001 - recorded in the results and the doc
        import traceback
        traceback.print_exc()
        gv["errors"].append(f"{what}: {e!r}")
        results["errors"].append(f"gvisor {what}: {e!r}")
    finally:
        gv["elapsed_s"][what] = round(time.monotonic() - t0, 1)


SPAWN_LOOP_N = 20
SPAWN_LOOP = "i=0; while [ $i -lt %d ]; do %s i=$((i+1)); done"


def spawn_inside(c: "Client", sid: str, reps: int = 3) -> dict:
    """What one fork+exec of /bin/true costs inside the sandbox, without the agent's per-command work: the server's
    `duration_ms` of a shell loop running it SPAWN_LOOP_N times minus that of the same loop without it, divided by
    SPAWN_LOOP_N (medians of `reps` runs each)."""
    def median_ms(script: str) -> float:
        ds = []
        for _ in range(reps):
            status, resp, _ = c.request("POST", f"/v1/sandboxes/{sid}/exec", {"argv": ["/bin/sh", "-c", script]})
            if check_exec("")(status, resp):
                raise RuntimeError(f"spawn loop: {check_exec('')(status, resp)}")
            ds.append(float(resp["duration_ms"]))
        return statistics.median(ds)
    with_true = median_ms(SPAWN_LOOP % (SPAWN_LOOP_N, "/bin/true;"))
    without = median_ms(SPAWN_LOOP % (SPAWN_LOOP_N, ""))
    return {"loop_with_ms": with_true, "loop_without_ms": without, "n": SPAWN_LOOP_N, "reps": reps,
            "per_spawn_ms": (with_true - without) / SPAWN_LOOP_N}


def gvisor_exec(port: int, p: dict, gv: dict, exec_body: dict, process_sid: str) -> None:
    """Warm exec on gVisor sandboxes: the process tier's command and concurrency levels (one client per sandbox);
    and, on one sandbox of each tier, what a fork+exec costs inside (`spawn_inside`)."""
    c = Client(port)
    sid, ns, err = c.create(GVISOR)
    if not sid:
        gv["unavailable"] = err
        log(f"gvisor tier unavailable, its measurements are skipped: {err}")
        return
    status, resp, _ = c.request("POST", f"/v1/sandboxes/{sid}/exec", {"argv": ["uname", "-r"]})
    release = resp.get("stdout", "").strip() if status == 200 and isinstance(resp, dict) else None
    gv["guest_kernel_release"] = release
    c.delete(sid)
    if release is None or release == platform.release():
        raise RuntimeError(f"the gvisor sandbox's kernel is {release!r}, the host's {platform.release()!r}: not gVisor")
    conc_levels = (1, 16)
    log(f"gvisor: creating {max(conc_levels)} sandboxes for warm exec (guest kernel {release})")
    made = create_many(port, max(conc_levels), 2, spec=GVISOR)
    try:
        if len(made["ids"]) < max(conc_levels):
            raise RuntimeError(f"could not create {max(conc_levels)} gvisor sandboxes: {made['failure']}")
        gv["create_for_exec_ms"] = made["latency_ms"]
        for conc in conc_levels:
            total, cap = p[f"gv_n_c{conc}"], p[f"gv_max_s_c{conc}"]
            log(f"gvisor exec_c{conc}: {total} requests at concurrency {conc} (at most {cap} s)")
            w = gv[f"exec_c{conc}"] = request_load(port, made["ids"][:conc], "/exec", exec_body, total, check_exec(""),
                                                   warmup=p["gv_warmup"], max_s=cap)
            log(f"  p50 {w['latency_ms'].get('p50', 0):.2f} ms p99 {w['latency_ms'].get('p99', 0):.2f} ms "
                f"{w['throughput_per_s'] or 0:.0f}/s, {w['ok']} ok, errors {w['errors']}")
        c = Client(port)
        gv["spawn_inside"] = {"gvisor": spawn_inside(c, made["ids"][0]), "process": spawn_inside(c, process_sid)}
        log("  one fork+exec of /bin/true inside: " + ", ".join(
            f"{tier} {r['per_spawn_ms']:.2f} ms" for tier, r in gv["spawn_inside"].items()))
    finally:
        # Not wait_clean(): the process tier's exec sandboxes still exist.
        d = delete_many(port, made["ids"], 4)
        gv["delete_for_exec"] = {k: d[k] for k in ("deleted", "errors", "error_examples", "latency_ms")}


def gvisor_unpooled_creates(port: int, p: dict, gv: dict) -> None:
    """`POST /v1/sandboxes {"isolation": "gvisor"}` with no pool: create+delete from one client."""
    c = Client(port)
    log(f"gvisor create+delete loop at concurrency 1 (no pool; up to {p['gv_cycles']} cycles or "
        f"{p['gv_loop_max_s']} s)")
    m0 = c.metrics()
    r = create_delete_loop(port, 1, p["gv_cycles"], p["gv_loop_max_s"], spec=GVISOR)
    m1 = c.metrics()
    cnt = m1.get("sandkasten_sandbox_create_seconds_count", 0) - m0.get("sandkasten_sandbox_create_seconds_count", 0)
    r["server_create_mean_ms"] = ((m1.get("sandkasten_sandbox_create_seconds_sum", 0) - m0.get("sandkasten_sandbox_create_seconds_sum", 0))
                                  / cnt * 1000) if cnt else None
    gv["unpooled_c1"] = r
    cm, dm = r["create_ms"] or {}, r["delete_ms"] or {}
    log(f"  {r['cycles_per_s'] or 0:.1f} cycles/s, create p50 {cm.get('p50', 0):.1f} ms, delete p50 "
        f"{dm.get('p50', 0):.1f} ms, errors {r['errors']}")
    wait_clean(15)


def gvisor_pooled_phase(server: Server, p: dict, results: dict) -> None:
    """A server whose only pool is a gVisor one for the default limits: hits of `POST /v1/sandboxes
    {"isolation": "gvisor"}` and the pool's refill."""
    def measure(gv: dict) -> None:
        gv["pool"] = measure_pool(server, "gvisor", GV_POOL_MIN, GV_POOL_MAX, p["gv_pool_rounds"], GVISOR)
    gvisor_part(results, "pool", measure)


def pooled_phase(server: Server, p: dict, results: dict) -> None:
    port = server.port
    c = Client(port)
    results["pool"] = measure_pool(server, "default", POOL_MIN, POOL_MAX, p["pool_rounds"])

    wait_pool_full(c, "default", POOL_MIN, time.perf_counter())
    log("pooled create+delete loop at concurrency 1")
    m0 = c.metrics()
    r = create_delete_loop(port, 1, p["cycles"], p["loop_max_s"])
    m1 = c.metrics()
    r["hits"] = m1.get("sandkasten_pool_hits_total", 0) - m0.get("sandkasten_pool_hits_total", 0)
    r["misses"] = m1.get("sandkasten_pool_misses_total", 0) - m0.get("sandkasten_pool_misses_total", 0)
    results["creates"]["pooled_c1"] = r
    log(f"  {r['cycles_per_s'] or 0:.1f} cycles/s, hits {r['hits']:.0f} misses {r['misses']:.0f}")


# ---------------------------------------------------------------------------------------------------------------


def machine(binary: str) -> dict:
    def out(argv):
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout.strip() or None
        except (OSError, subprocess.TimeoutExpired):
            return None
    head = out(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    dirty = out(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"])
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return {"nproc": len(os.sched_getaffinity(0)), "cpu": cpu, "kernel": platform.release(),
            "mem_total_mib": int(Path("/proc/meminfo").read_text().split()[1]) // 1024,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "sandkasten": f"{head}{' (uncommitted changes)' if dirty else ''}" if head else None,
            "sandkasten_binary": binary}


def main() -> int:
    args = bench_args(__doc__, DEFAULT_JSON, "sandkasten serve needs it", "fewer requests (a smoke test; the doc says so)",
                      lambda parser: parser.add_argument("--no-gvisor", action="store_true",
                                                         help="skip the gvisor tier's measurements"))
    if args is None:
        return 1
    binary = str(Path(args.sandkasten).resolve())
    p = {"quick": args.quick, "n_c1": 500, "n_c16": 2000, "n_py": 480, "cycles": 300, "loop_max_s": 15,
         "k_idle": 100, "concurrent": 1000, "pool_rounds": 10, "burst": 300,
         # gvisor: counts and caps keep its parts near 30 s (an exec of /bin/true takes ~50-70 ms on that tier)
         "gvisor": not args.no_gvisor, "gv_warmup": 2, "gv_n_c1": 200, "gv_max_s_c1": 6, "gv_n_c16": 480,
         "gv_max_s_c16": 8, "gv_cycles": 15, "gv_loop_max_s": 5, "gv_pool_rounds": 2}
    if args.quick:
        p.update(n_c1=100, n_c16=400, n_py=96, cycles=60, loop_max_s=5, pool_rounds=3, burst=100,
                 gv_n_c1=60, gv_max_s_c1=3, gv_n_c16=96, gv_max_s_c16=4, gv_cycles=6, gv_loop_max_s=2,
                 gv_pool_rounds=1)
    results: dict = {"machine": machine(binary), "params": p, "errors": []}
    results["loadavg_before"] = [round(x, 2) for x in os.getloadavg()]
    started = time.monotonic()
    phases = [("unpooled", False, [], unpooled_phase, "no pool"),
              ("pooled", True, [], pooled_phase, f"pool min {POOL_MIN} max {POOL_MAX}"),
              ("gvisor_pooled", False, GV_POOL_LINES, gvisor_pooled_phase,
               f"gvisor pool min {GV_POOL_MIN} max {GV_POOL_MAX}")]
    for label, pooled, extra, phase, what in phases:
        if label.startswith("gvisor") and (not p["gvisor"] or results.get("gvisor", {}).get("unavailable")):
            continue  # a server with a gvisor pool would not start without runsc
        server = Server(binary, pooled, extra)
        t0 = time.monotonic()
        try:
            log(f"starting sandkasten serve on 127.0.0.1:{server.port} ({what})")
            server.start()
            phase(server, p, results)
        except Exception as e:  # noqa: BLE001 - recorded in the results and the doc
            import traceback
            traceback.print_exc()
            results["errors"].append(f"{label} phase: {e!r}; server log: {server.log_tail()}")
        finally:
            code = server.stop()
            left, waited = wait_clean(15)
            results[f"shutdown_{label}"] = {"exit_code": code, "leftovers": left, "wait_s": waited}
            log(f"server stopped (exit {code}); leftovers after shutdown: {left}")
            server.cleanup()
            if label.startswith("gvisor") and "gvisor" in results:
                # the whole phase, server start and stop included
                results["gvisor"]["elapsed_s"]["pool_phase"] = round(time.monotonic() - t0, 1)
    return finish(results, started, args.json, not args.no_render)


def bench_args(doc: str, default_json: Path, why_root: str, quick_help: str = "fewer runs (a smoke test; the doc says so)",
               extra=None) -> argparse.Namespace | None:
    """The options every benchmark takes (`--sandkasten`, `--quick`, `--json`, `--no-render`, and those `extra`
    adds to the parser), parsed; None, with the reason printed, unless run as root (`why_root` says why it must)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--sandkasten", default=str(ROOT / "target" / "release" / "sandkasten"))
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--json", type=Path, default=default_json)
    parser.add_argument("--no-render", action="store_true", help="do not re-render docs/benchmarks.md")
    if extra is not None:
        extra(parser)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print(f"{Path(sys.argv[0]).name} must run as root ({why_root})", file=sys.stderr)
        return None
    return args


def finish(results: dict, started: float, path: Path, render_doc: bool) -> int:
    """Records the elapsed time (since `started`, monotonic) and the load, writes `results` to `path`, re-renders
    docs/benchmarks.md when `render_doc`; the exit code: 1 when a measurement failed."""
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    results["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")
    log(f"wrote {path} ({results['elapsed_s']} s)")
    if render_doc:
        sys.dont_write_bytecode = True  # no bench/__pycache__
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import render
        render.main([])
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
