"""The single-seed trainer: AdamW on a HookedTransformer, writing a run directory.

    summary = train(mpsp_run_config(ratio=0.9, epochs=100), "runs/r09")

Reproducibility: the model's init is drawn from ``train.seed`` inside ``fork_rng``; the data
order of epoch e is ``randperm`` from a generator seeded by ``(seed, e)`` alone, so resuming
from any epoch boundary replays exactly the same batches. Resume state (weights + AdamW
moments) is written atomically at every evaluation and on Ctrl-C; a resumed run ends with
bitwise the same weights as an uninterrupted one (CPU).

Evaluation at epoch 0, every ``eval_every`` epochs and at the last epoch, on every split;
for MPSP also on the train split's consistent / anti-shortcut groups, plus the gradient
probes of ``training.gradients``. Checkpoints: every evaluation for the first
``ckpt_density`` evaluations, then every 2nd for the next ``ckpt_density``, every 4th, ...
(dense early, sparse late, independent of the epoch budget), plus the last epoch.
With ``eval_schedule="log"``: evaluation and a checkpoint at every epoch of
``training.config.log_schedule(epochs, n_evals)``. The schedule is a function of the *target*
``epochs``: a run resumed with a larger ``--epochs`` keeps the evaluations and checkpoints it
has and follows the new target's schedule after the epoch it resumes from.

Collapse diagnostics in every metrics row (``collapse_diagnostics``, ``norm_diagnostics``):
``train_max_abs_logit``, ``train_zero_loss_frac`` (train examples whose loss is exactly 0 in
the run's dtype), both from the evaluation's forward pass over the train split;
``weight_norm`` (all parameters) and ``weight_norms`` (each parameter's Frobenius norm, by TL
name); ``grad_norm``: the norm of the gradient of the **last training step** (free: no extra
pass; with full batch, as in modular addition, that is the gradient of the full train loss at
the weights before that step), None where no step preceded the evaluation (epoch 0).

``dtype`` float64: weights, AdamW moments, arithmetic, checkpoints and resume state are all
float64 (``training.presets.build_model``); resume is bitwise there too.

This module computes; every file of the run directory (lock, splits, config, metrics,
checkpoints, resume state, summary) is written by ``training.writer.RunWriter``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor
from tqdm.auto import tqdm  # a widget in a notebook (ipywidgets, the notebook extra), text elsewhere

from lenslab.tasks import make_modadd_splits, make_mpsp_splits
from lenslab.tasks.mnist import make_mnist_splits
from lenslab.training.config import check_train, torch_dtype
from lenslab.training.errors import ConfigError, TrainingDiverged
from lenslab.training.gradients import gradient_dynamics
from lenslab.training.objective import Objective
from lenslab.training.presets import build_model
from lenslab.training.run import task_from_config
from lenslab.training.writer import (  # noqa: F401  (EvalSchedule, is_checkpoint_epoch, check_init_source: re-exported)
    EvalSchedule,
    Interrupted,
    RunWriter,
    check_init_source,
    is_checkpoint_epoch,
    resume_state,
    sigint_flag,
)

EVAL_CHUNK = 8192


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The generator that orders the data of ``epoch`` (stateless: a function of seed and epoch)."""
    return torch.Generator().manual_seed((seed * 1_000_003 + epoch) % (2**63))


def check_dtype_device(dtype: str, dev: torch.device) -> None:
    """Refuse, in one line, a precision the device cannot compute in (float64 on MPS, for one)."""
    want = torch_dtype({"dtype": dtype})
    try:
        x = torch.ones(2, 2, dtype=want, device=dev)
        (x @ x).sum().item()
    except (RuntimeError, TypeError) as e:
        msg = (str(e).splitlines()[0].split(". ")[0][:160]) if str(e) else type(e).__name__  # the cause, not the backend list
        raise ConfigError(
            f"--dtype {dtype}: device {dev} cannot compute in {dtype} ({msg}); use --dtype float32 or --device cpu"
        ) from None


