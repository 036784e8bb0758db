"""Exact-ratio, disjoint, seeded MPSP splits and counterfactual pairs.

- ``train``: ``n_train`` sequences, exactly ``round_half_up(ratio * n_train)`` of them
  shortcut-consistent (shortcut == label), the rest anti-shortcut; shuffled.
- ``validation``: ``n_val`` consistent sequences (r = 1): measures the shortcut.
- ``adv``: ``n_adv`` anti-shortcut sequences (r = 0): measures the true rule.
- ``counterfactual``: one partner per validation row (same order), an anti-shortcut
  sequence that differs from it in as few value tokens as possible (usually one), and that is
  never a training sequence. ``(validation, counterfactual)`` are the pairs for patching.

No sequence appears in two of train / validation / adv. Everything is a pure function of the
arguments: the same seed gives the same tensors.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from lenslab.tasks.errors import TaskError
from lenslab.tasks.mpsp import MPSPTask

ENUMERATE_LIMIT = 1 << 22  # enumerate the whole sequence space when it is this small


def n_consistent(ratio: float, n_train: int) -> int:
    """Number of shortcut-consistent train examples: ``round(ratio * n_train)``, halves up."""
    return math.floor(ratio * n_train + 0.5)


def check_ratio(ratio: Any) -> float:  # any raw value (JSON, CLI): refused with a readable TaskError
    """``ratio`` as a float, or one ``TaskError`` line: the one ratio check (``training.spec.MPSPSpec.ratio`` uses it)."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio):
        raise TaskError(f"ratio={ratio!r} is not a number in [0, 1]")
    if not 0.0 <= ratio <= 1.0:
        raise TaskError(f"ratio={ratio} is outside [0, 1]: it is the fraction of shortcut-consistent train examples")
    return float(ratio)


def _check_size(name: str, n: int, minimum: int = 1) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < minimum:
        raise TaskError(f"{name}={n!r} must be an integer >= {minimum}")


def _sample_groups(task: MPSPTask, need_c: int, need_a: int, rng: np.random.Generator):
    """Distinct sequence ids: ``need_c`` consistent and ``need_a`` anti-shortcut, in random order."""
    if task.n_sequences <= ENUMERATE_LIMIT:
        ids = np.arange(task.n_sequences, dtype=np.int64)
        x = task.decode(ids)
        consistent = task.labels(x) == task.shortcuts(x)
        pool_c, pool_a = ids[consistent], ids[~consistent]
        return rng.permutation(pool_c)[:need_c], rng.permutation(pool_a)[:need_a]
    got_c: list[np.ndarray] = []
    got_a: list[np.ndarray] = []
    seen: set[int] = set()
    n_c = n_a = 0
    while n_c < need_c or n_a < need_a:
        batch = rng.integers(0, task.n_sequences, size=max(4096, 2 * (need_c + need_a)), dtype=np.int64)
        _, first = np.unique(batch, return_index=True)
        batch = batch[np.sort(first)]
        batch = np.array([i for i in batch.tolist() if i not in seen], dtype=np.int64)
        seen.update(batch.tolist())
        x = task.decode(batch)
        consistent = task.labels(x) == task.shortcuts(x)
        c, a = batch[consistent][: need_c - n_c], batch[~consistent][: need_a - n_a]
        got_c.append(c)
        got_a.append(a)
        n_c += len(c)
        n_a += len(a)
    return np.concatenate(got_c), np.concatenate(got_a)


def _pack(task: MPSPTask, name: str, x: np.ndarray) -> dict[str, torch.Tensor]:
    return {
        f"{name}_tokens": torch.from_numpy(task.tokens(x)),
        f"{name}_labels": torch.from_numpy(task.labels(x)),
        f"{name}_shortcut": torch.from_numpy(task.shortcuts(x)),
    }


def check_split_sizes(task: MPSPTask, ratio: float, n_train: int, n_val: int, n_adv: int) -> None:
    """Refuse split sizes that need more distinct sequences than the task has, naming the largest n_train that fits."""
    have_c, have_a = task.count_groups()

    def fits(n: int) -> bool:
        c = n_consistent(ratio, n)
        return c + n_val <= have_c and n - c + n_adv <= have_a

    if fits(n_train):
        return
    lo, hi = 0, n_train  # fits(n) is monotone in n: bisect for the largest train split that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    c = n_consistent(ratio, n_train)
    raise TaskError(
        f"the splits need {c + n_val:,} shortcut-consistent and {n_train - c + n_adv:,} anti-shortcut distinct sequences, "
        f"but seq_len={task.seq_len}, n_values={task.n_values} allow only {have_c:,} and {have_a:,}; the largest train split "
        f"that fits beside n_val={n_val:,} and n_adv={n_adv:,} at r={ratio:g} is n_train={lo:,}: "
        "lower n_train/n_val/n_adv or raise seq_len/n_values"
    )


