"""``lenslab traps PATH``: the entry point the CLI calls (``paths.scan_path``'s typed result as a JSON
document) and its human-readable table. No analysis here: the library path is ``paths.scan_path``."""

from __future__ import annotations

import math
from collections.abc import Collection

from lenslab.interp.spectral.paths import TrapScan, scan_path


def traps_command(
    path,
    mode: str = "robust",
    seed: int = 0,
    n_shuffles: int = 1,
    jsd: bool = False,
    workers: int = 2,
    executor: str = "local",
    progress: bool = True,
    epochs: Collection[int] | None = None,
) -> dict:
    """``scan_path(...)`` as the ``lenslab traps --json`` document.

    Returns ``{"kind", "path", "mode", "seed", "n_shuffles", "checkpoints": [{"checkpoint", "epoch", "matrices", "skipped"[, "error"][, "jsd"]}]}``;
    see ``paths.scan_path`` for the arguments.
    """
    return scan_path(
        path,
        mode=mode,
        seed=seed,
        n_shuffles=n_shuffles,
        jsd=jsd,
        workers=workers,
        executor=executor,
        progress=progress,
        epochs=epochs,
    ).to_dict()


def _fmt(x, spec: str = ".4g") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def format_traps_table(result: dict | TrapScan) -> str:
    """One block per checkpoint: a row per matrix (traps, λ₊, threshold, largest/λ₊, HTSR α and its KS distance, or the error)."""
    if isinstance(result, TrapScan):
        result = result.to_dict()
    lines = [f"traps ({result.get('mode', '?')} mode, seed {result.get('seed', '?')}) for {result.get('path', '')}"]
    for ck in result["checkpoints"]:
        lines.append("")
        lines.append(f"== {ck['checkpoint']}" + (f" (epoch {ck['epoch']})" if ck.get("epoch") is not None else ""))
        if ck.get("error"):
            lines.append(f"   error: {ck['error']}")
            continue
        rows = ck["matrices"]
        width = max([len(r["name"]) for r in rows] + [6])
        lines.append(
            f"   {'matrix':<{width}}  {'N':>6} {'M':>6} {'traps':>5} {'lambda+':>9} {'thresh':>9} {'max/l+':>7} {'alpha':>6} {'ks':>6}"
        )
        no_alpha = []
        for r in rows:
            if r.get("error"):
                lines.append(f"   {r['name']:<{width}}  {r['N']:>6} {r['M']:>6}  error: {r['error']}")
                continue
            traps = f"{r['n_traps']}" if r.get("n_shuffles", 1) == 1 else f"{r['n_traps_mean']:.1f}±{r['n_traps_std']:.1f}"
            lines.append(
                f"   {r['name']:<{width}}  {r['N']:>6} {r['M']:>6} {traps:>5} {_fmt(r['lambda_plus']):>9} "
                f"{_fmt(r['threshold']):>9} {_fmt(r.get('largest_over_lambda_plus'), '.3g'):>7} "
                f"{_fmt(r.get('alpha'), '.3g'):>6} {_fmt(r.get('ks'), '.3f'):>6}"
            )
            if r.get("alpha_reason"):
                no_alpha.append(f"   no alpha for {r['name']}: {r['alpha_reason']}")
        lines += no_alpha
        skipped = ck.get("skipped", [])
        vectors = [s for s in skipped if len(s["shape"]) < 2]
        for s in skipped:
            if len(s["shape"]) >= 2:
                lines.append(f"   skipped {s['name']} {tuple(s['shape'])}: {s['reason']}")
        if vectors:
            lines.append(f"   skipped {len(vectors)} 1-D tensors (biases, norm scales)")
        for j in ck.get("jsd", []):
            flag = "HARMFUL" if j["harmful"] else "benign"
            acc = "" if j.get("accuracy_change") is None else f" acc change {j['accuracy_change']:+.4f}"
            on = f" on {j['probe']} probes" if j.get("probe") == "gaussian" else ""
            test = "" if j.get("jsd_split") is None else f"; J on test split {j['jsd_split']:.3g}"
            lines.append(
                f"   jsd {j['matrix']} trap {j['trap']}: J={j['jsd']:.3g}{on} (null p95 {j['null_p95']:.3g}) {flag}{test}{acc}"
            )
    return "\n".join(lines)
