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
prev=""
for arg in "$@"; do
  case "$prev" in --results) report_args=(--results "$arg") ;; esac
  case "$arg" in --results=*) report_args=("$arg") ;; esac
  prev=$arg
done

# Where a Docker engine answers, build (or confirm) the images this machine's runs use, so that
# --backend auto (the default) runs in containers; where that cannot be done, runs go local.
case " $* " in
  *" --backend local "*|*" --backend=local "*) ;;
  *) if "$VENV/bin/python" -c "from suite.engine import engine_answers as a; raise SystemExit(not a())"; then
       "$VENV/bin/python" -m suite images build --needed \
         || echo "images not built (see above); --backend auto falls back to the local backend" >&2
     fi ;;
esac

status=0
"$VENV/bin/python" -m suite run "$@" || status=$?
if [ "$status" -le 1 ]; then
  "$VENV/bin/python" -m suite report "${report_args[@]}"
fi
exit "$status"