def make_mpsp_splits(
    task: MPSPTask,
    ratio: float,
    n_train: int = 16_384,
    n_val: int = 2_048,
    n_adv: int = 2_048,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Build train / validation / adv / counterfactual splits (see the module docstring).

    Returns ``{"<split>_tokens": int64 [n, n_ctx], "<split>_labels": int64 [n],
    "<split>_shortcut": int64 [n]}`` for every split.
    """
    ratio = check_ratio(ratio)
    _check_size("n_train", n_train)
    _check_size("n_val", n_val)
    _check_size("n_adv", n_adv)
    check_split_sizes(task, ratio, n_train, n_val, n_adv)
    c_train = n_consistent(ratio, n_train)
    a_train = n_train - c_train
    need_c, need_a = c_train + n_val, a_train + n_adv
    rng = np.random.default_rng(seed)
    ids_c, ids_a = _sample_groups(task, need_c, need_a, rng)
    train_ids = rng.permutation(np.concatenate([ids_c[:c_train], ids_a[:a_train]]))
    val_ids, adv_ids = ids_c[c_train:], ids_a[a_train:]
    out: dict[str, torch.Tensor] = {}
    out.update(_pack(task, "train", task.decode(train_ids)))
    out.update(_pack(task, "validation", task.decode(val_ids)))
    out.update(_pack(task, "adv", task.decode(adv_ids)))
    cf = counterfactual_partners(task, task.decode(val_ids), forbidden=train_ids, rng=rng)
    out.update(_pack(task, "counterfactual", cf))
    return out


def counterfactual_partners(
    task: MPSPTask,
    x: np.ndarray,
    forbidden: np.ndarray | None = None,
    rng: np.random.Generator | None = None,
    max_random_tries: int = 4096,
) -> np.ndarray:
    """For each consistent value sequence in ``x`` [n, seq_len], an anti-shortcut partner.

    The partner differs in the fewest positions found: every single-position edit is tried
    (exhaustively); if none is anti-shortcut, random edits of 2, 3, ... positions are tried.
    Among the valid edits of the minimal size one is chosen at random (seeded).
    Sequences in ``forbidden`` (ids, e.g. the train split) are never chosen.
    """
    rng = rng if rng is not None else np.random.default_rng(0)
    forbidden_set = np.asarray(forbidden if forbidden is not None else [], dtype=np.int64)
    n, L = x.shape
    v = task.n_values
    # all single edits: [n, L, v] candidate sequences
    cand = np.repeat(x[:, None, None, :], L, axis=1).repeat(v, axis=2)  # [n, L, v, L]
    pos = np.arange(L)
    cand[:, pos, :, pos] = np.arange(v)[None, None, :]
    cand = cand.reshape(n, L * v, L)
    flat = cand.reshape(-1, L)
    ok = task.labels(flat) != task.shortcuts(flat)
    if forbidden_set.size:
        ok &= ~np.isin(task.encode(flat), forbidden_set)
    ok = ok.reshape(n, L * v)
    out = np.empty_like(x)
    for i in range(n):
        choices = np.flatnonzero(ok[i])
        if choices.size:
            out[i] = cand[i, rng.choice(choices)]
            continue
        out[i] = _random_partner(task, x[i], forbidden_set, rng, max_random_tries)
    return out


def _random_partner(task, row, forbidden, rng, tries) -> np.ndarray:
    L = row.shape[0]
    for d in range(2, L + 1):
        for _ in range(tries):
            y = row.copy()
            where = rng.choice(L, size=d, replace=False)
            y[where] = rng.integers(0, task.n_values, size=d)
            if (y != row).sum() != d:
                continue
            if task.labels(y[None])[0] != task.shortcuts(y[None])[0] and task.encode(y[None])[0] not in forbidden:
                return y
    raise TaskError(f"no anti-shortcut partner found for sequence {row.tolist()}")
