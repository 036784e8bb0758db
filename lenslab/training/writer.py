"""One run directory's bookkeeping, shared by both trainers: ``RunWriter``.

    w = RunWriter(out, config, resume)          # checks ``out`` against ``config``; writes nothing
    with w:                                     # mkdir + the run's lock (stale temp files removed)
        splits = w.open(model, opt, splits, dev)  # splits, resume state, config.json, metrics, environment
        w.log_eval(row)                         # one metrics.jsonl row
        w.checkpoint(epoch, model, resume_state(model.state_dict(), opt.state_dict()["state"]))
        w.diverged() / w.interrupted(epoch, state) / w.finish()   # summary.json

The training loops (``training.trainer``: one model; ``training.ensemble``: one writer per
member of a stack) only compute; every file of the run directory is written here, in the
formats of ``training.runio``:

- ``config.json``, ``splits.safetensors`` (written once, read back on resume);
- ``metrics.jsonl``: one row per evaluation, appended; on open, rows after the resumed epoch
  (written by a killed process after its last resume state) are dropped;
- ``checkpoints/<epoch>.safetensors`` on the epochs ``EvalSchedule.checkpoints`` picks (dense
  early, sparse late; every evaluation with the log schedule) and ``checkpoints/resume.safetensors``
  (weights + AdamW moments, ``RESUME_FORMAT``) at every evaluation and on Ctrl-C;
- ``summary.json``: ``running`` after each evaluation, then ``complete``, ``interrupted`` or
  ``diverged`` (``summarize``), with the ``environment`` the run trained in.
"""

from __future__ import annotations

import math
import signal
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from lenslab.training.config import comparable, log_schedule
from lenslab.training.errors import RunError
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

OWN_FILES = {"splits.safetensors", "checkpoints", "metrics.jsonl", ".lock", "summary.json"}


class Interrupted(Exception):
    """Raised after a Ctrl-C once the run has been saved; the CLI exits 130."""


# -- when a run evaluates and checkpoints --------------------------------------------------
def is_checkpoint_epoch(epoch: int, eval_every: int, density: int) -> bool:
    """Dense-early, sparse-late checkpoint rule on evaluation epochs: every evaluation for the first
    ``density`` evaluations, then every 2nd for the next ``density``, every 4th, ..."""
    if epoch % eval_every:
        return False
    i = epoch // eval_every
    if i <= density:
        return True
    stride = 2 ** math.floor(math.log2(i / density))
    return i % stride == 0


@dataclass(frozen=True)
class EvalSchedule:
    """When a run evaluates and checkpoints, from its train settings (see ``training.trainer``)."""

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


# -- Ctrl-C --------------------------------------------------------------------------------
@contextmanager
def sigint_flag():
    """Turn the first Ctrl-C into a flag (``flag["hit"]``) that a loop checks at the end of each epoch."""
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


# -- the pieces of a run directory -----------------------------------------------------------
def summarize(config: dict, rows: list[dict], epochs_done: int, status: str, env: dict) -> dict:
    """``summary.json``: status, epochs, the task's headline numbers, the last row, the environment."""
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


def resume_state(model_state: dict[str, Tensor], opt_state: dict[int, dict]) -> dict[str, Tensor]:
    """The resume file's tensors: ``model.<name>`` and ``optim.<i>.<key>`` (``torch.optim.AdamW.state_dict()["state"]`` form)."""
    tensors = {f"model.{k}": v for k, v in model_state.items()}
    for i, state in opt_state.items():
        for key, val in state.items():
            tensors[f"optim.{i}.{key}"] = val if torch.is_tensor(val) else torch.tensor(val)
    return tensors


def save_resume(run_dir: Path, epoch: int, tensors: dict[str, Tensor]) -> None:
    """Write the resume state (weights and optimizer moments) of ``epoch`` to ``checkpoints/resume.safetensors`` atomically."""
    atomic_save_safetensors(
        Path(run_dir) / "checkpoints" / "resume.safetensors", tensors, {"format": RESUME_FORMAT, "epoch": str(epoch)}
    )


def load_resume(run_dir: Path, model: torch.nn.Module, opt: torch.optim.Optimizer) -> int | None:
    """Load ``RUN/checkpoints/resume.safetensors`` into ``model`` and ``opt``; its epoch (None: no resume state)."""
    path = Path(run_dir) / "checkpoints" / "resume.safetensors"
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


def check_run_dir(out: Path, config: dict, resume: bool) -> bool:
    """Check ``out`` against ``config`` (writes nothing); True when an existing run is being resumed."""
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
            raise RunError(
                f"{out} holds a different run (differs in {', '.join(diffs[:5])}); resume it with its own settings or choose another --out"
            )
        return True
    if out.is_dir():
        foreign = sorted(p.name for p in out.iterdir() if p.name not in OWN_FILES and not p.name.startswith("."))
        if foreign:
            raise RunError(
                f"--out {out} is a non-empty directory that is not a lenslab run (holds {foreign[:3]}); choose an empty or new directory"
            )
    return False


