"""Scan safetensors files matrix by matrix: a run's checkpoints or a folder of HF-style shards.

Each job (a ``ScanJob``) names one matrix (file, key, head/pattern) and the analysis settings;
the worker memory-maps the file with ``safetensors.safe_open``, reads that one tensor, analyses
it and drops it, so memory stays bounded by the largest matrix (times the number of workers).
``executor="local"`` runs jobs on a thread pool (the Gram product and ``eigvalsh`` release the
GIL); ``executor="ray"`` sends them to Ray workers (optional dependency). Every option is checked
once, in ``ScanOptions``, before any file is read or any worker starts.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import no_type_check

import torch
from safetensors import safe_open
from tqdm.auto import tqdm  # a widget in a notebook (ipywidgets, the notebook extra), text elsewhere

from lenslab.interp.spectral.adapter import MatrixRef, Skipped, plan_matrices, to_2d
from lenslab.interp.spectral.errors import SpectralError
from lenslab.interp.spectral.htsr import AlphaFit, alpha_record, htsr_alpha
from lenslab.interp.spectral.traps import MODES, TrapRow, detect_traps
from lenslab.training.errors import RunError
from lenslab.training.runio import refuse_pickle

EXECUTORS = ("local", "ray")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@no_type_check  # validates raw option values itself, with the CLI's readable errors
@dataclass(frozen=True)
class ScanOptions:
    """How to scan: trap mode, seed, shuffles per matrix, workers and executor; checked on construction."""

    mode: str = "robust"
    seed: int = 0
    n_shuffles: int = 1
    workers: int = 2
    executor: str = "local"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise SpectralError(f"--mode {self.mode!r} is not one of {MODES}")
        if not _is_int(self.seed):
            raise SpectralError(f"--seed {self.seed!r} must be an integer")
        if not _is_int(self.n_shuffles) or self.n_shuffles < 1:
            raise SpectralError(f"n_shuffles={self.n_shuffles!r} must be an integer >= 1")
        if not _is_int(self.workers) or self.workers < 1:
            raise SpectralError(f"workers={self.workers!r} must be an integer >= 1")
        if self.executor not in EXECUTORS:
            raise SpectralError(f"executor={self.executor!r} is not one of {EXECUTORS}")


@dataclass(frozen=True)
class ScanJob:
    """One worker's job: the matrix ``ref`` in ``file``, analysed with ``mode``/``seed``/``n_shuffles``."""

    file: str
    ref: MatrixRef
    mode: str
    seed: int
    n_shuffles: int


def _one_line(e: Exception) -> str:
    s = str(e).strip().splitlines()
    return s[0] if s else type(e).__name__


