#!/usr/bin/env bash
# Regenerate every hash-locked requirement file from its top-level inputs:
#   requirements/locks/<env>-py<X.Y>.txt  for env in run, run-gpu, dev and Python 3.11, 3.12
#   docker/locks/<image>.txt              for every image of docker/images.yaml (the images' Python 3.11)
# Usage (from anywhere): requirements/lock.sh [UV_ARGS...]
# Extra arguments go to every `uv pip compile`, e.g. --upgrade-package numpy or --upgrade. Without
# them an existing lock is kept as the preference, so only what an input change forces moves.
#
# A lock is the full resolution (every transitive package, pinned with ==) with the sha256 of every
# distribution of each pinned version, so `pip install --require-hashes` installs the same bytes on
# every Linux x86_64 machine. Resolution is for manylinux_2_28 (glibc 2.28+: the Debian bookworm
# images and any current host). The output carries no timestamp: the same inputs give the same bytes.
# uv is pinned in requirements/dev.txt (`./run_tests.sh` installs it into .venv).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${SUITE_VENV:-.venv}
if [ -x "$VENV/bin/uv" ]; then
  uv=$VENV/bin/uv
elif command -v uv >/dev/null 2>&1; then
  uv=$(command -v uv)
else
  echo "error: uv not found in $VENV/bin or on PATH." >&2
  echo "Install the pinned one: ./run_tests.sh --co -q (sets up $VENV from the dev lock, uv included)," >&2
  echo "or: python3 -m pip install \"\$(grep '^uv==' requirements/dev.txt)\"" >&2
  exit 1
fi
want_uv=$(sed -n 's/^uv==\([^ ]*\).*/\1/p' requirements/dev.txt)
have_uv=$("$uv" --version | cut -d' ' -f2)
if [ "$have_uv" != "$want_uv" ]; then
  # Another uv may resolve or write differently; the locks would then change for no input change.
  echo "error: $uv is uv $have_uv; requirements/dev.txt pins uv==$want_uv" >&2
  exit 1
fi

PLATFORM=x86_64-manylinux_2_28
HOST_PYTHONS=(3.11 3.12)
# The images' interpreter: every base in docker/images.yaml is a python:3.11 image.
IMAGE_PYTHON=3.11

# compile OUT HEADER_LINE PYTHON_VERSION UV_INPUT_ARGS... (stdin is read when an input is "-")
compile() {
  local out=$1 what=$2 python=$3; shift 3
  local tmp
  tmp=$(mktemp)
  # uv keeps the pins of an existing output file where it can: start from the current lock.
  [ -f "$out" ] && cp "$out" "$tmp"
  "$uv" pip compile --quiet --generate-hashes --no-header \
    --python-version "$python" --python-platform "$PLATFORM" \
    --output-file "$tmp" "$@" "${extra_args[@]}"
  mkdir -p "$(dirname "$out")"
  {
    echo "# Hash-locked requirements: $what"
    echo "# Python $python, Linux x86_64 ($PLATFORM); resolved by uv $want_uv. Do not edit by hand."
    echo "# Regenerate every lock with: requirements/lock.sh"
    echo
    cat "$tmp"
  } > "$out"
  rm -f "$tmp"
  echo "wrote $out" >&2
}

extra_args=("$@")

for py in "${HOST_PYTHONS[@]}"; do
  compile "requirements/locks/run-py$py.txt" "requirements/host.txt + requirements/worker-cpu.txt" "$py" \
    requirements/host.txt requirements/worker-cpu.txt
  compile "requirements/locks/run-gpu-py$py.txt" "requirements/host.txt + requirements/worker-gpu.txt" "$py" \
    requirements/host.txt requirements/worker-gpu.txt
  # Under the run lock: a venv holding dev holds run too, at the same versions (ensure_venv relies on it).
  compile "requirements/locks/dev-py$py.txt" \
    "requirements/host.txt + requirements/worker-cpu.txt + requirements/dev.txt (under the run lock)" "$py" \
    requirements/host.txt requirements/worker-cpu.txt requirements/dev.txt -c "requirements/locks/run-py$py.txt"
done

# One line per image: NAME<TAB>LOCK<TAB>CONSTRAINTS<TAB>REQUIREMENT REQUIREMENT ... (tensorflow, then extra);
# LOCK and CONSTRAINTS relative to docker/, the lock where the entry's `lock` key says (default locks/NAME.txt).
# PyYAML reads the catalog: the venv's (host.txt pins it), else python3's.
yaml_python=python3
[ -x "$VENV/bin/python" ] && yaml_python=$VENV/bin/python
images=$("$yaml_python" - <<'EOF'
import sys

import yaml

path = "docker/images.yaml"
with open(path, encoding="utf-8") as f:
    catalog = yaml.safe_load(f)
images = catalog.get("images") if isinstance(catalog, dict) else None
if not isinstance(images, dict) or not images:
    sys.exit(f"error: {path}: 'images' must map image names to entries")
for name, entry in images.items():
    for key in ("tensorflow", "constraints"):
        if not isinstance(entry, dict) or not isinstance(entry.get(key), str) or not entry[key].strip():
            sys.exit(f"error: {path}: images.{name}.{key} must be a non-empty string")
    extra = entry.get("extra") or ""
    if not isinstance(extra, str):
        sys.exit(f"error: {path}: images.{name}.extra must be a string of space-separated requirements")
    lock = entry.get("lock", f"locks/{name}.txt")
    if not isinstance(lock, str) or not lock.endswith(".txt") or lock.startswith("/") or ".." in lock.split("/"):
        sys.exit(f"error: {path}: images.{name}.lock must be a .txt path inside docker/, e.g. locks/{name}.txt")
    print(f"{name}\t{lock}\t{entry['constraints']}\t{entry['tensorflow']} {extra}".rstrip())
EOF
)

while IFS=$'\t' read -r name lock constraints requirements; do
  # The image's own requirements, as the Dockerfile passes them to pip, on stdin (one per line).
  tr ' ' '\n' <<<"$requirements" | sed '/^$/d' |
    compile "docker/$lock" "image $name of docker/images.yaml ($requirements; -c docker/$constraints)" \
      "$IMAGE_PYTHON" - -c "docker/$constraints"
done <<<"$images"
