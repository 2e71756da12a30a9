# Sourced by run_all.sh and run_tests.sh: create the virtual environment once and install it from
# its hash-locked requirement file, again only when that lock changed (its sha256 is kept inside the venv).
# Usage: ensure_venv VENV_DIR ENV
#   ENV: an environment of requirements/environments.txt (run, run-gpu, cluster, cluster-gpu, dev),
#   which says what each is made of and which one it extends.
# The lock is requirements/locks/<ENV>-py<X.Y>.txt for the venv's Python X.Y (requirements/lock.sh
# writes them). `pip install --require-hashes --only-binary :all:` installs exactly its wheels: every
# package must be in the lock with a matching sha256, dependencies included, or pip stops; the lock's
# pip is installed first. A venv holding another environment, or one no locked install made, is
# recreated; packages the lock does not name are removed before the install; the venv is checked
# against the lock before <VENV_DIR>/.suite-lock.json records which lock it holds (results carry
# that record; suite/environment/locks.py reads it). The locks are for Linux x86_64: elsewhere this stops.
# A Python without a lock (or another platform) stops here, unless SUITE_UNLOCKED=1: then the
# top-level requirement files are installed without hashes (their dependencies float) and the
# record says "unlocked".
# SUITE_LOCKS_DIR replaces requirements/locks (the tests install a lock of their own with it).
# requirements/environments.txt, without comments: NAME BASE FILE... a line.
_suite_environments() {
  sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$1/requirements/environments.txt"
}

