"""Reports: the layer above training and interp that turns their numbers into HTML and figures.

    write_report("RUN/report.html", "run demo", [("Accuracy", [fig, "<p>note</p>", "plain text"]), ...])
    result, path = write_inspection("runs/demo")        # interp.inspect.inspect_run + its report

One self-contained HTML report: plotly.js and the circuitsvis bundle inlined once, no URLs loaded.
A section is ``(heading, items)``; an item is a plotly ``Figure``, an object with ``html()``
(an ``interp.visual.AttentionView``), an HTML string (starting with ``<``), or plain text.

Layers, bottom to top: tasks -> training -> interp -> report -> cli. training and interp return
data (dicts, tables); everything that assembles a page lives here, a sweep's figure in
``lenslab.sweep_figures`` (plotly only: the bare GPU machine draws it without circuitsvis).
"""

from __future__ import annotations

import html as html_lib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { border-bottom: 2px solid #888; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; }
pre, code { background: #f4f4f4; } pre { padding: .6em; overflow-x: auto; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 2px 6px; }
"""


def _item_html(item: Any) -> tuple[str, bool]:
    """HTML of one item and whether it needs the circuitsvis bundle."""
    if hasattr(item, "to_html") and hasattr(item, "to_plotly_json"):
        return item.to_html(full_html=False, include_plotlyjs=False), False
    if hasattr(item, "html") and callable(item.html):
        return item.html(), True
    text = str(item)
    if text.lstrip().startswith("<"):
        return text, False
    return f"<p>{html_lib.escape(text)}</p>", False


def render_report(title: str, sections: Sequence[tuple[str, Sequence[Any]]]) -> str:
    """An offline HTML page: plotly.js (and, when a section needs it, the circuitsvis bundle) inlined, then each section's figures, tables and views."""
    from plotly.offline import get_plotlyjs

    body, needs_cv = [], False
    for heading, items in sections:
        body.append(f"<h2>{html_lib.escape(str(heading))}</h2>")
        for item in items if isinstance(items, (list, tuple)) else [items]:
            h, cv = _item_html(item)
            needs_cv |= cv
            body.append(h)
    scripts = [f'<script type="text/javascript">{get_plotlyjs()}</script>']
    if needs_cv:
        from lenslab.interp.visual import circuitsvis_bundle_html

        scripts.append(circuitsvis_bundle_html())
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{html_lib.escape(title)}</title><style>{STYLE}</style>\n"
        + "\n".join(scripts)
        + f"\n</head><body><h1>{html_lib.escape(title)}</h1>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def write_report(path: str | Path, title: str, sections: Sequence[tuple[str, Sequence[Any]]]) -> Path:
    """Write the report atomically (temp file + rename) and return its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = render_report(title, sections)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


# -- lenslab inspect: the report of one run -------------------------------------------------------
def _open(run_or_path):
    from lenslab.training.run import Run

    return run_or_path if isinstance(run_or_path, Run) else Run.open(run_or_path)


def _limits_sentence(limits: dict) -> str:
    """The analysis limits as one sentence for the report (``result["limits"]`` keeps them as data)."""
    return (
        f"Limits: cross-split patching on {limits['patching_pairs']} pairs, at most {limits['max_examples']} examples per split; "
        f"evolution: {limits['evolution']}; traps: {limits['traps']}."
    )


def _table_html(rows: list[dict], keys: list[str]) -> str:
    def cell(v):
        return f"{v:.3f}" if isinstance(v, float) else html_lib.escape(str(v))

    head = "".join(f"<th>{html_lib.escape(k)}</th>" for k in keys)
    body = "".join("<tr>" + "".join(f"<td>{cell(r.get(k))}</td>" for k in keys) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def inspection_sections(run_dir, result: dict, n_examples: int = 2) -> list[tuple[str, list]]:
    """Report sections for ``result`` (from ``interp.inspect.inspect_run``): curves, gradients, circuits, views."""
    import torch

    from lenslab.interp import visual
    from lenslab.interp.patching import PatchGrid

    run = _open(run_dir)
    metrics = run.metrics
    phase = result["phase"]
    ph = (
        f"phase 1 (validation ≥ {phase['val_threshold']:.0%}) from epoch {phase['phase1_epoch']}; "
        f"adv plateau {phase['plateau_adv_acc']}; phase 2 (adv > plateau + {phase['margin']}) from epoch {phase['phase2_epoch']}; "
        f"first 100 % adv at epoch {phase['generalized_epoch']}"
    )
    sections: list[tuple[str, list]] = [
        ("Run", [f"{result['run']} — analysed checkpoint: epoch {result['epoch']}", _limits_sentence(result["limits"])]),
        ("Accuracy", [visual.accuracy_figure(metrics, phase), ph]),
        ("Gradient dynamics", [visual.gradient_figure(metrics)]),
        ("Softmax collapse and weight norms", visual.collapse_items(metrics)),
    ]
    head_rows = result["evolution"]["head_rows"]
    evo_items = [result["limits"]["evolution"]]
    if head_rows:
        evo_items += [
            visual.fingerprint_evolution_figure(head_rows, "w"),
            visual.fingerprint_evolution_figure(head_rows, "a"),
            visual.head_evolution_heatmap(head_rows, "ablate_delta_acc_adv", "mean-ablation Δ adv accuracy per head"),
            visual.head_evolution_heatmap(
                head_rows, "patch_z", "patching head output (validation→counterfactual), normalized LD"
            ),
        ]
    sections.append(("Circuit evolution", evo_items))
    fp = result["fingerprints"]
    keys = ["head_name", "source", "qk_rho", "pos0_mass", "ov_parity_rho"]
    sections.append(("Fingerprints (analysed checkpoint)", [_table_html(fp["weights"] + fp["activations"], keys)]))
    sections.append(
        (
            "Ablation (mean over train)",
            [visual.ablation_figure(result["ablation"], "delta_acc"), visual.ablation_figure(result["ablation"], "logit_diff")],
        )
    )
    patch_items = [
        f"{result['limits']['patching_pairs']} pairs; 0 = unpatched, 1 = receiver behaves like the source (normalized logit diff)"
    ]
    for d, grids in result["patching"].items():
        for k, g in grids.items():
            grid = PatchGrid(
                kind=k,
                direction=d,
                values=torch.tensor(g["values"]),
                n_pairs=g["n_pairs"],
                ld_source=g["ld_source"],
                ld_receiver=g["ld_receiver"],
            )
            patch_items.append(visual.patching_figure(grid))
    sections.append(("Cross-split patching", patch_items))
    sections.append(("Correlation traps", _trap_items(run, result["traps"])))
    model = run.model(result["epoch"])
    views = []
    for split in ("validation", "counterfactual"):
        for i in range(min(n_examples, len(run.splits[f"{split}_tokens"]))):
            tok = run.splits[f"{split}_tokens"][i]
            views.append(
                visual.attention_view(
                    model,
                    tok,
                    run.task.n_values,
                    title=f"{split} #{i}: label {int(run.splits[f'{split}_labels'][i])}, shortcut {int(run.splits[f'{split}_shortcut'][i])}",
                )
            )
    sections.append(("Attention (readout is the last row)", views))
    return sections


def _trap_items(run, traps: dict) -> list:
    from lenslab.interp.spectral import esd_figure, extract_matrices, trap_count_figure

    note = (
        f"Correlation traps (Prakash & Martin): eigenvalues of the entry-shuffled weight matrix's correlation matrix above the "
        f"Marchenko–Pastur bulk edge plus a Tracy–Widom allowance; {traps['mode']} mode (σ fitted on the bulk), seed {traps['seed']}, "
        f"{len(traps['epochs_used'])} of {traps['n_checkpoints']} checkpoints."
    )
    items = [note]
    rows = traps["rows"]
    if not rows:
        return items + ["no matrix could be analysed"]
    items.append(trap_count_figure(rows, run.metrics))
    errors = sorted({f"{r['matrix']}: {r['error']}" for r in rows if r["error"]})
    items += [f"not analysed: {e}" for e in errors]
    if traps["esd_matrix"] is not None:
        w = extract_matrices(run.model(traps["esd_epoch"])).matrices[traps["esd_matrix"]]
        items.append(esd_figure(w, f"{traps['esd_matrix']} (epoch {traps['esd_epoch']})", mode=traps["mode"], seed=traps["seed"]))
    last = traps["epochs_used"][-1]
    items.append(_table_html([r for r in rows if r["epoch"] == last], ["matrix", "n_traps", "lambda_plus", "threshold"]))
    return items


def write_inspection(run_dir, path: str | Path | None = None, **kwargs) -> tuple[dict, Path]:
    """``interp.inspect.inspect_run`` + ``inspection_sections`` + ``write_report`` to ``RUN/report.html``."""
    from lenslab.interp.inspect import inspect_run

    run = _open(run_dir)
    result = inspect_run(run, **kwargs)
    out = write_report(path or run.path / "report.html", f"lenslab inspect: {run.path.name}", inspection_sections(run, result))
    return result, out
