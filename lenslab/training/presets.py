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

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from lenslab.tasks import ModAddTask, MPSPTask
from lenslab.tasks.mnist import MNISTTask
from lenslab.training.errors import ConfigError
from lenslab.training.mlp import HookedMLP, build_mlp
from lenslab.training.spec import DTYPE_NAMES, MLPSpec, ModelSpec, check_field, is_mlp_config, params

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}  # the precisions lenslab trains in (training.spec.DTYPE_NAMES)
_MODEL = params(ModelSpec)


def torch_dtype(train: dict) -> torch.dtype:
    """The torch dtype of a ``config["train"]`` block (a block without ``dtype`` is an older float32 run)."""
    name = train.get("dtype", "float32")
    if name not in DTYPES:
        raise ConfigError(f"dtype={name!r} is not supported: use one of {', '.join(DTYPES)}")
    return DTYPES[name]


def mpsp_model_config(
    task: MPSPTask,
    n_layers: int = _MODEL["n_layers"].default,
    n_heads: int = _MODEL["n_heads"].default,
    d_model: int = _MODEL["d_model"].default,
    d_mlp: int = _MODEL["d_mlp"].default,
) -> dict:
    """Keyword arguments for ``HookedTransformerConfig`` of a paper-1 model on ``task`` (bounds: ``spec.ModelSpec``)."""
    check_field(ModelSpec, "n_layers", n_layers, "layers")
    check_field(ModelSpec, "n_heads", n_heads, "heads")
    check_field(ModelSpec, "d_model", d_model)
    check_field(ModelSpec, "d_mlp", d_mlp)
    if d_model % n_heads:
        raise ConfigError(f"d_model={d_model} is not divisible by heads={n_heads}: pick heads that divide it")
    return {
        "n_layers": n_layers,
        "d_model": d_model,
        "n_heads": n_heads,
        "d_head": d_model // n_heads,
        "d_mlp": d_mlp,
        "d_vocab": task.d_vocab,
        "d_vocab_out": task.k,
        "n_ctx": task.n_ctx,
        "act_fn": "relu",
        "normalization_type": "LN",
        "positional_embedding_type": "standard",
        "attn_only": False,
        "default_prepend_bos": False,
    }


def modadd_model_config(task: ModAddTask) -> dict:
    """The TransformerLens grokking-demo model for ``task`` (no LayerNorm)."""
    return {
        "n_layers": 1,
        "d_model": 128,
        "n_heads": 4,
        "d_head": 32,
        "d_mlp": 512,
        "d_vocab": task.d_vocab,
        "d_vocab_out": task.d_vocab_out,
        "n_ctx": task.n_ctx,
        "act_fn": "relu",
        "normalization_type": None,
        "positional_embedding_type": "standard",
        "attn_only": False,
        "default_prepend_bos": False,
    }


def mnist_model_config(
    task: MNISTTask,
    d_hidden: int = params(MLPSpec)["d_hidden"].default,
    init_scale: float = params(MLPSpec)["init_scale"].default,
) -> dict:
    """Paper 2's MLP for ``task``: 784 -> 200 -> 200 -> n_classes, ReLU, the ``nn.Linear`` init times ``init_scale``."""
    return {
        "arch": "mlp",
        "d_in": task.d_in,
        "d_hidden": d_hidden,
        "n_layers": 3,
        "d_out": task.d_out,
        "act_fn": "relu",
        "init_scale": init_scale,
    }


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
) -> HookedTransformer | HookedMLP:
    """A fresh ``HookedTransformer`` (or ``HookedMLP`` for an ``arch="mlp"`` block); with ``seed`` its
    init is reproducible and global RNGs are untouched.

    ``dtype`` ("float32" | "float64" or a torch dtype; default float32): the model is drawn in
    float32 and then cast (TransformerLens's ``.to``, which also sets ``cfg.dtype``), so a
    float64 model starts from exactly the float32 model's weights of the same seed.
    """
    if is_mlp_config(model_kwargs):
        want = DTYPES.get(dtype) if isinstance(dtype, str) else dtype
        if dtype is not None and want is None:
            raise ConfigError(f"dtype={dtype!r} is not supported: use one of {', '.join(DTYPES)}")
        return build_mlp(model_kwargs, seed=seed, device=device, dtype=want)
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
