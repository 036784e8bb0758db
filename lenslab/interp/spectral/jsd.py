"""Trap-replacement ablation: how far does replacing one trap move the model's output distribution?

For a trap with rank-1 component C_rand = s·u vᵀ in the shuffled matrix, C = C_rand mapped back
through the inverse permutation, the ablated matrix is

    W' = W − C + ε,   ε_ij ~ N(mean(C), std(C)²) i.i.d. (seeded),

written into a *copy* of the model. On probes x,

    J_k = mean_x JS( softmax(z(x)/T) ‖ softmax(z'(x)/T) ),   JS(P‖Q) = ½KL(P‖M) + ½KL(Q‖M), M = (P+Q)/2,

in nats (so 0 ≤ JS ≤ ln 2). The probes and the logits z depend on the model:

- ``HookedTransformer``: seeded uniform random token sequences of length n_ctx (or tokens you
  pass); z = the logits at the readout (last) position.
- ``HookedMLP`` (paper 2's MNIST MLP): Gaussian inputs x ~ N(0, I) of shape [n, d_in], drawn in
  float64 from ``torch.Generator().manual_seed(seed)`` and cast to the model's dtype (or inputs
  you pass); z = the model's outputs (there is no position).

Null: the same recipe with C_rand replaced by s·u'v'ᵀ for random unit u', v' (same s, same
permutation), ``n_null`` times; a trap is *harmful* when J_k exceeds the null's 95th percentile.

With a labelled ``split`` (test tokens, or an MLP's test inputs ``pixels / 255``) each row also
holds J_k on the split's inputs (``jsd_split``), the ablated model's accuracy there and its change.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from lenslab.interp.spectral.adapter import extract_matrices, from_2d
from lenslab.interp.spectral.shuffle import make_generator
from lenslab.interp.spectral.traps import TrapComponent, detect_traps
from lenslab.training.mlp import HookedMLP

Model = HookedTransformer | HookedMLP


def js_divergence(
    p_logits: Float[Tensor, "batch k"], q_logits: Float[Tensor, "batch k"], temperature: float = 1.0
) -> Float[Tensor, " batch"]:
    """Per-row Jensen–Shannon divergence (natural log) between softmax(p/T) and softmax(q/T)."""
    p = torch.softmax(p_logits.double() / temperature, -1)
    q = torch.softmax(q_logits.double() / temperature, -1)
    m = (p + q) / 2
    kl = lambda a: (torch.xlogy(a, a) - torch.xlogy(a, m)).sum(-1)
    return (0.5 * kl(p) + 0.5 * kl(q)).clamp_min(0.0)


def random_probes(model: HookedTransformer, n: int = 256, seed: int = 0) -> Int[Tensor, "n pos"]:
    """``n`` token sequences of length n_ctx, uniform over the vocabulary (seeded)."""
    return torch.randint(0, model.cfg.d_vocab, (n, model.cfg.n_ctx), generator=make_generator(seed))


def gaussian_probes(model: HookedMLP, n: int = 256, seed: int = 0) -> Float[Tensor, "n d_in"]:
    """``n`` inputs x ~ N(0, I) of the MLP's width d_in: drawn in float64 from ``make_generator(seed)``, in the model's dtype."""
    x = torch.randn(n, model.cfg["d_in"], generator=make_generator(seed), dtype=torch.float64)
    return x.to(model.dtype)


def default_probes(model: Model, n: int = 256, seed: int = 0) -> Int[Tensor, "n pos"] | Float[Tensor, "n d_in"]:
    """The ablation's probes for ``model``: Gaussian inputs for a ``HookedMLP``, random tokens otherwise."""
    return gaussian_probes(model, n, seed) if isinstance(model, HookedMLP) else random_probes(model, n, seed)


def replacement(w: Float[Tensor, "n m"], comp: TrapComponent, generator: torch.Generator) -> Float[Tensor, "n m"]:
    """W − C + ε with ε i.i.d. Gaussian matched to C's mean and std (see the module docstring)."""
    c = comp.in_original().to(w.dtype)
    noise = c.mean() + c.std() * torch.randn(c.shape, generator=generator, dtype=w.dtype)
    return w - c + noise


def null_component(comp: TrapComponent, generator: torch.Generator) -> TrapComponent:
    """A random rank-1 component of the same size: random unit u', v', same s and permutation."""
    u = torch.randn(comp.u.shape, generator=generator, dtype=comp.u.dtype)
    v = torch.randn(comp.v.shape, generator=generator, dtype=comp.v.dtype)
    return TrapComponent(s=comp.s, u=u / u.norm(), v=v / v.norm(), perm=comp.perm, shape=comp.shape)


