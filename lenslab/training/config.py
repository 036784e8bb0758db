"""Run configs: the ``config.json`` written into every run directory.

``{"format", "lenslab_version", "task": {...}, "model": {HookedTransformerConfig kwargs},
"train": {...}}``. ``HookedTransformer(HookedTransformerConfig(**config["model"]))`` rebuilds
the model; ``task`` and ``train`` rebuild the data and the optimisation. A run that starts from
another run's weights (``with_init``) also has ``"init": {"from", "epoch", "sha256"}``.

Default training settings (paper 1 leaves lr, batch and betas open):
MPSP: AdamW lr 1e-3, weight decay 0.1, betas (0.9, 0.999), batch 512, eval every 5 epochs.
Modular addition: the standard grokking recipe, AdamW lr 1e-3, weight decay 1.0,
betas (0.9, 0.98), full batch, eval every 50 epochs.

Common settings: ``dtype`` ("float32" | "float64") is the precision of the weights, the AdamW
moments, the arithmetic and the checkpoints. The model config stays the plain JSON kwargs of
``HookedTransformerConfig`` (no dtype there): ``build_model(config["model"], dtype=...)`` builds
the model in float32 (so a float64 run starts from its float32 twin's init, exactly upcast) and
then casts it with TransformerLens's ``.to(dtype)``, which also sets ``model.cfg.dtype``. To load
a checkpoint by hand: ``HookedTransformer(HookedTransformerConfig(**config["model"],
dtype=torch.float64))``. ``eval_schedule`` "linear" evaluates every ``eval_every`` epochs (and
thins checkpoints, ``ckpt_density``); "log" evaluates and checkpoints at ``log_schedule(epochs,
n_evals)`` (see there). Run directories written before these keys existed mean
``LEGACY_TRAIN`` (float32, linear); ``runio.read_config`` fills them in.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from lenslab.tasks import ModAddTask, MPSPTask
from lenslab.tasks.splits import check_ratio
from lenslab.training.errors import ConfigError
from lenslab.training.presets import DTYPES, modadd_model_config, mpsp_model_config
from lenslab.training.runio import CKPT_RE, RUN_FORMAT, check_model_kwargs, file_sha256

VERSION = "0.1.0"

TRAIN_DEFAULTS = {
    "mpsp": dict(epochs=150, lr=1e-3, weight_decay=0.1, betas=[0.9, 0.999], batch_size=512, eval_every=5),
    "modadd": dict(epochs=3000, lr=1e-3, weight_decay=1.0, betas=[0.9, 0.98], batch_size=None, eval_every=50),
}
COMMON_TRAIN = dict(seed=0, ckpt_density=16, grad_probe_size=256, dtype="float32", eval_schedule="linear", n_evals=200)
EVAL_SCHEDULES = ("linear", "log")
MAX_EVALS = 2000  # log_schedule is exact integer arithmetic: 0.05 s at 1000 evaluations, ~16 s at 10,000
# what a config.json without these keys (written before they existed) trained with
LEGACY_TRAIN = {"dtype": "float32", "eval_schedule": "linear", "n_evals": 200}


def mpsp_run_config(
    label: str = "sum2",
    shortcut: str = "max",
    ratio: float = 0.9,
    seq_len: int = 5,
    n_values: int = 16,
    n_train: int = 16_384,
    n_val: int = 2_048,
    n_adv: int = 2_048,
    data_seed: int = 0,
    layers: int = 2,
    heads: int = 2,
    **train: Any,
) -> dict:
    """A complete MPSP run config. ``data_seed`` fixes the splits; ``train["seed"]`` the model."""
    task = MPSPTask(label=label, shortcut=shortcut, seq_len=seq_len, n_values=n_values)
    task_cfg = dict(
        name="mpsp",
        label=label,
        shortcut=shortcut,
        ratio=check_ratio(ratio),
        seq_len=seq_len,
        n_values=n_values,
        seed=data_seed,
        n_train=n_train,
        n_val=n_val,
        n_adv=n_adv,
    )
    return _assemble(task_cfg, mpsp_model_config(task, layers, heads), "mpsp", train)


def modadd_run_config(p: int = 113, train_frac: float = 0.3, data_seed: int = 0, **train: Any) -> dict:
    task = ModAddTask(p=p, train_frac=train_frac)
    task_cfg = dict(name="modadd", p=p, train_frac=train_frac, seed=data_seed)
    return _assemble(task_cfg, modadd_model_config(task), "modadd", train)


def _assemble(task_cfg: dict, model: dict, kind: str, train: dict) -> dict:
    full = {**TRAIN_DEFAULTS[kind], **COMMON_TRAIN}
    unknown = set(train) - set(full)
    if unknown:
        raise ConfigError(f"unknown training setting(s) {sorted(unknown)}; known: {sorted(full)}")
    full.update({k: v for k, v in train.items() if v is not None or k == "batch_size"})
    cfg = {"format": RUN_FORMAT, "lenslab_version": VERSION, "task": task_cfg, "model": model, "train": full}
    check_train(cfg)
    return cfg


def _num(name: str, v: Any, lo: float, hi: float, integer: bool = False) -> None:
    bad = isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and not isinstance(v, int))
    if bad or not math.isfinite(v) or not lo <= v <= hi:
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"{name}={v!r} must be {kind} in [{lo:g}, {hi:g}]")


def check_train(cfg: dict) -> None:
    """Validate the ``train`` block (and that the task fits the model) before any work starts."""
    t = cfg["train"]
    _num("epochs", t.get("epochs"), 0, 10_000_000, integer=True)
    _num("seed", t.get("seed"), 0, 2**63 - 1, integer=True)
    _num("lr", t.get("lr"), 1e-12, 10.0)
    _num("weight_decay", t.get("weight_decay"), 0.0, 100.0)
    betas = t.get("betas")
    if not (isinstance(betas, (list, tuple)) and len(betas) == 2):
        raise ConfigError(f"betas={betas!r} must be two numbers in [0, 1)")
    for b in betas:
        _num("beta", b, 0.0, 0.999999)
    if t.get("batch_size") is not None:
        _num("batch_size", t["batch_size"], 1, 1 << 24, integer=True)
    _num("eval_every", t.get("eval_every"), 1, 10_000_000, integer=True)
    _num("ckpt_density", t.get("ckpt_density"), 1, 1_000_000, integer=True)
    _num("grad_probe_size", t.get("grad_probe_size"), 1, 1 << 16, integer=True)
    if t.get("dtype", "float32") not in DTYPES:
        raise ConfigError(f"dtype={t['dtype']!r} is not supported: use one of {', '.join(DTYPES)}")
    if t.get("eval_schedule", "linear") not in EVAL_SCHEDULES:
        raise ConfigError(f"eval_schedule={t['eval_schedule']!r} is not supported: use one of {', '.join(EVAL_SCHEDULES)}")
    _num("n_evals", t.get("n_evals", 200), 1, MAX_EVALS, integer=True)
    check_model_kwargs(cfg["model"], "model config")
    task = cfg["task"]
    if task.get("name") == "mpsp":
        for key in ("n_train", "n_val", "n_adv"):
            _num(key, task.get(key), 1, 1 << 26, integer=True)
        _num("data seed", task.get("seed"), 0, 2**63 - 1, integer=True)
        if task["seq_len"] + 1 > cfg["model"]["n_ctx"]:
            raise ConfigError(
                f"seq_len={task['seq_len']} needs n_ctx >= {task['seq_len'] + 1} (values + readout), "
                f"but the model has n_ctx={cfg['model']['n_ctx']}"
            )
    elif task.get("name") != "modadd":
        raise ConfigError(f"unknown task {task.get('name')!r}: use 'mpsp' or 'modadd'")


def torch_dtype(train: dict) -> torch.dtype:
    """The torch dtype of a ``config["train"]`` block (a block without ``dtype`` is an older float32 run)."""
    name = train.get("dtype", "float32")
    if name not in DTYPES:
        raise ConfigError(f"dtype={name!r} is not supported: use one of {', '.join(DTYPES)}")
    return DTYPES[name]


def _iroot_ceil(n: int, r: int) -> int:
    """The smallest integer k with k**r >= n (exact integer arithmetic)."""
    k = max(1, math.ceil(math.exp(math.log(n) / r)))  # a float guess, corrected exactly below
    while k > 1 and (k - 1) ** r >= n:
        k -= 1
    while k**r < n:
        k += 1
    return k


def log_schedule(epochs: int, n_evals: int) -> list[int]:
    """Epoch 0 and ``min(n_evals, epochs)`` log-spaced epochs from 1 to ``epochs`` (both included).

    Each next epoch is ``ceil(cur * (epochs / cur) ** (1 / left))``, where ``left`` counts the
    epochs still to place, or ``cur + 1`` where that would repeat ``cur``: exactly geometric
    where the spacing exceeds one epoch, consecutive where it would not, so no evaluation is
    lost to rounding. Integer arithmetic only, so it is the same on every machine and a resumed
    run lands on the same epochs. ``log_schedule(10**6, 7) == [0, 1, 10, 100, ..., 10**6]``.
    """
    if n_evals >= epochs:
        return list(range(epochs + 1))
    if n_evals == 1:
        return [0, epochs]
    out, cur, left = [0, 1], 1, n_evals - 1
    while left > 0:
        nxt = max(cur + 1, _iroot_ceil(cur ** (left - 1) * epochs, left))  # cur * (epochs/cur)**(1/left), rounded up
        out.append(nxt)
        cur, left = nxt, left - 1
    return out


def comparable(cfg: dict) -> dict:
    """The parts of a config that must match for ``--resume`` (everything but the epoch budget)."""
    train = {k: v for k, v in cfg["train"].items() if k != "epochs"}
    return {"task": cfg["task"], "model": cfg["model"], "train": train, "init": cfg.get("init")}


def with_init(config: dict, source: str | Path) -> dict:
    """``config``, set to start from the weights of another run's checkpoint instead of a fresh init.

        cfg = with_init(modadd_run_config(p=31, weight_decay=0.0, epochs=4000), "runs/grok")

    ``source`` is a run directory (its last checkpoint) or one checkpoint file in it. The
    architectures must be the same; the task and the training settings may differ (the optimizer
    starts fresh: AdamW moments are not carried over). The checkpoint's path, epoch and sha256 go
    into ``config["init"]``, so the run records where it came from, and a restart from scratch
    refuses a source that has changed since.
    """
    from lenslab.training.run import Run  # run.py does not import this module; the import is local to keep it light

    run = Run.open(source)
    if run.config["model"] != config["model"]:
        keys = sorted(k for k in set(run.config["model"]) | set(config["model"]) if run.config["model"].get(k) != config["model"].get(k))
        diffs = ", ".join(f"{k} ({config['model'].get(k)!r} here, {run.config['model'].get(k)!r} there)" for k in keys[:4])
        raise ConfigError(f"init from {source}: its model differs from this run's in {diffs}; a run can start only from weights of the same architecture")
    path = run.checkpoint_file()
    m = CKPT_RE.match(path.name)
    if m is None:
        raise ConfigError(f"init from {path}: not a model checkpoint (<epoch>.safetensors) of a run")
    init = {"from": str(path.resolve()), "epoch": int(m.group(1)), "sha256": file_sha256(path)}
    return {**config, "init": init}
