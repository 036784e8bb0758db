"""Modular addition: tokens ``a b =``, label ``(a + b) mod p`` (the grokking task).

Token ids: ``0 .. p-1`` are the numbers, ``p`` is ``=``; vocab p+1, output classes p, n_ctx 3.
The split is a seeded random ``train_frac`` of all p² pairs; the test split is the rest.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from lenslab.tasks.errors import TaskError


@dataclass(frozen=True)
class ModAddTask:
    """Modular addition ``a b = -> (a + b) mod p`` over every pair, ``train_frac`` of them in the train split."""

    p: int = 113
    train_frac: float = 0.3

    def __post_init__(self) -> None:
        if not isinstance(self.p, int) or self.p < 2:
            raise TaskError(f"p={self.p!r} must be an integer >= 2")
        if self.p > 4096:
            raise TaskError(f"p={self.p} would make {self.p**2:,} pairs; use p <= 4096")
        f = self.train_frac
        if not isinstance(f, (int, float)) or not (0.0 < f < 1.0):  # NaN fails the comparison
            raise TaskError(f"train_frac={f!r} must lie strictly between 0 and 1")
        if self.n_train < 1 or self.n_train >= self.p**2:
            raise TaskError(f"train_frac={f} leaves an empty train or test split for p={self.p}")

    n_ctx = 3

    @property
    def n_train(self) -> int:
        """Train pairs: round(train_frac · p²)."""
        return round(self.train_frac * self.p**2)

    @property
    def d_vocab(self) -> int:
        return self.p + 1

    @property
    def d_vocab_out(self) -> int:
        return self.p

    def to_dict(self) -> dict:
        return asdict(self)


def make_modadd_splits(task: ModAddTask, seed: int = 0) -> dict[str, torch.Tensor]:
    """All p² pairs, shuffled with ``seed``; the first round(train_frac·p²) are train."""
    p = task.p
    a, b = np.meshgrid(np.arange(p), np.arange(p), indexing="ij")
    a, b = a.reshape(-1), b.reshape(-1)
    tokens = np.stack([a, b, np.full_like(a, p)], axis=1).astype(np.int64)
    labels = ((a + b) % p).astype(np.int64)
    perm = np.random.default_rng(seed).permutation(p * p)
    out = {}
    for name, idx in (("train", perm[: task.n_train]), ("test", perm[task.n_train :])):
        out[f"{name}_tokens"] = torch.from_numpy(tokens[idx].copy())
        out[f"{name}_labels"] = torch.from_numpy(labels[idx].copy())
    return out
