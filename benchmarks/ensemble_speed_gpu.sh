#!/usr/bin/env bash
# Superseded by benchmarks/gpu/ (README, "GPU path"): the device image has no venv and no TransformerLens,
# so the GPU benchmark now travels with its wheels and runs as part b of benchmarks/gpu/run_on_device.sh,
# which also checks correctness first and reports seed-epochs/s at E = 64/256/1024 as a fraction of peak.
#   bash benchmarks/ensemble_speed_gpu.sh OUT      # on the GPU machine, with .whl carried: part b only
set -euo pipefail
exec bash "$(dirname "$0")/gpu/run_on_device.sh" "${1:?give the output folder, e.g. \$OUT}" --part b "${@:2}"
