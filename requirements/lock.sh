#!/usr/bin/env bash
# Regenerate every hash-locked requirement file from its top-level inputs:
#   requirements/locks/<env>-py<X.Y>.txt  for every environment of requirements/environments.txt and Python 3.11, 3.12
#   docker/locks/<image>.txt              for every image of docker/images.yaml (the images' Python 3.11)
# Usage (from anywhere): requirements/lock.sh [UV_ARGS...]
# Extra arguments go to every `uv pip compile`, e.g. --upgrade-package numpy or --upgrade. Without
# them an existing lock is kept as the preference, so only what an input change forces moves.
#
# A lock is the full resolution (every transitive package, pinned with ==) with the sha256 of every
# file of each pinned version on the index: wheels for every platform, and the sdist where there is
# one. `pip install --require-hashes` then refuses any other file, but which of the listed files a
# machine takes depends on it: requirements/ensure_venv.sh adds --only-binary :all: and refuses a
# machine other than Linux x86_64, so a host gets the same wheels as every other Linux x86_64 host
# with glibc 2.28+ (manylinux_2_28, what the resolution is for: the Debian bookworm images and any
# current host) instead of building an sdist. The output carries no timestamp: the same inputs give
# the same bytes.
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
# The venv's Python reads the image catalog through the suite's own code (one
# definition: suite/environment/image_catalog.py); it has PyYAML (host.txt pins it).
PY=$VENV/bin/python
[ -x "$PY" ] || PY=python3

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

# One line per image: NAME<TAB>LOCK<TAB>CONSTRAINTS<TAB>REQUIREMENT REQUIREMENT ... (tensorflow, then extra);
# LOCK and CONSTRAINTS relative to docker/. The catalog is read and checked as every other command
# reads it (suite.environment.image_catalog.load_catalog), except that a lock file may not exist yet: this writes
# it. Read first, so that a catalog error stops the script before any lock is written.
images=$("$PY" - <<'EOF'
import sys

from suite.environment.image_catalog import ImageError, load_catalog

try:
    catalog = load_catalog(locks_may_be_missing=True)
except ImageError as e:
    sys.exit(f"error: {e}")
for name, d in catalog.images.items():
    print(f"{name}\t{d.lock}\t{d.constraints}\t{d.tensorflow} {d.extra or ''}".rstrip())
EOF
)

# requirements/environments.txt: NAME BASE INPUT... a line, each base before its extensions. An
# extension is compiled under its base's lock (cluster under run, cluster-gpu under run-gpu, dev under
# cluster), so a venv holding it holds its base at the same versions (ensure_venv relies on it).
for py in "${HOST_PYTHONS[@]}"; do
  while read -r env base inputs; do
    read -r -a files <<<"$inputs"
    if [ "$base" = "-" ]; then
      compile "requirements/locks/$env-py$py.txt" "${inputs// / + }" "$py" "${files[@]}"
    else
      compile "requirements/locks/$env-py$py.txt" "${inputs// / + } (under the $base lock)" "$py" \
        "${files[@]}" -c "requirements/locks/$base-py$py.txt"
    fi
  done < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' requirements/environments.txt)
done

while IFS=$'\t' read -r name lock constraints requirements; do
  # The image's own requirements, as the Dockerfile passes them to pip, on stdin (one per line).
  tr ' ' '\n' <<<"$requirements" | sed '/^$/d' |
    compile "docker/$lock" "image $name of docker/images.yaml ($requirements; -c docker/$constraints)" \
      "$IMAGE_PYTHON" - -c "docker/$constraints"
done <<<"$images"
