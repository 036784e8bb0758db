"""Train E members at once on stacked parameters; each member is an ordinary run directory.

    configs = [mpsp_run_config(ratio=0.9, seed=s) for s in range(8)]
    summaries = train_ensemble(configs, [f"runs/r09/seed_{s}" for s in range(8)])

Members share the architecture, the dtype and the batch/epoch/evaluation schedule; they may
differ in the model seed (init and data order), the task's ratio (MPSP) and data seed, the
learning rate and the weight decay. Both tasks: MPSP (pre-LN) and modular addition (no
LayerNorm, full batch), and paper 2's MNIST MLP (``training.stacked_mlp``, MSE or cross-entropy). Members with different train-split sizes (modadd train fractions)
cannot share a stack: train them in separate ensembles. Member ``e`` does exactly what ``training.trainer.train(configs[e], outs[e])`` does: the
same init (``build_model(seed)``), the same batches (``epoch_generator(seed, epoch)``), AdamW
with the same update, the same evaluations, gradient probes, checkpoints, resume state and
summary, written in the same formats. Only the arithmetic is batched (``training.stacked``),
so floats differ in the last bits from the single-seed trainer; the tests state the tolerance.

A member's resume state is the single-seed trainer's format, so any member can be continued by
either trainer. After a kill, members may stand at different epochs (their files are written
one member at a time); each member keeps its own epoch counter and the loop runs until all
reach the target, leaving finished members untouched.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm  # a widget in a notebook (ipywidgets, the notebook extra), text elsewhere

from lenslab.training.config import check_train, torch_dtype
from lenslab.training.errors import ConfigError, TrainingDiverged
from lenslab.training.gradients import gradient_dynamics
from lenslab.training.objective import Objective
from lenslab.training.presets import build_model
from lenslab.training.runio import run_environment
from lenslab.training.spec import is_mlp_config
from lenslab.training.stacked import StackedTransformer, check_supported
from lenslab.training.stacked_adamw import StackedAdamW
from lenslab.training.stacked_mlp import StackedMLP
from lenslab.training.trainer import (
    check_dtype_device,
    deterministic_algorithms,
    epoch_generator,
    eval_postfix,
    evaluate,
    make_splits,
    norm_diagnostics,
    resolve_device,
)
from lenslab.training.writer import Interrupted, RunWriter, resume_state, sigint_flag

# members per stack in a sweep, from benchmarks/ensemble_speed.py on 2 cores (benchmarks/results_ensemble_speed_cpu.json):
# with one process per core (sweep --workers, the default) E = 4 was best, 3.2x the plain TL loop.
# `lenslab train --seeds` measures the size instead (lenslab/training/calibrate.py): it differs by machine.
SWEEP_ENSEMBLE = 4
SHARED_TRAIN = (
    "epochs",
    "betas",
    "batch_size",
    "eval_every",
    "ckpt_density",
    "grad_probe_size",
    "dtype",
    "eval_schedule",
    "n_evals",
)
PER_MEMBER = "the model seed, the task's ratio and data seed, lr and weight_decay (dtype and schedules are shared)"


def check_ensemble(configs: list[dict]) -> None:
    """Members must share everything but seed, ratio, data seed, lr and weight decay."""
    if not configs:
        raise ConfigError("an ensemble needs at least one member config")
    for c in configs:
        check_train(c)
        if c.get("init") is not None:
            raise ConfigError(
                "the ensemble engine starts every member from its seed's init; train a run with an 'init' (with_init, --init-from) on its own"
            )
    first = configs[0]
    if not is_mlp_config(first["model"]):
        check_supported(first["model"])
    for i, c in enumerate(configs[1:], 1):
        if c["model"] != first["model"]:
            diff = sorted(k for k in set(c["model"]) | set(first["model"]) if c["model"].get(k) != first["model"].get(k))
            raise ConfigError(
                f"ensemble member {i} has a different model ({', '.join(diff)}); members may differ only in {PER_MEMBER}"
            )
        for k in SHARED_TRAIN:
            if c["train"][k] != first["train"][k]:
                raise ConfigError(
                    f"ensemble member {i} has train.{k}={c['train'][k]!r}, member 0 {first['train'][k]!r}; members may differ only in {PER_MEMBER}"
                )
        task_a = {k: v for k, v in c["task"].items() if k not in ("ratio", "seed")}
        task_b = {k: v for k, v in first["task"].items() if k not in ("ratio", "seed")}
        if task_a != task_b:
            raise ConfigError(f"ensemble member {i} has a different task; members may differ only in {PER_MEMBER}")


def ensemble_step(
    ens: Any,  # a StackedTransformer, or a wrapper with its call and .params (the GPU path's compiled engine)
    opt: StackedAdamW,
    tokens: Int[Tensor, "E n pos"] | Float[Tensor, "E n d_in"],
    labels: Int[Tensor, "E n"],
    idx: Int[Tensor, "E batch"],
    active: list[bool] | None = None,
    grads_out: list[Tensor] | None = None,
    objective: Objective | None = None,
) -> Float[Tensor, " E"]:
    """One AdamW step of every member on its own rows ``idx`` of its train split; returns the losses.

    ``tokens``: token ids ``[E, n, pos]``, or an MLP's inputs ``[E, n, d_in]``. ``objective``: the
    task's loss (default: cross-entropy; MSE on one-hot targets for an MNIST MLP so configured).
    ``grads_out``, a list, is refilled with this step's stacked gradients (for ``grad_norm``)."""
    batch = torch.gather(tokens, 1, idx[:, :, None].expand(-1, -1, tokens.shape[2]))
    y = torch.gather(labels, 1, idx)
    logits = ens(batch)
    loss_e = member_losses(logits, y, objective)
    grads = list(torch.autograd.grad(loss_e.sum(), list(ens.params)))
    opt.step(grads, active)
    if grads_out is not None:
        grads_out[:] = grads
    return loss_e.detach()


