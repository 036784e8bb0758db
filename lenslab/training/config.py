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

The fields, their defaults, bounds and help live once, in ``training.spec`` (``RunSpec`` and
its blocks); the functions here build and check the dict form through it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from lenslab.training.errors import ConfigError
from lenslab.training.presets import DTYPES, mnist_model_config, modadd_model_config, mpsp_model_config, torch_dtype
from lenslab.training.run import Run
from lenslab.training.runio import CKPT_RE, file_sha256, read_config
from lenslab.training.spec import (
    EVAL_SCHEDULES,
    LEGACY_TRAIN,
    MAX_EVALS,
    RUN_FORMAT,
    TASK,
    TASKS,
    VERSION,
    MLPSpec,
    MNISTSpec,
    ModAddSpec,
    ModelSpec,
    MPSPSpec,
    RunSpec,
    TrainSpec,
    params,
)

__all__ = [
    "COMMON_TRAIN",
    "DTYPES",
    "EVAL_SCHEDULES",
    "FLAG_PLACES",
    "LEGACY_TRAIN",
    "MAX_EVALS",
    "RUN_FORMAT",
    "TRAIN_DEFAULTS",
    "VERSION",
    "check_train",
    "comparable",
    "config_from_flags",
    "default_run_dir",
    "default_seeds_dir",
    "init_config",
    "log_schedule",
    "mnist_run_config",
    "modadd_run_config",
    "mpsp_run_config",
    "resume_config",
    "torch_dtype",
    "with_init",
]

# the defaults, as dicts (read from TrainSpec's field metadata, where they live)
_TRAIN = params(TrainSpec)
TRAIN_DEFAULTS = {task: {k: p.default_for(task) for k, p in _TRAIN.items() if isinstance(p.default, dict)} for task in TASKS}
COMMON_TRAIN = {k: p.default for k, p in _TRAIN.items() if not isinstance(p.default, dict)}
_MPSP = params(MPSPSpec)
_MODEL = params(ModelSpec)
_MODADD = params(ModAddSpec)
_MNIST = params(MNISTSpec)
_MLP = params(MLPSpec)


def mpsp_run_config(
    label: str = _MPSP["label"].default,
    shortcut: str = _MPSP["shortcut"].default,
    ratio: float = _MPSP["ratio"].default,
    seq_len: int = _MPSP["seq_len"].default,
    n_values: int = _MPSP["n_values"].default,
    n_train: int = _MPSP["n_train"].default,
    n_val: int = _MPSP["n_val"].default,
    n_adv: int = _MPSP["n_adv"].default,
    data_seed: int = _MPSP["seed"].default,
    layers: int = _MODEL["n_layers"].default,
    heads: int = _MODEL["n_heads"].default,
    **train: Any,
) -> dict:
    """A complete MPSP run config. ``data_seed`` fixes the splits; ``train["seed"]`` the model."""
    task = MPSPSpec(
        label=label,
        shortcut=shortcut,
        ratio=ratio,
        seq_len=seq_len,
        n_values=n_values,
        seed=data_seed,
        n_train=n_train,
        n_val=n_val,
        n_adv=n_adv,
    )
    model = ModelSpec(**mpsp_model_config(task.rule, layers, heads))
    return RunSpec(task=task, model=model, train=TrainSpec.for_task("mpsp", **train)).to_dict()


def modadd_run_config(
    p: int = _MODADD["p"].default,
    train_frac: float = _MODADD["train_frac"].default,
    data_seed: int = _MODADD["seed"].default,
    **train: Any,
) -> dict:
    """A modular-addition run config (TransformerLens's grokking model: 1L, d_model 128, 4 heads, d_mlp 512, no LayerNorm); ``train`` overrides the train block (epochs, lr, weight_decay, dtype, ...)."""
    task = ModAddSpec(p=p, train_frac=train_frac, seed=data_seed)
    model = ModelSpec(**modadd_model_config(task.rule))
    return RunSpec(task=task, model=model, train=TrainSpec.for_task("modadd", **train)).to_dict()


