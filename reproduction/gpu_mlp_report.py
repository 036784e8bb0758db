"""Part f of the GPU script (paper 2's MNIST MLP) read back: one row per member by REPRODUCTION item 8's rules.

    .venv/bin/python reproduction/gpu_mlp_report.py FILES_AT/paper2.json reproduction/results/gpu/mlp

``FILES_AT`` is where the device call's files came back (``benchmarks/gpu/run_on_device.sh``). Reads
``paper2.json``'s ``"mlp"`` key (every member's evaluations, and traps and alpha at up to 12
checkpoints each), applies ``lenslab.training.outcomes.mnist_phases`` (fit, grok, peak, anti-grok,
fall onset: the rules fixed in ``reproduction/mnist_antigrok.py`` before item 8's runs were looked
at) and writes ``members.csv`` / ``members.json``: per member the phases' steps, the first
checkpoint with a trap in any matrix, the first with alpha < 2 in any matrix, the traps per matrix
at the last checkpoint, and the trap-vs-fall comparison of item 8. Prints one line per member.
Nothing here is tuned to a result: the rules and the trap settings are part f's and item 8's.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lenslab.training.outcomes import mnist_phases
from reproduction.mnist_antigrok import compare


class ReportError(Exception):
    """A paper2.json this report cannot read: one line."""


def load_mlp(path: Path) -> dict:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ReportError(f"cannot read {path}: {e}") from None
    mlp = doc.get("mlp")
    if not isinstance(mlp, dict):
        raise ReportError(f"{path} has no 'mlp' key: part f did not run (run_on_device.sh --part f)")
    if "runs" not in mlp:
        raise ReportError(f"{path}: part f trained nothing ({mlp.get('skipped') or mlp.get('error') or 'no runs'})")
    return mlp


def member_row(run: dict, steps_per_epoch: int) -> dict:
    ph = mnist_phases(run["metrics"])
    by_epoch: dict[int, list[dict]] = {}
    for r in run["traps"] or []:
        by_epoch.setdefault(r["epoch"], []).append(r)
    checkpoints = sorted(by_epoch)
    step = lambda epoch: epoch * steps_per_epoch
    first_trap = next((step(e) for e in checkpoints if any((r["n_traps"] or 0) > 0 for r in by_epoch[e])), None)

    def below_2(r):
        a = r.get("alpha")
        return a is not None and not (isinstance(a, float) and math.isnan(a)) and a < 2

    first_a2 = next((step(e) for e in checkpoints if any(below_2(r) for r in by_epoch[e])), None)
    last = by_epoch[checkpoints[-1]] if checkpoints else []
    return {
        "weight_decay": run["weight_decay"],
        "seed": run["seed"],
        **{k: v for k, v in ph.items() if k != "phase"},
        "trap_checkpoints": len(checkpoints),
        "first_trap_step": first_trap,
        "first_alpha_below_2_step": first_a2,
        "traps_final": {r["matrix"]: r["n_traps"] for r in last},
        "trap_vs_fall": compare(first_trap, ph["fall_onset_step"]),
    }


def report(paper2_json: str | Path, out_dir: str | Path) -> list[dict]:
    mlp = load_mlp(Path(paper2_json))
    rows = [member_row(r, mlp["steps_per_epoch"]) for r in mlp["runs"]]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: json.dumps(v) if isinstance(v, dict) else v for k, v in r.items()})
    (out / "members.csv").write_text(buf.getvalue())
    meta = {k: mlp.get(k) for k in ("protocol", "steps", "stack_steps_per_s", "engine", "calibration")}
    (out / "members.json").write_text(json.dumps({"part_f": meta, "members": rows}, indent=1) + "\n")
    return rows


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: gpu_mlp_report.py FILES_AT/paper2.json OUT_DIR", file=sys.stderr)
        return 2
    try:
        rows = report(*argv)
    except ReportError as e:
        print(f"gpu_mlp_report: error: {e}", file=sys.stderr)
        return 2
    for r in rows:
        print(
            f"wd {r['weight_decay']:g} seed {r['seed']}: {r['steps']:,} steps, {r['outcome']}; fit {r['fit_step']}, grok {r['grok_step']}, "
            f"peak {r['peak_test_acc']:.3f} at {r['peak_step']}, final {r['test_acc_final']:.3f}, fall onset {r['fall_onset_step']}, "
            f"anti-grok {r['anti_grok_step']}; first trap {r['first_trap_step']}, alpha < 2 at {r['first_alpha_below_2_step']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
