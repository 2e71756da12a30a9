#!/usr/bin/env bash
# GPU evidence for the seed question, on a machine with one NVIDIA GPU and JAX with CUDA, without
# Docker and without TensorFlow: the width scenario's CPU and GPU points and the GPU knobs that
# apply under JAX, on the Keras JAX backend and the local backend, then the reports.
#
#   benchmarks/gpu_evidence.sh --prepare-wheels        # here, with internet: fill benchmarks/wheels/
#   benchmarks/gpu_evidence.sh --machine h200          # there: check, install, run, report
#
# benchmarks/wheels/ is git-ignored (about 37 MiB of binary wheels for CPython 3.12, plus MNIST's
# test set): copy it along with the working tree to the GPU machine. Every result is written as
# soon as its run ends, and a second call with the same flags runs only what is not done yet (bring
# <results>/<machine>/ back first when the machine starts bare).
#
# What it writes
#   <results>/<machine>/                 one result file per run (default results: reports/results)
#   <results>/<machine>/scenarios/       the JAX scenarios it derived and ran (the reports' Reproduce
#                                        lines name them)
#   <results>/<machine>/gpu_evidence.log everything this script and the suite printed
#   <reports>/                           `python -m suite report` over every machine in <results>
#                                        (default reports/)
#   $OUT/ (when set and a folder)        gpu_evidence.tar.gz (results, derived scenarios, reports),
#                                        the log and the two scenario pages, so they come back;
#                                        `tar -xzf gpu_evidence.tar.gz -C reports` puts them in place
#                                        (with the default --results and --reports)
#
# The JAX scenarios are derived from scenarios/mnist_mlp_width.yaml and scenarios/gpu_knobs.yaml,
# never copied by hand: named <name>_jax (their results never mix with TensorFlow ones), backend
# jax, jit_compile true (under Keras' JAX backend jit_compile false runs the step op by op, a mode
# nobody trains in; true is Keras' own default there and the counterpart of TensorFlow's compiled
# graph), sizes from the flags below. Knobs: steps_per_execution and mixed precision apply; the
# jit_compile variant equals the base under JAX and is left out; the tf.data variants stay and are
# recorded as skipped where TensorFlow is not installed, and a variant that also sets other knobs
# gets a twin with NumPy input ("..., NumPy input") that runs.
#
# Data: MNIST's training set is not on a machine without internet, so by default the runs train on
# synthetic digits of MNIST's shapes and sizes (60,000 + 10,000: the seed question's 469 steps per
# epoch; step times do not depend on the pixel values), which the results and reports mark.
# --data t10k trains on the real test set's digits instead (8,000 train / 2,000 test, data.data_dir),
# from benchmarks/wheels/mnist/ (copied there by --prepare-wheels) or --mnist DIR.
#
# Python: --python (default python3) must hold JAX (with CUDA on the GPU machine). Packages the
# suite needs and that interpreter lacks (keras, PyYAML, tabulate, matplotlib, nvidia-ml-py for GPU
# telemetry, and their dependencies) are installed from the wheel folder, without any index, into
# benchmarks/.gpu-evidence-venv: a venv layered over --python (system site packages plus a .pth
# with that interpreter's own site folders, so its JAX with CUDA is the one used). NumPy, SciPy and
# JAX are never installed: the ones JAX was built with are used.
#
# How long: --budget-s (default 540 s, counted from the script's start) bounds everything; the
# width scenario runs first, the knobs with the time left, and the reports are always written in the
# last 45 s (runs cut at the budget are missing from them, and the exit code is 4). Measured on a
# shared 2-core machine (load 4-8) at the default size, one repetition: CPU fit 25 s (width 100),
# 75 s (750), 120 s (2000), steady epochs 1.3, 4.0 and 9.1 s (54 GFLOP/s of a 96 GFLOP/s matmul peak
# at 2000); around each fit 23-63 s of fixed cost (Python and JAX start, 60,000 synthetic digits,
# build, evaluation, the step-floor probe), and the first epoch 11-31 s longer than the rest (XLA
# compilation). Expected on a quiet 16-core host with an H200, not measured: a fixed cost of 10-15 s
# per run, CPU epochs about 8 times shorter, GPU steps of 0.3-1 ms (Python dispatch), so 15-35 s per
# run: the 18 width runs (3 widths x 2 devices x 3 repetitions) in 5-7 min, and the knobs (5 variants
# that run at batch 128) get the rest, probably their first repetition only. Repetitions are
# interleaved, so a cut leaves every point with its first ones; --no-knobs, --widths and --repeats
# trade one for the other, and a second call completes what the first left.
#
# Exit codes: 0 done; 1 some run failed (recorded, see the reports); 2 a precondition or a flag is
# wrong (the message says which); 4 the budget ended the runs early (what ran is reported).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WHEELS_DEFAULT="$REPO/benchmarks/wheels"
WHEELS_LIMIT_MIB=56  # the tree travels with the wheels in 64 MiB; the rest is for the tree
MNIST_DEFAULT="$REPO/../shared/data/mnist"

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
  cat <<EOF
