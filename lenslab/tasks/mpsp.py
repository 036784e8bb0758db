"""MPSP family: label = sum(x) mod k, shortcut = max(x) mod k or x[0] mod k.

Token layout (n_ctx = seq_len + 1)::

    position: 0 .. seq_len-1   seq_len
    token:    x_0 .. x_{n-1}   READOUT (= n_values)

The model reads its answer at the last position (the readout token). Values are
integers in ``0 .. n_values-1``; ties for the maximum are allowed (the shortcut
only needs the max *value*).

Defaults: ``seq_len=5``, ``n_values=16``. The foundation issue guessed seq_len 8; on 2 CPU
cores a 2L model at seq_len 8 learned only the shortcut within 240 epochs, while seq_len 5
showed the paper's two-phase dynamics (``docs/PROBES.md``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from numpy.typing import ArrayLike

from lenslab.tasks.errors import TaskError

LABELS = {"sum2": 2, "sum3": 3}
SHORTCUTS = ("max", "first")


@dataclass(frozen=True)
class MPSPTask:
    """One member of the MPSP family (no data, only the rule)."""

    label: str = "sum2"
    shortcut: str = "max"
    seq_len: int = 5
    n_values: int = 16

    def __post_init__(self) -> None:
        if self.label not in LABELS:
            raise TaskError(f"unknown label {self.label!r}: choose one of {sorted(LABELS)}")
        if self.shortcut not in SHORTCUTS:
            raise TaskError(f"unknown shortcut {self.shortcut!r}: choose one of {list(SHORTCUTS)}")
        if not isinstance(self.seq_len, int) or self.seq_len < 2:
            raise TaskError(f"seq_len={self.seq_len!r} is too short: use an integer >= 2")
        if not isinstance(self.n_values, int) or self.n_values < self.k:
            raise TaskError(f"n_values={self.n_values!r} must be an integer >= k={self.k} so that every class occurs")
        if self.seq_len * math.log2(self.n_values) > 62.5 or self.n_values**self.seq_len > 2**62:  # log first: no huge int
            raise TaskError(
                f"n_values**seq_len = {self.n_values}**{self.seq_len} overflows int64 sequence ids; "
                "use a shorter sequence or fewer values"
            )

    @property
    def k(self) -> int:
        return LABELS[self.label]

    @property
    def n_ctx(self) -> int:
        return self.seq_len + 1

    @property
    def readout_token(self) -> int:
        return self.n_values

    @property
    def d_vocab(self) -> int:
        return self.n_values + 1

    @property
    def n_sequences(self) -> int:
        return self.n_values**self.seq_len

    def to_dict(self) -> dict:
        return asdict(self)

    # -- the rule ---------------------------------------------------------------
    def labels(self, x: np.ndarray) -> np.ndarray:
        """``sum(x) mod k`` for value sequences ``x`` of shape [n, seq_len]."""
        return (x.sum(axis=-1) % self.k).astype(np.int64)

    def shortcuts(self, x: np.ndarray) -> np.ndarray:
        """``max(x) mod k`` or ``x[0] mod k`` for value sequences [n, seq_len]."""
        s = x.max(axis=-1) if self.shortcut == "max" else x[..., 0]
        return (s % self.k).astype(np.int64)

    def tokens(self, x: np.ndarray) -> np.ndarray:
        """Append the readout token: [n, seq_len] values -> [n, n_ctx] tokens."""
        readout = np.full((x.shape[0], 1), self.readout_token, dtype=np.int64)
        return np.concatenate([x.astype(np.int64), readout], axis=1)

    # -- sequence ids (base-n_values integers) ------------------------------------
    def encode(self, x: np.ndarray) -> np.ndarray:
        weights = self.n_values ** np.arange(self.seq_len - 1, -1, -1, dtype=np.int64)
        return (x.astype(np.int64) * weights).sum(axis=-1)

    def decode(self, ids: ArrayLike) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        out = np.empty((ids.shape[0], self.seq_len), dtype=np.int64)
        rem = ids.copy()
        for pos in range(self.seq_len - 1, -1, -1):
            out[:, pos] = rem % self.n_values
            rem //= self.n_values
        return out

    def count_groups(self) -> tuple[int, int]:
        """Exact number of (consistent, anti-shortcut) sequences, by dynamic programming.

        State after each position: (running max or first value, running sum mod k).
        """
        k, v = self.k, self.n_values
        # counts[a, s]: number of prefixes whose feature value is a and sum mod k is s
        counts = np.zeros((v, k), dtype=object)
        for a in range(v):
            counts[a, a % k] = 1
        for _ in range(self.seq_len - 1):
            new = np.zeros((v, k), dtype=object)
            for a in range(v):
                for s in range(k):
                    c = counts[a, s]
                    if c == 0:
                        continue
                    for x in range(v):
                        a2 = max(a, x) if self.shortcut == "max" else a
                        new[a2, (s + x) % k] += c
            counts = new
        consistent = sum(int(counts[a, s]) for a in range(v) for s in range(k) if a % k == s)
        return consistent, self.n_sequences - consistent
