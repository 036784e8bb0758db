"""``lenslab traps PATH``: the entry point the CLI calls, and its human-readable table."""

from __future__ import annotations

import json
import math
from collections.abc import Collection
from pathlib import Path

from lenslab.interp.spectral.errors import SpectralError
from lenslab.interp.spectral.scan import scan_files, shard_files
from lenslab.interp.spectral.traps import MODES

JSD_PROBES = 256  # random-token probes per J_k
JSD_NULL = 20  # random rank-1 replacements for the null distribution


def _is_run_dir(path: Path) -> bool:
    """A folder with a ``config.json`` that is (or claims to be, or is too broken to tell) a lenslab run.

    A Hugging Face model folder also has a ``config.json`` (a JSON object without lenslab's
    ``format``) next to its ``*.safetensors``: that one is scanned as shards, not refused as a bad run.
    """
    config = path / "config.json"
    if not (path.is_dir() and config.is_file()):
        return False
    has_shards = any(path.glob("*.safetensors")) and not (path / "splits.safetensors").is_file()
    if not has_shards:
        return True
    try:
        data = json.loads(config.read_bytes()[: 1 << 20])
    except (json.JSONDecodeError, UnicodeDecodeError):
        return True  # let the run reader say what is wrong with it
    return not isinstance(data, dict) or str(data.get("format", "")).startswith("lenslab")


def _is_checkpoint(path: Path) -> bool:
    return path.is_file() and path.parent.name == "checkpoints" and _is_run_dir(path.parent.parent)


def resolve(path: str | Path) -> tuple[str, list[tuple[int | None, Path]], Path | None]:
    """``(kind, [(epoch, file)], run_dir)`` for a run dir, a checkpoint, a shard folder or one file."""
    from lenslab.training.errors import RunError
    from lenslab.training.run import Run

    path = Path(path)
    if not path.exists():
        raise SpectralError(f"{path}: no such file or directory")
    if _is_run_dir(path) or _is_checkpoint(path):
        try:
            run = Run.open(path)
        except RunError as e:
            raise SpectralError(str(e)) from None
        if run.focus is not None:
            return "checkpoint", [(run.focus_epoch(), run.focus)], run.path
        ckpts = run.checkpoints()
        if not ckpts:
            raise SpectralError(f"{path}: the run has no checkpoints yet")
        return "run", [(e, p) for e, p in ckpts], run.path
    if path.is_dir():
        return "shards", [(None, f) for f in shard_files(path)], None
    if path.suffix == ".safetensors":
        return "file", [(None, path)], None
    raise SpectralError(f"{path}: expected a run directory, a checkpoint, a .safetensors file or a folder of shards")


def _jsd_rows(run_dir: Path, epoch: int | None, mode: str, seed: int) -> list[dict]:
    from lenslab.interp.spectral.jsd import trap_jsd
    from lenslab.training.run import Run

    run = Run.open(run_dir)
    model = run.model(epoch)
    split = None
    try:
        splits = run.splits
        name = "test" if "test_tokens" in splits else ("adv" if "adv_tokens" in splits else None)
        if name:
            split = (splits[f"{name}_tokens"], splits[f"{name}_labels"])
    except Exception:  # noqa: BLE001
        split = None  # no splits file: J_k only
    return [r.to_record() for r in trap_jsd(model, mode=mode, seed=seed, split=split, n_probes=JSD_PROBES, n_null=JSD_NULL)]


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
    """Trap rows, with each matrix's HTSR α columns (``htsr.alpha_record``), for every checkpoint (or the one file / shard folder) at ``path``.

    Returns ``{"kind", "path", "mode", "seed", "checkpoints": [{"checkpoint", "epoch", "matrices", "skipped"[, "jsd"]}]}``;
    for shards all files form one entry. ``jsd=True`` (run dirs and checkpoints only) adds trap-replacement J_k rows.
    ``epochs`` (run directories only) keeps just those checkpoints.
    """
    if mode not in MODES:
        raise SpectralError(f"--mode {mode!r} is not one of {MODES}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise SpectralError(f"--seed {seed!r} must be an integer")
    kind, items, run_dir = resolve(path)
    if epochs is not None and kind == "run":
        wanted = set(epochs)
        items = [(e, f) for e, f in items if e in wanted]
    if jsd and run_dir is None:
        raise SpectralError(f"{path}: --jsd needs a lenslab run (its config builds the model); shard folders have none")
    groups = [(str(Path(path)), None, [f for _, f in items])] if kind == "shards" else [(str(f), e, [f]) for e, f in items]
    out = []
    for label, epoch, files in groups:
        entry = {"checkpoint": label, "epoch": epoch}
        try:
            entry.update(scan_files(files, mode, seed, n_shuffles, workers, executor, progress, desc=Path(label).name))
        except SpectralError as e:
            if kind != "run":
                raise
            entry.update(matrices=[], skipped=[], error=str(e))  # one bad checkpoint does not stop the run
        if jsd and "error" not in entry:
            entry["jsd"] = _jsd_rows(run_dir, epoch, mode, seed)
        out.append(entry)
    return {"kind": kind, "path": str(path), "mode": mode, "seed": seed, "n_shuffles": n_shuffles, "checkpoints": out}


def _fmt(x, spec: str = ".4g") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def format_traps_table(result: dict) -> str:
    """One block per checkpoint: a row per matrix (traps, λ₊, threshold, largest/λ₊, HTSR α and its KS distance, or the error)."""
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
            lines.append(f"   jsd {j['matrix']} trap {j['trap']}: J={j['jsd']:.3g} (null p95 {j['null_p95']:.3g}) {flag}{acc}")
    return "\n".join(lines)
