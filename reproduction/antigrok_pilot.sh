#!/bin/bash
# Pilot for the anti-grokking probe 2 (issue 15). Probe 1 (p = 31, 30 % train) did not grok, not even the
# weight-decay-1 control, in 18,685 steps. Question: at p = 31, which train fraction lets the CONTROL
# (weight decay 1, float64, seed 0) grok within 4,000 full-batch steps?
# Rule fixed before running: probe 2 uses the smallest fraction whose control reaches test accuracy >= 0.95
# by step 4,000. Only the control is looked at; no weight-decay-0/0.01 run is made before the choice.
# Ran 2026-12-04 on the 2-core CPU (two runs at a time, one thread each): about 4 min per run.
set -e
ROOT=${1:-$HOME/lenslab-runs/pilot}
mkdir -p "$ROOT" && cd "$ROOT"
run() { OMP_NUM_THREADS=1 lenslab train --task modadd --p 31 --train-frac "$1" --weight-decay 1 --dtype float64 \
          --epochs 4000 --eval-schedule log --n-evals 60 --seed 0 --no-progress --out "frac$1" > "frac$1.log" 2>&1; }
run 0.4 & run 0.5 & wait
run 0.6
