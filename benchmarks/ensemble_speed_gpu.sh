#!/usr/bin/env bash
# Ensemble speed on a CUDA machine, plus the wall-time estimate for the full paper grid
# (2 architectures x 2 head counts x 2 ratios x 32 seeds x 15,000 epochs = 3.84 M seed-epochs).
#   bash benchmarks/ensemble_speed_gpu.sh            # from the repo root, venv with a CUDA torch
# Prints the benchmark JSON and one line with the estimate at the best measured E.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device visible to torch')"
"$PY" benchmarks/ensemble_speed.py --device cuda --sizes "${SIZES:-1,8,32,64,128,256}" --steps "${STEPS:-16}" --skip-single | tee /tmp/ensemble_speed_gpu.json
"$PY" - <<'PY'
import json
r = json.load(open("/tmp/ensemble_speed_gpu.json"))
best = r[r["best"]]
seed_epochs = 2 * 2 * 2 * 32 * 15_000
hours = seed_epochs / best["seed_epochs_per_s"] / 3600
print(json.dumps({"paper_grid_seed_epochs": seed_epochs, "best": r["best"], "seed_epochs_per_s": best["seed_epochs_per_s"],
                  "estimated_hours_one_gpu_training_only": round(hours, 2),
                  "note": "training only; evaluations every 5 epochs add per-member forward + gradient-probe time"}, indent=2))
PY
