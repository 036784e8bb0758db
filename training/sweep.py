"""Seed sweeps over a grid of cells, packed into ensembles, run locally or on a Ray cluster.

    plan = plan_sweep("runs/sweep", layers=[1, 2], heads=[1, 2], ratios=[0.5, 0.9], seeds=range(32))
    run_sweep(plan)                       # resumable: finished members are skipped
    table = summarize_sweep("runs/sweep") # one row per cell, also results.csv / .json / .html

Layout: ``OUT/sweep.json`` (the plan), one ordinary run directory per member at
``OUT/<cell>/seed_<s>/`` where ``<cell>`` is e.g. ``L2H1-r0.9-wd0.1``. Members that share an
architecture are packed into ensembles of up to ``ensemble_size`` (they may differ in r and
weight decay); each ensemble is one job, trained by ``training.ensemble.train_ensemble`` with
``resume=True``, so a killed sweep picks up where each member stopped. Progress is read from
the members' ``summary.json`` files, which works the same for local processes and Ray workers
on a shared filesystem.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from training.config import mpsp_run_config
from training.errors import ConfigError, RunError
from training.runio import RunLock, atomic_write_bytes, atomic_write_json, is_temp_file_name

SWEEP_FORMAT = "lenslab-sweep/1"
EXECUTORS = ("local", "ray")


@dataclass(frozen=True)
class Cell:
    layers: int
    heads: int
    ratio: float
    weight_decay: float

    @property
    def name(self) -> str:
        return f"L{self.layers}H{self.heads}-r{self.ratio:g}-wd{self.weight_decay:g}"


@dataclass(frozen=True)
class Member:
    cell: Cell
    seed: int
    out: str
    config: dict


def plan_sweep(
    out: str | Path,
    layers: Iterable[int],
    heads: Iterable[int],
    ratios: Iterable[float],
    seeds: Iterable[int],
    weight_decays: Iterable[float] = (0.1,),
    ensemble_size: int | None = None,
    **settings,
) -> dict:
    """The sweep's plan: every (cell, seed) with its full run config. ``settings`` go to ``mpsp_run_config``."""
    layers, heads, ratios, seeds, wds = (list(x) for x in (layers, heads, ratios, seeds, weight_decays))
    for name, values in (("layers", layers), ("heads", heads), ("ratios", ratios), ("seeds", seeds), ("weight decays", wds)):
        if not values:
            raise ConfigError(f"the sweep has no {name}: give at least one")
        if len(set(values)) != len(values):
            raise ConfigError(f"the sweep lists a value of {name} twice: {values}")
    if ensemble_size is None:
        from training.ensemble import SWEEP_ENSEMBLE

        ensemble_size = SWEEP_ENSEMBLE
    if not isinstance(ensemble_size, int) or ensemble_size < 1:
        raise ConfigError(f"ensemble_size={ensemble_size!r} must be an integer >= 1")
    members = []
    for L in layers:
        for H in heads:
            for r in ratios:
                for wd in wds:
                    cell = Cell(L, H, float(r), float(wd))
                    for s in seeds:
                        cfg = mpsp_run_config(ratio=r, layers=L, heads=H, seed=s, weight_decay=wd, **settings)
                        members.append(asdict(Member(cell, s, f"{cell.name}/seed_{s}", cfg)))
    return {
        "format": SWEEP_FORMAT,
        "root": str(Path(out)),
        "grid": {"layers": layers, "heads": heads, "ratios": ratios, "seeds": seeds, "weight_decays": wds},
        "settings": settings,
        "ensemble_size": ensemble_size,
        "members": members,
    }


def _members(plan: dict) -> list[Member]:
    return [Member(Cell(**m["cell"]), m["seed"], m["out"], m["config"]) for m in plan["members"]]


def _is_done(root: Path, m: Member) -> bool:
    path = root / m.out / "summary.json"
    try:
        s = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return s.get("status") == "complete" and s.get("epochs_completed") == m.config["train"]["epochs"]


def pack(plan: dict, skip_done: bool = True) -> list[list[Member]]:
    """Jobs: members grouped by architecture, chunked into ensembles of ``ensemble_size``."""
    root = Path(plan["root"])
    groups: dict[str, list[Member]] = {}
    for m in _members(plan):
        if skip_done and _is_done(root, m):
            continue
        groups.setdefault(json.dumps(m.config["model"], sort_keys=True), []).append(m)
    size = plan["ensemble_size"]
    return [g[i : i + size] for g in groups.values() for i in range(0, len(g), size)]


def _epochs_done(root: Path, members: list[Member]) -> int:
    total = 0
    for m in members:
        try:
            total += int(json.loads((root / m.out / "summary.json").read_text()).get("epochs_completed", 0))
        except (OSError, ValueError, TypeError):
            pass
    return total


