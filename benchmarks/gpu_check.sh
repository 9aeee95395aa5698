#!/usr/bin/env bash
# The one command to run on a lent GPU machine: installs the carried wheels and jaxlab (no
# dependencies), shows the GPU and JAX's devices, runs every method's smoke preset (a line per
# method: ok/failed and wall time, going on after a failure), then each benchmarks/*_speed.py
# once with --brief (~30 s each), and writes one table to stdout and to $OUT/RESULTS_gpu.md
# (benchmarks/RESULTS_gpu.md when $OUT is unset).
#
# Here, once:   bash benchmarks/fetch_gpu_wheels.sh          (wheels into the ignored .whl/)
# There:        device run, carry [".whl"], command "bash benchmarks/gpu_check.sh"
#
# Without a GPU it says so and runs the smoke part on the CPU (benchmarks skipped: they measure
# the GPU), which is how the tests run it.
#
# Options: --methods=a,b (smoke part limited to these slugs), --skip-benchmarks,
#          --benchmarks=a,b (only these benchmarks/<name>.py; named ones run on a CPU too),
#          --timeout=S (per smoke run, default 300; per benchmark, default 120),
#          --budget=S (default 540: no benchmark starts after S seconds in all, so the check ends
#          inside one 10-minute device command; those not run are listed as skipped).
# Environment: PYTHON (default python3), WHEEL_DIR (default .whl), OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PYTHON=${PYTHON:-python3}
WHEEL_DIR=${WHEEL_DIR:-.whl}
METHODS=""
BENCHMARKS=""
SKIP_BENCHMARKS=0
SMOKE_TIMEOUT=300
BENCH_TIMEOUT=120
BUDGET=540
for arg in "$@"; do
  case "$arg" in
    --methods=*) METHODS=${arg#--methods=} ;;
    --skip-benchmarks) SKIP_BENCHMARKS=1 ;;
    --benchmarks=*) BENCHMARKS=${arg#--benchmarks=} ;;
    --timeout=*) SMOKE_TIMEOUT=${arg#--timeout=}; BENCH_TIMEOUT=${arg#--timeout=} ;;
    --budget=*) BUDGET=${arg#--budget=} ;;
    *) echo "gpu_check: unknown argument $arg (see the header of $0)" >&2; exit 2 ;;
  esac
done
if [[ -n "${OUT:-}" ]]; then REPORT="$OUT/RESULTS_gpu.md"; else REPORT="benchmarks/RESULTS_gpu.md"; fi
WORK=$(mktemp -d /tmp/jaxlab-gpu-check.XXXXXX)
LOGS="$WORK/logs"
mkdir -p "$LOGS" "$(dirname "$REPORT")"
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3

# 1. Carried wheels and the project, without dependencies (the machine has no network).
if compgen -G "$WHEEL_DIR/*.whl" >/dev/null; then
  SITE="$WORK/site"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHEEL_DIR"/*.whl || { echo "gpu_check: installing $WHEEL_DIR failed" >&2; exit 1; }
  "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
    --target "$SITE" . >"$LOGS/install.log" 2>&1 \
    || echo "gpu_check: installing jaxlab into $SITE failed (running from the checkout instead)"
  export PYTHONPATH="$REPO:$SITE${PYTHONPATH:+:$PYTHONPATH}"
  echo "gpu_check: installed $(ls "$WHEEL_DIR"/*.whl | wc -l) wheels into $SITE"
else
  export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
  echo "gpu_check: no wheels in $WHEEL_DIR; using $PYTHON's own packages"
fi

# 2. The GPU and JAX.
if command -v nvidia-smi >/dev/null; then nvidia-smi; GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); fi
JAX_LINE=$("$PYTHON" -c "import jax; print(jax.__version__, jax.default_backend(), jax.devices())" 2>"$LOGS/jax.log")
if [[ -z "$JAX_LINE" ]]; then
  echo "gpu_check: JAX does not import:" >&2; cat "$LOGS/jax.log" >&2; exit 1