def member_losses(
    logits: Float[Tensor, "E batch k"], labels: Int[Tensor, "E batch"], objective: Objective | None
) -> Float[Tensor, " E"]:
    """Each member's mean training loss, as ``Objective.loss`` computes it for one member."""
    if objective is not None and objective.loss_name == "mse":
        # one-hot by comparison, not F.one_hot: the same exact 0/1 values, with no scatter, so no
        # deterministic-mode question and nothing that a CUDA graph capture could trip on
        classes = torch.arange(objective.n_classes, device=labels.device)
        target = (labels[..., None] == classes).to(logits.dtype)
        return (logits - target).square().flatten(1).mean(1)  # MSELoss's mean over batch and classes
    return (
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
        .view(labels.shape[0], -1)
        .mean(1)
    )


class _Member:
    """One member: its run writer (directory, metrics rows), splits and epoch counter."""

    def __init__(self, config: dict, out: Path, resume: bool):
        self.config, self.writer = config, RunWriter(out, config, resume)
        self.out, self.resuming = self.writer.out, self.writer.resuming
        self.epoch = 0
        self.diverged_at: int | None = None
        self.splits: dict[str, torch.Tensor] | None = None  # a new member's, until the writer opens (then every member's)

    @property
    def rows(self) -> list[dict]:
        return self.writer.rows


