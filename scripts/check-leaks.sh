#!/usr/bin/env bash
# Fails when anything of a sandbox is still on the host: records, cgroups, processes running as sandbox ids, or mounts.
# Run after the test suite (nothing else may be running sandboxes at that moment).
set -uo pipefail

state_dir=${SANDKASTEN_STATE_DIR:-/run/sandkasten}
id_base=1000000000
id_end=$((id_base + 65536))
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

mounts=$(grep -i sandkasten /proc/self/mountinfo)
[ -n "$mounts" ] && problems+=("mounts left: $mounts")

# The egress tests' own test hosts (network namespaces with veth pairs) and anything still routed to them.
namespaces=$(ip netns list 2>/dev/null | grep -E '^sk-test-')
[ -n "$namespaces" ] && problems+=("test network namespaces left: $namespaces")
links=$(ip -br link 2>/dev/null | grep -E '^skh')
[ -n "$links" ] && problems+=("test veth links left: $links")

if [ "${#problems[@]}" -gt 0 ]; then
  printf 'leak check failed:\n' >&2
  printf '  %s\n' "${problems[@]}" >&2
  exit 1
fi
echo "leak check: no records, cgroups, sandbox processes, mounts or test network namespaces left"