Options (defaults in brackets):
  --prepare-wheels        download the wheels into --wheels (needs the package index), copy the MNIST
                          test set beside them, print the total, and exit
  --target-python X.Y     --prepare-wheels: the Python version of the GPU machine [3.12]
  --python PY             interpreter that holds JAX [python3]
  --wheels DIR            wheel folder [benchmarks/wheels]
  --machine NAME          results folder name [the suite's default: this host's name]
  --results DIR           [reports/results]      --reports DIR   [reports]
  --widths LIST|all       first-layer widths, comma-separated [100,750,2000]; all: the scenario's six
  --epochs N              [10]   --repeats N (3 or more gives intervals) [3]
  --train-samples N       [all]  --test-samples N [all]
  --knob-batches LIST     batch sizes for the knobs [128]; --no-knobs leaves them out
  --data synthetic|t10k   [synthetic]       --mnist DIR   IDX folder for --data t10k
  --run-timeout S         limit of one run [300]
  --budget-s S            limit of the whole script, reports included [540]
  --allow-no-gpu          run without an NVIDIA GPU (a CPU machine): GPU points are recorded as skipped
  --jax-preallocate       keep JAX's default of taking 75% of GPU memory at start (peak memory then
                          shows the pool, not the use) [off: XLA_PYTHON_CLIENT_PREALLOCATE=false]
EOF
}

die() {
  echo "error: $*" >&2
  exit 2
}

# ------------------------------------------------------------------ flags
PY=python3
WHEELS=$WHEELS_DEFAULT
MACHINE=""
RESULTS="$REPO/reports/results"
REPORTS="$REPO/reports"
WIDTHS="100,750,2000"
EPOCHS=10
REPEATS=3
TRAIN_SAMPLES=""
TEST_SAMPLES=""
KNOB_BATCHES="128"
KNOBS=1
DATA=synthetic
MNIST=""
RUN_TIMEOUT=300
BUDGET=540
ALLOW_NO_GPU=0
PREALLOCATE=0
PREPARE=0
TARGET_PY=3.12

