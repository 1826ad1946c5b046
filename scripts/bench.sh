#!/usr/bin/env bash
# Cold-start benchmark: installs the contenders (bubblewrap, runsc) when missing, builds sandkasten in release mode,
# then runs bench/cold_start.py, which writes bench/results/cold_start.json and regenerates docs/benchmarks.md.
#
#   scripts/bench.sh            200 interleaved runs per contender
#   scripts/bench.sh --quick    30 runs (a smoke test; the doc says so)
#   scripts/bench.sh --runs N   N runs
#
# Run as root (the process tier and runsc need it). Installing is idempotent: `dpkg -s` first, and `apt-get update`
# only when something is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=200
while [ "$#" -gt 0 ]; do
  case "$1" in
    --quick) runs=30 ;;
    --runs)
      [ "$#" -ge 2 ] || { echo "bench: --runs needs a number" >&2; exit 2; }
      runs=$2
      shift
      ;;
    -h | --help)
      sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
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

scripts/setup.sh runsc
cargo build --release -p sandkasten-cli
target_dir=${CARGO_TARGET_DIR:-target}

exec /usr/bin/python3 bench/cold_start.py --sandkasten "$target_dir/release/sandkasten" --runs "$runs"
