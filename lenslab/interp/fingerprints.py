"""Per-head circuit fingerprints, from weights alone and from activations on a split.

Token layout as in ``tasks.mpsp``: value tokens ``0..n_values-1`` at positions
``0..n_ctx-2``, the readout token at the last position; ``k`` classes.

For head (l, h), with the readout position as the query:

- ``qk_rho`` — Spearman ρ between a key's token value ``v`` and the attention score
  (pre-softmax, after the 1/√d_head scale) the readout query gives that key, over all
  value-token keys. +1: the head ranks keys by magnitude (the max-shortcut circuit).
- ``pos0_mass`` — attention probability from the readout query to position 0, averaged over
  sequences. A mass in [0, 1], not a ρ (the first-element shortcut circuit has it near 1).
- ``ov_parity_rho`` — Spearman ρ, over all (key, class c) pairs, between the indicator
  ``1[v mod k == c]`` and the head's direct contribution to logit c if it attended fully to
  that key: ``value(key) W_O``, centred over d_model, times the final LayerNorm weight (and,
  from activations, divided by the cached final LN scale), times ``W_U``, centred over classes.
  +1 means the head writes the key's own class (a parity-encoding OV circuit). With two
  classes and a continuous contribution the largest possible value is √3/2 ≈ 0.87 (a binary
  indicator against distinct ranks); it reaches 1 only when the contribution takes two values.

Weights-only mode ("virtual circuits"): the residual at key position j holding token v is
approximated by its embedding ``W_E[v] + W_pos[j]`` and passed through the head's ``ln1``
exactly. For layer 0 this is the model's actual residual, so the numbers are exact functions
of (v, j) (averaged uniformly over the value grid rather than over the data). For layers ≥ 1
it is the **direct path through the embeddings**: contributions of earlier layers to the
residual are ignored. QK and OV stay factored (``FactoredMatrix``; biases folded in by
appending a constant 1 to the residual). ``pos0_mass`` from weights is the mean over uniformly
random value sequences (all of them when there are ≤ 4096, else 2048 seeded samples). The final
LayerNorm's per-example scale is dropped in weights mode (its centring and weight are kept).

A ρ of a constant input is undefined; we report 0.0 for it (no monotone relation).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch
from jaxtyping import Float, Int
from scipy.stats import spearmanr
from torch import Tensor
from transformer_lens import FactoredMatrix, HookedTransformer
from transformer_lens import utilities as utils  # "utils" is deprecated (removed in TL 4)

from lenslab.interp.common import InterpError, Table, check_index, check_tokens, head_label, task_numbers

FINGERPRINTS = ("qk_rho", "pos0_mass", "ov_parity_rho")


def rho(x, y) -> float:
    """Spearman ρ of two 1-D arrays; 0.0 when either is constant."""
    x, y = np.asarray(x, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
    if x.size < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return 0.0
    r = spearmanr(x, y).statistic
    return 0.0 if not math.isfinite(r) else float(r)


def _ln(module, x: Float[Tensor, "n d_model"]) -> Float[Tensor, "n d_model"]:
    return module(x[None])[0]


def _augment(x: Float[Tensor, "n d"]) -> Float[Tensor, "n d_plus_1"]:
    return torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype, device=x.device)], dim=1)


def qk_circuit(model: HookedTransformer, layer: int, head: int) -> FactoredMatrix:
    """``[W_Q; b_Q] [W_K; b_K]ᵀ / attn_scale`` as a (d_model+1)² FactoredMatrix (bias row last)."""
    attn = model.blocks[layer].attn
    q = torch.cat([attn.W_Q[head], attn.b_Q[head][None]]) / attn.attn_scale
    k = torch.cat([attn.W_K[head], attn.b_K[head][None]])
    return FactoredMatrix(q, k.T)


def ov_unembed_circuit(model: HookedTransformer, layer: int, head: int) -> FactoredMatrix:
    """``[W_V; b_V] W_O · C · diag(w_ln_final) · W_U`` as a (d_model+1) × k FactoredMatrix (C centres d_model)."""
    attn = model.blocks[layer].attn
    v = torch.cat([attn.W_V[head], attn.b_V[head][None]])
    return FactoredMatrix(v, attn.W_O[head] @ _final_ln_linear(model) @ model.W_U)


def _final_ln_linear(model: HookedTransformer) -> Float[Tensor, "d_model d_model"]:
    """The linear part of the final LayerNorm with its scale dropped: centring, then its weight."""
    d, device = model.cfg.d_model, model.W_U.device
    norm = model.cfg.normalization_type
    if norm is None:
        return torch.eye(d, device=device)
    center = torch.eye(d, device=device) - 1.0 / d
    if norm in ("LN",) and hasattr(model.ln_final, "w"):
        return center @ torch.diag(model.ln_final.w)
    return center


def _classes_centered(c: Float[Tensor, "n k"]) -> Float[Tensor, "n k"]:
    return c - c.mean(-1, keepdim=True)


def _parity_rho(values: Int[Tensor, " n"], contrib: Float[Tensor, "n k"], k: int) -> float:
    own = (values[:, None].cpu() % k == torch.arange(k)[None]).float()
    return rho(own.numpy(), _classes_centered(contrib).cpu().numpy())


def _check_head(model: HookedTransformer, layer: int, head: int) -> None:
    check_index("layer", layer, model.cfg.n_layers)
    check_index("head", head, model.cfg.n_heads)


def weight_fingerprints(
    model: HookedTransformer, n_values: int | None = None, k: int | None = None, readout_token: int | None = None, seed: int = 0
) -> Table:
    """One row per head from the weights alone (see the module docstring for the approximation).

    ``n_values`` and ``k`` default to the task of the run the model came from (``Run.model()`` attaches it)."""
    n_values, k = task_numbers(model, n_values, k)
    n_ctx = model.cfg.n_ctx
    readout_token = n_values if readout_token is None else readout_token
    check_index("readout_token", readout_token, model.cfg.d_vocab)
    if n_values > model.cfg.d_vocab or n_values < k:
        raise InterpError(f"n_values={n_values} must be in [{k}, {model.cfg.d_vocab}] for this model")
    seq_len = n_ctx - 1
    vals = torch.arange(n_values).repeat(seq_len)  # key grid: value-major within each position
    poss = torch.arange(seq_len).repeat_interleave(n_values)
    with torch.no_grad():
        keys = model.W_E[vals] + model.W_pos[poss]  # [n_keys, d_model]
        query = (model.W_E[readout_token] + model.W_pos[seq_len])[None]
        seqs = _value_sequences(n_values, seq_len, seed)
        rows = Table()
        for layer in range(model.cfg.n_layers):
            ln1 = model.blocks[layer].ln1
            key_in = _augment(_ln(ln1, torch.cat([keys, query])))
            q_in = key_in[-1:]
            for head in range(model.cfg.n_heads):
                qk = qk_circuit(model, layer, head)
                scores = (q_in @ qk @ key_in.T).AB[0]  # the factored product, multiplied out for 1 query
                grid = scores[:-1].reshape(seq_len, n_values)  # [pos, value]
                per_seq = torch.cat([grid[torch.arange(seq_len)[None], seqs], scores[-1].expand(len(seqs), 1)], dim=1)
                pos0 = torch.softmax(per_seq, -1)[:, 0].mean()
                contrib = (key_in[:-1] @ ov_unembed_circuit(model, layer, head)).AB  # [n_keys, k]
                rows.append(
                    {
                        "layer": layer,
                        "head": head,
                        "head_name": head_label(layer, head),
                        "source": "weights",
                        "qk_rho": rho(vals.numpy(), scores[:-1].cpu().numpy()),
                        "pos0_mass": float(pos0),
                        "ov_parity_rho": _parity_rho(vals, contrib, k),
                    }
                )
    return rows


def _value_sequences(n_values: int, seq_len: int, seed: int, limit: int = 4096, n_samples: int = 2048) -> Int[Tensor, "n seq"]:
    if n_values**seq_len <= limit:
        return torch.tensor(list(itertools.product(range(n_values), repeat=seq_len)), dtype=torch.long)
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n_values, (n_samples, seq_len), generator=g)


def activation_fingerprints(model: HookedTransformer, tokens: Int[Tensor, "batch pos"], k: int | None = None) -> Table:
    """One row per head from activations on ``tokens`` (readout query = last position).

    Key positions are every position before the readout; their token ids are the values. ``k`` defaults to
    the task of the run the model came from.
    """
    if k is None:
        _, k = task_numbers(model, None, None)
    tokens = check_tokens(model, tokens)
    n_ctx = tokens.shape[1]
    names = {utils.get_act_name(n, layer) for layer in range(model.cfg.n_layers) for n in ("attn_scores", "pattern", "v")}
    names.add("ln_final.hook_scale")
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
        key_vals = tokens[:, : n_ctx - 1]
        final_lin = _final_ln_linear(model) @ model.W_U  # [d_model, k]
        scale = (
            cache["ln_final.hook_scale"][:, -1]
            if "ln_final.hook_scale" in cache.cache_dict
            else torch.ones(len(tokens), 1, device=model.W_U.device)
        )
        rows = Table()
        for layer in range(model.cfg.n_layers):
            scores = cache[utils.get_act_name("attn_scores", layer)][:, :, -1, : n_ctx - 1]  # [b, head, key]
            pattern = cache[utils.get_act_name("pattern", layer)][:, :, -1, 0]  # [b, head]
            v = cache[utils.get_act_name("v", layer)][:, : n_ctx - 1]  # [b, key, head, d_head]
            W_O = model.blocks[layer].attn.W_O
            for head in range(model.cfg.n_heads):
                contrib = (v[:, :, head] @ W_O[head] @ final_lin) / scale[:, None]  # [b, key, k]
                rows.append(
                    {
                        "layer": layer,
                        "head": head,
                        "head_name": head_label(layer, head),
                        "source": "activations",
                        "qk_rho": rho(key_vals.cpu().numpy(), scores[:, head].cpu().numpy()),
                        "pos0_mass": float(pattern[:, head].mean()),
                        "ov_parity_rho": _parity_rho(key_vals.reshape(-1), contrib.reshape(-1, contrib.shape[-1]), k),
                    }
                )
    return rows


def head_fingerprint(
    model: HookedTransformer, layer: int, head: int, n_values: int, k: int, tokens: Tensor | None = None
) -> dict:
    """Fingerprints of one head (weights, plus activations when ``tokens`` is given)."""
    _check_head(model, layer, head)
    out = {"weights": weight_fingerprints(model, n_values, k).where(layer=layer, head=head)[0]}
    if tokens is not None:
        out["activations"] = activation_fingerprints(model, tokens, k).where(layer=layer, head=head)[0]
    return out