need_value() { [ $# -ge 2 ] && [ -n "$2" ] || die "flag $1 needs a value (see --help)"; }
positive_int() { [[ $2 =~ ^[1-9][0-9]*$ ]] || die "flag $1: got '$2'; allowed: an integer >= 1"; }
int_list() { [[ $2 =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || die "flag $1: got '$2'; allowed: integers >= 1, comma-separated"; }

while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --prepare-wheels) PREPARE=1 ;;
    --target-python) need_value "$@"; TARGET_PY=$2; shift ;;
    --python) need_value "$@"; PY=$2; shift ;;
    --wheels) need_value "$@"; WHEELS=$2; shift ;;
    --machine) need_value "$@"; MACHINE=$2; shift ;;
    --results) need_value "$@"; RESULTS=$2; shift ;;
    --reports) need_value "$@"; REPORTS=$2; shift ;;
    --widths) need_value "$@"; WIDTHS=$2; shift ;;
    --epochs) need_value "$@"; positive_int "$1" "$2"; EPOCHS=$2; shift ;;
    --repeats) need_value "$@"; positive_int "$1" "$2"; REPEATS=$2; shift ;;
    --train-samples) need_value "$@"; positive_int "$1" "$2"; TRAIN_SAMPLES=$2; shift ;;
    --test-samples) need_value "$@"; positive_int "$1" "$2"; TEST_SAMPLES=$2; shift ;;
    --knob-batches) need_value "$@"; int_list "$1" "$2"; KNOB_BATCHES=$2; shift ;;
    --no-knobs) KNOBS=0 ;;
    --data) need_value "$@"; DATA=$2; shift ;;
    --mnist) need_value "$@"; MNIST=$2; shift ;;
    --run-timeout) need_value "$@"; positive_int "$1" "$2"; RUN_TIMEOUT=$2; shift ;;
    --budget-s) need_value "$@"; positive_int "$1" "$2"; BUDGET=$2; shift ;;
    --allow-no-gpu) ALLOW_NO_GPU=1 ;;
    --jax-preallocate) PREALLOCATE=1 ;;
    *) die "unknown flag '$1'; see benchmarks/gpu_evidence.sh --help" ;;
  esac
  shift
done
case "$DATA" in synthetic|t10k) ;; *) die "flag --data: got '$DATA'; allowed: synthetic, t10k" ;; esac
# Flags name paths from where the script was started; it runs from the repository.
WHEELS=$(realpath -m "$WHEELS")
RESULTS=$(realpath -m "$RESULTS")
REPORTS=$(realpath -m "$REPORTS")
[ -z "$MNIST" ] || MNIST=$(realpath -m "$MNIST")
[ "$WIDTHS" = all ] || int_list --widths "$WIDTHS"
[[ $TARGET_PY =~ ^3\.[0-9]+$ ]] || die "flag --target-python: got '$TARGET_PY'; allowed: a version like 3.12"

wheels_mib() { du -sm "$1" | cut -f1; }

# ------------------------------------------------------------------ --prepare-wheels (here, with internet)
# What the wheel folder holds: the host side's packages at the versions the suite renders with, NVML
# for the telemetry, and the worker's Keras. Versions come from the run lock for the target Python
# (requirements/locks/run-pyX.Y.txt), which pins every dependency too, and after the download each
# wheel's sha256 is checked against the hashes the lock lists for it: the device gets files a locked
# install would take, except NumPy and SciPy, left out because the device uses its JAX's own. Without
# that lock, versions come from the top-level pins (requirements/host.txt, worker-cpu.txt), nothing
# is hash-checked, and a name pinned nowhere is taken at its newest version, and said so.
WHEEL_NAMES=(PyYAML tabulate matplotlib nvidia-ml-py keras)
LOCK="$REPO/requirements/locks/run-py$TARGET_PY.txt"
pins() {
  local name pin
  for name in "${WHEEL_NAMES[@]}"; do
    pin=""
    [ -f "$LOCK" ] && pin=$(grep -hioE "^$name==[^ ;]+" "$LOCK" | head -n1 || true)
    [ -n "$pin" ] || pin=$(grep -hiE "^$name==" "$REPO/requirements/host.txt" "$REPO/requirements/worker-cpu.txt" | head -n1 || true)
    echo "${pin:-$name}"
  done
}

