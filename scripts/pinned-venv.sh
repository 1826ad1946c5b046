# Sourced by the setup scripts: `pinned_venv WHO VENV REQUIREMENTS [EXECUTABLE]` makes VENV with /usr/bin/python3
# (installing Debian's python3-venv first when ensurepip is missing) and installs REQUIREMENTS into it, only when a
# package is missing, a pinned `name==version` differs, or EXECUTABLE (a file under VENV/bin) is absent. WHO names
# the caller in its messages. Idempotent and quiet.

pinned_venv() {
  local who=$1 venv=$2 requirements=$3 executable=${4:-python}
  # Debian's python3 has no ensurepip (so no `-m venv`) without python3-venv.
  if ! /usr/bin/python3 -c 'import ensurepip' >/dev/null 2>&1; then
    if [ "$(id -u)" -ne 0 ]; then
      echo "$who: python3-venv is missing (run as root to install it)" >&2
      return 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
  fi
  if ! pinned_venv_present "$venv" "$requirements" "$executable"; then
    [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
    pinned_venv_present "$venv" "$requirements" "$executable" ||
      { echo "$who: $venv does not hold the versions of $requirements after pip" >&2; return 1; }
  fi
}

# Every `name==version` of the requirements file installed at exactly that version, and the executable there?
pinned_venv_present() {
  local venv=$1 requirements=$2 executable=$3
  [ -x "$venv/bin/python" ] && [ -x "$venv/bin/$executable" ] || return 1
  "$venv/bin/python" - "$requirements" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version

for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, want = line.split("==")
    try:
        if version(name) != want:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
PY
}
