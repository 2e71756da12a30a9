# Sourced by run_all.sh and run_tests.sh: create the virtual environment once and install it from
# its hash-locked requirement file, again only when that lock changed (its sha256 is kept inside the venv).
# Usage: ensure_venv VENV_DIR ENV
#   ENV: run (host.txt + worker-cpu.txt), run-gpu (host.txt + worker-gpu.txt), dev (run + dev.txt).
# The lock is requirements/locks/<ENV>-py<X.Y>.txt for the venv's Python X.Y (requirements/lock.sh
# writes them). `pip install --require-hashes` installs exactly its files: every package must be
# in the lock with a matching sha256, dependencies included, or pip stops. Packages the lock does not
# name are removed, and the venv is checked against the lock before <VENV_DIR>/.suite-lock.json
# records which lock it holds (results carry that record; suite/locks.py reads it).
# A Python without a lock stops here, unless SUITE_UNLOCKED=1: then the top-level requirement
# files are installed without hashes (their dependencies float) and the record says "unlocked".
# SUITE_LOCKS_DIR replaces requirements/locks (the tests install a lock of their own with it).
ensure_venv() {
  local venv=${1:-} env=${2:-}
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  local inputs=()
  case "$env" in
    run) inputs=(requirements/host.txt requirements/worker-cpu.txt) ;;
    run-gpu) inputs=(requirements/host.txt requirements/worker-gpu.txt) ;;
    dev) inputs=(requirements/host.txt requirements/worker-cpu.txt requirements/dev.txt) ;;
    *)
      echo "error: ensure_venv: environment '$env' is unknown; allowed: run, run-gpu, dev" \
        "(usage: ensure_venv VENV_DIR ENV)" >&2
      return 2
      ;;
  esac
  if [ -z "$venv" ]; then
    echo "error: ensure_venv: no venv folder given (usage: ensure_venv VENV_DIR ENV)" >&2
    return 2
  fi

  # The pinned numpy, matplotlib and keras need Python 3.11; an older interpreter would only fail
  # deep inside pip with "no matching distribution". An existing venv keeps the Python it was made with.
  local py="${PYTHON:-python3}"
  [ -x "$venv/bin/python" ] && py="$venv/bin/python"
  if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    local found
    found="Python $("$py" -c 'import platform; print(platform.python_version())' 2>/dev/null)" || found="not runnable"
    echo "error: Python 3.11+ is needed; $py is $found." >&2
    if [ "$py" = "$venv/bin/python" ]; then
      echo "Remove $venv and rerun with PYTHON=/path/to/python3.11 (or newer)." >&2
    else
      echo "Rerun with PYTHON=/path/to/python3.11 (or newer)." >&2
    fi
    return 1
  fi
  local version xy
  version=$("$py" -c 'import platform; print(platform.python_version())') || return 1
  xy=$(echo "$version" | cut -d. -f1,2)

  local locks=${SUITE_LOCKS_DIR:-$root/requirements/locks}
  local lock="$locks/$env-py$xy.txt"
  local want
  if [ -f "$lock" ]; then
    want=$(sha256sum "$lock" | cut -d' ' -f1)
  elif [ "${SUITE_UNLOCKED:-0}" = "1" ]; then
    lock=""
    want="unlocked $(cd "$root" && cat "${inputs[@]}" | sha256sum | cut -d' ' -f1)"
  else
    local have
    have=$(cd "$locks" 2>/dev/null && ls -- "$env"-py*.txt 2>/dev/null |
      sed -e "s/^$env-py//" -e 's/\.txt$//' | paste -sd' ' -)
    echo "error: no lock for Python $xy: $lock does not exist." >&2
    echo "Locks of environment '$env' exist for Python: ${have:-none} (in $locks)." >&2
    if [ "$py" = "$venv/bin/python" ]; then
      echo "Use one of them (remove $venv and rerun with PYTHON=/path/to/python<X.Y>)," >&2
    else
      echo "Use one of them (rerun with PYTHON=/path/to/python<X.Y>)," >&2
    fi
    echo "or add $xy to HOST_PYTHONS in requirements/lock.sh and run requirements/lock.sh," >&2
    echo "or set SUITE_UNLOCKED=1 to install the unhashed top-level pins (results then say 'unlocked')." >&2
    return 1
  fi

  local stamp="$venv/.requirements.sha256" record="$venv/.suite-lock.json"
  if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ -f "$record" ]; then
    local held
    held=$(cat "$stamp")
    [ "$held" = "$want" ] && return 0
    # The dev lock is the run lock plus the test tools at the same versions (requirements/lock.sh
    # compiles it under the run lock; tests/test_locks.py checks it), so a dev venv serves a run as
    # it is: no uninstall and reinstall each time ./run_all.sh and ./run_tests.sh take turns.
    if [ "$env" = run ] && [ -n "$lock" ] && [ -f "$locks/dev-py$xy.txt" ] &&
      [ "$held" = "$(sha256sum "$locks/dev-py$xy.txt" | cut -d' ' -f1)" ]; then
      return 0
    fi
  fi

  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv" || return 1
  rm -f "$stamp" "$record"  # until the install below succeeds, the venv holds no known lock
  if [ -n "$lock" ]; then
    echo "setting up $venv from $lock (hash-checked) ..." >&2
    "$venv/bin/python" -m pip install --quiet --require-hashes -r "$lock" || return 1
    # What an earlier lock or a manual install left behind would make the venv differ from the lock.
    local extra
    extra=$(cd "$root" && "$venv/bin/python" -m suite.locks extraneous "$lock") || return 1
    if [ -n "$extra" ]; then
      echo "removing packages the lock does not name: $(echo "$extra" | paste -sd' ' -)" >&2
      # shellcheck disable=SC2086
      "$venv/bin/python" -m pip uninstall --quiet --yes $extra || return 1
    fi
    (cd "$root" && "$venv/bin/python" -m suite.locks check "$lock") || return 1
  else
    echo "WARNING: no lock for Python $xy; SUITE_UNLOCKED=1 installs the top-level pins of ${inputs[*]}" >&2
    echo "WARNING: without hashes: their dependencies float and results record the environment as unlocked." >&2
    local args=()
    for f in "${inputs[@]}"; do args+=(-r "$root/$f"); done
    "$venv/bin/python" -m pip install --quiet "${args[@]}" || return 1
  fi
  (cd "$root" && "$venv/bin/python" - "$record" "$env" "$lock" <<'EOF'
import hashlib
import json
import os
import platform
import sys

record, environment, lock = sys.argv[1:4]
if lock:
    with open(lock, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    # Relative to the repository root where it lies inside it, as results quote it.
    relative = os.path.relpath(os.path.abspath(lock))
    lock = relative if not relative.startswith("..") else os.path.abspath(lock)
facts = {
    "environment": environment,
    "lock_file": lock or None,
    "lock_sha256": digest if lock else None,
    "python": platform.python_version(),
}
with open(record, "w", encoding="utf-8") as f:
    json.dump(facts, f, indent=2)
    f.write("\n")
EOF
  ) || return 1
  echo "$want" > "$stamp"
}
