"""HookedTransformerConfig presets for the papers' models, and seeded construction.

Paper 1 (MPSP) models: ``n_layers`` in {1, 2}, ``n_heads`` in {1, 2}, d_model 64,
d_mlp 128, d_head = 64 / n_heads. Choices the paper leaves open, made here:

- pre-LayerNorm (``normalization_type="LN"``) in every block and before the unembedding;
- learned absolute positional embeddings (``positional_embedding_type="standard"``);
- ReLU MLPs;
- readout: the logits at the last position (the readout token), over ``k`` classes
  (``d_vocab_out = k``).

Paper 2 / grokking model: 1 layer, d_model 128, 4 heads x 32, d_mlp 512, ReLU, no LayerNorm,
n_ctx 3, readout at the ``=`` position.

``build_model`` never touches the global RNGs: ``HookedTransformerConfig(seed=...)`` would
reseed torch, numpy and random for the whole process, so we leave ``seed`` unset and draw the
initial weights inside ``torch.random.fork_rng``.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from lenslab.tasks import ModAddTask, MPSPTask
from lenslab.training.errors import ConfigError

DTYPES = {"float32": torch.float32, "float64": torch.float64}  # the precisions lenslab trains in (training.config.DTYPES)


def _check_int(name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"{name}={value!r} must be an integer in [{lo}, {hi}]")
    return value


def mpsp_model_config(task: MPSPTask, n_layers: int = 2, n_heads: int = 2, d_model: int = 64, d_mlp: int = 128) -> dict:
    """Keyword arguments for ``HookedTransformerConfig`` of a paper-1 model on ``task``."""
    _check_int("layers", n_layers, 1, 64)
    _check_int("heads", n_heads, 1, 64)
    _check_int("d_model", d_model, 1, 8192)
    _check_int("d_mlp", d_mlp, 1, 65536)
    if d_model % n_heads:
        raise ConfigError(f"d_model={d_model} is not divisible by heads={n_heads}: pick heads that divide it")
    return dict(
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        d_head=d_model // n_heads,
        d_mlp=d_mlp,
        d_vocab=task.d_vocab,
        d_vocab_out=task.k,
        n_ctx=task.n_ctx,
        act_fn="relu",
        normalization_type="LN",
        positional_embedding_type="standard",
        attn_only=False,
        default_prepend_bos=False,
    )


def modadd_model_config(task: ModAddTask) -> dict:
    """The TransformerLens grokking-demo model for ``task`` (no LayerNorm)."""
    return dict(
        n_layers=1,
        d_model=128,
        n_heads=4,
        d_head=32,
        d_mlp=512,
        d_vocab=task.d_vocab,
        d_vocab_out=task.d_vocab_out,
        n_ctx=task.n_ctx,
        act_fn="relu",
        normalization_type=None,
        positional_embedding_type="standard",
        attn_only=False,
        default_prepend_bos=False,
    )


def hooked_config(model_kwargs: dict, device: str | None = None) -> HookedTransformerConfig:
    """``HookedTransformerConfig(**model_kwargs)``, refusing ``seed`` (it reseeds globally)."""
    if model_kwargs.get("seed") is not None:
        raise ConfigError("model config sets 'seed', which reseeds the global RNGs: remove it and use build_model(seed=...)")
    kwargs = dict(model_kwargs)
    if device is not None:
        kwargs["device"] = device
    return HookedTransformerConfig(**kwargs)


def build_model(
    model_kwargs: dict, seed: int | None = None, device: str | None = None, dtype: str | torch.dtype | None = None
) -> HookedTransformer:
    """A fresh ``HookedTransformer``; with ``seed`` its init is reproducible and global RNGs are untouched.

    ``dtype`` ("float32" | "float64" or a torch dtype; default float32): the model is drawn in
    float32 and then cast (TransformerLens's ``.to``, which also sets ``cfg.dtype``), so a
    float64 model starts from exactly the float32 model's weights of the same seed.
    """
    cfg = hooked_config(model_kwargs, device)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*HookedTransformer is deprecated.*")
        if seed is None:
            model = HookedTransformer(cfg)
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                model = HookedTransformer(cfg)
    if dtype is not None:
        want = DTYPES.get(dtype) if isinstance(dtype, str) else dtype
        if want is None:
            raise ConfigError(f"dtype={dtype!r} is not supported: use one of {', '.join(DTYPES)}")
        if want != model.cfg.dtype:
            model = model.to(want, print_details=False)
    return model