def resolve_device(device: str | None) -> torch.device:
    """``device`` (default: cuda when available), checked before any work: a bad name is one ConfigError line."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"--device {device!r} is not a device name: use cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and (not torch.cuda.is_available() or (dev.index or 0) >= torch.cuda.device_count()):
        raise ConfigError(f"--device {device!r}: this machine has {torch.cuda.device_count()} usable CUDA device(s); use cpu")
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {device!r}: lenslab trains on cpu or cuda")
    return dev


def make_splits(config: dict) -> dict[str, torch.Tensor]:
    """The splits of a run config's task (MPSP, modular addition or MNIST), from its data seed."""
    task_cfg = config["task"]
    task = task_from_config(task_cfg)
    if task_cfg["name"] == "mpsp":
        return make_mpsp_splits(
            task, task_cfg["ratio"], task_cfg["n_train"], task_cfg["n_val"], task_cfg["n_adv"], task_cfg["seed"]
        )
    if task_cfg["name"] == "mnist":
        return make_mnist_splits(task, task_cfg["seed"])
    return make_modadd_splits(task, task_cfg["seed"])


@torch.no_grad()
def evaluate(
    model: torch.nn.Module, splits: dict[str, torch.Tensor], device: torch.device, objective: Objective | None = None
) -> dict:
    """Loss and accuracy on every split (and the MPSP train groups), in the model's dtype (float32 at
    least), plus the train split's ``collapse_diagnostics`` from the same forward pass.
    ``objective``: how the task is fed and scored (default: a token task with cross-entropy)."""
    obj = objective or Objective("tokens", "ce", 0)
    dtype = next(model.parameters()).dtype
    was_training = model.training
    model.eval()
    out: dict = {}
    for name in obj.split_names(splits):
        inputs, labels = splits[f"{name}{obj.input_part}"], splits[f"{name}_labels"]
        losses, correct, max_logit = [], [], []
        for s in range(0, len(inputs), EVAL_CHUNK):
            x = obj.inputs({f"{name}{obj.input_part}": inputs[s : s + EVAL_CHUNK]}, name, device, dtype)
            logits = obj.logits(model, x)
            logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
            y = labels[s : s + EVAL_CHUNK].to(device)
            losses.append(obj.example_losses(logits, y).cpu())
            correct.append((logits.argmax(-1) == y).cpu())
            max_logit.append(logits.abs().max().cpu())
        loss, hit = torch.cat(losses), torch.cat(correct)
        out[f"{name}_loss"] = float(loss.mean())
        out[f"{name}_acc"] = float(hit.float().mean())
        if name == "train":
            out.update(collapse_diagnostics(loss, torch.stack(max_logit).max()))
        if name == "train" and "train_shortcut" in splits:
            consistent = splits["train_labels"] == splits["train_shortcut"]
            for group, mask in (("consistent", consistent), ("anti", ~consistent)):
                out[f"train_{group}_acc"] = float(hit[mask].float().mean()) if mask.any() else None
                out[f"train_{group}_loss"] = float(loss[mask].mean()) if mask.any() else None
    model.train(was_training)
    return out


def collapse_diagnostics(train_losses: Tensor, max_abs_logit: Tensor) -> dict:
    """Softmax-collapse signs on the train split: the largest |logit| and the share of examples
    whose cross-entropy is exactly 0 in the run's dtype (they no longer send any gradient)."""
    return {"train_max_abs_logit": float(max_abs_logit), "train_zero_loss_frac": float((train_losses == 0).double().mean())}


def norm_diagnostics(named_params: list[tuple[str, Tensor]], grads: list[Tensor | None] | None) -> dict:
    """``weight_norm`` over all parameters, ``weight_norms`` (each one's Frobenius norm by name) and
    ``grad_norm`` of ``grads`` (the last step's; None without one), computed in the run's dtype."""
    with torch.no_grad():
        sq = [p.detach().pow(2).sum() for _, p in named_params]
        out: dict = {
            "weight_norm": float(torch.stack(sq).sum().sqrt()),
            "weight_norms": {n: float(v.sqrt()) for (n, _), v in zip(named_params, sq)},
        }
        present = [g for g in grads or [] if g is not None]
        out["grad_norm"] = float(torch.stack([g.pow(2).sum() for g in present]).sum().sqrt()) if present else None
    return out


def _optimizer(model: torch.nn.Module, t: dict) -> torch.optim.AdamW:
    return torch.optim.AdamW(model.parameters(), lr=t["lr"], betas=tuple(t["betas"]), weight_decay=t["weight_decay"])


@contextmanager
def deterministic_algorithms():
    """Deterministic kernels for the duration of training, then the caller's setting again.

    Without it, the CPU backward of the embedding lookup (an accumulating index_put) sums in a
    thread-dependent order, and two identical runs drift apart in the last bits after one epoch.
    """
    previous = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous, warn_only=warn_only)


