#!/usr/bin/env bash
# Run every scenario (or the files given) and write the Markdown reports into reports/.
# Sets up .venv from a hash-locked requirement file on first use (SUITE_ENV=run-gpu: the GPU worker;
# a backend that needs another environment, such as the cluster one, gets it by itself).
# Arguments go to `python -m suite run`, e.g. ./run_all.sh --smoke,
# ./run_all.sh scenarios/mnist_mlp_width.yaml --backend local.
# Exit code: 0 all ran (skips included), 1 some run failed (recorded, see the report), 2 bad input.
set -euo pipefail
cd "$(dirname "$0")"
. requirements/ensure_venv.sh
VENV=${SUITE_VENV:-.venv}

report_args=()
backend=auto
fleet=0
prev=""
for arg in "$@"; do
  case "$prev" in --results) report_args=(--results "$arg") ;; --backend) backend=$arg ;; esac
  case "$arg" in --results=*) report_args=("$arg") ;; --backend=*) backend=${arg#--backend=} ;; --hosts|--hosts=*) fleet=1 ;; esac
  prev=$arg
done

# The locked environment the chosen backend needs on this machine (the registry in suite/backends
# says; it is read with the system Python, before the venv exists): run for most, one with Ray for
# a cluster backend.
backend_env=$("${PYTHON:-python3}" -S -c \
  'import sys; from suite.backends import environment_of; print(environment_of(sys.argv[1]))' "$backend")

# Which hash-locked environment the venv holds: run (the CPU worker, the default), run-gpu (the
# worker with CUDA wheels, for --backend local on a GPU machine without Docker) or cluster (run + Ray,
# which the cluster backend needs; chosen by itself for it); see requirements/locks/.
# SUITE_WORKER_REQUIREMENTS (a requirements file, the older way to say so) still works: it names the env.
SUITE_ENV=${SUITE_ENV:-}
if [ -n "${SUITE_WORKER_REQUIREMENTS:-}" ]; then
  case "$SUITE_WORKER_REQUIREMENTS" in
    requirements/worker-gpu.txt | ./requirements/worker-gpu.txt) worker_env=run-gpu ;;
    requirements/worker-cpu.txt | ./requirements/worker-cpu.txt) worker_env=run ;;
    *)
      echo "error: SUITE_WORKER_REQUIREMENTS=$SUITE_WORKER_REQUIREMENTS: allowed are requirements/worker-cpu.txt" \
        "and requirements/worker-gpu.txt (better: SUITE_ENV=run or SUITE_ENV=run-gpu)" >&2
      exit 2
      ;;
  esac
  if [ -n "$SUITE_ENV" ] && [ "$SUITE_ENV" != "$worker_env" ]; then
    echo "error: SUITE_ENV=$SUITE_ENV and SUITE_WORKER_REQUIREMENTS=$SUITE_WORKER_REQUIREMENTS disagree;" \
      "set SUITE_ENV only" >&2
    exit 2
  fi
  echo "note: SUITE_WORKER_REQUIREMENTS=$SUITE_WORKER_REQUIREMENTS is read as SUITE_ENV=$worker_env" >&2
  SUITE_ENV=$worker_env
fi
case "${SUITE_ENV:=$backend_env}" in
  run | run-gpu | cluster | cluster-gpu) ;;
  *)
    echo "error: SUITE_ENV=$SUITE_ENV: allowed are run (CPU worker), run-gpu (CUDA wheels), cluster" \
      "(run + Ray, for a cluster backend) and cluster-gpu (run-gpu + Ray)" >&2
    exit 2
    ;;
esac
# A backend that needs another environment takes it, or its GPU twin (the same plus CUDA wheels):
# the GPU worker asked for (run-gpu) becomes that twin.
if [ "$backend_env" != run ] && [ "$SUITE_ENV" = run-gpu ]; then
  echo "note: SUITE_ENV=run-gpu with --backend $backend: using $backend_env-gpu (run-gpu + what the backend needs)" >&2
  SUITE_ENV=$backend_env-gpu
fi
if [ "$backend_env" != run ] && [ "$SUITE_ENV" != "$backend_env" ] && [ "$SUITE_ENV" != "$backend_env-gpu" ]; then
  echo "error: --backend $backend needs the $backend_env environment (or $backend_env-gpu);" \
    "SUITE_ENV=$SUITE_ENV is set (unset it, or set SUITE_ENV=$backend_env)" >&2
  exit 2
fi
ensure_venv "$VENV" "$SUITE_ENV"


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
