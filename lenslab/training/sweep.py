"""Seed sweeps over a grid of cells, packed into ensembles, run locally or on a Ray cluster.

    plan = plan_sweep("runs/sweep", layers=[1, 2], heads=[1, 2], ratios=[0.5, 0.9], seeds=range(32))
    run_sweep(plan)                       # resumable: finished members are skipped
    table = summarize_sweep("runs/sweep") # one row per cell, also results.csv / .json
    lenslab.report.write_sweep_figure("runs/sweep", table)   # results.html (figures live above training)

Layout: ``OUT/sweep.json`` (the plan), one ordinary run directory per member at
``OUT/<cell>/seed_<s>/`` where ``<cell>`` is e.g. ``L2H1-r0.9-wd0.1``. Members that share an
architecture are packed into ensembles of up to ``ensemble_size`` (they may differ in r and
weight decay); each ensemble is one job, trained by ``training.ensemble.train_ensemble`` with
``resume=True``, so a killed sweep picks up where each member stopped. Progress is read from
the members' ``summary.json`` files, which works the same for local processes and Ray workers
on a shared filesystem.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm.auto import tqdm  # a widget in a notebook (ipywidgets, the notebook extra), text elsewhere

from lenslab.training.config import mpsp_run_config
from lenslab.training.errors import ConfigError, RunError
from lenslab.training.runio import RunLock, atomic_write_bytes, atomic_write_json, is_temp_file_name, read_summary

SWEEP_FORMAT = "lenslab-sweep/1"
EXECUTORS = ("local", "ray")


# the axes a cell is named by beyond layers/heads/r/wd, with the value that leaves them out of the name
# (mpsp_run_config's defaults), so a cell's name depends on its values only, never on the grid around it
AXIS_DEFAULTS = {"seq_len": 5, "n_values": 16, "batch_size": 512, "lr": 1e-3}
AXIS_TAGS = {"seq_len": "len", "n_values": "v", "batch_size": "b", "lr": "lr"}
FULL_BATCH = 0  # batch_size 0 in a grid (or "full" on the command line) = the whole train split


@dataclass(frozen=True)
class Cell:
    layers: int
    heads: int
    ratio: float
    weight_decay: float
    seq_len: int = AXIS_DEFAULTS["seq_len"]
    n_values: int = AXIS_DEFAULTS["n_values"]
    batch_size: int = AXIS_DEFAULTS["batch_size"]  # FULL_BATCH = full batch
    lr: float = AXIS_DEFAULTS["lr"]

    @property
    def name(self) -> str:
        base = f"L{self.layers}H{self.heads}-r{self.ratio:g}-wd{self.weight_decay:g}"
        for axis, default in AXIS_DEFAULTS.items():
            v = getattr(self, axis)
            if v != default:
                base += f"-{AXIS_TAGS[axis]}" + ("full" if axis == "batch_size" and v == FULL_BATCH else f"{v:g}")
        return base

    @classmethod
    def of(cls, config: dict) -> Cell:
        """The cell a member's run config belongs to (read from the config, so old plans name cells the same way)."""
        t, task, model = config["train"], config["task"], config["model"]
        return cls(
            model["n_layers"],
            model["n_heads"],
            float(task["ratio"]),
            float(t["weight_decay"]),
            int(task["seq_len"]),
            int(task["n_values"]),
            int(t["batch_size"] or FULL_BATCH),
            float(t["lr"]),
        )


@dataclass(frozen=True)
class ModAddCell:
    """A modular-addition cell: modulus, train fraction, weight decay, dtype (and lr when not 1e-3)."""

    p: int
    train_frac: float
    weight_decay: float
    dtype: str = "float32"
    lr: float = 1e-3

    @property
    def name(self) -> str:
        base = f"p{self.p}-f{self.train_frac:g}-wd{self.weight_decay:g}-{self.dtype}"
        return base if self.lr == 1e-3 else f"{base}-lr{self.lr:g}"

    @classmethod
    def of(cls, config: dict) -> ModAddCell:
        t, task = config["train"], config["task"]
        return cls(int(task["p"]), float(task["train_frac"]), float(t["weight_decay"]), t.get("dtype", "float32"), float(t["lr"]))