# The environments whose lock holds ENV's lock at the same versions: those that extend it, at any
# depth (each extension's lock is compiled under its base's). Plain arrays: bash 3.2 (macOS) has no
# associative ones, and SUITE_UNLOCKED=1 serves such machines.
_suite_wider_envs() {
  local root=$1 env=$2 name base files i j k next
  local names=() bases=()
  while read -r name base files; do
    names+=("$name")
    bases+=("$base")
  done < <(_suite_environments "$root")
  for ((i = 0; i < ${#names[@]}; i++)); do
    base=${bases[i]}
    for ((k = 0; k < ${#names[@]}; k++)); do # up the chain of bases (no longer than the list)
      [ "$base" = "-" ] || [ -z "$base" ] && break
      if [ "$base" = "$env" ]; then
        printf '%s\n' "${names[i]}"
        break
      fi
      next=""
      for ((j = 0; j < ${#names[@]}; j++)); do
        if [ "${names[j]}" = "$base" ]; then next=${bases[j]}; fi
      done
      base=$next
    done
  done
}

ensure_venv() {
  local venv=${1:-} env=${2:-}
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  local inputs=() name base files known=()
  while read -r name base files; do
    known+=("$name")
    [ "$name" = "$env" ] && read -r -a inputs <<<"$files"
  done < <(_suite_environments "$root")
  if [ ${#inputs[@]} -eq 0 ]; then
    local allowed
    allowed=$(printf '%s, ' "${known[@]}")
    echo "error: ensure_venv: environment '$env' is unknown; allowed: ${allowed%, }" \
      "(usage: ensure_venv VENV_DIR ENV; requirements/environments.txt lists them)" >&2
    return 2
  fi
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
  local version xy unlocked_why=""
  version=$("$py" -c 'import platform; print(platform.python_version())') || return 1
  xy=$(echo "$version" | cut -d. -f1,2)

  local locks=${SUITE_LOCKS_DIR:-$root/requirements/locks}
  local lock="$locks/$env-py$xy.txt"
  local want
  # SUITE_UNLOCKED=1 is asked for where no lock can serve: a Python without a lock, or a machine
  # other than Linux x86_64 (below), where a lock of this Python exists yet cannot be installed as
  # it promises. So it wins over an existing lock.
  if [ "${SUITE_UNLOCKED:-0}" = "1" ]; then
    [ -f "$lock" ] && unlocked_why="SUITE_UNLOCKED=1 is set (the lock $lock is not used)" ||
      unlocked_why="no lock for Python $xy"
    lock=""
    want="unlocked $(cd "$root" && cat "${inputs[@]}" | sha256sum | cut -d' ' -f1)"
  elif [ -f "$lock" ]; then
    want=$(sha256sum "$lock" | cut -d' ' -f1)
  else
    local have
    # `|| true`: with no lock at all, ls fails, and under the callers' `set -euo pipefail` the
    # assignment would end the script before the message below says why.
    have=$(cd "$locks" 2>/dev/null && ls -- "$env"-py*.txt 2>/dev/null |
      sed -e "s/^$env-py//" -e 's/\.txt$//' | paste -sd' ' -) || true
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
    # The cluster lock is the run lock plus Ray, the dev lock the cluster lock plus the test tools,
    # at the same versions (requirements/lock.sh compiles each under the other; tests/test_locks.py
    # checks it), so a venv holding a wider one serves a narrower one as it is: no uninstall and
    # reinstall each time ./run_all.sh and ./run_tests.sh take turns.
    local wider
    for wider in $(_suite_wider_envs "$root" "$env"); do
      if [ -n "$lock" ] && [ -f "$locks/$wider-py$xy.txt" ] &&
        [ "$held" = "$(sha256sum "$locks/$wider-py$xy.txt" | cut -d' ' -f1)" ]; then
        return 0
      fi
    done
  fi

  if [ -n "$lock" ]; then
    # The locks hold wheels for Linux x86_64 only (their sdists would be built here, from source,
    # into files no lock hashed): elsewhere a locked install cannot be what the lock promises.
    local machine
    machine=$(uname -sm 2>/dev/null) || machine="unknown"
    if [ "$machine" != "Linux x86_64" ]; then
      echo "error: the locks in $locks are for Linux x86_64; this machine is '$machine'." >&2
      echo "Set SUITE_UNLOCKED=1 to install the unhashed top-level pins of ${inputs[*]}" \
        "(results then say 'unlocked')." >&2
      return 1
    fi
  fi

  if [ -x "$venv/bin/python" ] && [ -n "$lock" ]; then
    # `pip install --require-hashes` checks only what it downloads: a version already installed is
    # kept as it is. A venv whose files no locked install checked (made without a record, or under
    # SUITE_UNLOCKED=1) is therefore emptied first, or its record would vouch for unchecked files.
    # So is one holding another environment (dev serves run, above): run-gpu's tensorflow and
    # run's tensorflow-cpu share files (tensorflow/...), and uninstalling one deletes the other's.
    local recorded
    recorded=$("$venv/bin/python" -c '
import json, sys
try:
    with open(sys.argv[1], encoding="utf-8") as f:
        facts = json.load(f)
except (OSError, ValueError):
    facts = None
locked = isinstance(facts, dict) and facts.get("lock_file") and isinstance(facts.get("environment"), str)
print(facts["environment"] if locked else "")
' "$record" 2>/dev/null) || recorded=""
    # A wider venv serves a narrower one (above), so it turns into it in place: the removal below
    # takes only the test tools or Ray, which share no files with what the narrower lock installs.
    if [ "$recorded" != "$env" ] && ! _suite_wider_envs "$root" "$env" | grep -qx -- "$recorded"; then
      if [ -z "$recorded" ]; then
        echo "recreating $venv: it holds no record of a hash-checked install" >&2
      else
        echo "recreating $venv: it holds environment '$recorded', '$env' is asked for" >&2
      fi
      rm -f "$stamp" "$record"
      "$py" -m venv --clear "$venv" || return 1
    fi
  fi
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv" || return 1
  rm -f "$stamp" "$record"  # until the install below succeeds, the venv holds no known lock
  if [ -n "$lock" ]; then
    echo "setting up $venv from $lock (hash-checked) ..." >&2
    # What an earlier lock of this environment, a manual install or `python -m venv` (setuptools, on
    # 3.11) left goes before the install: removed after it, a package sharing files with one the lock
    # installs would delete them.
    local extra
    extra=$(cd "$root" && "$venv/bin/python" -m suite.environment.locks extraneous "$lock") || return 1
    if [ -n "$extra" ]; then
      echo "removing packages the lock does not name: $(echo "$extra" | paste -sd' ' -)" >&2
      # shellcheck disable=SC2086
      "$venv/bin/python" -m pip uninstall --quiet --yes $extra || return 1
    fi
    # The lock's pip first (the one a venv is born with differs by Python build), then the rest by it.
    # --only-binary: the lock hashes sdists too; a machine without a matching wheel must stop, not build.
    local installer
    installer=$(mktemp) || return 1
    if ! (cd "$root" && "$venv/bin/python" -m suite.environment.locks installer "$lock") >"$installer" ||
      { [ -s "$installer" ] && ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        --require-hashes --no-deps --only-binary :all: -r "$installer"; }; then
      rm -f "$installer"
      return 1
    fi
    rm -f "$installer"
    "$venv/bin/python" -m pip install --quiet --require-hashes --only-binary :all: -r "$lock" || return 1
    (cd "$root" && "$venv/bin/python" -m suite.environment.locks check "$lock") || return 1
  else
    echo "WARNING: $unlocked_why; SUITE_UNLOCKED=1 installs the top-level pins of ${inputs[*]}" >&2
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