fi
echo "gpu_check: jax $JAX_LINE"
BACKEND=$(echo "$JAX_LINE" | awk '{print $2}')
if [[ "$BACKEND" != "gpu" && "$BACKEND" != "cuda" ]]; then
  if [[ -z "$BENCHMARKS" ]]; then
    echo "gpu_check: no GPU found (JAX backend '$BACKEND'): running the smoke part on the CPU;" \
         "benchmarks skipped (they measure the GPU)"
    SKIP_BENCHMARKS=1
  else
    echo "gpu_check: no GPU found (JAX backend '$BACKEND'): running on the CPU"
  fi
  export JAX_PLATFORMS=cpu
fi

ROWS=()
FAILED=0
run_timed() {   # kind name log command...: one table row; the command's output goes to the log
  local kind=$1 name=$2 log=$3; shift 3
  local start end status
  start=$(date +%s.%N)
  timeout "$TIMEOUT" "$@" >"$log" 2>&1
  status=$?
  end=$(date +%s.%N)
  local wall
  wall=$(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.1f", b - a}')
  if [[ $status -eq 0 ]]; then
    ROWS+=("| $kind | \`$name\` | ok | $wall |")
  else
    [[ $status -eq 124 ]] && status="timeout after ${TIMEOUT} s" || status="exit $status"
    ROWS+=("| $kind | \`$name\` | **failed** ($status) | $wall |")
    FAILED=$((FAILED + 1))
    echo "---- $name failed ($status); last lines of its log:"
    tail -n 25 "$log"
  fi
  echo "${ROWS[-1]}"
}

# 3. Every method's smoke preset.
if [[ -n "$METHODS" ]]; then
  IFS=, read -r -a SLUGS <<<"$METHODS"
else
  SLUGS=()
  for config in configs/*.py; do
    slug=$(basename "$config" .py)
    [[ "$slug" == "__init__" ]] || SLUGS+=("$slug")
  done
fi
TIMEOUT=$SMOKE_TIMEOUT
for slug in "${SLUGS[@]}"; do
  run_timed smoke "$slug" "$LOGS/smoke-$slug.log" "$PYTHON" -m "experiments.$slug" \
    "--config=configs/$slug.py:smoke" "--workdir=$WORK/smoke/$slug"
done

# 4. Each speed benchmark, briefly.
BENCH_OUTPUT=()
if [[ $SKIP_BENCHMARKS -eq 0 ]]; then
  TIMEOUT=$BENCH_TIMEOUT
  if [[ -n "$BENCHMARKS" ]]; then
    IFS=, read -r -a NAMES <<<"$BENCHMARKS"
    SCRIPTS=()
    for name in "${NAMES[@]}"; do SCRIPTS+=("benchmarks/$name.py"); done
  else
    SCRIPTS=(benchmarks/*_speed.py)
  fi
  for script in "${SCRIPTS[@]}"; do
    name=$(basename "$script" .py)
    if (( SECONDS + BENCH_TIMEOUT / 2 > BUDGET )); then
      ROWS+=("| benchmark | \`$name\` | skipped (the ${BUDGET} s budget is spent) | |")
      echo "${ROWS[-1]}"
      continue
    fi
    run_timed benchmark "$name" "$LOGS/$name.log" "$PYTHON" "$script" --brief
    BENCH_OUTPUT+=("$name")
  done
fi

# 5. The table.
{
  echo "## GPU check, $(date -u +%Y-%m-%d), ${GPU_NAME:-no GPU}"
  echo
  echo "jax $JAX_LINE; python $("$PYTHON" -c 'import platform; print(platform.python_version())');" \
       "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo
  echo "| part | name | outcome | wall (s) |"
  echo "|---|---|---|---|"
  printf '%s\n' "${ROWS[@]}"
  echo
  echo "$FAILED failed of ${#ROWS[@]}."
  for name in "${BENCH_OUTPUT[@]}"; do
    echo
    echo "### \`$name --brief\`"
    echo
    echo '```'
    tail -n 40 "$LOGS/$name.log"
    echo '```'
  done
} >"$REPORT"
echo
cat "$REPORT"
if [[ -n "${OUT:-}" ]]; then   # every log in one file, since only a few files come back
  for log in "$LOGS"/*.log; do echo "==== $(basename "$log")"; cat "$log"; done >"$OUT/gpu_check_logs.txt"
fi
echo "gpu_check: wrote $REPORT (logs in $LOGS)"
[[ $FAILED -eq 0 ]]