def cell_of(config: dict) -> Cell | ModAddCell:
    """The cell a member's run config belongs to."""
    return ModAddCell.of(config) if config["task"]["name"] == "modadd" else Cell.of(config)


@dataclass(frozen=True)
class Member:
    cell: Cell | ModAddCell
    seed: int
    out: str
    config: dict


def _axis(name: str, values, given: dict) -> list:
    """One grid axis: the list given, or the single setting (or default) of the same name."""
    if values is None:
        return [given.pop(name, AXIS_DEFAULTS[name])]
    if name in given:
        raise ConfigError(f"{name} is given both as a grid axis and as a setting: give it once")
    if isinstance(values, (int, float)):  # a single value (n_values=8) is a one-value axis
        return [values]
    return list(values)


def plan_sweep(
    out: str | Path,
    layers: Iterable[int],
    heads: Iterable[int],
    ratios: Iterable[float],
    seeds: Iterable[int],
    weight_decays: Iterable[float] = (0.1,),
    ensemble_size: int | None = None,
    seq_lens: int | Iterable[int] | None = None,
    n_values: int | Iterable[int] | None = None,
    batch_sizes: int | Iterable[int] | None = None,
    lrs: float | Iterable[float] | None = None,
    **settings,
) -> dict:
    """The sweep's plan: every (cell, seed) with its full run config. ``settings`` go to ``mpsp_run_config``.

    Grid axes: layers x heads x ratios x weight decays x seq_lens x n_values x batch sizes x lrs
    (a batch size of 0 = full batch). An axis left out takes the single setting of the same name
    (``seq_len=6``) or the default. Every config is built, and so validated, before anything runs.
    """
    given = dict(settings)
    if given.get("batch_size", AXIS_DEFAULTS["batch_size"]) is None:
        given["batch_size"] = FULL_BATCH
    axes = {
        "layers": list(layers),
        "heads": list(heads),
        "ratios": list(ratios),
        "seeds": list(seeds),
        "weight_decays": list(weight_decays),
        "seq_lens": _axis("seq_len", seq_lens, given),
        "n_values": _axis("n_values", n_values, given),
        "batch_sizes": _axis("batch_size", batch_sizes, given),
        "lrs": _axis("lr", lrs, given),
    }
    for name, values in axes.items():
        if not values:
            raise ConfigError(f"the sweep has no {name.replace('_', ' ')}: give at least one")
        if len(set(values)) != len(values):
            raise ConfigError(f"the sweep lists a value of {name.replace('_', ' ')} twice: {values}")
    n_train = given.get("n_train", 16_384)
    for bs in axes["batch_sizes"]:
        if isinstance(bs, bool) or not isinstance(bs, int) or bs < 0:
            raise ConfigError(f"batch size {bs!r} must be a positive integer, or 0 / 'full' for the whole train split")
        if isinstance(n_train, int) and bs > n_train:
            raise ConfigError(
                f"batch size {bs} is larger than the train split (n_train={n_train}): use at most {n_train}, or full"
            )
    if ensemble_size is None:
        from lenslab.training.ensemble import SWEEP_ENSEMBLE

        ensemble_size = SWEEP_ENSEMBLE
    if not isinstance(ensemble_size, int) or ensemble_size < 1:
        raise ConfigError(f"ensemble_size={ensemble_size!r} must be an integer >= 1")
    members = []
    for L, H, r, wd, T, V, bs, lr in itertools.product(
        axes["layers"],
        axes["heads"],
        axes["ratios"],
        axes["weight_decays"],
        axes["seq_lens"],
        axes["n_values"],
        axes["batch_sizes"],
        axes["lrs"],
    ):
        for s in axes["seeds"]:
            cfg = mpsp_run_config(
                ratio=r, layers=L, heads=H, seed=s, weight_decay=wd, seq_len=T, n_values=V, batch_size=bs or None, lr=lr, **given
            )
            cell = Cell.of(cfg)
            members.append(asdict(Member(cell, s, f"{cell.name}/seed_{s}", cfg)))
    _check_split_sizes(members)
    return {
        "format": SWEEP_FORMAT,
        "root": str(Path(out)),
        "grid": axes,
        "settings": settings,
        "ensemble_size": ensemble_size,
        "members": members,
    }


