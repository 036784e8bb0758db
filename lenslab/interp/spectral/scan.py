"""Scan safetensors files matrix by matrix: a run's checkpoints or a folder of HF-style shards.

Each task names one matrix (file, key, head/pattern); the worker memory-maps the file with
``safetensors.safe_open``, reads that one tensor, analyses it and drops it, so memory stays
bounded by the largest matrix (times the number of workers). ``executor="local"`` runs tasks on a
thread pool (the Gram product and ``eigvalsh`` release the GIL); ``executor="ray"`` sends them
to Ray workers (optional dependency).
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from lenslab.interp.spectral.adapter import MatrixRef, Skipped, plan_matrices, to_2d
from lenslab.interp.spectral.errors import SpectralError
from lenslab.interp.spectral.htsr import AlphaFit, alpha_record, htsr_alpha
from lenslab.interp.spectral.traps import TrapRow, detect_traps
from lenslab.training.errors import RunError
from lenslab.training.runio import refuse_pickle

EXECUTORS = ("local", "ray")


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


def analyze_task(task: tuple) -> dict:
    """Read one matrix from its file and return its trap row plus its HTSR α columns as a dict (errors become error rows)."""
    file, ref, mode, seed, n_shuffles = task
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


def run_tasks(
    tasks: list[tuple], workers: int = 2, executor: str = "local", progress: bool = True, desc: str = "traps"
) -> list[dict]:
    """Results of ``analyze_task`` over ``tasks``, in order."""
    if executor not in EXECUTORS:
        raise SpectralError(f"executor={executor!r} is not one of {EXECUTORS}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise SpectralError(f"workers={workers!r} must be an integer >= 1")
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
    """``{"matrices": [...], "skipped": [...]}`` for the matrices held in ``files``."""
    plan, skipped = plan_files(files, per_head=per_head)
    tasks = [(f, ref, mode, seed, n_shuffles) for f, ref in plan]
    return {"matrices": run_tasks(tasks, workers, executor, progress, desc), "skipped": [asdict(s) for s in skipped]}