@dataclass
class JSDRow:
    """One trap's replacement ablation: J_k on the probes, its null (random rank-1 replacements), whether it is harmful, and the accuracy change on a split when one was given."""

    matrix: str
    trap: int  # index among this matrix's traps, largest first
    eigenvalue: float
    jsd: float
    null_p95: float
    null_mean: float
    harmful: bool
    accuracy: float | None = None
    accuracy_change: float | None = None
    probe: str = "tokens"  # what J_k was measured on: "tokens" (random), "gaussian" (MLP inputs N(0, I)) or "given"
    jsd_split: float | None = None  # J_k on the split's inputs (test tokens / test images), when a split is given

    def to_record(self) -> dict:
        return asdict(self)


def _logits(model: Model, inputs: Tensor, batch: int = 4096) -> Float[Tensor, "n k"]:
    """Readout-position logits of a transformer; a ``HookedMLP``'s outputs (inputs cast to its dtype)."""
    with torch.no_grad():
        if isinstance(model, HookedMLP):
            inputs = inputs.to(model.dtype)
            return torch.cat([model(inputs[i : i + batch]) for i in range(0, len(inputs), batch)])
        return torch.cat([model(inputs[i : i + batch])[:, -1] for i in range(0, len(inputs), batch)])


def trap_jsd(
    model: Model,
    mode: str = "robust",
    seed: int = 0,
    n_probes: int = 256,
    n_null: int = 20,
    probes: Int[Tensor, "n pos"] | Float[Tensor, "n d_in"] | None = None,
    split: tuple[Tensor, Tensor] | None = None,
    temperature: float = 1.0,
    matrices: list[str] | None = None,
) -> list[JSDRow]:
    """J_k for every trap of every matrix (optionally only ``matrices``); see the module docstring.

    ``probes``: default ``default_probes(model, n_probes, seed)`` (random tokens; Gaussian inputs
    for a ``HookedMLP``). ``split = (inputs, labels)`` (tokens, or an MLP's float inputs) adds J_k on
    those inputs, the accuracy (argmax of the logits) and its change.
    """
    work = copy.deepcopy(model).eval()
    params = dict(work.named_parameters())
    mats = extract_matrices(work)
    probe_kind = "given" if probes is not None else "gaussian" if isinstance(work, HookedMLP) else "tokens"
    probes = default_probes(work, n_probes, seed) if probes is None else probes
    base = _logits(work, probes)
    base_acc = base_split = None
    if split is not None:
        base_split = _logits(work, split[0])
        base_acc = float((base_split.argmax(-1) == split[1]).double().mean())
    gen = make_generator(seed + 1)
    rows = []
    for ref in mats.refs:
        if matrices is not None and ref.name not in matrices:
            continue
        w = mats.matrices[ref.name].detach().double()
        _, comps = detect_traps(w, ref.name, mode=mode, seed=seed, return_components=True)
        if not comps:
            continue
        param = params[ref.key]
        original = param.detach().clone()

        def score(new_w, param=param, ref=ref, original=original, with_split=True):
            with torch.no_grad():
                param.copy_(from_2d(new_w, ref, original))
            j = float(js_divergence(base, _logits(work, probes), temperature).mean())
            acc = j_split = None
            if split is not None and with_split:
                z = _logits(work, split[0])
                acc = float((z.argmax(-1) == split[1]).double().mean())
                j_split = float(js_divergence(base_split, z, temperature).mean())
            with torch.no_grad():
                param.copy_(original)
            return j, acc, j_split

        for k, comp in enumerate(comps):
            j, acc, j_split = score(replacement(w, comp, gen))
            null = [score(replacement(w, null_component(comp, gen), gen), with_split=False)[0] for _ in range(n_null)]
            p95 = float(np.percentile(null, 95)) if null else math.nan
            rows.append(
                JSDRow(
                    matrix=ref.name,
                    trap=k,
                    eigenvalue=comp.s**2 / max(w.shape),
                    jsd=j,
                    null_p95=p95,
                    null_mean=float(np.mean(null)) if null else math.nan,
                    harmful=bool(j > p95),
                    accuracy=acc,
                    accuracy_change=None if acc is None else acc - base_acc,
                    probe=probe_kind,
                    jsd_split=j_split,
                )
            )
    return rows