def plan_modadd_sweep(
    out: str | Path,
    weight_decays: Iterable[float],
    seeds: Iterable[int],
    train_fracs: Iterable[float] = (0.3,),
    dtypes: Iterable[str] = ("float32",),
    p: int = 113,
    ensemble_size: int | None = None,
    **settings,
) -> dict:
    """A modular-addition sweep: weight decays x train fractions x dtypes x seeds, every member a full run config.

    ``settings`` go to ``modadd_run_config`` (epochs, lr, eval_schedule, n_evals, ...). Members of
    one train fraction and dtype share an ensemble (they may differ in seed and weight decay).
    """
    from lenslab.training.config import modadd_run_config

    axes = {"weight_decays": list(weight_decays), "train_fracs": list(train_fracs), "dtypes": list(dtypes), "seeds": list(seeds)}
    for name, values in axes.items():
        if not values:
            raise ConfigError(f"the sweep has no {name.replace('_', ' ')}: give at least one")
        if len(set(values)) != len(values):
            raise ConfigError(f"the sweep lists a value of {name.replace('_', ' ')} twice: {values}")
    if ensemble_size is None:
        ensemble_size = 8  # modular addition is full batch: one step per epoch, so wider stacks amortise more
    if not isinstance(ensemble_size, int) or ensemble_size < 1:
        raise ConfigError(f"ensemble_size={ensemble_size!r} must be an integer >= 1")
    members = []
    for frac, dt, wd in itertools.product(axes["train_fracs"], axes["dtypes"], axes["weight_decays"]):
        for s in axes["seeds"]:
            cfg = modadd_run_config(p=p, train_frac=frac, weight_decay=wd, seed=s, dtype=dt, **settings)
            cell = ModAddCell.of(cfg)
            members.append(asdict(Member(cell, s, f"{cell.name}/seed_{s}", cfg)))
    return {
        "format": SWEEP_FORMAT,
        "root": str(Path(out)),
        "grid": {**axes, "p": [p]},
        "settings": settings,
        "ensemble_size": ensemble_size,
        "members": members,
    }


def _check_split_sizes(members: list[dict]) -> None:
    """Every task in the grid can build its splits (enough distinct sequences), checked before any I/O."""
    from lenslab.tasks import MPSPTask
    from lenslab.tasks.errors import TaskError
    from lenslab.tasks.splits import check_split_sizes

    seen = set()
    for m in members:
        t = m["config"]["task"]
        key = (t["label"], t["shortcut"], t["seq_len"], t["n_values"], t["ratio"], t["n_train"], t["n_val"], t["n_adv"])
        if key not in seen:
            seen.add(key)
            try:
                check_split_sizes(
                    MPSPTask(label=t["label"], shortcut=t["shortcut"], seq_len=t["seq_len"], n_values=t["n_values"]),
                    t["ratio"],
                    t["n_train"],
                    t["n_val"],
                    t["n_adv"],
                )
            except TaskError as e:
                raise ConfigError(f"sweep cell {m['out'].split('/')[0]}: {e}") from None


def _members(plan: dict) -> list[Member]:
    return [Member(cell_of(m["config"]), m["seed"], m["out"], m["config"]) for m in plan["members"]]


def _is_done(root: Path, m: Member) -> bool:
    s = read_summary(root / m.out, strict=False)
    if s is None:
        return False
    return s.get("status") == "complete" and s.get("epochs_completed") == m.config["train"]["epochs"]


def _ensemble_key(config: dict) -> str:
    """Members that can share one stacked ensemble: same model, task (but r and data seed) and shared train settings."""
    from lenslab.training.ensemble import SHARED_TRAIN

    task = {k: v for k, v in config["task"].items() if k not in ("ratio", "seed")}
    shared = {k: config["train"][k] for k in SHARED_TRAIN}
    return json.dumps({"model": config["model"], "task": task, "train": shared}, sort_keys=True)