# -- the writer ------------------------------------------------------------------------------
class RunWriter:
    """Everything one training run writes to its directory ``out`` (see the module docstring).

    Construction checks ``out`` against ``config`` and writes nothing (``resuming``: an existing
    run is continued, which needs ``resume=True``; a different run there is refused). ``with
    writer:`` creates the directory and holds its lock; ``open`` then sets the run up. After
    ``open``: ``start`` (the epoch training continues from), ``rows`` (the metrics so far),
    ``env`` (the environment for ``summary.json``), ``schedule``; ``summary`` is the last
    summary written.
    """

    def __init__(self, out: str | Path, config: dict, resume: bool = False):
        self.out, self.config = Path(out), config
        self.schedule = EvalSchedule.of(config["train"])
        self.resuming = check_run_dir(self.out, config, resume)
        has_resume_state = self.resuming and (self.out / "checkpoints" / "resume.safetensors").is_file()
        self.init_path = None if has_resume_state else check_init_source(config)  # a resume never re-reads the source
        self.rows: list[dict] = []
        self.start = 0
        self.env: dict = {}
        self.summary: dict = {}
        self._lock = RunLock(self.out)

    def __enter__(self) -> RunWriter:  # noqa: PYI034  (typing.Self needs Python 3.11)
        self.out.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self._lock.release()

    def open(
        self,
        model: torch.nn.Module,
        opt: torch.optim.Optimizer,
        splits: dict[str, Tensor] | None,
        device: torch.device,
        env: dict | None = None,
    ) -> dict[str, Tensor]:
        """Set the run up under the lock; returns its splits.

        A new run: ``splits`` are saved, old checkpoints removed, ``model`` takes the init
        checkpoint's weights if the config names one. A resumed run: its splits are read back
        (``splits`` is ignored), ``model`` and ``opt`` take the resume state, metrics rows after
        it are dropped. Both: ``config.json`` is written and the environment carried over
        (``env``: ``run_environment(device)`` unless given; a note on stderr when it changed).
        """
        t = self.config["train"]
        if self.resuming:
            splits = load_run_splits(self.out, self.config["model"])
        else:
            if splits is None:
                raise ValueError("a new run needs its splits")
            save_splits(self.out, splits)
        start = load_resume(self.out, model, opt) if self.resuming else None
        if start is not None and start > t["epochs"]:
            raise RunError(f"{self.out} has already trained {start} epochs; --epochs is the total and must be >= {start}")
        atomic_write_json(self.out / "config.json", {**self.config, "train": {**t}})
        rows = read_jsonl(self.out / "metrics.jsonl")
        if start is None:
            start = 0
            rows = []
            for _, p in list_checkpoints(self.out):
                p.unlink()
            if self.init_path is not None:  # another run's weights instead of the seed's init; AdamW starts fresh
                load_checkpoint_into(model, self.init_path, self.config["model"], cast=True)  # the source may be in another dtype
        self.rows = [r for r in rows if r["epoch"] <= start]
        rewrite_jsonl(self.out / "metrics.jsonl", self.rows)
        self.start = start
        self.env, note = carry_environment(self.out, env if env is not None else run_environment(device), start)
        if note is not None:
            print(note, file=sys.stderr)
        return splits

    @property
    def last_epoch(self) -> int:
        """The epoch of the last metrics row (0 without one): the run's last good state."""
        return self.rows[-1]["epoch"] if self.rows else 0

    def pending_eval(self, epoch: int) -> bool:
        """Whether ``epoch`` (where training starts) is due an evaluation it has not had: epoch 0, or one a kill cut off."""
        return self.schedule.evaluates(epoch) and (not self.rows or self.rows[-1]["epoch"] != epoch)

    def log_eval(self, row: dict) -> None:
        """Append one evaluation row (it has its ``epoch``) to ``metrics.jsonl``."""
        self.rows.append(row)
        append_jsonl(self.out / "metrics.jsonl", row)

    def checkpoint(self, epoch: int, model: torch.nn.Module, state: dict[str, Tensor]) -> None:
        """After an evaluation at ``epoch``: the model checkpoint when the schedule keeps one, the
        resume state ``state`` (``resume_state(...)``) and a ``running`` summary."""
        if self.schedule.checkpoints(epoch):
            save_checkpoint(self.out, epoch, model, self.config["model"])
        save_resume(self.out, epoch, state)
        self._summary(epoch, "running")

    def diverged(self) -> int:
        """Record that training diverged (``summary.json`` status ``diverged`` at the last good epoch); returns that epoch."""
        last = self.last_epoch
        self._summary(last, "diverged")
        return last

    def interrupted(self, epoch: int, state: dict[str, Tensor]) -> None:
        """Record a Ctrl-C at the end of ``epoch``: the resume state ``state`` unless that epoch's
        evaluation already saved it, and an ``interrupted`` summary."""
        if self.rows[-1]["epoch"] != epoch:
            save_resume(self.out, epoch, state)
        self._summary(epoch, "interrupted")

    def finish(self) -> dict:
        """Record that the run reached its target epochs; returns the ``complete`` summary."""
        return self._summary(self.config["train"]["epochs"], "complete")

    def _summary(self, epochs_done: int, status: str) -> dict:
        self.summary = summarize(self.config, self.rows, epochs_done, status, self.env)
        atomic_write_json(self.out / "summary.json", self.summary)
        return self.summary
