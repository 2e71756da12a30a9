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
  echo "setting up $venv (pinned: $*) ..." >&2
  [ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  local args=()
  for f in "$@"; do args+=(-r "$f"); done
  "$venv/bin/python" -m pip install --quiet "${args[@]}"
  echo "$want" > "$stamp"
}