def run_job(root: str, job: list[dict], threads: int | None = None, device: str | None = None, on_eval=None) -> list[str]:
    """Train one packed ensemble (called in a worker process or a Ray task)."""
    import torch

    from training.ensemble import train_ensemble

    if threads:
        torch.set_num_threads(threads)
    members = [Member(Cell(**m["cell"]), m["seed"], m["out"], m["config"]) for m in job]
    outs = [Path(root) / m.out for m in members]
    train_ensemble([m.config for m in members], outs, resume=True, progress=False, device=device, on_eval=on_eval)
    return [m.out for m in members]


def _without_epochs(members) -> list:
    """Plans compare without the epoch budget: rerunning with a larger --epochs extends the sweep."""
    if not isinstance(members, list):
        return []
    return [{**m, "config": {**m["config"], "train": {k: v for k, v in m["config"]["train"].items() if k != "epochs"}}} for m in members]


def write_plan(plan: dict) -> Path:
    """Write ``OUT/sweep.json``; an existing plan must be the same sweep up to ``epochs`` (else refuse)."""
    root = Path(plan["root"])
    path = root / "sweep.json"
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except ValueError as e:
            raise RunError(f"{path} is not valid JSON ({e}); move it away to start a new sweep there") from None
        if old.get("format") != SWEEP_FORMAT:
            raise RunError(f"{path} is not a lenslab sweep plan; choose another --out")
        if _without_epochs(old.get("members")) != _without_epochs(plan["members"]):
            raise RunError(f"{root} holds a different sweep (grid {old.get('grid')}); rerun it with the same flags, or choose another --out")
    elif root.exists() and any(p.name != ".lock" and not is_temp_file_name(p.name) for p in root.iterdir()):
        raise RunError(f"--out {root} is a non-empty directory without a sweep.json; choose an empty or new directory")
    root.mkdir(parents=True, exist_ok=True)
    # the folder is the root: not stored, so a moved or copied sweep folder is the same sweep, byte for byte
    atomic_write_json(path, {k: v for k, v in plan.items() if k != "root"})
    return path


def run_sweep(plan: dict, executor: str = "local", workers: int | None = None, progress: bool = True, device: str | None = None, poll_s: float = 2.0) -> list[dict]:
    """Run every unfinished member; returns ``summarize_sweep``'s table. Killed? Run it again.

    ``workers``: ensembles trained at once, each with cores/workers threads. Default: 1 on CUDA;
    on the CPU one per core (at most one per job), because these small models use one core
    each better than two cores together (``benchmarks/ensemble_speed.py``: ``_x2proc``).
    """
    if executor not in EXECUTORS:
        raise ConfigError(f"executor={executor!r}: use one of {EXECUTORS}")
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"workers={workers!r} must be an integer >= 1")
    from training.trainer import resolve_device

    on_cuda = resolve_device(device).type == "cuda"  # a bad --device fails here, before anything is written
    root = Path(plan["root"])
    with RunLock(root):  # one sweep process per folder; also removes temp files a killed one left
        return _run_sweep_locked(plan, root, executor, workers, on_cuda, progress, device, poll_s)


def _run_sweep_locked(plan, root, executor, workers, on_cuda, progress, device, poll_s) -> list[dict]:
    write_plan(plan)
    all_members = _members(plan)
    jobs = pack(plan)
    if workers is None:
        workers = 1 if on_cuda else max(1, min(_cpu_count(), len(jobs)))
    total = sum(m.config["train"]["epochs"] for m in all_members)
    bar = tqdm(total=total, initial=_epochs_done(root, all_members), desc=f"sweep ({len(all_members)} runs, {len(jobs)} jobs left)",
               unit="member-epoch", file=sys.stderr, disable=not progress, dynamic_ncols=True)
    job_dicts = [[asdict(m) for m in job] for job in jobs]
    threads = max(1, _cpu_count() // workers)
    from training.trainer import Interrupted

    try:
        if executor == "local":
            _run_local(str(root), job_dicts, workers, threads, device, lambda: _tick(bar, root, all_members), poll_s)
        else:
            _run_ray(str(root), job_dicts, workers, threads, device, lambda: _tick(bar, root, all_members), poll_s)
        _tick(bar, root, all_members)
    except (Interrupted, KeyboardInterrupt):
        raise Interrupted(f"sweep interrupted; every member is saved. Continue with the same lenslab sweep command (--out {root})") from None
    finally:
        bar.close()
    return summarize_sweep(root)


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _tick(bar, root: Path, members: list[Member]) -> None:
    bar.n = _epochs_done(root, members)
    bar.refresh()


def _run_local(root, jobs, workers, threads, device, tick, poll_s) -> None:
    if workers == 1:
        for job in jobs:
            run_job(root, job, None, device, on_eval=lambda e, row: tick())
            tick()
        return
    import multiprocessing as mp

    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        futures = [pool.submit(run_job, root, job, threads, device) for job in jobs]
        while not all(f.done() for f in futures):
            time.sleep(poll_s)
            tick()
        for f in futures:
            f.result()  # re-raise a worker's error


def _run_ray(root, jobs, workers, threads, device, tick, poll_s) -> None:
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor ray needs Ray, which is not installed: pip install 'lenslab[ray]' (or use --executor local)") from None
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=workers * threads, log_to_driver=False, include_dashboard=False)
    try:
        remote = ray.remote(num_cpus=threads)(run_job)
        pending = [remote.remote(root, job, threads, device) for job in jobs]
        while pending:
            done, pending = ray.wait(pending, timeout=poll_s)
            for ref in done:
                ray.get(ref)
            tick()
    finally:
        if started:
            ray.shutdown()