def mnist_run_config(
    n_per_class: int = _MNIST["n_per_class"].default,
    n_classes: int = _MNIST["n_classes"].default,
    loss: str = _MNIST["loss"].default,
    data_seed: int = _MNIST["seed"].default,
    d_hidden: int = _MLP["d_hidden"].default,
    init_scale: float = _MLP["init_scale"].default,
    **train: Any,
) -> dict:
    """Paper 2's MLP on MNIST (the predecessor's protocol by default: 784-200-200-10, init x8, MSE, AdamW 5e-4, batch 200)."""
    task = MNISTSpec(n_per_class=n_per_class, n_classes=n_classes, loss=loss, seed=data_seed)
    model = MLPSpec(**mnist_model_config(task.rule, d_hidden=d_hidden, init_scale=init_scale))
    return RunSpec(task=task, model=model, train=TrainSpec.for_task("mnist", **train)).to_dict()


def check_train(cfg: dict) -> None:
    """Validate a whole config dict (train block, model, task, and that the task fits the model) before any work starts.

    ``RunSpec.from_dict``: one ``ConfigError`` (or ``TaskError``) line; ``cfg`` is not modified.
    """
    RunSpec.from_dict(cfg)


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
    run = Run.open(source)
    if run.config["model"] != config["model"]:
        keys = sorted(
            k for k in set(run.config["model"]) | set(config["model"]) if run.config["model"].get(k) != config["model"].get(k)
        )
        diffs = ", ".join(f"{k} ({config['model'].get(k)!r} here, {run.config['model'].get(k)!r} there)" for k in keys[:4])
        raise ConfigError(
            f"init from {source}: its model differs from this run's in {diffs}; a run can start only from weights of the same architecture"
        )
    path = run.checkpoint_file()
    m = CKPT_RE.match(path.name)
    if m is None:
        raise ConfigError(f"init from {path}: not a model checkpoint (<epoch>.safetensors) of a run")
    init = {"from": str(path.resolve()), "epoch": int(m.group(1)), "sha256": file_sha256(path)}
    return {**config, "init": init}


# -- the command line's configs (lenslab train's flags -> a config dict) ----------------------------
def _flag_places() -> dict[str, tuple[str, str]]:
    """flag -> (block, key) in config.json, from the spec's field metadata (``Param.flag``)."""
    places = {TASK.flag: ("task", "name")}
    for block, cls in (
        ("task", MPSPSpec),
        ("model", ModelSpec),
        ("task", ModAddSpec),
        ("task", MNISTSpec),
        ("model", MLPSpec),
        ("train", TrainSpec),
    ):
        for key, p in params(cls).items():
            if p.flag and p.flag != "epochs":
                places.setdefault(p.flag, (block, key))
    return places


FLAG_PLACES = _flag_places()  # flag -> where it lives in config.json (the flags --resume checks)
TRAIN_FLAGS = tuple(p.flag for p in _TRAIN.values() if p.flag)
MPSP_FLAGS = tuple(p.flag for p in (*_MPSP.values(), *_MODEL.values()) if p.flag and p.flag not in ("data_seed",))
MODADD_FLAGS = tuple(p.flag for p in _MODADD.values() if p.flag and p.flag != "data_seed")
MNIST_FLAGS = tuple(p.flag for p in (*_MNIST.values(), *_MLP.values()) if p.flag and p.flag != "data_seed")
TASK_FLAGS = {"mpsp": MPSP_FLAGS, "modadd": MODADD_FLAGS, "mnist": MNIST_FLAGS}
BUILDERS = {"mpsp": "mpsp_run_config", "modadd": "modadd_run_config", "mnist": "mnist_run_config"}


def _flag_value(flag: str, value: Any) -> Any:
    """A flag's value as config.json holds it: batch size 0 is full batch (None), betas a list."""
    if flag == "batch_size":
        return value or None
    if flag == "betas":
        return list(value)
    return value


