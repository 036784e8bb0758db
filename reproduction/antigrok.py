"""The anti-grokking probe (issue 15, REPRODUCTION items 6-7): modular addition, fixed weight decay from step 0.

    .venv/bin/python reproduction/antigrok.py train ~/lenslab-runs/antigrok --epochs 10000
    .venv/bin/python reproduction/antigrok.py report ~/lenslab-runs/antigrok reproduction/results/antigrok

Set-up (chosen before any run, from the issue): p = 31, train fraction 0.3 (288 of 961 pairs),
full batch, AdamW lr 1e-3, betas (0.9, 0.98), log-spaced evaluations and checkpoints.
Arms: float64 at weight decay 0, 0.01 and 1.0 (the grokking control), float32 at weight decay 0
and 0.01; seeds 0 and 1 each. Each dtype is one stacked ensemble (members differ in seed and
weight decay). ``train`` is resumable: run it again, or with a larger ``--epochs``, and every
member continues where it stopped (float32 first: it is four times cheaper per step here).

``report`` reads the runs and writes, per run, the accuracy / collapse-diagnostic trajectory and
the trap count and HTSR alpha of every matrix at every checkpoint (``lenslab traps``' robust
mode), plus one figure.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ARMS = {"float32": (0.0, 0.01), "float64": (0.0, 0.01, 1.0)}
SEEDS = (0, 1)
TASK = {"p": 31, "train_frac": 0.3}


def configs(dtype: str, epochs: int, n_evals: int) -> tuple[list[dict], list[str]]:
    from training.config import modadd_run_config

    cfgs, names = [], []
    for wd in ARMS[dtype]:
        for s in SEEDS:
            cfgs.append(modadd_run_config(**TASK, weight_decay=wd, seed=s, epochs=epochs, dtype=dtype, eval_schedule="log", n_evals=n_evals))
            names.append(f"{dtype}-wd{wd:g}/seed_{s}")
    return cfgs, names


def train(root: Path, epochs: int, n_evals: int) -> None:
    from training.ensemble import train_ensemble

    for dtype in ARMS:
        cfgs, names = configs(dtype, epochs, n_evals)
        print(f"{dtype}: {len(cfgs)} members to epoch {epochs}", file=sys.stderr, flush=True)
        train_ensemble(cfgs, [root / n for n in names], resume=True, progress=True)


def report(root: Path, out: Path) -> None:
    from interp.spectral import traps_command
    from training.run import Run

    out.mkdir(parents=True, exist_ok=True)
    runs = {}
    for d in sorted(root.glob("*/seed_*")):
        run = Run.open(d)
        name = f"{d.parent.name}/{d.name}"
        scan = traps_command(str(d), mode="robust", seed=0, n_shuffles=1, jsd=False, workers=1, progress=False)
        runs[name] = {"metrics": run.metrics, "traps": scan.get("rows", scan)}
    (out / "runs.json").write_text(json.dumps(runs, default=str))
    print(json.dumps({k: v["metrics"][-1] for k, v in runs.items()}, indent=1, default=str))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["train", "report"])
    ap.add_argument("root")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--epochs", type=int, default=10_000)
    ap.add_argument("--n-evals", type=int, default=120)
    a = ap.parse_args()
    if a.what == "train":
        train(Path(a.root), a.epochs, a.n_evals)
    else:
        report(Path(a.root), Path(a.out))