def wilson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of k successes in n (scipy's ``binomtest(...).proportion_ci``)."""
    from scipy.stats import binomtest

    if n == 0:
        return (math.nan, math.nan)
    ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    return (float(ci.low), float(ci.high))


def summarize_sweep(root: str | Path, write: bool = True) -> list[dict]:
    """One row per cell: runs finished, generalized, rate with a Wilson 95 % interval, median first epoch."""
    root = Path(root)
    try:
        plan = json.loads((root / "sweep.json").read_text())
    except (OSError, ValueError) as e:
        raise RunError(f"{root}: no readable sweep.json ({e}); is this a sweep directory?") from None
    by_cell: dict[Cell, list[Member]] = {}
    for m in _members(plan):
        by_cell.setdefault(m.cell, []).append(m)
    rows = []
    for cell, members in by_cell.items():
        summaries = []
        for m in members:
            try:
                summaries.append(json.loads((root / m.out / "summary.json").read_text()))
            except (OSError, ValueError):
                pass
        done = [s for s in summaries if s.get("status") == "complete"]
        gen = [s for s in done if s.get("generalized")]
        lo, hi = wilson(len(gen), len(done))
        firsts = [s["first_generalized_epoch"] for s in gen if s.get("first_generalized_epoch") is not None]
        rows.append({
            "cell": cell.name, "layers": cell.layers, "heads": cell.heads, "ratio": cell.ratio, "weight_decay": cell.weight_decay,
            "runs_planned": len(members), "runs": len(done), "generalized": len(gen),
            "rate": len(gen) / len(done) if done else None, "wilson_low": lo if done else None, "wilson_high": hi if done else None,
            "median_first_generalized_epoch": statistics.median(firsts) if firsts else None,
            "still_generalized_at_end": sum(1 for s in gen if s.get("still_generalized_at_end")),
        })
    if write:
        atomic_write_json(root / "results.json", {"grid": plan["grid"], "settings": plan["settings"], "cells": rows})
        atomic_write_bytes(root / "results.csv", _csv(rows).encode())
        atomic_write_bytes(root / "results.html", sweep_figure(rows).to_html(include_plotlyjs=True, full_html=True, div_id="lenslab-sweep-results").encode())
    return rows


def _csv(rows: list[dict]) -> str:
    import csv
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["cell"], lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if v is None else v) for k, v in r.items()})
    return buf.getvalue()


def sweep_figure(rows: list[dict]):
    """Generalization rate vs r, one line per architecture (and weight decay), Wilson 95 % error bars."""
    import plotly.graph_objects as go

    fig = go.Figure()
    keys = sorted({(r["layers"], r["heads"], r["weight_decay"]) for r in rows})
    for L, H, wd in keys:
        pts = sorted((r for r in rows if (r["layers"], r["heads"], r["weight_decay"]) == (L, H, wd) and r["rate"] is not None), key=lambda r: r["ratio"])
        fig.add_trace(go.Scatter(
            x=[r["ratio"] for r in pts], y=[r["rate"] for r in pts], mode="lines+markers",
            name=f"{L}L {H}H wd {wd:g}" if len({k[2] for k in keys}) > 1 else f"{L}L {H}H",
            error_y=dict(type="data", symmetric=False, array=[r["wilson_high"] - r["rate"] for r in pts], arrayminus=[r["rate"] - r["wilson_low"] for r in pts]),
            text=[f"{r['generalized']}/{r['runs']} seeds" for r in pts], hovertemplate="r=%{x}: %{y:.2f} (%{text})",
        ))
    fig.update_layout(title="Generalization rate vs spurious ratio r (Wilson 95% interval)", xaxis_title="r", yaxis_title="fraction of seeds reaching 100% adversarial accuracy",
                      yaxis_range=[-0.05, 1.05], template="plotly_white")
    return fig