def train_ensemble(
    configs: list[dict],
    outs: list[str | Path],
    resume: bool = False,
    progress: bool = True,
    device: str | None = None,
    on_eval: Callable[[int, dict], None] | None = None,
    step: Callable[..., Tensor] | None = None,
) -> list[dict]:
    """Train every ``configs[e]`` into ``outs[e]`` in one stacked model; returns the summaries.

    ``step`` replaces ``ensemble_step`` (same arguments, same return): a caller's way to run the
    identical update differently, e.g. captured as one CUDA graph (``benchmarks/gpu``'s part f).

    ``resume=True`` continues existing members (each from its own resume state) and starts
    missing ones. Ctrl-C saves every member and raises ``training.trainer.Interrupted``. A
    member whose loss turns NaN/inf stops (summary ``diverged``) while the others go on; once
    all are done, ``TrainingDiverged`` names it.
    """
    check_ensemble(configs)
    if len(outs) != len(configs):
        raise ConfigError(f"{len(configs)} configs but {len(outs)} output directories")
    paths = [Path(o) for o in outs]
    if len({p.resolve() for p in paths}) != len(paths):
        raise ConfigError("two ensemble members write to the same directory: give each its own --out")
    dev = resolve_device(device)
    check_dtype_device(configs[0]["train"]["dtype"], dev)
    members = [_Member(c, p, resume) for c, p in zip(configs, paths)]
    cache: dict[str, dict] = {}
    for m in members:  # bad sizes fail before anything is written
        if not m.resuming:
            key = json.dumps(m.config["task"], sort_keys=True)
            if key not in cache:
                cache[key] = make_splits(m.config)
            m.splits = cache[key]
    with ExitStack() as stack_ctx:
        for m in members:
            stack_ctx.enter_context(m.writer)
        t0 = configs[0]["train"]
        env = run_environment(dev)
        models = []
        states = []
        for m in members:
            model = build_model(
                m.config["model"], seed=m.config["train"]["seed"], device=str(dev), dtype=m.config["train"]["dtype"]
            )
            opt = torch.optim.AdamW(model.parameters(), lr=m.config["train"]["lr"])  # holds the resume state for StackedAdamW
            m.splits = m.writer.open(model, opt, m.splits, dev, env)
            m.epoch = m.writer.start
            models.append(model)
            states.append(opt.state_dict()["state"])
        stack = StackedMLP if is_mlp_config(configs[0]["model"]) else StackedTransformer
        ens = stack.from_models(models).to(dev)
        opt = StackedAdamW(
            list(ens.params),
            [m.config["train"]["lr"] for m in members],
            [m.config["train"]["weight_decay"] for m in members],
            tuple(t0["betas"]),
        )
        for e, state in enumerate(states):
            opt.load_member_state(e, state)
        template = models[0]
        return _loop(members, ens, opt, template, dev, progress, on_eval, step or ensemble_step)