def pack(plan: dict, skip_done: bool = True) -> list[list[Member]]:
    """Jobs: members that can share an ensemble (same architecture, task shape, batch and epochs), in chunks of ``ensemble_size``."""
    root = Path(plan["root"])
    groups: dict[str, list[Member]] = {}
    for m in _members(plan):
        if skip_done and _is_done(root, m):
            continue
        groups.setdefault(_ensemble_key(m.config), []).append(m)
    return [chunk for g in groups.values() for chunk in chunked(g, plan["ensemble_size"])]


def chunked(items: list, size: int) -> list[list]:
    """``items`` in consecutive chunks of ``size`` (the last may be shorter): the members of one ensemble each."""
    return [items[i : i + size] for i in range(0, len(items), size)]


def _epochs_done(root: Path, members: list[Member]) -> int:
    total = 0
    for m in members:
        try:
            total += int((read_summary(root / m.out, strict=False) or {}).get("epochs_completed", 0))
        except (ValueError, TypeError):
            pass
    return total


def run_job(root: str, job: list[dict], threads: int | None = None, device: str | None = None, on_eval=None) -> list[str]:
    """Train one packed ensemble (called in a worker process or a Ray task)."""
    import torch

    from lenslab.training.ensemble import train_ensemble

    if threads:
        torch.set_num_threads(threads)
    members = [Member(cell_of(m["config"]), m["seed"], m["out"], m["config"]) for m in job]
    outs = [Path(root) / m.out for m in members]
    train_ensemble([m.config for m in members], outs, resume=True, progress=False, device=device, on_eval=on_eval)
    return [m.out for m in members]


def _without_epochs(config: dict) -> dict:
    """Configs compare without the epoch budget (rerunning with a larger --epochs extends a member), and with
    the train settings that older plans did not write filled in with the values they meant."""
    from lenslab.training.config import LEGACY_TRAIN

    train = {**LEGACY_TRAIN, **config["train"]}
    return {**config, "train": {k: v for k, v in train.items() if k != "epochs"}}


def _merge_grids(old: dict, new: dict) -> dict:
    return {k: sorted(set(old.get(k, [])) | set(v), key=lambda x: (x is None, x)) for k, v in new.items()}


def write_plan(plan: dict) -> dict:
    """Write ``OUT/sweep.json``; returns the stored plan: every member this folder has ever planned.

    An existing plan grows: a member already planned at the same place (cell and seed) must have
    the same config up to ``epochs`` (else the folder holds a different sweep, and this refuses);
    new cells and seeds are added; members left out of this grid stay in the plan and the tables,
    untouched. So a sweep can be extended on the cells that are still moving.
    """
    root = Path(plan["root"])
    path = root / "sweep.json"
    stored = {k: v for k, v in plan.items() if k != "root"}  # the folder is the root: a moved sweep folder is the same sweep
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except ValueError as e:
            raise RunError(f"{path} is not valid JSON ({e}); move it away to start a new sweep there") from None
        if old.get("format") != SWEEP_FORMAT or not isinstance(old.get("members"), list):
            raise RunError(f"{path} is not a lenslab sweep plan; choose another --out")
        new_by_out = {m["out"]: m for m in plan["members"]}
        for m in old["members"]:
            n = new_by_out.get(m.get("out"))
            if n is not None and _without_epochs(n["config"]) != _without_epochs(m["config"]):
                t_old, t_new = m["config"], n["config"]
                t_old, t_new = _without_epochs(t_old), _without_epochs(t_new)
                diff = sorted(
                    f"{blk}.{k}"
                    for blk in ("task", "model", "train")
                    for k in set(t_old[blk]) | set(t_new[blk])
                    if t_old[blk].get(k) != t_new[blk].get(k)
                )
                raise RunError(
                    f"{root} holds a different sweep: its {m['out']} was planned with other settings ({', '.join(diff[:4])}); "
                    "rerun it with the same flags, or choose another --out"
                )
        kept = [m for m in old["members"] if m["out"] not in new_by_out]
        stored = {**stored, "members": kept + plan["members"], "grid": _merge_grids(old.get("grid", {}), plan["grid"])}
    elif root.exists() and any(p.name != ".lock" and not is_temp_file_name(p.name) for p in root.iterdir()):
        raise RunError(f"--out {root} is a non-empty directory without a sweep.json; choose an empty or new directory")
    root.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, stored)
    return {**stored, "root": str(root)}


