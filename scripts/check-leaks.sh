#!/usr/bin/env bash
# Fails when anything of a sandbox is still on the host: records, cgroups, processes running as sandbox ids, gVisor
# bundles, checkpoint images, runsc state and processes, or mounts.
# Run after the test suite (nothing else may be running sandboxes at that moment).
set -uo pipefail

state_dir=${SANDKASTEN_STATE_DIR:-/run/sandkasten}
id_base=1000000000
id_end=$((id_base + 4096 * 65536))  # every sandbox's own range (runtime/src/id_ranges.rs: MAX_RANGES of 65536 ids)
problems=()

records=$(find "$state_dir/sandboxes" -name '*.json' 2>/dev/null)
[ -n "$records" ] && problems+=("records left: $records")

cgroups=$(find /sys/fs/cgroup -maxdepth 3 -type d -name 'sandkasten*' 2>/dev/null)
[ -n "$cgroups" ] && problems+=("cgroups left: $cgroups")

# Zombies are left out: an agent whose owner was killed on purpose (the kill -9 tests) is re-parented to the host's
# init, which reaps it when it gets round to it; a zombie holds no memory, namespace, cgroup or file. Live processes
# get a few seconds to finish exiting.
sandbox_processes() {
  ps -e -o uid=,pid=,stat=,args= | awk -v lo="$id_base" -v hi="$id_end" '$1 >= lo && $1 < hi && $3 !~ /^Z/'
}
processes=$(sandbox_processes)
for _ in $(seq 1 50); do
  [ -z "$processes" ] && break
  sleep 0.2
  processes=$(sandbox_processes)
done
[ -n "$processes" ] && problems+=("sandbox processes still running: $processes")

# The gvisor tier: bundles, runsc's state entries, and runsc's own processes (runsc, runsc-sandbox, runsc-gofer; the
# doctor's probe uses a state directory of its own and removes it).
bundles=$(find "$state_dir/gvisor" -mindepth 1 -maxdepth 1 2>/dev/null)
[ -n "$bundles" ] && problems+=("gVisor bundles left: $bundles")
images=$(find "$state_dir/checkpoints" -mindepth 1 -maxdepth 1 2>/dev/null)
[ -n "$images" ] && problems+=("gVisor checkpoint images left: $images")
runsc_state=$(find "$state_dir/runsc" -mindepth 1 -maxdepth 1 2>/dev/null)
[ -n "$runsc_state" ] && problems+=("runsc state left: $runsc_state")
runsc_processes() {
  ps -e -o pid=,stat=,args= | awk '$2 !~ /^Z/ && ($3 ~ /(^|\/)runsc$/ || $3 ~ /^runsc-(sandbox|gofer)$/)'
}
runsc_left=$(runsc_processes)
for _ in $(seq 1 25); do
  [ -z "$runsc_left" ] && break
  sleep 0.2
  runsc_left=$(runsc_processes)
done
[ -n "$runsc_left" ] && problems+=("runsc processes still running: $runsc_left")

mounts=$(grep -i sandkasten /proc/self/mountinfo)
[ -n "$mounts" ] && problems+=("mounts left: $mounts")

# The egress tests' own test hosts (network namespaces with veth pairs) and anything still routed to them.
namespaces=$(ip netns list 2>/dev/null | grep -E '^sk-test-')
[ -n "$namespaces" ] && problems+=("test network namespaces left: $namespaces")
links=$(ip -br link 2>/dev/null | grep -E '^skh')
[ -n "$links" ] && problems+=("test veth links left: $links")

# The snapshot store's S3 test server (crates/snapshot-store/tests/s3.rs starts and kills it).
moto=$(ps -e -o pid=,stat=,args= | awk '$2 !~ /^Z/ && /s3-test-venv\/bin\/moto_server/')
[ -n "$moto" ] && problems+=("S3 test servers still running: $moto")

if [ "${#problems[@]}" -gt 0 ]; then
  printf 'leak check failed:\n' >&2
  printf '  %s\n' "${problems[@]}" >&2
  exit 1
fi
echo "leak check: no records, cgroups, sandbox processes, gVisor bundles, checkpoint images, runsc state or processes, mounts, test network namespaces or S3 test servers left"
