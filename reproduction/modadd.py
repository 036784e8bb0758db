"""Items 6 and 7 of REPRODUCTION.md: traps through grokking and long training without weight decay.

    .venv/bin/python reproduction/modadd.py reproduction/results/modadd [--p 31] [--continue-epochs 20000]

Scaled down for a CPU (the paper: p = 113, 30 % of the pairs, then far longer training):

1. ``lenslab train`` of TransformerLens's grokking model (1 layer, d_model 128, 4 heads, d_mlp 512,
   no LayerNorm) on ``a + b mod p``, full batch AdamW (betas 0.9/0.98), weight decay 1.0, into
   ``runs/repro/modadd/grok`` (resumable);
2. trap counts per matrix over every checkpoint of that run (robust mode, seed 0);
3. from the final (grokked) weights, ``--continue-epochs`` more full-batch epochs with a fresh
   AdamW at weight decay 0 and, separately, 0.01 (same lr and betas): ``lenslab train
   --init-from`` into ``runs/repro/modadd/grok_p<p>_then_wd<wd>`` (resumable), with a checkpoint
   every ``--record-every`` epochs, and trap counts per checkpoint;
4. the trap-replacement JSD ablation (null-calibrated, with the test-accuracy change) on the
   weight-decay-0 model at the end.

Writes ``grok_traps.csv``, ``continuation.csv``, ``jsd.csv``, ``summary.json`` and ``traps.html``.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lenslab.interp.spectral import trap_counts_over_run, trap_jsd
from lenslab.training.config import modadd_run_config, with_init
from lenslab.training.run import Run
from lenslab.training.trainer import train
from reproduction.figures import write_figure


def continuation(grok_dir: Path, a: argparse.Namespace, weight_decay: float) -> tuple[list[dict], Run]:
    """``lenslab train --init-from grok_dir --weight-decay wd``: every record checkpointed, traps per checkpoint."""
    records = a.continue_epochs // a.record_every
    cfg = modadd_run_config(
        p=a.p,
        train_frac=a.train_frac,
        lr=a.lr,
        weight_decay=weight_decay,
        epochs=a.continue_epochs,
        eval_every=a.record_every,
        ckpt_density=records + 1,
        seed=0,
    )
    out = Path(a.runs) / f"{grok_dir.name}_then_wd{weight_decay:g}"

    def log(row: dict) -> None:
        print(
            f"  wd {weight_decay}: epoch {a.grok_epochs + row['epoch']}: train {row['train_acc']:.3f} test {row['test_acc']:.3f}",
            file=sys.stderr,
            flush=True,
        )

    train(with_init(cfg, grok_dir), out, resume=(out / "config.json").is_file(), progress=False, on_eval=log)
    run = Run.open(out)
    rows: dict[int, dict] = {}
    for r in trap_counts_over_run(out).to_records():  # robust mode, seed 0, one shuffle, as for the grokking run
        e = a.grok_epochs + r["epoch"]
        row = rows.setdefault(
            e, {"weight_decay": weight_decay, "epoch": e, "train_acc": r["train_acc"], "test_acc": r["test_acc"]}
        )
        row[f"traps:{r['matrix']}"] = r["n_traps"]
    assert len(rows) == records + 1, f"{out}: expected a checkpoint at every record, found {sorted(rows)}"
    return [rows[e] for e in sorted(rows)], run


def _csv(path: Path, rows: list[dict]) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--runs", default="runs/repro/modadd")
    ap.add_argument("--p", type=int, default=31)
    ap.add_argument("--train-frac", type=float, default=0.8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--grok-epochs", type=int, default=600)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--continue-epochs", type=int, default=20_000)
    ap.add_argument("--record-every", type=int, default=1_000)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    cfg = modadd_run_config(
        p=a.p, train_frac=a.train_frac, lr=a.lr, weight_decay=1.0, epochs=a.grok_epochs, eval_every=a.eval_every, seed=0
    )
    run_dir = Path(a.runs) / f"grok_p{a.p}"
    train(cfg, run_dir, resume=(run_dir / "config.json").is_file(), progress=False)
    run = Run.open(run_dir)
    grok_rows = [dict(r) for r in trap_counts_over_run(run.path).to_records()]
    _csv(out / "grok_traps.csv", grok_rows)
    t_grok = time.time() - t0
    cont = []
    runs = {}
    for wd in (0.0, 0.01):
        rows, runs[wd] = continuation(run_dir, a, wd)
        cont += rows
    _csv(out / "continuation.csv", cont)
    split = (run.splits["test_tokens"], run.splits["test_labels"])
    jsd = [r.to_record() for r in trap_jsd(runs[0.0].model(), split=split, n_null=20)]
    _csv(out / "jsd.csv", jsd) if jsd else (out / "jsd.csv").write_text("no traps in the weight-decay-0 model\n")
    m = run.metrics
    summary = {
        "protocol": {
            k: getattr(a, k) for k in ("p", "train_frac", "lr", "grok_epochs", "eval_every", "continue_epochs", "record_every")
        },
        "grok": {
            "memorized_epoch": next((r["epoch"] for r in m if r["train_acc"] == 1.0), None),
            "test_095_epoch": next((r["epoch"] for r in m if r["test_acc"] >= 0.95), None),
            "final_train_acc": m[-1]["train_acc"],
            "final_test_acc": m[-1]["test_acc"],
        },
        "continuation_end": {str(wd): rows[-1] for wd in (0.0, 0.01) for rows in [[r for r in cont if r["weight_decay"] == wd]]},
        "continuation_min_test_acc": {str(wd): min(r["test_acc"] for r in cont if r["weight_decay"] == wd) for wd in (0.0, 0.01)},
        "jsd": jsd,
        "wall_s": {"grok_and_trap_scan": round(t_grok, 1), "total": round(time.time() - t0, 1)},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    write_figure(figure(grok_rows, m, cont), out / "traps.html")
    print(json.dumps(summary["continuation_end"], indent=2, default=float))


def figure(grok_rows, metrics, cont):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, subplot_titles=("test accuracy", "traps, all matrices"))
    fig.add_trace(
        go.Scatter(
            x=[r["epoch"] for r in metrics], y=[r["test_acc"] for r in metrics], name="grokking (wd 1.0)", line={"color": "black"}
        ),
        row=1,
        col=1,
    )
    epochs = sorted({r["epoch"] for r in grok_rows})
    fig.add_trace(
        go.Scatter(
            x=epochs,
            y=[sum(r["n_traps"] for r in grok_rows if r["epoch"] == e) for e in epochs],
            name="grokking (wd 1.0)",
            line={"color": "black"},
            showlegend=False,
        ),
        row=2,
        col=1,
    )
    for wd, color in ((0.0, "#d62728"), (0.01, "#1f77b4")):
        rows = [r for r in cont if r["weight_decay"] == wd]
        fig.add_trace(
            go.Scatter(
                x=[r["epoch"] for r in rows], y=[r["test_acc"] for r in rows], name=f"continued, wd {wd}", line={"color": color}
            ),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Scatter(
                x=[r["epoch"] for r in rows],
                y=[sum(v for k, v in r.items() if k.startswith("traps:")) for r in rows],
                name=f"continued, wd {wd}",
                line={"color": color},
                showlegend=False,
            ),
            row=2,
            col=1,
        )
    fig.update_xaxes(title_text="epoch", row=2, col=1)
    fig.update_layout(template="plotly_white", height=600, title="Items 6-7: modular addition, traps through grokking and after")
    return fig


if __name__ == "__main__":
    main()