def run_sweep(
    plan: dict,
    executor: str = "local",
    workers: int | None = None,
    progress: bool = True,
    device: str | None = None,
    poll_s: float = 2.0,
) -> list[dict]:
    """Run every unfinished member; returns ``summarize_sweep``'s table. Killed? Run it again.

    ``workers``: ensembles trained at once, each with cores/workers threads. Default: 1 on CUDA;
    on the CPU one per core (at most one per job), because these small models use one core
    each better than two cores together (``benchmarks/ensemble_speed.py``: ``_x2proc``).
    """
    if executor not in EXECUTORS:
        raise ConfigError(f"executor={executor!r}: use one of {EXECUTORS}")
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"workers={workers!r} must be an integer >= 1")
    from lenslab.training.trainer import resolve_device

    on_cuda = resolve_device(device).type == "cuda"  # a bad --device fails here, before anything is written
    root = Path(plan["root"])
    with RunLock(root):  # one sweep process per folder; also removes temp files a killed one left
        return _run_sweep_locked(plan, root, executor, workers, on_cuda, progress, device, poll_s)


def _run_sweep_locked(plan, root, executor, workers, on_cuda, progress, device, poll_s) -> list[dict]:
    write_plan(plan)
    all_members = _members(plan)  # this command's grid; the folder's other cells stay as they are
    jobs = pack(plan)
    if workers is None:
        workers = 1 if on_cuda else max(1, min(_cpu_count(), len(jobs)))
    total = sum(m.config["train"]["epochs"] for m in all_members)
    bar = tqdm(
        total=total,
        initial=_epochs_done(root, all_members),
        desc=f"sweep ({len(all_members)} runs, {len(jobs)} jobs left)",
        unit="member-epoch",
        file=sys.stderr,
        disable=not progress,
        dynamic_ncols=True,
    )
    job_dicts = [[asdict(m) for m in job] for job in jobs]
    threads = max(1, _cpu_count() // workers)
    from lenslab.training.trainer import Interrupted

    try:
        if executor == "local":
            _run_local(str(root), job_dicts, workers, threads, device, lambda: _tick(bar, root, all_members), poll_s)
        else:
            _run_ray(str(root), job_dicts, workers, threads, device, lambda: _tick(bar, root, all_members), poll_s)
        _tick(bar, root, all_members)
    except (Interrupted, KeyboardInterrupt):
        raise Interrupted(
            f"sweep interrupted; every member is saved. Continue with the same lenslab sweep command (--out {root})"
        ) from None
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
        raise ConfigError(
            "--executor ray needs Ray, which is not installed: pip install 'lenslab[ray]' (or use --executor local)"
        ) from None
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


def summarize_sweep(root: str | Path, write: bool = True, outcomes: bool = True) -> list[dict]:
    """One row per cell: runs finished, generalized, rate with a Wilson 95 % interval, median first epoch,
    and how the runs that did not generalize failed (``training.outcomes``).

    With ``write``: ``results.json`` (``cells`` and, with ``outcomes``, ``runs``: one row per finished
    run), ``results.csv`` (cells), ``results_runs.csv`` (runs). Tables only: the figure of these rows,
    ``results.html``, is ``lenslab.report.write_sweep_figure(root, rows)``.
    """
    root = Path(root)
    try:
        plan = json.loads((root / "sweep.json").read_text())
    except (OSError, ValueError) as e:
        raise RunError(f"{root}: no readable sweep.json ({e}); is this a sweep directory?") from None
    by_cell: dict[Cell | ModAddCell, list[Member]] = {}
    for m in _members(plan):
        by_cell.setdefault(m.cell, []).append(m)
    if any(isinstance(c, ModAddCell) for c in by_cell):
        return _summarize_modadd(root, plan, by_cell, write)
    rows, run_rows = [], []
    for cell, members in by_cell.items():
        done, cell_runs = [], []
        for m in members:
            s = read_summary(root / m.out, strict=False)
            if s is None or s.get("status") != "complete":
                continue
            done.append(s)
            if outcomes:
                from lenslab.training.outcomes import run_outcome
                from lenslab.training.run import Run

                cell_runs.append({"cell": cell.name, **asdict(cell), "seed": m.seed, **run_outcome(Run.open(root / m.out))})
        gen = [s for s in done if s.get("generalized")]
        lo, hi = wilson(len(gen), len(done))
        firsts = [s["first_generalized_epoch"] for s in gen if s.get("first_generalized_epoch") is not None]
        epochs = [s.get("epochs_completed") for s in done]
        row = {
            "cell": cell.name,
            **asdict(cell),
            "runs_planned": len(members),
            "runs": len(done),
            "generalized": len(gen),
            "rate": len(gen) / len(done) if done else None,
            "wilson_low": lo if done else None,
            "wilson_high": hi if done else None,
            "median_first_generalized_epoch": statistics.median(firsts) if firsts else None,
            "still_generalized_at_end": sum(1 for s in gen if s.get("still_generalized_at_end")),
            "epochs_min": min(epochs, default=None),
            "epochs_max": max(epochs, default=None),
        }
        if outcomes:
            from lenslab.training.outcomes import FAILURES

            row.update({f"failed_{o}": sum(1 for r in cell_runs if r["outcome"] == o) for o in FAILURES})
        rows.append(row)
        run_rows += cell_runs
    if write:
        doc = {"grid": plan["grid"], "settings": plan["settings"], "cells": rows}
        if outcomes:
            doc["runs"] = run_rows
            atomic_write_bytes(root / "results_runs.csv", _csv(run_rows).encode())
        atomic_write_json(root / "results.json", doc)
        atomic_write_bytes(root / "results.csv", _csv(rows).encode())
    return rows


def _summarize_modadd(root: Path, plan: dict, by_cell: dict, write: bool) -> list[dict]:
    """Modular-addition cells: how many runs grokked (test >= 0.95), how many then anti-grokked, median test accuracies."""
    from lenslab.training.outcomes import modadd_outcome
    from lenslab.training.run import Run

    rows, run_rows = [], []
    for cell, members in by_cell.items():
        runs = []
        for m in members:
            s = read_summary(root / m.out, strict=False)
            if s is not None and s.get("status") == "complete":
                runs.append({"cell": cell.name, **asdict(cell), "seed": m.seed, **modadd_outcome(Run.open(root / m.out))})
        rows.append(
            {
                "cell": cell.name,
                **asdict(cell),
                "runs_planned": len(members),
                "runs": len(runs),
                "grokked": sum(r["outcome"] in ("grokked", "anti-grokked") for r in runs),
                "anti_grokked": sum(r["outcome"] == "anti-grokked" for r in runs),
                "median_test_acc_best": _median(runs, "test_acc_best"),
                "median_test_acc_final": _median(runs, "test_acc_final"),
                "epochs_min": min((r["epochs"] for r in runs), default=None),
                "epochs_max": max((r["epochs"] for r in runs), default=None),
            }
        )
        run_rows += runs
    if write:
        atomic_write_json(
            root / "results.json", {"grid": plan["grid"], "settings": plan["settings"], "cells": rows, "runs": run_rows}
        )
        atomic_write_bytes(root / "results.csv", _csv(rows).encode())
        atomic_write_bytes(root / "results_runs.csv", _csv(run_rows).encode())
    return rows


def _median(rows: list[dict], key: str) -> float | None:
    return statistics.median(r[key] for r in rows) if rows else None


def _csv(rows: list[dict]) -> str:
    import csv
    import io

    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["cell"], lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if v is None else v) for k, v in r.items()})
    return buf.getvalue()
