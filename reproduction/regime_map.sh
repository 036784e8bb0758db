#!/usr/bin/env bash
# Issue 16's regime map, in the order that decides the most first. Resumable: run it again after a
# kill and each sweep continues where its members stopped; finished cells are skipped.
#   RUNS=~/lenslab-runs/regime bash reproduction/regime_map.sh
# Knobs fixed before any result was seen: 2 heads, d_model 64, AdamW lr 1e-3, betas (0.9, 0.999),
# weight decay 0.1, batch 512, eval every 5 epochs, 16,384 / 2,048 / 2,048 examples, data seed 0,
# label sum mod 2, shortcut max mod 2, 4 seeds per cell. Candidate regime: seq_len 6 (at 150
# epochs r = 0.5 sat at chance and r = 0.9 on the shortcut there), against seq_len 5 (the easy one).
# Horizon: 400 epochs per cell (the first sweep was started at 1,000 and cut to 400 at epoch 115,
# when the shared CPU ran at 0.7 seed-epochs/s). At epoch ~180 both r of step 1 had memorized their
# train split (train 0.98, adversarial 0.5 / 0.07), so coverage (steps 2-3) and weight decay (step 4)
# were moved ahead of 1L; the rest follows as the CPU allows (the order changed twice, while step 1
# and then step 2 ran; the reasons are given where they apply).
set -euo pipefail
RUNS=${RUNS:-$HOME/lenslab-runs/regime}
while [ -n "${WAIT_PID:-}" ] && kill -0 "$WAIT_PID" 2>/dev/null; do sleep 10; done  # a sweep already on the folder
L="python -m lenslab.cli sweep --out $RUNS --heads 2 --ratios 0.5,0.9 --seeds 0-3 --no-progress"
$L --layers 2 --seq-len 6 --epochs 400                      # 1. the candidate regime, 2L
$L --layers 2 --seq-len 6 --n-values 8 --epochs 60          # 2. coverage: 8**6 = 262k sequences vs 16**6 = 16.8M
# step 2 was started at 400 epochs and stopped at 60: by epoch 55 all four r = 0.5 runs and three of
# four r = 0.9 runs had reached 100 % adversarial accuracy (a rate can only rise with more epochs, and
# r = 0.5 was already 4/4, so no horizon could give r = 0.9 the lead). Step 1 memorized instead:
# the boundary between the two coverages is the next cell (12**6 = 3.0M sequences).
$L --layers 2 --seq-len 6 --n-values 12 --epochs 200        # 3. coverage between the two
$L --layers 2 --seq-len 6 --weight-decay 0.4 --epochs 200   # 4. weight decay at low coverage
# Steps 3 and 4 run 200 epochs, not 400, so that both fit in the session's CPU time (step 3 was
# started at 400 and cut to 200 at epoch 112).
# 1L in the regime picked from steps 1-3: no regime gave 2L the paper's direction, so the pick is
# the boundary (12 values), where 2L runs split between the rule and memorizing.
$L --layers 1 --seq-len 6 --n-values 12 --epochs 200        # 5. 1L at the boundary
# One r = 0.9 run of step 5 was climbing off the shortcut at epoch 200 (adversarial 0.965): that cell, extended.
$L --layers 1 --seq-len 6 --n-values 12 --ratios 0.9 --epochs 300
# At 300 two of the four had reached 100 % (epochs 215 and 240): extended again while still moving.
$L --layers 1 --seq-len 6 --n-values 12 --ratios 0.9 --epochs 500
# Not run in that session (CPU): seq_len 5 at this horizon (item 1's 16-seed table at 100 epochs
# stands for it), 1L at 8 and 16 values, and full batch (0.87 s per seed-epoch on 2 cores: 8 runs x
# 1,000 steps is about 2 hours; 200 full-batch steps would barely train).
# $L --layers 2 --seq-len 5 --epochs 200
# $L --layers 1 --seq-len 6 --epochs 400
# $L --layers 1 --seq-len 6 --n-values 8 --epochs 400
# $L --layers 2 --seq-len 6 --batch-size full --epochs 1000