def config_from_flags(given: dict) -> dict:
    """The config of ``lenslab train``'s flags (``{flag name: value}``, only those given; the rest default)."""
    task = given.get(TASK.flag, TASK.default)
    train = {k: _flag_value(k, given[k]) for k in TRAIN_FLAGS if k in given}
    own = set(TASK_FLAGS[task])
    for other, flags in TASK_FLAGS.items():
        stray = sorted((set(given) & set(flags)) - own)
        if other != task and stray:
            takes = ", ".join("--" + f.replace("_", "-") for f in TASK_FLAGS[task]) or "no task flags"
            hint = f"add --task {other}" if task == TASK.default and "task" not in given else f"{task} takes {takes}"
            raise ConfigError(
                f"--{stray[0].replace('_', '-')} is {'an' if other in ('mpsp', 'mnist') else 'a'} {other} flag; {hint}"
            )
    kw = {k: given[k] for k in TASK_FLAGS[task] if k in given}
    if "data_seed" in given:
        kw["data_seed"] = given["data_seed"]
    return globals()[BUILDERS[task]](**kw, **train)


def resume_config(run_dir: str | Path, given: dict) -> dict:
    """The stored config of ``run_dir``, with ``given["epochs"]`` applied; any other flag given must agree with it."""
    cfg = read_config(run_dir)
    for flag, value in given.items():
        if flag == "epochs":
            continue
        block, key = FLAG_PLACES[flag]
        stored = cfg[block].get(key)
        value = _flag_value(flag, value)
        if stored != value:
            raise ConfigError(
                f"--{flag.replace('_', '-')} {value} differs from the run's {block}.{key}={stored!r}; drop the flag to resume"
            )
    if "epochs" in given:
        cfg["train"]["epochs"] = given["epochs"]
        RunSpec.from_dict(cfg)
    return cfg


def init_config(source: str | Path, given: dict) -> dict:
    """``--init-from``: the source run's settings, overridden by the flags given, starting from its weights (``with_init``)."""
    if not Path(source).exists():
        raise ConfigError(f"--init-from {source}: no such run directory or checkpoint file")
    src = Run.open(source).config
    name = src["task"]["name"]
    if given.get(TASK.flag, name) != name:
        raise ConfigError(
            f"--task {given[TASK.flag]} with --init-from a {name} run: the weights cannot carry over to another task"
        )
    skip = {f for task, flags in TASK_FLAGS.items() if task != name for f in flags} - set(TASK_FLAGS[name])
    inherited = {TASK.flag: name, "epochs": src["train"]["epochs"]}
    for flag, (block, key) in FLAG_PLACES.items():
        if flag not in skip and key in src[block]:
            inherited[flag] = src[block][key]
    if inherited.get("batch_size", 0) is None:
        inherited["batch_size"] = 0  # the flag's spelling of full batch
    return with_init(config_from_flags({**inherited, **given}), source)


def default_run_dir(cfg: dict) -> Path:
    """Where a run goes when no --out is given: ``runs/<task>-<settings>``."""
    t, m = cfg["task"], cfg["model"]
    if t["name"] == "modadd":
        name = f"modadd-p{t['p']}-wd{cfg['train']['weight_decay']:g}-s{cfg['train']['seed']}"
    elif t["name"] == "mnist":
        name = f"mnist-{t['n_per_class'] * t['n_classes']}-{t['loss']}-wd{cfg['train']['weight_decay']:g}-s{cfg['train']['seed']}"
    else:
        name = f"mpsp-{t['label']}-{t['shortcut']}-r{t['ratio']:g}-{m['n_layers']}L{m['n_heads']}H-s{cfg['train']['seed']}"
    if cfg["train"].get("dtype", "float32") != "float32":
        name += "-" + cfg["train"]["dtype"]
    if cfg.get("init"):
        name += f"-from{cfg['init']['epoch']}"
    return Path("runs") / name


def default_seeds_dir(given: dict) -> Path:
    """Where ``--seeds`` runs go when no --out is given: the one-seed name without its seed, plus ``-seeds``."""
    one = default_run_dir(config_from_flags(given))
    return one.with_name(one.name.rsplit("-s", 1)[0] + "-seeds")