if [ "$PREPARE" -eq 1 ]; then
  mapfile -t WANT < <(pins)
  for want in "${WANT[@]}"; do
    [[ $want == *==* ]] || echo "note: neither $LOCK nor requirements/host.txt and worker-cpu.txt pin $want; taking its newest version"
  done
  mkdir -p "$WHEELS"
  plat=()
  for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do
    plat+=(--platform "$p")
  done
  echo "downloading wheels for CPython $TARGET_PY on x86-64 Linux into $WHEELS: ${WANT[*]} and their dependencies"
  pydl=$PY
  "$pydl" -m pip --version >/dev/null 2>&1 || pydl="$REPO/.venv/bin/python"
  locked=()
  if [ -f "$LOCK" ]; then
    # The lock's pins as constraints (name==version lines: pip download takes no hashes with -c); the
    # files fetched are checked against the lock's hashes below.
    grep -oE '^[A-Za-z0-9][A-Za-z0-9._-]*==[^ ;]+' "$LOCK" > "$WHEELS/.lock-constraints.txt"
    locked=(-c "$WHEELS/.lock-constraints.txt")
    echo "versions from $LOCK"
  else
    echo "note: no lock for Python $TARGET_PY ($LOCK); dependencies take their newest versions"
  fi
  "$pydl" -m pip download --quiet --only-binary=:all: --python-version "$TARGET_PY" --implementation cp \
    "${plat[@]}" "${locked[@]}" -d "$WHEELS" "${WANT[@]}"
  rm -f "$WHEELS/.lock-constraints.txt"
  if [ -f "$LOCK" ]; then
    if ! (cd "$REPO" && "$pydl" -m suite.environment.locks check-wheels "$LOCK" "$WHEELS"); then
      die "a downloaded wheel is not a file $LOCK hashes (above); the index served other bytes than the lock's"
    fi
    echo "every wheel's sha256 is one $LOCK lists for it"
  fi
  # JAX's own NumPy (and SciPy, which JAX needs) are used there; another copy could break jaxlib.
  rm -f "$WHEELS"/numpy-*.whl "$WHEELS"/scipy-*.whl
  src=${MNIST:-$MNIST_DEFAULT}
  if [ -f "$src/t10k-images-idx3-ubyte.gz" ] && [ -f "$src/t10k-labels-idx1-ubyte.gz" ]; then
    mkdir -p "$WHEELS/mnist"
    install -m 0644 "$src"/t10k-*-ubyte.gz "$WHEELS/mnist/"
    echo "copied MNIST's test set (IDX) from $src to $WHEELS/mnist/ (for --data t10k)"
  else
    echo "note: no t10k-*-ubyte.gz in $src: --data t10k will need --mnist DIR there"
  fi
  total=$(wheels_mib "$WHEELS")
  echo "wheel folder: $(find "$WHEELS" -name '*.whl' | wc -l) wheels, ${total} MiB in all (limit ${WHEELS_LIMIT_MIB} MiB)"
  [ "$total" -le "$WHEELS_LIMIT_MIB" ] || die "$WHEELS holds ${total} MiB, over ${WHEELS_LIMIT_MIB} MiB: it cannot travel with the tree"
  exit 0
fi

# ------------------------------------------------------------------ preconditions
[ -z "${SUITE_WORKER_REQUIREMENTS:-}" ] || echo "note: SUITE_WORKER_REQUIREMENTS is ignored here" >&2
[ -z "${SUITE_ENV:-}" ] || echo "note: SUITE_ENV is ignored here (the device has its own Python)" >&2
if [ "$ALLOW_NO_GPU" -eq 0 ]; then
  command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi not found on PATH: this needs a machine with an NVIDIA GPU \
and its driver. On a machine without one, --allow-no-gpu records the GPU points as skipped."
  gpus=$(nvidia-smi -L 2>&1) || die "nvidia-smi -L failed (driver not loaded?): $gpus"
  [ "$(grep -c '^GPU ' <<<"$gpus")" -ge 1 ] || die "nvidia-smi lists no GPU: $gpus"
fi
command -v "$PY" >/dev/null 2>&1 || die "--python $PY: no such interpreter"
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
  || die "--python $PY is not Python 3.11 or newer (the suite's floor)"
if [ "$PREALLOCATE" -eq 0 ]; then export XLA_PYTHON_CLIENT_PREALLOCATE=false; fi
jax_gpus=$("$PY" -c 'import jax; print(sum(d.platform == "gpu" for d in jax.devices()))' 2>/dev/null | tail -n1) \
  || die "JAX is not importable in $PY ($("$PY" -c 'import jax' 2>&1 | tail -n1)); use --python with the interpreter that holds JAX"
