#!/usr/bin/env bash
# Benchmarks: installs the cold-start contenders (bubblewrap, runsc: scripts/setup.sh) when missing, builds sandkasten in release mode,
# then runs bench/cold_start.py (one-shot cold starts, the gvisor tier beside `runsc do` included; ~2-3 min) and
# bench/warm.py (`sandkasten serve` over HTTP: warm exec/code, throughput, creation rate, pool, idle memory, 1,000
# sandboxes, and the gvisor tier's warm exec, pooled and unpooled create beside the process tier's; ~2 min, of which
# the gvisor parts ~30 s) and bench/runs.py (one-shot POST /v1/run without pool, with a pool, with Python/Node
# zygotes; ~1 min), which write bench/results/{cold_start,warm,runs}.json; bench/render.py then renders docs/benchmarks.md and docs/benchmarks-latency.svg.
#
#   scripts/bench.sh            200 interleaved cold runs per contender, full warm run
#   scripts/bench.sh --quick    30 cold runs, fewer warm requests (a smoke test; the doc says so)
#   scripts/bench.sh --runs N   N cold runs
#   scripts/bench.sh --snapshots-only   pause/resume, snapshot, restore, fork and dedup per tier (bench/snapshots.py,
#                               ~3 min, bench/results/snapshots.json)
#   scripts/bench.sh --microvm-only   the microvm tier against a bare QEMU boot of the same kernel and root
#                               (bench/microvm.py, ~3 min, bench/results/microvm.json)
#   scripts/bench.sh --templates-only   python-data's build cold vs cached, and a first cell `import pandas` cold vs
#                               from a pool whose zygote preloaded it (bench/templates.py, ~4 min,
#                               bench/results/templates.json)
#   scripts/bench.sh --cold-only / --warm-only / --runs-only / --egress-only   one part (the doc is rendered from
#                               all JSON files); egress = the proxy vs a direct connection on loopback
#                               (crates/egress/examples/egress_bench, ~15 s, bench/results/egress.json)
#
# Run as root (the process tier and runsc need it). Installing is idempotent: `dpkg -s` first, and `apt-get update`
# only when something is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=200
quick=
cold=1
warm=1
oneshot=1
egress=1
snapshots=1
microvm=1
templates=1
while [ "$#" -gt 0 ]; do
  case "$1" in
    --quick) runs=30; quick=--quick ;;
    --cold-only) warm= oneshot= egress= snapshots= microvm= templates= ;;
    --warm-only) cold= oneshot= egress= snapshots= microvm= templates= ;;
    --runs-only) cold= warm= egress= snapshots= microvm= templates= ;;
    --egress-only) cold= warm= oneshot= snapshots= microvm= templates= ;;
    --snapshots-only) cold= warm= oneshot= egress= microvm= templates= ;;
    --microvm-only) cold= warm= oneshot= egress= snapshots= templates= ;;
    --templates-only) cold= warm= oneshot= egress= snapshots= microvm= ;;
    --runs)
      [ "$#" -ge 2 ] || { echo "bench: --runs needs a number" >&2; exit 2; }
      runs=$2
      shift
      ;;
    -h | --help)
      sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "bench: unknown argument: $1 (try --help)" >&2
      exit 2
      ;;
  esac
  shift
done
case "$runs" in
  '' | *[!0-9]* | 0) echo "bench: --runs must be a positive integer, got '$runs'" >&2; exit 2 ;;
esac

if [ -n "$cold$warm$oneshot$snapshots$microvm$templates" ]; then
  scripts/setup.sh   # installs runsc (bookworm-backports) and bubblewrap
  cargo build --release -p sandkasten-cli
fi
target_dir=${CARGO_TARGET_DIR:-target}

if [ -n "$cold" ]; then
  /usr/bin/python3 bench/cold_start.py --sandkasten "$target_dir/release/sandkasten" --runs "$runs"
fi
if [ -n "$warm" ]; then
  # warm.py exits 1 when a measurement failed (recorded in warm.json and the doc); render anyway, then report it.
  status=0
  /usr/bin/python3 bench/warm.py --sandkasten "$target_dir/release/sandkasten" $quick --no-render || status=$?
fi
if [ -n "$oneshot" ]; then
  /usr/bin/python3 bench/runs.py --sandkasten "$target_dir/release/sandkasten" $quick --no-render || status=$?
fi
if [ -n "$egress" ]; then
  # The egress proxy against a direct connection on loopback; exits 1 if a request failed (no JSON written then).
  cargo build --release -p sandkasten-egress --example egress_bench
  "$target_dir/release/examples/egress_bench" --json bench/results/egress.json $quick || status=$?
fi
if [ -n "$snapshots" ]; then
  /usr/bin/python3 bench/snapshots.py --sandkasten "$target_dir/release/sandkasten" $quick --no-render || status=$?
fi
if [ -n "$microvm" ]; then
  rounds=10
  [ -n "$quick" ] && rounds=3
  /usr/bin/python3 bench/microvm.py --binary "$target_dir/release/sandkasten" --rounds "$rounds" --no-render || status=$?
fi
if [ -n "$templates" ]; then
  /usr/bin/python3 bench/templates.py --sandkasten "$target_dir/release/sandkasten" $quick --no-render || status=$?
fi
/usr/bin/python3 bench/render.py
exit "${status:-0}"