def train(
    config: dict,
    out: str | Path,
    resume: bool = False,
    progress: bool = True,
    device: str | None = None,
    on_eval: Callable[[dict], None] | None = None,
) -> dict:
    """Train one model as ``config`` says, into the run directory ``out``; returns the summary.

    ``resume=True`` continues an existing run up to ``config["train"]["epochs"]`` (the total).
    A config made by ``training.config.with_init`` starts from another run's weights (epoch 0
    evaluates them unchanged) with a fresh AdamW.
    Ctrl-C saves the resume state at the end of the current epoch and raises ``Interrupted``.
    """
    check_train(config)
    t = config["train"]
    dev = resolve_device(device)
    check_dtype_device(t["dtype"], dev)
    writer = RunWriter(out, config, resume)
    splits = None if writer.resuming else make_splits(config)  # bad sizes fail before anything is written
    with writer:
        model = build_model(config["model"], seed=t["seed"], device=str(dev), dtype=t["dtype"])
        opt = _optimizer(model, t)
        splits = writer.open(model, opt, splits, dev)
        return _loop(config, writer, model, opt, splits, dev, progress, on_eval)


def _loop(
    config: dict, writer: RunWriter, model: torch.nn.Module, opt: torch.optim.Optimizer, splits, dev, progress, on_eval
) -> dict:
    t, out, start, schedule = config["train"], writer.out, writer.start, writer.schedule
    epochs, seed = t["epochs"], t["seed"]
    obj = Objective.of(config)
    tokens = obj.inputs(splits, "train", dev, torch_dtype(t))  # tokens, or the MLP's float inputs
    labels = splits["train_labels"].to(dev)
    consistent = (splits["train_labels"] == splits["train_shortcut"]) if "train_shortcut" in splits else None
    n = tokens.shape[0]
    bs = t["batch_size"] or n
    steps_per_epoch = -(-n // bs)
    dev_splits = {k: v.to(dev) for k, v in splits.items()}

    def state() -> dict[str, Tensor]:
        return resume_state(model.state_dict(), opt.state_dict()["state"])

    def do_eval(epoch: int) -> None:
        params = list(model.named_parameters())
        row = {"epoch": epoch, **evaluate(model, dev_splits, dev, obj), **norm_diagnostics(params, [p.grad for _, p in params])}
        if obj.kind == "images":
            row["step"] = epoch * steps_per_epoch
        if consistent is not None:
            row.update(gradient_dynamics(model, tokens, labels, consistent.to(dev), t["grad_probe_size"]))
        writer.log_eval(row)
        writer.checkpoint(epoch, model, state())
        bar.set_postfix_str(eval_postfix(row), refresh=False)
        if on_eval is not None:
            on_eval(row)

    bar = tqdm(total=epochs, initial=start, desc=out.name or "train", file=sys.stderr, disable=not progress, dynamic_ncols=True)
    model.train()
    try:
        with sigint_flag() as sigint, deterministic_algorithms():
            if writer.pending_eval(start):
                do_eval(start)  # epoch 0, or an evaluation a kill cut off
            for epoch in range(start + 1, epochs + 1):
                perm = torch.randperm(n, generator=epoch_generator(seed, epoch)).to(dev)
                loss_sum = torch.zeros((), device=dev, dtype=torch_dtype(t))
                for s in range(0, n, bs):
                    idx = perm[s : s + bs]
                    loss = obj.loss(obj.logits(model, tokens[idx]), labels[idx])
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    loss_sum += loss.detach()
                if not (torch.isfinite(loss_sum) and all(torch.isfinite(p).all() for p in model.parameters())):
                    last = writer.diverged()  # the last step can poison the weights after a finite loss
                    raise TrainingDiverged(
                        f"training diverged at epoch {epoch} (loss or weights are NaN/inf); the last good state is epoch {last} "
                        f"in {out}/checkpoints: lower --lr and start a new run"
                    )
                bar.update(1)
                if schedule.evaluates(epoch):
                    do_eval(epoch)
                if sigint["hit"] and epoch < epochs:
                    writer.interrupted(epoch, state())
                    raise Interrupted(
                        f"interrupted at epoch {epoch}; saved. Continue with: lenslab train ... --out {out} --resume"
                    )
    finally:
        bar.close()
    return writer.finish()


def eval_postfix(row: dict) -> str:
    """The progress bar's numbers after an evaluation."""
    keys = [("train", "train_acc"), ("val", "validation_acc"), ("adv", "adv_acc"), ("test", "test_acc")]
    return " ".join(f"{name} {row[k]:.3f}" for name, k in keys if row.get(k) is not None)