if [ "$ALLOW_NO_GPU" -eq 0 ] && [ "$jax_gpus" -lt 1 ]; then
  die "JAX in $PY sees no GPU (jax.devices(): $("$PY" -c 'import jax; print(jax.devices())' 2>&1 | tail -n1)); \
install JAX with CUDA (jax[cuda12] or jax[cuda13]) or pass --python with the one that has it"
fi

if [ "$DATA" = t10k ]; then
  MNIST=${MNIST:-$WHEELS/mnist}
  [ -f "$MNIST/t10k-images-idx3-ubyte.gz" ] || [ -f "$MNIST/t10k-images-idx3-ubyte" ] \
    || die "--data t10k: no t10k-images-idx3-ubyte(.gz) in $MNIST; pass --mnist DIR, or run --prepare-wheels"
fi

# What the suite imports for `run --backend local` and `report` (scenario: yaml; report: tabulate,
# numpy, scipy, matplotlib; worker: keras and JAX) and NVML for the GPU telemetry.
MODULES=(keras:keras yaml:PyYAML tabulate:tabulate numpy:numpy scipy:scipy matplotlib:matplotlib)
[ "$ALLOW_NO_GPU" -eq 1 ] || MODULES+=(pynvml:nvidia-ml-py)
missing_dists() {
  local py=$1 m
  for m in "${MODULES[@]}"; do
    "$py" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('${m%%:*}') is None)" 2>/dev/null || echo "${m#*:}"
  done
}
mapfile -t MISSING < <(missing_dists "$PY")
RUNPY=$PY
if [ "${#MISSING[@]}" -gt 0 ]; then
  for dist in "${MISSING[@]}"; do
    case "$dist" in numpy|scipy) die "$PY lacks $dist, which JAX needs and the suite uses; install it with JAX" ;; esac
  done
  if [ ! -d "$WHEELS" ] || [ -z "$(find "$WHEELS" -maxdepth 1 -name '*.whl' -print -quit)" ]; then
    die "$PY lacks ${MISSING[*]} and there is no wheel folder $WHEELS: run benchmarks/gpu_evidence.sh \
--prepare-wheels where the package index can be reached, and bring $WHEELS along"
  fi
  "$PY" -m pip --version >/dev/null 2>&1 || die "$PY has no pip, which installing ${MISSING[*]} from $WHEELS needs"
  VENV="$REPO/benchmarks/.gpu-evidence-venv"
  echo "installing ${MISSING[*]} from $WHEELS ($(wheels_mib "$WHEELS") MiB) into $VENV, layered over $PY"
  rm -rf "$VENV"
  "$PY" -m venv --without-pip --system-site-packages "$VENV" || die "$PY -m venv failed"
  # --system-site-packages sees the base interpreter's packages only; when $PY is itself a venv its
  # own folders (where JAX with CUDA may live, also those its .pth files add) come in through this
  # .pth: every entry of its sys.path but the standard library, which the venv has already.
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$PY" - >"$site/_gpu_evidence_base.pth" <<'PYEOF'
import os
import sys
import sysconfig

std = os.path.realpath(sysconfig.get_path("stdlib"))  # the base interpreter's, also inside a venv
for p in sys.path:
    real = os.path.realpath(p) if p else ""
    if real and os.path.isdir(real) and real != std and not real.startswith(std + os.sep):
        print(p)
PYEOF
  pins_for=()
  for dist in "${MISSING[@]}"; do
    pin=$(pins | grep -i "^$dist==" || true)
    pins_for+=("${pin:-$dist}")
  done
  "$PY" -m pip --python "$VENV/bin/python" install --quiet --no-index --find-links "$WHEELS" "${pins_for[@]}" \
    || die "installing ${pins_for[*]} from $WHEELS failed (see above): the wheels must match $PY \
($("$PY" -c 'import platform; print(platform.python_version())')); rebuild them with --prepare-wheels --target-python X.Y"
  RUNPY="$VENV/bin/python"
  mapfile -t STILL < <(missing_dists "$RUNPY")
  [ "${#STILL[@]}" -eq 0 ] || die "still missing after the install from $WHEELS: ${STILL[*]}"
