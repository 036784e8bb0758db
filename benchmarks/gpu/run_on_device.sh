#!/usr/bin/env bash
# On the GPU machine, from the repository root, as one command (<= 9 minutes, <= 8 files into OUT):
#   bash benchmarks/gpu/run_on_device.sh "$OUT" [--part a|b|c|d|e|all|a,b,c] [--budget-s 540]
# Installs the carried wheels (.whl/, from fetch_wheels.sh) into /tmp, then runs benchmarks/gpu/device_run.py:
# a correctness, b speed, c paper-1 slice, d paper-2 slice, e HTSR alpha speed (its docstring says what each writes).
# Bad input (no CUDA, a wheel missing or of the wrong version, too little budget, OUT not writable) is one
# line on stderr and exit 2, before any work.
set -uo pipefail
START=$(date +%s)
cd "$(dirname "$0")/../.."
if [ $# -lt 1 ] || [[ "$1" == -* ]]; then
  echo "run_on_device: error: give the output folder first: run_on_device.sh OUT [--part a|b|c|d|e|all] [--budget-s 540]" >&2
  exit 2
fi
OUT=$1
shift
WHEELS=${WHEELS:-.whl}
SITE=${SITE:-/tmp/lenslab-gpu/site}
PY=${PY:-python3}
HARD_LIMIT_S=${HARD_LIMIT_S:-575}  # a last guard under the device's 10 minutes: SIGINT saves every run, then exit

if [ ! -d "$WHEELS" ]; then
  echo "run_on_device: error: wheel folder $WHEELS is missing: run benchmarks/gpu/fetch_wheels.sh here and name $WHEELS in carry" >&2
  exit 2
fi
"$PY" benchmarks/gpu/wheel_pins.py check "$WHEELS" >/dev/null 2>/tmp/lenslab-gpu-wheels.err || {
  sed 's/^error: /run_on_device: error: /' /tmp/lenslab-gpu-wheels.err >&2
  exit 2
}
STAMP=$(ls "$WHEELS"/*.whl | xargs -n1 basename | sort | tr '\n' ' ')
if [ "$(cat "$SITE/.stamp" 2>/dev/null)" != "$STAMP" ]; then  # a warm machine keeps the install of an earlier call
  rm -rf "$SITE"
  mkdir -p "$SITE"
  if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
      --target "$SITE" "$WHEELS"/*.whl >/tmp/lenslab-gpu-pip.log 2>&1; then
    echo "run_on_device: error: pip could not install $WHEELS into $SITE (log: $(tail -1 /tmp/lenslab-gpu-pip.log))" >&2
    exit 2
  fi
  echo "$STAMP" >"$SITE/.stamp"
fi

export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export CUBLAS_WORKSPACE_CONFIG=:4096:8  # lenslab trains under torch.use_deterministic_algorithms(True)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
LEFT=$((HARD_LIMIT_S - ($(date +%s) - START)))
exec timeout --signal=INT --kill-after=15 "$LEFT" "$PY" benchmarks/gpu/device_run.py "$OUT" --started-at "$START" --wheels "$WHEELS" "$@"
