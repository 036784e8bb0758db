#!/usr/bin/env bash
# Issue 25: paper 1's two 2L 2-head boundary cells past the memorization wall, toward 2,000 epochs.
#   RUNS=~/lenslab-runs/boundary bash reproduction/boundary_long.sh
# Fixed before any run of this script was looked at (2026-12-06, 19:20 UTC):
# - Knobs as regime_map.sh's steps 1 and 3 (2L, 2 heads, d_model 64, AdamW lr 1e-3, weight decay
#   0.1, batch 512, seq_len 6, 16,384 / 2,048 / 2,048 examples, data seed 0, sum mod 2, max mod 2,
#   seeds 0-3), except evaluation every 10 epochs (the issue's choice) instead of 5.
# - Order: the 12-value cells first (the boundary: half the r = 0.5 runs learned the rule by epoch
#   200, the rest memorized), then the 16-value cells. Each cell pair advances in rounds of 200
#   epochs (r = 0.5 then r = 0.9 within a round), so that when the CPU time runs out both r stand
#   at the same epoch.
# - One process, one thread (the MNIST-MLP run has the other core), 4 seeds stacked. WORKERS=2 runs
#   the two r of a round side by side, one thread each, when no MNIST run needs the other core:
#   a speed knob only, since each member's numbers do not depend on which process steps it.
# - Outcomes by lenslab/training/outcomes.py, unchanged. The write-up reports the last round that
#   every member of a cell pair finished.
# CELLS picks which value counts run (default "12 16"); CELLS=16 skips the 12-value cells, e.g. on
# a machine where their finished runs are gone but their tables are committed.
# LAST (default 2000, the issue's horizon) extends the rounds past 2,000. Added 2026-12-07 12:40 UTC,
# after the 2,000-epoch 16-value tables were read and committed, for an exploratory extension of a
# copy of those runs (cp -r ~/lenslab-runs/boundary/v16 ~/lenslab-runs/boundary_ext/), so that the
# committed tables stay reproducible from the original folder. Fixed before the extension ran: the
# same knobs, WORKERS=2, read at the last 200-epoch round both r finished, reporting whether any
# r = 0.5 run reaches the rule (a longer horizon can only raise paper 1's "at any point" rate) and how
# many r = 0.9 runs hold it at the end. Not pre-registered by issue 25; REPRODUCTION 1c says so.
# Resumable: run it again after a kill; each member continues from its last checkpoint. A round
# that every member has already passed exits 2 ("already trained N epochs"), and is skipped.
set -euo pipefail
RUNS=${RUNS:-$HOME/lenslab-runs/boundary}
export OMP_NUM_THREADS=1
L="python -m lenslab.cli sweep --heads 2 --layers 2 --ratios 0.5,0.9 --seeds 0-3 --seq-len 6
   --eval-every 10 --workers ${WORKERS:-1} --ensemble-size 4 --no-progress"
round() { $L --n-values "$1" --epochs "$2" --out "$RUNS/v$1" || [ $? -eq 2 ]; }
CELLS=${CELLS:-12 16}
case " $CELLS " in *" 12 "*) for E in $(seq 200 200 "${LAST:-2000}"); do round 12 "$E"; done ;; esac
case " $CELLS " in *" 16 "*) for E in $(seq 400 200 "${LAST:-2000}"); do round 16 "$E"; done ;; esac
