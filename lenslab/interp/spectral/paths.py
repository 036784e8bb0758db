"""Trap scans of a path (a run directory, one checkpoint, a folder of shards, one file) as typed results.

    scan = scan_path("runs/demo")                  # TrapScan: one CheckpointScan per checkpoint
    for ck in scan.checkpoints: ck.epoch, ck.matrices  # matrices: a Table, one record per matrix
    scan.to_dict()                                 # the ``lenslab traps --json`` document

The library path: ``run.trap_counts_over_run`` reads these objects, and ``command.traps_command``
(the CLI's entry point) only turns them into the JSON document and the text table.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from lenslab.interp.common import Table
from lenslab.interp.spectral.errors import SpectralError
from lenslab.interp.spectral.scan import ScanOptions, scan_with, shard_files

JSD_PROBES = 256  # probes per J_k: random token sequences, or Gaussian inputs N(0, I) for an MLP
JSD_NULL = 20  # random rank-1 replacements for the null distribution


@dataclass(frozen=True)
class CheckpointScan:
    """One checkpoint (or one file, or all shards of a folder together).

    ``matrices``: per matrix, its trap row (``TrapRow.to_record``), its HTSR α columns
    (``htsr.alpha_record``) and ``file``; ``skipped``: what was not a matrix; ``error``: why a
    run's checkpoint could not be scanned at all; ``jsd``: trap-replacement J_k rows when asked.
    """

    checkpoint: str
    epoch: int | None
    matrices: Table = field(default_factory=Table)
    skipped: list[dict] = field(default_factory=list)
    error: str | None = None
    jsd: list[dict] | None = None

    def to_dict(self) -> dict:
        d = {"checkpoint": self.checkpoint, "epoch": self.epoch, "matrices": list(self.matrices), "skipped": list(self.skipped)}
        if self.error is not None:
            d["error"] = self.error
        if self.jsd is not None:
            d["jsd"] = list(self.jsd)
        return d


@dataclass(frozen=True)
class TrapScan:
    """Every checkpoint scanned at ``path``, with the settings used."""

    kind: str  # "run", "checkpoint", "shards" or "file"
    path: str
    mode: str
    seed: int
    n_shuffles: int
    checkpoints: list[CheckpointScan]

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "path": self.path,
            "mode": self.mode,
            "seed": self.seed,
            "n_shuffles": self.n_shuffles,
            "checkpoints": [c.to_dict() for c in self.checkpoints],
        }

    def __repr__(self) -> str:
        bad = sum(1 for c in self.checkpoints if c.error)
        last = next((c for c in reversed(self.checkpoints) if not c.error), None)
        traps = {r["name"]: r["n_traps"] for r in last.matrices} if last is not None else {}
        return (
            f"TrapScan({self.path!r}, {self.mode}, seed {self.seed}: {len(self.checkpoints)} checkpoints"
            + (f", {bad} unreadable" if bad else "")
            + (f"; traps at the last: {traps}" if traps else "")
            + ")"
        )

    def _repr_html_(self) -> str:
        """The trap counts and alpha per matrix over checkpoints (``format_traps_table``) in a <pre> block."""
        import html

        from lenslab.interp.spectral.command import format_traps_table

        return f"<div><b>{html.escape(repr(self))}</b><pre>{html.escape(format_traps_table(self))}</pre></div>"


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


def _jsd_split(run, model) -> tuple | None:
    """The run's labelled split for the ablation's accuracy column: the test split (``adv`` for MPSP runs
    without one); an MNIST MLP's test images as its inputs, ``pixels / 255`` in the model's dtype. None without splits."""
    try:
        names = run.split_names()
    except Exception:  # noqa: BLE001
        return None  # no splits file: J_k only
    name = "test" if "test" in names else ("adv" if "adv" in names else None)
    if name is None:
        return None
    split = run.split(name)  # an image task's inputs come back as pixels / 255 in the run's dtype
    return split.tokens.to(model.dtype) if run.is_mnist else split.tokens, split.labels


def _jsd_rows(run_dir: Path, epoch: int | None, mode: str, seed: int) -> list[dict]:
    from lenslab.interp.spectral.jsd import trap_jsd
    from lenslab.training.run import Run

    run = Run.open(run_dir)
    model = run.model(epoch)
    split = _jsd_split(run, model)
    return [r.to_record() for r in trap_jsd(model, mode=mode, seed=seed, split=split, n_probes=JSD_PROBES, n_null=JSD_NULL)]


def _as_path(path):
    """A ``Run`` as its focused checkpoint (if it was opened on one) or its directory; anything else as given."""
    from lenslab.training.run import Run

    if isinstance(path, Run):
        return path.focus if path.focus is not None else path.path
    return path


def scan_path(
    path,
    mode: str = "robust",
    seed: int = 0,
    n_shuffles: int = 1,
    jsd: bool = False,
    workers: int = 2,
    executor: str = "local",
    progress: bool = True,
    epochs: Collection[int] | None = None,
) -> TrapScan:
    """Trap rows, with each matrix's HTSR α columns, for every checkpoint (or the one file / shard folder) at ``path``.

    For shards all files form one checkpoint entry. ``jsd=True`` (run dirs and checkpoints only)
    adds trap-replacement J_k rows (``jsd.trap_jsd``: random-token probes for a transformer, Gaussian
    inputs for an MNIST MLP; J_k and the accuracy change on the test split too where the run has one). ``epochs`` (run directories only) keeps just those checkpoints.
    Every option is checked (``ScanOptions``) before ``path`` is read.
    """
    options = ScanOptions(mode, seed, n_shuffles, workers, executor)
    path = _as_path(path)
    kind, items, run_dir = resolve(path)
    if epochs is not None and kind == "run":
        wanted = set(epochs)
        items = [(e, f) for e, f in items if e in wanted]
    if jsd and run_dir is None:
        raise SpectralError(f"{path}: --jsd needs a lenslab run (its config builds the model); shard folders have none")
    groups = [(str(Path(path)), None, [f for _, f in items])] if kind == "shards" else [(str(f), e, [f]) for e, f in items]
    out = []
    for label, epoch, files in groups:
        try:
            scanned = scan_with(files, options, progress, desc=Path(label).name)
        except SpectralError as e:
            if kind != "run":
                raise
            out.append(CheckpointScan(label, epoch, error=str(e)))  # one bad checkpoint does not stop the run
            continue
        rows = _jsd_rows(run_dir, epoch, mode, seed) if jsd else None
        out.append(CheckpointScan(label, epoch, Table(scanned["matrices"]), scanned["skipped"], jsd=rows))
    return TrapScan(kind, str(path), mode, seed, n_shuffles, out)
