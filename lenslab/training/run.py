"""Open a run directory (or one checkpoint inside it) as HookedTransformers plus their splits.

run = Run.open("runs/demo")          # or Run.open("runs/demo/checkpoints/40.safetensors")
model = run.model()                  # last checkpoint (or the one the path named)
for epoch, model in run.iter_models():   # every checkpoint (or epochs=[...]), one model object reused
    ...
run.splits["adv_tokens"], run.metrics, run.summary
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
from transformer_lens import HookedTransformer

from lenslab.tasks import ModAddTask, MPSPTask
from lenslab.tasks.mnist import MNISTTask
from lenslab.training.errors import RunError
from lenslab.training.mlp import HookedMLP
from lenslab.training.presets import build_model, torch_dtype
from lenslab.training.runio import (
    CKPT_RE,
    list_checkpoints,
    load_checkpoint_into,
    load_run_splits,
    read_config,
    read_jsonl,
    read_summary,
    refuse_pickle,
)


def task_from_config(task_cfg: dict) -> MPSPTask | ModAddTask | MNISTTask:
    """The task object described by ``config["task"]``."""
    name = task_cfg.get("name")
    if name == "mpsp":
        return MPSPTask(
            label=task_cfg.get("label"),
            shortcut=task_cfg.get("shortcut"),
            seq_len=task_cfg.get("seq_len"),
            n_values=task_cfg.get("n_values"),
        )
    if name == "modadd":
        return ModAddTask(p=task_cfg.get("p"), train_frac=task_cfg.get("train_frac"))
    if name == "mnist":
        return MNISTTask(n_per_class=task_cfg.get("n_per_class"), n_classes=task_cfg.get("n_classes"), loss=task_cfg.get("loss"))
    raise RunError(f"config.json: unknown task name {name!r}; expected 'mpsp', 'modadd' or 'mnist'")


class Split(NamedTuple):
    """One labelled split of a run: ``(tokens, labels, shortcut)`` (``shortcut`` None where the task has none;
    an image task's ``tokens`` are its model inputs, pixels / 255). A tuple, so ``evaluate_ablations`` and the
    patching functions take it as they take a hand-built ``(tokens, labels, shortcut)``."""

    tokens: torch.Tensor
    labels: torch.Tensor
    shortcut: torch.Tensor | None


@dataclass
class Run:
    """A run directory, opened read-only.

    ``config`` (its config.json as a dict), ``task`` (the task object), ``metrics`` (every evaluation row of
    metrics.jsonl), ``summary`` (summary.json, None while training), ``splits`` (every tensor of
    splits.safetensors by name) and ``split(name)`` (one split as a ``Split``); ``model(epoch)`` and
    ``iter_models()`` load checkpoints.
    """

    path: Path
    config: dict
    focus: Path | None = None  # the checkpoint the user pointed at, if any
    _splits: dict | None = field(default=None, repr=False)

    @classmethod
    def open(cls, path: str | Path) -> Run:
        """A run directory, or a checkpoint file inside ``RUN/checkpoints/``."""
        path = Path(path)
        if not path.exists():
            raise RunError(f"{path}: no such file or directory")
        focus = None
        if path.is_file():
            refuse_pickle(path)
            focus = path
            run_dir = path.parent.parent if path.parent.name == "checkpoints" else path.parent
            if not (run_dir / "config.json").is_file():
                raise RunError(f"{path}: a checkpoint outside a run directory (no config.json in {run_dir})")
        else:
            run_dir = path
        return cls(path=run_dir, config=read_config(run_dir), focus=focus)

    # -- contents --------------------------------------------------------------------
    @property
    def task(self) -> MPSPTask | ModAddTask | MNISTTask:
        return task_from_config(self.config["task"])

    @property
    def is_mpsp(self) -> bool:
        return self.config["task"].get("name") == "mpsp"

    @property
    def splits(self) -> dict[str, torch.Tensor]:
        if self._splits is None:
            m = self.config["model"]
            self._splits = load_run_splits(self.path, m)
        return self._splits

    def split(self, name: str) -> Split:
        """The split ``name`` (``split_names()`` lists them) as ``Split(tokens, labels, shortcut)``."""
        names = self.split_names()
        if name not in names:
            raise RunError(f"{self.path}: no split {name!r}; this run has {names}")
        sp = self.splits
        if self.is_mnist:
            from lenslab.tasks.mnist import pixels_to_inputs

            return Split(pixels_to_inputs(sp[f"{name}_images"], self.dtype), sp[f"{name}_labels"], None)
        return Split(sp[f"{name}_tokens"], sp[f"{name}_labels"], sp.get(f"{name}_shortcut"))

    def eval_splits(self) -> dict[str, Split]:
        """Every split that has a shortcut, by name: what ``evaluate_ablations`` takes (MPSP: train, validation, adv, ...)."""
        out = {n: self.split(n) for n in self.split_names()}
        return {n: s for n, s in out.items() if s.shortcut is not None}

    def split_names(self) -> list[str]:
        part = "_images" if self.is_mnist else "_tokens"
        return [k[: -len(part)] for k in self.splits if k.endswith(part)]

    @property
    def is_mnist(self) -> bool:
        return self.config["task"].get("name") == "mnist"

    @property
    def metrics(self) -> list[dict]:
        return read_jsonl(self.path / "metrics.jsonl")

    @property
    def summary(self) -> dict | None:
        return read_summary(self.path)

    def checkpoints(self) -> list[tuple[int, Path]]:
        return list_checkpoints(self.path)

    def epochs(self) -> list[int]:
        return [e for e, _ in self.checkpoints()]

    # -- models ----------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        """The precision the run trained (and checkpointed) in: ``config["train"]["dtype"]``."""
        return torch_dtype(self.config["train"])

    def new_model(self, device: str = "cpu") -> HookedTransformer | HookedMLP:
        """A fresh model of this run's architecture, in the run's dtype. CPU by default (not TL's
        "cuda when available"): the analysis tools build their inputs on the CPU; pass ``device="cuda"`` to move it."""
        return build_model(self.config["model"], seed=0, device=device, dtype=self.dtype)

    def checkpoint_file(self, epoch: int | None = None) -> Path:
        """The checkpoint file of ``epoch`` (default: the focused or the last checkpoint)."""
        ckpts = self.checkpoints()
        if epoch is None:
            if self.focus is not None:
                return self.focus
            if not ckpts:
                raise RunError(f"{self.path}: the run has no checkpoints yet")
            return ckpts[-1][1]
        for e, p in ckpts:
            if e == epoch:
                return p
        raise RunError(f"{self.path}: no checkpoint for epoch {epoch}; available: {[e for e, _ in ckpts]}")

    def model(self, epoch: int | None = None, device: str = "cpu") -> HookedTransformer | HookedMLP:
        """The model at ``epoch`` (default: the focused or the last checkpoint), in eval mode."""
        model = self.new_model(device)
        load_checkpoint_into(model, self.checkpoint_file(epoch), self.config["model"])
        model.lenslab_task = self.task  # what the analysis functions read n_values / k from when not given
        return model.eval()

    def describe(self) -> dict:
        """Name, task, model, epochs and outcome in a few fields (the reprs show these)."""
        t, m = self.config["task"], self.config["model"]
        task = " ".join(f"{k}={v}" for k, v in t.items() if k != "seed" and not isinstance(v, (dict, list)))
        if m.get("arch") == "mlp":
            model = f"MLP {'-'.join(str(d) for d in [m['d_in'], *[m['d_hidden']] * (m['n_layers'] - 1), m['d_out']])}"
        else:
            model = f"{m.get('n_layers')}L {m.get('n_heads')}H d_model {m.get('d_model')}"
        epochs = self.epochs()
        s = self.summary or {}
        outcome = {k: s[k] for k in ("generalized", "outcome", "test_acc", "adv_acc") if k in s}
        metrics = self.metrics if (self.path / "metrics.jsonl").is_file() else []
        last = metrics[-1] if metrics else {}
        accs = {k: v for k, v in last.items() if k.endswith("_acc")}
        return {
            "name": self.path.name,
            "path": str(self.path),
            "task": task,
            "model": model,
            "dtype": str(self.dtype).replace("torch.", ""),
            "checkpoints": len(epochs),
            "epochs": f"{epochs[0]}..{epochs[-1]}" if epochs else "none yet",
            **outcome,
            **{f"last {k}": round(v, 4) for k, v in accs.items() if isinstance(v, float)},
        }

    def __repr__(self) -> str:
        d = self.describe()
        return (
            f"Run({d['path']!r}: {d['task']}; {d['model']}, {d['dtype']}; {d['checkpoints']} checkpoints, epochs {d['epochs']})"
        )

    def _repr_html_(self) -> str:
        import html

        rows = "".join(
            f"<tr><th style='text-align:left'>{html.escape(str(k))}</th><td style='text-align:left'>{html.escape(str(v))}</td></tr>"
            for k, v in self.describe().items()
        )
        return f"<div class='lenslab-run'><b>lenslab Run</b><table>{rows}</table></div>"

    def focus_epoch(self) -> int | None:
        if self.focus is None:
            return None
        m = CKPT_RE.match(self.focus.name)
        return int(m.group(1)) if m else None

    def iter_models(
        self, device: str = "cpu", epochs: Collection[int] | None = None
    ) -> Iterator[tuple[int, HookedTransformer | HookedMLP]]:
        """``(epoch, model)`` over every checkpoint (or those of ``epochs``) in order; one model object, reloaded in place."""
        ckpts = self.checkpoints()
        if epochs is not None:
            wanted = set(epochs)
            missing = sorted(wanted - {e for e, _ in ckpts})
            if missing:
                raise RunError(f"{self.path}: no checkpoint for epoch(s) {missing[:5]}; available: {[e for e, _ in ckpts]}")
            ckpts = [(e, p) for e, p in ckpts if e in wanted]
        model = self.new_model(device).eval()
        model.lenslab_task = self.task
        for epoch, path in ckpts:
            load_checkpoint_into(model, path, self.config["model"])
            yield epoch, model


def open_run(path: str | Path) -> Run:
    """Shorthand for ``Run.open``."""
    return Run.open(path)
