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
"""

from __future__ import annotations

import math
import signal
import sys
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm
from transformer_lens import HookedTransformer

from lenslab.tasks import make_modadd_splits, make_mpsp_splits
from lenslab.training.config import check_train, comparable, log_schedule, torch_dtype
from lenslab.training.errors import ConfigError, RunError, TrainingDiverged
from lenslab.training.gradients import gradient_dynamics, readout_logits
from lenslab.training.presets import build_model
from lenslab.training.run import task_from_config
from lenslab.training.runio import (
    RESUME_FORMAT,
    RunLock,
    append_jsonl,
    atomic_save_safetensors,
    atomic_write_json,
    carry_environment,
    check_state_dict,
    file_sha256,
    list_checkpoints,
    load_checkpoint_into,
    load_run_splits,
    read_config,
    read_jsonl,
    read_safetensors,
    rewrite_jsonl,
    run_environment,
    save_checkpoint,
    save_splits,
)

EVAL_CHUNK = 8192
OWN_FILES = {"splits.safetensors", "checkpoints", "metrics.jsonl", ".lock", "summary.json"}


class Interrupted(Exception):
    """Raised after a Ctrl-C once the run has been saved; the CLI exits 130."""


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The generator that orders the data of ``epoch`` (stateless: a function of seed and epoch)."""
    return torch.Generator().manual_seed((seed * 1_000_003 + epoch) % (2**63))


def is_checkpoint_epoch(epoch: int, eval_every: int, density: int) -> bool:
    """Dense-early, sparse-late checkpoint rule on evaluation epochs (see the module docstring)."""
    if epoch % eval_every:
        return False
    i = epoch // eval_every
    if i <= density:
        return True
    stride = 2 ** int(math.floor(math.log2(i / density)))
    return i % stride == 0


@dataclass(frozen=True)
class EvalSchedule:
    """When a run evaluates and checkpoints (see the module docstring), from its train settings."""

    epochs: int
    every: int
    density: int
    log_epochs: frozenset[int] | None  # None: the linear schedule

    @classmethod
    def of(cls, t: dict) -> EvalSchedule:
        log = frozenset(log_schedule(t["epochs"], t["n_evals"])) if t.get("eval_schedule", "linear") == "log" else None
        return cls(t["epochs"], t["eval_every"], t["ckpt_density"], log)

    def evaluates(self, epoch: int) -> bool:
        if epoch == self.epochs:
            return True
        return epoch in self.log_epochs if self.log_epochs is not None else epoch % self.every == 0

    def checkpoints(self, epoch: int) -> bool:
        """Only on evaluation epochs: every one (log), or the dense-early, sparse-late rule plus the last (linear)."""
        if not self.evaluates(epoch):
            return False
        return self.log_epochs is not None or epoch == self.epochs or is_checkpoint_epoch(epoch, self.every, self.density)


def check_dtype_device(dtype: str, dev: torch.device) -> None:
    """Refuse, in one line, a precision the device cannot compute in (float64 on MPS, for one)."""
    want = torch_dtype({"dtype": dtype})
    try:
        x = torch.ones(2, 2, dtype=want, device=dev)
        (x @ x).sum().item()
    except (RuntimeError, TypeError) as e:
        msg = (str(e).splitlines()[0].split(". ")[0][:160]) if str(e) else type(e).__name__  # the cause, not the backend list
        raise ConfigError(f"--dtype {dtype}: device {dev} cannot compute in {dtype} ({msg}); use --dtype float32 or --device cpu") from None


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
    task_cfg = config["task"]
    task = task_from_config(task_cfg)
    if task_cfg["name"] == "mpsp":
        return make_mpsp_splits(
            task, task_cfg["ratio"], task_cfg["n_train"], task_cfg["n_val"], task_cfg["n_adv"], task_cfg["seed"]
        )
    return make_modadd_splits(task, task_cfg["seed"])