fi
KERAS_BACKEND=jax "$RUNPY" -c 'import keras' >/dev/null 2>&1 \
  || die "Keras does not start on JAX in $RUNPY: $(KERAS_BACKEND=jax "$RUNPY" -c 'import keras' 2>&1 | tail -n1)"

cd "$REPO"
[ -n "$MACHINE" ] || MACHINE=$("$RUNPY" -c 'from suite.environment import host_facts; print(host_facts.machine_name())')
[[ $MACHINE =~ ^[A-Za-z0-9_.-]+$ ]] || die "flag --machine: got '$MACHINE'; allowed: letters, digits, '_', '.', '-'"
MDIR="$RESULTS/$MACHINE"
mkdir -p "$MDIR/scenarios" || die "cannot create $MDIR"
LOG="$MDIR/gpu_evidence.log"

main() {
  echo "== gpu_evidence $(date -u +%Y-%m-%dT%H:%M:%SZ) machine=$MACHINE python=$RUNPY"
  [ "$ALLOW_NO_GPU" -eq 1 ] || echo "GPUs: $(nvidia-smi -L | tr '\n' ' ')"
  echo "JAX sees $jax_gpus GPU(s); TensorFlow: $("$RUNPY" -c 'import importlib.util as u; print("installed" if u.find_spec("tensorflow") else "not installed (tf.data variants are skipped)")')"
  [ "$PREALLOCATE" -eq 1 ] || echo "XLA_PYTHON_CLIENT_PREALLOCATE=false: JAX allocates GPU memory as it needs it"

  # ------------------------------------------------------------------ derived JAX scenarios
  "$RUNPY" - "$MDIR/scenarios" "$WIDTHS" "$EPOCHS" "$REPEATS" "${TRAIN_SAMPLES:-0}" "${TEST_SAMPLES:-0}" \
    "$KNOB_BATCHES" "$DATA" "${MNIST:-}" "$RUN_TIMEOUT" "$REPO" <<'PYEOF' || die "deriving the JAX scenarios failed (see above)"
import copy
import os
import sys
from pathlib import Path

import yaml

out, widths, epochs, repeats, n_train, n_test, batches, data, mnist, timeout, repo = sys.argv[1:]
JAX_NOTE = (
    " Derived for the Keras JAX backend by benchmarks/gpu_evidence.sh: every training step is compiled"
    " (jit_compile: true, Keras' own default under JAX; false would run it op by op)."
)


def derive(src: str, suffix: str = "_jax") -> dict:
    doc = yaml.safe_load(Path(src).read_text(encoding="utf-8"))
    doc = copy.deepcopy(doc)
    doc["name"] += suffix
    doc["backend"] = "jax"
    doc["description"] = (doc.get("description") or "").strip() + JAX_NOTE
    doc.setdefault("training", {})
    doc["training"].update(jit_compile=True, epochs=int(epochs))
    doc["repeats"], doc["timeout_s"] = int(repeats), int(timeout)
    d = doc.setdefault("data", {})
    if int(n_train):
        d["train_samples"] = int(n_train)
    if int(n_test):
        d["test_samples"] = int(n_test)
    if data == "t10k":
        # Relative to the repository, where the worker resolves it: the path is part of each run's
        # fingerprint, which must not depend on where this checkout lies.
        d["data_dir"] = os.path.relpath(os.path.realpath(mnist), os.path.realpath(repo))
        d.setdefault("test_samples", 2000)
    return doc


width = derive("scenarios/mnist_mlp_width.yaml")
if widths != "all":
    width["matrix"]["model.hidden.0"] = [int(w) for w in widths.split(",")]
    width["description"] += f" Widths run here: {widths.replace(',', ', ')}."

knobs = derive("scenarios/gpu_knobs.yaml")
knobs["matrix"]["training.batch_size"] = [int(b) for b in batches.split(",")]
knobs["description"] += f" Batch sizes run here: {batches.replace(',', ', ')}."


def value_at(doc: dict, path: str) -> object:
    for part in path.split("."):
        doc = doc.get(part) if isinstance(doc, dict) else None
    return doc


variants, dropped = [], []
for v in knobs.get("variants", []):
    changes = {k: val for k, val in (v.get("set") or {}).items() if value_at(knobs, k) != val}
    if v.get("set") and not changes:
        dropped.append(v["name"])  # the base already is this variant under JAX
        continue
    variants.append(v)
    if changes.get("training.input_pipeline") == "tf_data" and len(changes) > 1:
        twin = {k: val for k, val in changes.items() if k != "training.input_pipeline"}
        variants.append({"name": f"{v['name']}, NumPy input", "set": twin})
knobs["variants"] = variants
if dropped:
    knobs["description"] += f" Left out as equal to the base under JAX: {', '.join(dropped)}."

for doc in (width, knobs):
    path = Path(out) / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=100), encoding="utf-8")
    print(f"derived {path}")
