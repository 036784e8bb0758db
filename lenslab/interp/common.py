"""Shared helpers for interp/: errors, index checks, head labels, logit differences, tables (``readout_logits`` is
``training.gradients``'s, re-exported here)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from lenslab.tasks.errors import LenslabError
from lenslab.training.gradients import readout_logits  # noqa: F401 (re-exported: the one definition lives in training)


class InterpError(LenslabError):
    """Bad input to an interpretability function (a layer/head/position out of range, ...)."""


def check_index(name: str, value: int | None, n: int, allow_none: bool = False) -> int | None:
    """``value`` must be an int in ``[0, n)``; else one ``InterpError`` line naming the valid range."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
        raise InterpError(f"{name}={value!r} is out of range: valid {name}s are 0..{n - 1}")
    return value


def check_tokens(model: HookedTransformer, tokens: Tensor, name: str = "tokens") -> Int[Tensor, "batch pos"]:
    """``tokens`` as int64 ``[batch, pos]`` that fit ``model`` (positions <= n_ctx, ids < d_vocab), or an ``InterpError`` naming what does not."""
    if not isinstance(tokens, Tensor) or tokens.ndim != 2 or tokens.dtype not in (torch.int64, torch.int32):
        raise InterpError(f"{name} must be an integer tensor [batch, pos]; got {getattr(tokens, 'shape', type(tokens))}")
    if tokens.shape[1] > model.cfg.n_ctx:
        raise InterpError(f"{name} has {tokens.shape[1]} positions but the model's n_ctx is {model.cfg.n_ctx}")
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= model.cfg.d_vocab):
        raise InterpError(f"{name} holds token ids outside 0..{model.cfg.d_vocab - 1}")
    return tokens.long()


def gather_class(logits: Float[Tensor, "batch k"], cls: Int[Tensor, " batch"]) -> Float[Tensor, " batch"]:
    """``logits[i, cls[i]]`` for every row ``i``."""
    return logits.gather(-1, cls.long()[:, None])[:, 0]


def label_vs_shortcut_diff(
    logits: Float[Tensor, "batch k"], labels: Int[Tensor, " batch"], shortcut: Int[Tensor, " batch"]
) -> Float[Tensor, " batch"]:
    """Logit of the true label minus logit of the shortcut class.

    Where ``label == shortcut`` (shortcut-consistent examples) the two coincide, so we use the
    margin instead: true-label logit minus the largest logit among the *other* classes. In both
    cases a positive value means the model prefers the true label.
    """
    true = gather_class(logits, labels)
    other = logits.clone()
    other.scatter_(-1, labels.long()[:, None], float("-inf"))
    runner_up = other.max(-1).values
    return torch.where(labels == shortcut, true - runner_up, true - gather_class(logits, shortcut))


def head_label(layer: int, head: int) -> str:
    """The one name of attention head ``head`` in layer ``layer``: ``L{layer}H{head}`` (tables, figures, views)."""
    return f"L{layer}H{head}"


def head_names(model: HookedTransformer) -> list[str]:
    """Every head's label (``L0H0``, ``L0H1``, ...), in layer-major order."""
    return [head_label(layer, head) for layer in range(model.cfg.n_layers) for head in range(model.cfg.n_heads)]


def check_scales(scales, error: type[Exception] = InterpError) -> tuple[float, ...]:
    """``scales`` as a tuple of floats, each finite and > 0 (input or weight multipliers); else one ``error`` line."""
    out = tuple(scales)
    if not out or any(isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c <= 0 for c in out):
        raise error(f"scales={scales!r} must be a non-empty list of finite numbers > 0, e.g. (0.5, 1.0, 2.0)")
    return tuple(float(c) for c in out)


def task_numbers(model, n_values: int | None, k: int | None) -> tuple[int, int]:
    """``(n_values, k)``: as given, else from the task a ``Run`` attached to the model it loaded (``model.lenslab_task``)."""
    task = getattr(model, "lenslab_task", None)
    if n_values is None or k is None:
        if task is None or not hasattr(task, "n_values"):
            raise InterpError("this model carries no MPSP task: pass n_values= and k= (or load it with Run.open(path).model())")
        n_values = task.n_values if n_values is None else n_values
        k = task.k if k is None else k
    return n_values, k


class Table(list):
    """A list of dict rows (one labeled record each); ``to_records`` for plotly/pandas/JSON."""

    def to_records(self) -> list[dict]:
        return [dict(r) for r in self]

    def column(self, key: str) -> list:
        return [r.get(key) for r in self]

    def where(self, **match) -> Table:
        return Table(r for r in self if all(r.get(k) == v for k, v in match.items()))

    def to_pandas(self):
        """A DataFrame; integer columns with missing values (``layer``/``head`` of the "none" row) stay
        integers (pandas' nullable ``Int64``), not floats with NaN."""
        import pandas as pd

        records = self.to_records()
        df = pd.DataFrame(records)
        for col in df.columns:
            vals = [r.get(col) for r in records]
            present = [v for v in vals if v is not None]
            if present and len(present) < len(vals) and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
                df[col] = pd.array(vals, dtype="Int64")
        return df

    def __repr__(self) -> str:
        cols = list(dict.fromkeys(k for r in self for k in r))
        return f"Table({len(self)} rows; columns {cols})"

    def _repr_html_(self) -> str:
        """The rows as an HTML table in a notebook (pandas', a TransformerLens dependency), with the row count."""
        return self.to_pandas()._repr_html_() + f"<p>{len(self)} rows</p>"


def subsample(n: int, max_n: int | None, seed: int = 0) -> Int[Tensor, " m"]:
    """Indices of at most ``max_n`` of ``n`` rows (seeded, sorted); all rows when ``max_n`` is None."""
    if max_n is None or n <= max_n:
        return torch.arange(n)
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=g)[:max_n].sort().values


def as_float_list(x: Iterable) -> list[float]:
    """``x`` as a list of Python floats (tensors, arrays and lists alike)."""
    return [float(v) for v in x]