@torch.no_grad()
def evaluate(model: HookedTransformer, splits: dict[str, torch.Tensor], device: torch.device) -> dict:
    """Loss and accuracy on every split (and the MPSP train groups), in the model's dtype (float32 at
    least), plus the train split's ``collapse_diagnostics`` from the same forward pass."""
    was_training = model.training
    model.eval()
    out: dict = {}
    names = sorted(k[: -len("_tokens")] for k in splits if k.endswith("_tokens"))
    for name in sorted(names, key=lambda n: n != "train"):
        if name == "counterfactual":
            continue
        tokens, labels = splits[f"{name}_tokens"], splits[f"{name}_labels"]
        losses, correct, max_logit = [], [], []
        for s in range(0, len(tokens), EVAL_CHUNK):
            logits = readout_logits(model, tokens[s : s + EVAL_CHUNK].to(device))
            logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
            y = labels[s : s + EVAL_CHUNK].to(device)
            losses.append(F.cross_entropy(logits, y, reduction="none").cpu())
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
        out: dict = {"weight_norm": float(torch.stack(sq).sum().sqrt()), "weight_norms": {n: float(v.sqrt()) for (n, _), v in zip(named_params, sq)}}
        present = [g for g in grads or [] if g is not None]
        out["grad_norm"] = float(torch.stack([g.pow(2).sum() for g in present]).sum().sqrt()) if present else None
    return out


def _optimizer(model: HookedTransformer, t: dict) -> torch.optim.AdamW:
    return torch.optim.AdamW(model.parameters(), lr=t["lr"], betas=tuple(t["betas"]), weight_decay=t["weight_decay"])


def _save_resume(run_dir: Path, epoch: int, model: HookedTransformer, opt: torch.optim.Optimizer) -> None:
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    for i, state in opt.state_dict()["state"].items():
        for key, val in state.items():
            tensors[f"optim.{i}.{key}"] = val if torch.is_tensor(val) else torch.tensor(val)
    atomic_save_safetensors(run_dir / "checkpoints" / "resume.safetensors", tensors, {"format": RESUME_FORMAT, "epoch": str(epoch)})