def _loop(
    members: list[_Member],
    ens: StackedTransformer | StackedMLP,
    opt: StackedAdamW,
    template,
    dev,
    progress,
    on_eval,
    step: Callable[..., Tensor] = ensemble_step,
) -> list[dict]:
    t = members[0].config["train"]
    epochs, bs_cfg = t["epochs"], t["batch_size"]
    schedule = members[0].writer.schedule  # shared by all members (SHARED_TRAIN)
    last_grads: list[Tensor] = []  # the last step's stacked gradients, for each member's grad_norm
    E = len(members)
    obj = Objective.of(members[0].config)
    # [E, n, pos] token ids, or [E, n, d_in] an MLP's inputs (pixels / 255 in the run's dtype)
    tokens = torch.stack([obj.inputs(m.splits, "train", dev, torch_dtype(t)) for m in members])
    labels = torch.stack([m.splits["train_labels"] for m in members]).to(dev)  # [E, n]
    n = tokens.shape[1]
    bs = bs_cfg or n
    steps_per_epoch = -(-n // bs)
    dev_splits = [{k: v.to(dev) for k, v in m.splits.items()} for m in members]
    consistent = [
        (m.splits["train_labels"] == m.splits["train_shortcut"]).to(dev) if "train_shortcut" in m.splits else None
        for m in members
    ]

    def state(e: int) -> dict[str, Tensor]:
        """Member ``e``'s resume state in the single-seed trainer's format."""
        return resume_state(ens.member_state_dict(e), opt.member_state(e))

    def do_eval(e: int) -> None:
        m = members[e]
        template.load_state_dict(ens.member_state_dict(e))
        grads = [g[e] for g in last_grads] if last_grads else None
        row = {
            "epoch": m.epoch,
            **evaluate(template, dev_splits[e], dev, obj),
            **norm_diagnostics(list(template.named_parameters()), grads),
        }
        if obj.kind == "images":
            row["step"] = m.epoch * steps_per_epoch
        if consistent[e] is not None:
            row.update(
                gradient_dynamics(
                    template, dev_splits[e]["train_tokens"], dev_splits[e]["train_labels"], consistent[e], t["grad_probe_size"]
                )
            )
        m.writer.log_eval(row)
        m.writer.checkpoint(m.epoch, template, state(e))
        if on_eval is not None:
            on_eval(e, row)

    def running(m: _Member) -> bool:
        return m.epoch < epochs and m.diverged_at is None

    low = min(m.epoch for m in members)
    bar = tqdm(total=epochs, initial=low, desc=f"ensemble of {E}", file=sys.stderr, disable=not progress, dynamic_ncols=True)
    ens.train()
    try:
        with sigint_flag() as sigint, deterministic_algorithms():
            for e, m in enumerate(members):
                if m.writer.pending_eval(m.epoch):
                    do_eval(e)  # epoch 0, or an evaluation a kill cut off
            while any(running(m) for m in members):
                active = [running(m) for m in members]
                perm = torch.stack(
                    [
                        torch.randperm(n, generator=epoch_generator(m.config["train"]["seed"], m.epoch + 1))
                        if a
                        else torch.arange(n)
                        for m, a in zip(members, active)
                    ]
                ).to(dev)
                loss_sum = torch.zeros(E, device=dev, dtype=ens.params[0].dtype)
                for s in range(0, n, bs):
                    loss_sum += step(ens, opt, tokens, labels, perm[:, s : s + bs], active, last_grads, obj)
                finite = torch.isfinite(loss_sum).tolist()
                for e, m in enumerate(members):
                    if not active[e]:
                        continue
                    m.epoch += 1
                    if not finite[e]:
                        m.diverged_at = m.epoch
                        m.writer.diverged()
                    elif schedule.evaluates(m.epoch):
                        do_eval(e)
                new_low = (
                    min(m.epoch for m in members if m.diverged_at is None)
                    if any(m.diverged_at is None for m in members)
                    else epochs
                )
                bar.update(new_low - low)
                low = new_low
                bar.set_postfix_str(_ensemble_postfix(members), refresh=False)
                if sigint["hit"] and any(running(m) for m in members):
                    for e, m in enumerate(members):
                        if running(m):
                            m.writer.interrupted(m.epoch, state(e))
                    where = members[0].out.parent
                    raise Interrupted(
                        f"interrupted at epoch {low}; all {E} members saved. Continue with: lenslab train ... --out {where} --resume"
                    )
    finally:
        bar.close()
    summaries = []
    for m in members:
        if m.diverged_at is None:
            m.writer.finish()
        summaries.append(m.writer.summary)
    bad = [m for m in members if m.diverged_at is not None]
    if bad:
        names = ", ".join(f"{m.out} (epoch {m.diverged_at})" for m in bad[:4])
        raise TrainingDiverged(
            f"{len(bad)} of {E} members diverged (loss NaN/inf): {names}; their last good checkpoints are kept, "
            f"the other members completed. Lower --lr for those seeds and start new runs"
        )
    return summaries


def _ensemble_postfix(members: list[_Member]) -> str:
    rows = [m.rows[-1] for m in members if m.rows]
    if not rows:
        return ""
    if "adv_acc" in rows[0]:
        gen = sum(1 for m in members if any(r.get("adv_acc") == 1.0 for r in m.rows))
        val = sum(r["validation_acc"] for r in rows) / len(rows)
        adv = sum(r["adv_acc"] for r in rows) / len(rows)
        return f"generalized {gen}/{len(members)}  mean val {val:.3f} adv {adv:.3f}"
    return eval_postfix(rows[0])
