#!/usr/bin/env bash
# Fuzzes the HTTP API with schemathesis against its own OpenAPI spec: a real `sandkasten serve` on loopback, every
# operation with generated input, and the check that no input makes the server answer 5xx. Run as root.
#
#   scripts/fuzz-api.sh            about 50 examples per operation
#   scripts/fuzz-api.sh --quick    10 examples per operation
#
# schemathesis is installed from PyPI into target/fuzz-venv (once). The server, its spawner and its sandboxes are
# stopped on every path; the leak check runs at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

examples=50
[ "${1:-}" = "--quick" ] && examples=10

venv=target/fuzz-venv
if [ ! -x "$venv/bin/st" ]; then
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q schemathesis
fi

cargo build -p sandkasten-cli
target_dir=${CARGO_TARGET_DIR:-target}
work=$(mktemp -d)
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$target_dir/debug/sandkasten" serve --insecure-no-auth --listen "127.0.0.1:$port" --database "$work/db.sqlite" &
server=$!
cleanup() {
  kill -TERM "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 1 100); do
  curl -fs "http://127.0.0.1:$port/healthz" >/dev/null && break
  sleep 0.1
done

# One live sandbox, so that operations on `{id}` reach the runtime rather than stopping at 404.
id=$(curl -fs -X POST "http://127.0.0.1:$port/v1/sandboxes" -d '{}' | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
echo "fuzzing http://127.0.0.1:$port with sandbox $id, $examples examples per operation"

"$venv/bin/st" run "http://127.0.0.1:$port/openapi.json" \
  --checks not_a_server_error \
  --max-examples "$examples" \
  --workers 2 \
  --request-timeout 30 \
  --header "X-Fuzz: 1" \
  --suppress-health-check all

cleanup
trap - EXIT
scripts/check-leaks.sh
