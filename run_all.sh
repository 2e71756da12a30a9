#!/usr/bin/env bash
# Run every scenario (or the files given) and write the Markdown reports into reports/.
# Sets up .venv with pinned dependencies on first use. Arguments go to `python -m suite run`,
# e.g. ./run_all.sh --smoke, ./run_all.sh scenarios/mnist_mlp_width.yaml --backend local.
# Exit code: 0 all ran (skips included), 1 some run failed (recorded, see the report), 2 bad input.
set -euo pipefail
cd "$(dirname "$0")"
. requirements/ensure_venv.sh
VENV=${SUITE_VENV:-.venv}
ensure_venv "$VENV" requirements/host.txt "${SUITE_WORKER_REQUIREMENTS:-requirements/worker-cpu.txt}"

report_args=()
backend=auto
fleet=0
prev=""
for arg in "$@"; do
  case "$prev" in --results) report_args=(--results "$arg") ;; --backend) backend=$arg ;; esac
  case "$arg" in --results=*) report_args=("$arg") ;; --backend=*) backend=${arg#--backend=} ;; --hosts|--hosts=*) fleet=1 ;; esac
  prev=$arg
done

# Get the chosen backend ready before the run (the registry in suite/backends knows what each needs:
# the Docker one builds or confirms the images this machine's runs use, so that --backend auto,
# the default, runs in containers). Where that cannot be done, auto picks the next backend.
# With --hosts, each host of the fleet gets its own images ready on its own engine instead.
ready=0
if [ "$fleet" -eq 0 ]; then
  "$VENV/bin/python" -m suite backends --prepare "$backend" || ready=$?
fi
if [ "$ready" -eq 2 ]; then exit 2; fi  # bad input, e.g. a backend name the registry does not know
if [ "$ready" -ne 0 ]; then
  echo "backend $backend not ready (see above); --backend auto picks the next one that can run" >&2
fi

# MNIST once into the Keras cache (~/.keras/datasets), checked by sha256; runs read it from there
# (containers get it read-only). Without internet this fails: a warning, then the full-size run is
# refused unless --allow-synthetic, and a smoke run trains on synthetic digits, marked as such.
# On a machine without internet: python -m suite data fetch --from PATH (mnist.npz or IDX files).
if ! "$VENV/bin/python" -m suite data fetch; then
  echo "warning: MNIST could not be fetched (see above); a full-size run needs it, or --allow-synthetic" >&2
fi

status=0
"$VENV/bin/python" -m suite run "$@" || status=$?
if [ "$status" -le 1 ]; then
  "$VENV/bin/python" -m suite report "${report_args[@]}"
fi
exit "$status"