def shard_files(folder: Path) -> list[Path]:
    """The shard files of a folder: those listed in ``model.safetensors.index.json``, else ``*.safetensors``."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as e:
            raise SpectralError(f"{index}: not a valid safetensors index ({_one_line(e)}); fix or delete it") from None
        files = [folder / f for f in dict.fromkeys(weight_map.values())]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise SpectralError(f"{index}: lists shard(s) {missing[:3]} that are not in {folder}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise SpectralError(f"{folder}: no *.safetensors files (and no config.json): not a run or a shard folder")
    return files


def plan_files(
    files: list[Path], per_head: bool = False, include_pos: bool = False
) -> tuple[list[tuple[str, MatrixRef]], list[Skipped]]:
    """``(file, ref)`` tasks for the matrices in ``files`` (read headers only), and what was skipped."""
    shapes, where, skipped = {}, {}, []
    for f in files:
        try:
            refuse_pickle(f)  # by name or by content, with the command that converts it
        except RunError as e:
            raise SpectralError(str(e)) from None
        try:
            with safe_open(str(f), framework="pt") as h:
                for k in h.keys():  # noqa: SIM118 (safe_open is not a dict)
                    shapes[k] = tuple(h.get_slice(k).get_shape())
                    where[k] = str(f)
        except Exception as e:  # noqa: BLE001 (safetensors raises several types for garbled headers)
            raise SpectralError(f"{f}: not a readable safetensors file ({_one_line(e)})") from None
    refs, skipped = plan_matrices(shapes, per_head=per_head, include_pos=include_pos)
    return [(where[r.key], r) for r in refs], skipped


def analyze_task(job: ScanJob) -> dict:
    """Read one matrix from its file and return its trap row plus its HTSR α columns as a dict (errors become error rows)."""
    file, ref, mode, seed, n_shuffles = job.file, job.ref, job.mode, job.seed, job.n_shuffles
    try:
        with safe_open(file, framework="pt") as h:
            t = h.get_tensor(ref.key)
        w = to_2d(t, ref).double() if t.is_floating_point() else to_2d(t, ref)
        del t
    except Exception as e:  # noqa: BLE001 (any read failure becomes an error row)
        n, m = max(ref.shape), min(ref.shape)
        error = f"{file}: cannot read {ref.key} ({_one_line(e)})"
        return TrapRow(ref.name, n, m, n / m, mode, seed, n_shuffles, error=error).to_record() | alpha_record(
            AlphaFit.failed(error)
        )
    rec = detect_traps(w, ref.name, mode=mode, seed=seed, n_shuffles=n_shuffles).to_record()
    rec.update(alpha_record(htsr_alpha(w, ref.name)))
    rec["file"] = Path(file).name
    return rec


def run_tasks(tasks: list[ScanJob], options: ScanOptions, progress: bool = True, desc: str = "traps") -> list[dict]:
    """Results of ``analyze_task`` over ``tasks``, in order, with ``options``' workers and executor (already checked)."""
    workers, executor = options.workers, options.executor
    bar = tqdm(total=len(tasks), desc=desc, file=sys.stderr, disable=not progress, leave=False)
    try:
        if executor == "ray":
            try:
                import ray
            except ImportError:
                raise SpectralError(
                    "executor='ray' needs Ray, which is not installed: pip install 'lenslab[ray]' (or use --executor local)"
                ) from None
            if not ray.is_initialized():
                ray.init(ignore_reinit_error=True, num_cpus=workers, log_to_driver=False)
            remote = ray.remote(analyze_task)
            futures = [remote.remote(t) for t in tasks]
            out = []
            for f in futures:
                out.append(ray.get(f))
                bar.update()
            return out
        if workers == 1:
            out = []
            for t in tasks:
                out.append(analyze_task(t))
                bar.update()
            return out
        # split torch's intra-op threads between the workers (restored afterwards)
        threads = torch.get_num_threads()
        torch.set_num_threads(max(1, threads // workers))
        try:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                out = []
                for r in pool.map(analyze_task, tasks):
                    out.append(r)
                    bar.update()
                return out
        finally:
            torch.set_num_threads(threads)
    finally:
        bar.close()


def scan_files(
    files: list[Path],
    mode: str = "robust",
    seed: int = 0,
    n_shuffles: int = 1,
    workers: int = 2,
    executor: str = "local",
    progress: bool = True,
    per_head: bool = False,
    desc: str = "traps",
) -> dict:
    """``{"matrices": [...], "skipped": [...]}`` for the matrices held in ``files`` (options checked before any read)."""
    options = ScanOptions(mode, seed, n_shuffles, workers, executor)
    return scan_with(files, options, progress, per_head, desc)


def scan_with(
    files: list[Path], options: ScanOptions, progress: bool = True, per_head: bool = False, desc: str = "traps"
) -> dict:
    """``scan_files`` with its options already checked: headers first, then one ``ScanJob`` per matrix."""
    plan, skipped = plan_files(files, per_head=per_head)
    jobs = [ScanJob(str(f), ref, options.mode, options.seed, options.n_shuffles) for f, ref in plan]
    return {"matrices": run_tasks(jobs, options, progress, desc), "skipped": [asdict(s) for s in skipped]}