PYEOF
  SCEN_WIDTH="$MDIR/scenarios/mnist_mlp_width_jax.yaml"
  SCEN_KNOBS="$MDIR/scenarios/gpu_knobs_jax.yaml"
  scen=("$SCEN_WIDTH")
  [ "$KNOBS" -eq 0 ] || scen+=("$SCEN_KNOBS")
  "$RUNPY" -m suite check "${scen[@]}" || die "the derived scenarios do not validate (see above)"

  run_args=(--backend local --results "$RESULTS" --machine "$MACHINE")
  if [ "$DATA" = synthetic ] && "$RUNPY" -m suite run --help 2>/dev/null | grep -q -- '--allow-synthetic'; then
    run_args+=(--allow-synthetic)  # full size on synthetic digits, knowingly; the reports mark it
  fi

  # ------------------------------------------------------------------ runs, within the budget
  # The budget counts from the script's start (installs and checks included); the reports and the
  # copy to $OUT get the last REPORT_RESERVE seconds.
  START=$SECONDS
  REPORT_RESERVE=45
  cut=0
  failed=0
  for file in "${scen[@]}"; do
    left=$((BUDGET - SECONDS - REPORT_RESERVE))
    if [ "$left" -le 10 ]; then
      echo "budget of ${BUDGET} s reached: $(basename "$file") not run"
      cut=1
      continue
    fi
    echo "== $(basename "$file"): up to ${left} s"
    rc=0
    timeout -s TERM -k 20 "$left" "$RUNPY" -m suite run "$file" "${run_args[@]}" || rc=$?
    case "$rc" in
      0) ;;
      1) failed=1 ;;
      124|130|143) echo "budget of ${BUDGET} s reached during $(basename "$file"): the runs done so far are kept"; cut=1 ;;
      *) echo "python -m suite run $file exited $rc"; exit "$rc" ;;
    esac
  done
  echo "== runs took $((SECONDS - START)) s"

  "$RUNPY" -m suite report --results "$RESULTS" --out "$REPORTS"

  if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
    pages=()
    for name in mnist_mlp_width_jax gpu_knobs_jax; do
      [ -f "$REPORTS/$name.md" ] && pages+=("$REPORTS/$name.md")
    done
    mapfile -t made < <(cd "$REPORTS" && find . -maxdepth 1 \( -name '*.md' -o -name '*.png' \) | sort)
    tar -czf "$OUT/gpu_evidence.tar.gz" -C "$(dirname "$RESULTS")" "$(basename "$RESULTS")/$MACHINE" -C "$REPORTS" "${made[@]}"
    cp "${pages[@]}" "$OUT/" 2>/dev/null || true
    cp "$LOG" "$OUT/gpu_evidence.log"
    echo "copied results and reports to $OUT"
  fi

  if [ "$cut" -eq 1 ]; then return 4; fi
  return "$failed"
}

rc=0
main 2>&1 | tee -a "$LOG" || rc=${PIPESTATUS[0]}
exit "$rc"
