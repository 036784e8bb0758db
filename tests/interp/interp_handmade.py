"""Hand-built models whose behaviour is known in closed form (no LayerNorm, attention only)."""

from __future__ import annotations

import warnings

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

N_VALUES, SEQ_LEN = 8, 4
N_CTX, READOUT = SEQ_LEN + 1, N_VALUES
# residual dimensions
MAG, EVEN, ODD, QUERY, POS0 = 0, 1, 2, 3, 4
D_MODEL, D_HEAD = 8, 4


def _model(n_heads: int) -> HookedTransformer:
    cfg = HookedTransformerConfig(
        n_layers=1,
        d_model=D_MODEL,
        n_heads=n_heads,
        d_head=D_HEAD,
        n_ctx=N_CTX,
        d_vocab=N_VALUES + 1,
        d_vocab_out=2,
        attn_only=True,
        normalization_type=None,
        act_fn="relu",
        default_prepend_bos=False,
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore")
        model = HookedTransformer(cfg)
    for p in model.parameters():
        p.data.zero_()
    E = model.embed.W_E.data
    for v in range(N_VALUES):
        E[v, MAG] = v
        E[v, EVEN if v % 2 == 0 else ODD] = 1.0
    E[READOUT, QUERY] = 1.0
    model.pos_embed.W_pos.data[0, POS0] = 1.0
    return model.eval()


def copy_first_model(score: float = 60.0) -> HookedTransformer:
    """One head: the readout attends to position 0 and copies its parity to the logits.

    logits at the readout ≈ onehot(x_0 mod 2): the answer is the first element's parity.
    """
    model = _model(1)
    attn = model.blocks[0].attn
    attn.W_Q.data[0, QUERY, 0] = score
    attn.W_K.data[0, POS0, 0] = 1.0 * (D_HEAD**0.5)
    attn.W_V.data[0, EVEN, 0] = 1.0
    attn.W_V.data[0, ODD, 1] = 1.0
    attn.W_O.data[0, 0, EVEN] = 1.0
    attn.W_O.data[0, 1, ODD] = 1.0
    model.unembed.W_U.data[EVEN, 0] = 1.0
    model.unembed.W_U.data[ODD, 1] = 1.0
    return model


def fingerprint_model(ov_sign: float = 1.0) -> HookedTransformer:
    """Head 0: score = key value (monotone), OV writes the key's parity class (sign ``ov_sign``).
    Head 1: attends to position 0 only (score 40 there, 0 elsewhere), OV zero."""
    model = _model(2)
    attn = model.blocks[0].attn
    s = D_HEAD**0.5  # undo the 1/sqrt(d_head) scale
    attn.W_Q.data[0, QUERY, 0] = 1.0
    attn.W_K.data[0, MAG, 0] = s
    attn.W_V.data[0, EVEN, 0] = 1.0
    attn.W_V.data[0, ODD, 1] = 1.0
    attn.W_O.data[0, 0, EVEN] = 1.0
    attn.W_O.data[0, 1, ODD] = 1.0
    attn.W_Q.data[1, QUERY, 1] = 40.0
    attn.W_K.data[1, POS0, 1] = s
    model.unembed.W_U.data[EVEN, 0] = ov_sign
    model.unembed.W_U.data[ODD, 1] = ov_sign
    return model


def random_tokens(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, N_VALUES, (n, SEQ_LEN), generator=g)
    return torch.cat([x, torch.full((n, 1), READOUT)], dim=1)
