#!/usr/bin/env bash
# Download, here, the wheels the device image lacks (benchmarks/gpu/wheels.txt) into .whl/ (git-ignored),
# for Python 3.12 on x86-64 Linux, then check them: every pin present, nothing else, under 40 MiB.
#   bash benchmarks/gpu/fetch_wheels.sh        # from anywhere; needs pip and the package index
# Then name .whl in the device call's carry (README, "GPU path").
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${DEST:-.whl}
PY=${PY:-python3}
mapfile -t SPECS < <(sed 's/#.*//' benchmarks/gpu/wheels.txt | awk 'NF {print $1}')
mkdir -p "$DEST"
"$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$DEST" "${SPECS[@]}"
"$PY" benchmarks/gpu/wheel_pins.py check "$DEST" --prune
