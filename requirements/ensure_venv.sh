# Sourced by run_all.sh and run_tests.sh: create the virtual environment once and reinstall only
# when a requirements file changed (their hash is kept inside the venv).
# Usage: ensure_venv VENV_DIR REQUIREMENTS_FILE...
ensure_venv() {
  local venv=$1; shift
  local stamp="$venv/.requirements.sha256"
  local want
  want=$(cat "$@" | sha256sum | cut -d' ' -f1)
  if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0
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
  echo "setting up $venv (pinned: $*) ..." >&2
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  local args=()
  for f in "$@"; do args+=(-r "$f"); done
  "$venv/bin/python" -m pip install --quiet "${args[@]}"
  echo "$want" > "$stamp"
}