def _load_resume(run_dir: Path, model: HookedTransformer, opt: torch.optim.Optimizer) -> int | None:
    path = run_dir / "checkpoints" / "resume.safetensors"
    if not path.exists():
        return None
    tensors, meta = read_safetensors(path)
    if meta.get("format") != RESUME_FORMAT or not str(meta.get("epoch", "")).isdigit():
        raise RunError(f"{path}: not a lenslab resume state")
    state = {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
    want = next(model.parameters()).dtype
    found = sorted({str(v.dtype).removeprefix("torch.") for v in state.values() if v.dtype.is_floating_point})
    if found and found != [str(want).removeprefix("torch.")]:
        raise RunError(
            f"{path}: the resume state is {', '.join(found)} but the run's config says train.dtype {str(want).removeprefix('torch.')}; "
            "refusing to resume in another precision (start a new run, e.g. with --init-from)"
        )
    check_state_dict(state, model, str(path))
    model.load_state_dict(state)
    sd = opt.state_dict()
    new_state: dict[int, dict] = {}
    for k, v in tensors.items():
        if k.startswith("optim."):
            _, i, key = k.split(".", 2)
            new_state.setdefault(int(i), {})[key] = v
    n_params = len(sd["param_groups"][0]["params"])
    if new_state and set(new_state) != set(range(n_params)):
        raise RunError(f"{path}: optimizer state does not match the model ({len(new_state)} vs {n_params} tensors)")
    sd["state"] = new_state
    opt.load_state_dict(sd)
    return int(meta["epoch"])


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


@contextmanager
def _sigint_flag():
    """Turn the first Ctrl-C into a flag that the loop checks at the end of each epoch."""
    flag = {"hit": False}
    if not hasattr(signal, "SIGINT") or signal.getsignal(signal.SIGINT) is None:
        yield flag
        return
    try:
        previous = signal.signal(signal.SIGINT, lambda *_: flag.__setitem__("hit", True))
    except ValueError:  # not the main thread
        yield flag
        return
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


def check_init_source(config: dict) -> Path | None:
    """The checkpoint ``config["init"]`` names, checked unchanged since the config was made (None: no init)."""
    init = config.get("init")
    if init is None:
        return None
    path = Path(init["from"])
    if not path.is_file():
        raise RunError(f"init: the checkpoint this run starts from, {path}, is gone; restore it or start a new run")
    if file_sha256(path) != init["sha256"]:
        raise RunError(f"init: {path} has changed since this run was configured (sha256 differs); start a new run from it")
    return path


def _summarize(config: dict, rows: list[dict], epochs_done: int, status: str, env: dict) -> dict:
    summary: dict = {"status": status, "epochs_completed": epochs_done, "epochs_target": config["train"]["epochs"]}
    if config["task"]["name"] == "mpsp":
        gen = [r["epoch"] for r in rows if r.get("adv_acc") == 1.0]
        summary["generalized"] = bool(gen)
        summary["first_generalized_epoch"] = gen[0] if gen else None
        summary["max_adv_acc"] = max((r["adv_acc"] for r in rows), default=None)
        summary["still_generalized_at_end"] = bool(rows) and rows[-1].get("adv_acc") == 1.0
    else:
        best = max(rows, key=lambda r: r.get("test_acc", -1), default=None)
        summary["best_test_acc"] = best["test_acc"] if best else None
        summary["best_test_epoch"] = best["epoch"] if best else None
    summary["final"] = rows[-1] if rows else None
    summary["environment"] = env  # the process that wrote this summary: see runio.run_environment
    return summary


def _prepare_dir(out: Path, config: dict, resume: bool) -> bool:
    """Check ``out`` against ``config``; returns True when an existing run is being resumed."""
    if out.exists() and not out.is_dir():
        raise RunError(f"--out {out} is a file, not a directory")
    if (out / "config.json").is_file():
        old = read_config(out)
        if not resume:
            raise RunError(f"{out} already holds a run: pass --resume to continue it, or choose another --out")
        if comparable(old) != comparable(config):
            diffs = [
                f"{part}.{k}"
                for part in ("task", "model", "train")
                for k in sorted(set(old[part]) | set(config[part]))
                if k != "epochs" and old[part].get(k) != config[part].get(k)
            ]
            raise RunError(f"{out} holds a different run (differs in {', '.join(diffs[:5])}); resume it with its own settings or choose another --out")
        return True
    if out.is_dir():
        foreign = sorted(p.name for p in out.iterdir() if p.name not in OWN_FILES and not p.name.startswith("."))
        if foreign:
            raise RunError(f"--out {out} is a non-empty directory that is not a lenslab run (holds {foreign[:3]}); choose an empty or new directory")
    return False


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
    out = Path(out)
    t = config["train"]
    dev = resolve_device(device)
    check_dtype_device(t["dtype"], dev)
    resuming = _prepare_dir(out, config, resume)
    has_resume_state = resuming and (out / "checkpoints" / "resume.safetensors").is_file()
    init_path = None if has_resume_state else check_init_source(config)  # a resume never re-reads the source
    splits = None if resuming else make_splits(config)  # bad sizes fail before anything is written
    out.mkdir(parents=True, exist_ok=True)
    with RunLock(out):
        if resuming:
            m = config["model"]
            splits = load_run_splits(out, m)
        else:
            save_splits(out, splits)
        model = build_model(config["model"], seed=t["seed"], device=str(dev), dtype=t["dtype"])
        opt = _optimizer(model, t)
        start = _load_resume(out, model, opt) if resuming else None
        if start is not None and start > t["epochs"]:
            raise RunError(f"{out} has already trained {start} epochs; --epochs is the total and must be >= {start}")
        atomic_write_json(out / "config.json", {**config, "train": {**t}})
        rows = read_jsonl(out / "metrics.jsonl")
        if start is None:
            start = 0
            rows = []
            for _, p in list_checkpoints(out):
                p.unlink()
            if init_path is not None:  # another run's weights instead of the seed's init; AdamW starts fresh
                load_checkpoint_into(model, init_path, config["model"], cast=True)  # the source may be in another dtype
        rows = [r for r in rows if r["epoch"] <= start]
        rewrite_jsonl(out / "metrics.jsonl", rows)
        return _loop(config, out, model, opt, splits, start, rows, dev, progress, on_eval)


def _loop(config, out, model, opt, splits, start, rows, dev, progress, on_eval) -> dict:
    t = config["train"]
    env, note = carry_environment(out, run_environment(dev), start)
    if note is not None:
        print(note, file=sys.stderr)
    epochs, seed = t["epochs"], t["seed"]
    schedule = EvalSchedule.of(t)
    tokens = splits["train_tokens"].to(dev)
    labels = splits["train_labels"].to(dev)
    consistent = (splits["train_labels"] == splits["train_shortcut"]) if "train_shortcut" in splits else None
    n = tokens.shape[0]
    bs = t["batch_size"] or n
    dev_splits = {k: v.to(dev) for k, v in splits.items()}

    def do_eval(epoch: int) -> None:
        params = list(model.named_parameters())
        row = {"epoch": epoch, **evaluate(model, dev_splits, dev), **norm_diagnostics(params, [p.grad for _, p in params])}
        if consistent is not None:
            row.update(gradient_dynamics(model, tokens, labels, consistent.to(dev), t["grad_probe_size"]))
        rows.append(row)
        append_jsonl(out / "metrics.jsonl", row)
        if schedule.checkpoints(epoch):
            save_checkpoint(out, epoch, model, config["model"])
        _save_resume(out, epoch, model, opt)
        atomic_write_json(out / "summary.json", _summarize(config, rows, epoch, "running", env))
        bar.set_postfix_str(_postfix(row), refresh=False)
        if on_eval is not None:
            on_eval(row)

    bar = tqdm(total=epochs, initial=start, desc=out.name or "train", file=sys.stderr, disable=not progress, dynamic_ncols=True)
    model.train()
    try:
        with _sigint_flag() as sigint, deterministic_algorithms():
            if schedule.evaluates(start) and (not rows or rows[-1]["epoch"] != start):
                do_eval(start)  # epoch 0, or an evaluation a kill cut off
            for epoch in range(start + 1, epochs + 1):
                perm = torch.randperm(n, generator=epoch_generator(seed, epoch)).to(dev)
                loss_sum = torch.zeros((), device=dev, dtype=torch_dtype(t))
                for s in range(0, n, bs):
                    idx = perm[s : s + bs]
                    loss = F.cross_entropy(readout_logits(model, tokens[idx]), labels[idx])
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    loss_sum += loss.detach()
                if not (torch.isfinite(loss_sum) and all(torch.isfinite(p).all() for p in model.parameters())):
                    last = rows[-1]["epoch"] if rows else 0  # the last step can poison the weights after a finite loss
                    atomic_write_json(out / "summary.json", _summarize(config, rows, last, "diverged", env))
                    raise TrainingDiverged(
                        f"training diverged at epoch {epoch} (loss or weights are NaN/inf); the last good state is epoch {last} "
                        f"in {out}/checkpoints: lower --lr and start a new run"
                    )
                bar.update(1)
                if schedule.evaluates(epoch):
                    do_eval(epoch)
                if sigint["hit"] and epoch < epochs:
                    if rows[-1]["epoch"] != epoch:
                        _save_resume(out, epoch, model, opt)
                    atomic_write_json(out / "summary.json", _summarize(config, rows, epoch, "interrupted", env))
                    raise Interrupted(f"interrupted at epoch {epoch}; saved. Continue with: lenslab train ... --out {out} --resume")
    finally:
        bar.close()
    summary = _summarize(config, rows, epochs, "complete", env)
    atomic_write_json(out / "summary.json", summary)
    return summary


def _postfix(row: dict) -> str:
    keys = [("train", "train_acc"), ("val", "validation_acc"), ("adv", "adv_acc"), ("test", "test_acc")]
    return " ".join(f"{name} {row[k]:.3f}" for name, k in keys if row.get(k) is not None)
