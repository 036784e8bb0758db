"""Seeded element-wise shuffles of a matrix and their inverse (never the global RNG)."""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor


def make_generator(seed: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded with ``seed``."""
    return torch.Generator(device="cpu").manual_seed(int(seed))


def random_permutation(n: int, generator: torch.Generator) -> Int[Tensor, " n"]:
    """A permutation of ``0..n-1`` drawn from ``generator`` (the shuffles of the trap detector)."""
    return torch.randperm(n, generator=generator)


def shuffle(w: Float[Tensor, "n m"], perm: Int[Tensor, " nm"]) -> Float[Tensor, "n m"]:
    """``W_rand.flatten() = W.flatten()[perm]`` (row-major): one permutation of all entries."""
    return w.reshape(-1)[perm].reshape(w.shape)


def unshuffle(w_rand: Float[Tensor, "n m"], perm: Int[Tensor, " nm"]) -> Float[Tensor, "n m"]:
    """The inverse of ``shuffle``: ``unshuffle(shuffle(W, p), p) == W``."""
    flat = torch.empty_like(w_rand.reshape(-1))
    flat[perm] = w_rand.reshape(-1)
    return flat.reshape(w_rand.shape)
