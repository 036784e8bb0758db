"""E HookedTransformers as one stack of parameters: the presets' forward math, batched over members.

    stack = StackedTransformer.from_models([build_model(kwargs, seed=s) for s in range(8)])
    logits = stack(tokens)                 # tokens [E, batch, pos] -> readout logits [E, batch, d_vocab_out]
    stack.member_state_dict(3)             # a plain HookedTransformer state dict for member 3

Parameters keep TransformerLens's names and shapes with a leading member axis
(``blocks.0.attn.W_Q`` is ``[E, n_heads, d_model, d_head]``), so a member loads into an
ordinary ``HookedTransformer`` with ``load_state_dict``. The forward pass is exactly the math of
``HookedTransformer`` for the lenslab presets (pre-LN or no norm, standard positional
embedding, causal attention scaled by 1/sqrt(d_head), ReLU MLP), reorganised for speed:

- the token embedding is a one-hot matmul (deterministic backward, no scatter);
- Q, K and V come from one fused matmul per layer;
- LayerNorm's w and b, and attention's 1/sqrt(d_head), are folded into the next matmul's
  (small) weights instead of being applied to the (large) activations;
- only the readout (last) position's logits are returned, so in the **last** layer only the
  last position's query, attention output and MLP are computed (keys and values still use
  every position). Earlier positions of the last layer cannot influence the readout logits.
  That single query's attention is computed by broadcasting, without transposes.

``tests/training/test_training_stacked.py`` checks every member against ``HookedTransformer``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn
from transformer_lens import HookedTransformer

from lenslab.training.errors import ConfigError

SUPPORTED = {"act_fn": "relu", "positional_embedding_type": "standard", "attn_only": False}


def check_supported(model_kwargs: dict) -> None:
    """Refuse configs whose math the stacked forward does not implement."""
    for key, want in SUPPORTED.items():
        if model_kwargs.get(key, want) != want:
            raise ConfigError(
                f"the ensemble engine implements {key}={want!r} only, got {model_kwargs[key]!r}: train this model with the single-seed trainer"
            )
    if model_kwargs.get("normalization_type") not in (None, "LN"):
        raise ConfigError(
            f"the ensemble engine implements normalization_type 'LN' or None, got {model_kwargs['normalization_type']!r}"
        )
    for key in ("use_attn_result", "use_split_qkv_input", "scale_attn_by_inverse_layer_idx", "use_hook_mlp_in", "gated_mlp"):
        if model_kwargs.get(key):
            raise ConfigError(f"the ensemble engine does not implement {key}=True: train this model with the single-seed trainer")


class StackedParams(nn.Module):
    """The bookkeeping of E stacked members, shared by ``StackedTransformer`` and ``StackedMLP``: one
    ``[E, *shape]`` parameter per named parameter of a template member, in its order and under its names,
    and the member's other state-dict entries (buffers) kept from the template."""

    def __init__(self, template: nn.Module, stacked: dict[str, Tensor]):
        super().__init__()
        self.names = [n for n, _ in template.named_parameters()]
        missing = set(self.names) - set(stacked)
        if missing:
            raise ConfigError(f"stacked parameters lack {sorted(missing)[:3]}")
        self.n_members = next(iter(stacked.values())).shape[0]
        # nn.ParameterDict forbids dots in names; keep an ordered list plus a name index.
        self.params = nn.ParameterList([nn.Parameter(stacked[n].detach().clone()) for n in self.names])
        self._index = {n: i for i, n in enumerate(self.names)}
        self._buffers_template = {k: v.detach().clone() for k, v in template.state_dict().items() if k not in self._index}

    @classmethod
    def from_models(cls, models: list[nn.Module]):
        """Stack ``models`` (one architecture) into one ``cls``; the first is the template."""
        if not models:
            raise ConfigError("an ensemble needs at least one member")
        names = [n for n, _ in models[0].named_parameters()]
        stacked = {n: torch.stack([dict(m.named_parameters())[n].detach() for m in models]) for n in names}
        return cls(models[0], stacked)

    def p(self, name: str) -> Tensor:
        """The stacked ``[E, *shape]`` parameter of a member's parameter ``name``."""
        return self.params[self._index[name]]

    def member_state_dict(self, e: int) -> dict[str, Tensor]:
        """Member ``e`` as its model's state dict (parameters copied, buffers included)."""
        out = {k: v.clone() for k, v in self._buffers_template.items()}
        for n, p in zip(self.names, self.params):
            out[n] = p[e].detach().clone()
        return out

    def load_member(self, e: int, state: dict[str, Tensor]) -> None:
        """Overwrite member ``e``'s parameters with ``state``'s (a member state dict)."""
        with torch.no_grad():
            for n, p in zip(self.names, self.params):
                p[e].copy_(state[n])


class StackedTransformer(StackedParams):
    """E members with identical architecture; parameters ``[E, *tl_shape]`` under TL's names."""

    def __init__(self, template: HookedTransformer, stacked: dict[str, Tensor]):
        super().__init__(template, stacked)
        cfg = template.cfg
        self.cfg = cfg
        self.ln = cfg.normalization_type == "LN"
        self.eps = cfg.eps
        self.attn_scale = cfg.attn_scale if cfg.use_attn_scale else 1.0

    # --- the math ---------------------------------------------------------------------------
    def _norm(self, x: Tensor, prefix: str) -> Tensor:
        """TL's LayerNorm: (x - mean) / sqrt(var + eps) * w + b (biased variance), per member w, b."""
        if not self.ln:
            return x
        w, b = self.p(prefix + ".w"), self.p(prefix + ".b")  # [E, d_model]
        shape = (w.shape[0],) + (1,) * (x.dim() - 2) + (w.shape[1],)
        return torch.addcmul(b.view(shape), F.layer_norm(x, x.shape[-1:], eps=self.eps), w.view(shape))

    def _ln(self, x: Tensor) -> Tensor:
        """LayerNorm without its affine part (w, b are folded into the next matmul by ``_fold``)."""
        return F.layer_norm(x, x.shape[-1:], eps=self.eps) if self.ln else x

    def _fold(self, prefix: str, W: Float[Tensor, "E D n"], b: Float[Tensor, "E n"]) -> tuple[Tensor, Tensor]:
        """Weights and bias [E, 1, n] such that ``_ln(x) @ W' + b' == LN(x) @ W + b``: the LayerNorm's
        w, b folded into the (small) weights, not applied to the (large) activations."""
        if not self.ln:
            return W, b[:, None, :]
        w_ln, b_ln = self.p(prefix + ".w"), self.p(prefix + ".b")
        return W * w_ln[:, :, None], torch.baddbmm(b[:, None, :], b_ln[:, None, :], W)

    def _block(self, layer: int, x: Float[Tensor, "E B T D"], last_only: bool) -> Tensor:
        pre = f"blocks.{layer}."
        E, B, T, D = x.shape
        H, dh = self.cfg.n_heads, self.cfg.d_head
        ln1 = pre + "ln1"

        def weights(c: str) -> tuple[Tensor, Tensor]:  # [E, D, H*dh], [E, H*dh]; the 1/sqrt(d_head) folded into Q
            W, b = (
                self.p(pre + f"attn.W_{c}").permute(0, 2, 1, 3).reshape(E, D, H * dh),
                self.p(pre + f"attn.b_{c}").reshape(E, H * dh),
            )
            return (W / self.attn_scale, b / self.attn_scale) if c == "Q" else (W, b)

        def proj(inp: Tensor, cs: str) -> Tensor:  # inp: LN-normalised (no affine)
            Ws, bs = zip(*(weights(c) for c in cs))
            W, bias = self._fold(ln1, torch.cat(Ws, dim=2), torch.cat(bs, dim=1))
            return torch.baddbmm(bias, inp.reshape(E, -1, D), W)

        h = self._ln(x)
        if last_only:  # one query: scores and mixing by broadcasting in the [E, B, T, H, dh] layout (no transposes)
            k, v = proj(h, "KV").view(E, B, T, 2, H, dh).unbind(3)
            # normalise the last position again rather than slice h: a slice's backward zero-fills all of h (measured slower)
            q = proj(self._ln(x[:, :, -1:]), "Q").view(E, B, 1, H, dh)
            pattern = (q * k).sum(-1).softmax(2)  # [E, B, T, H]
            z = (pattern[..., None] * v).sum(2).reshape(E, B, H * dh)  # [E, B, H*dh]
            Tq = 1
        else:
            q, k, v = proj(h, "QKV").view(E, B, T, 3, H, dh).unbind(3)
            Tq = T
            q, k, v = q.transpose(2, 3), k.transpose(2, 3), v.transpose(2, 3)  # [E, B, H, T, dh]
            scores = q @ k.transpose(-1, -2)  # [E, B, H, T, T]
            if T > 1:
                mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
                scores = scores.masked_fill(~mask, float("-inf"))
            z = (scores.softmax(-1) @ v).transpose(2, 3).reshape(E, B * T, H * dh)  # [E, B*T, H*dh]
        W_O = self.p(pre + "attn.W_O").reshape(E, H * dh, D)
        attn_out = torch.baddbmm(self.p(pre + "attn.b_O")[:, None, :], z.reshape(E, B * Tq, H * dh), W_O).view(E, B, Tq, D)
        resid = (x[:, :, -1:] if last_only else x) + attn_out
        W_in, b_in = self._fold(pre + "ln2", self.p(pre + "mlp.W_in"), self.p(pre + "mlp.b_in"))
        hidden = torch.baddbmm(b_in, self._ln(resid).reshape(E, B * Tq, D), W_in).relu()
        mlp_out = torch.baddbmm(self.p(pre + "mlp.b_out")[:, None, :], hidden, self.p(pre + "mlp.W_out"))
        return resid + mlp_out.view(E, B, Tq, D)

    def forward(self, tokens: Int[Tensor, "E B T"]) -> Float[Tensor, "E B d_vocab_out"]:
        """Readout logits (last position) of every member on its own batch."""
        E, B, T = tokens.shape
        if E != self.n_members:
            raise ValueError(f"tokens have {E} member rows, the ensemble has {self.n_members}")
        W_E = self.p("embed.W_E")  # [E, d_vocab, D]
        onehot = F.one_hot(tokens.reshape(E, B * T), W_E.shape[1]).to(W_E.dtype)
        x = torch.bmm(onehot, W_E).view(E, B, T, -1) + self.p("pos_embed.W_pos")[:, None, :T]
        L = self.cfg.n_layers
        for layer in range(L):
            x = self._block(layer, x, last_only=layer == L - 1)
        x = self._norm(x[:, :, -1], "ln_final")  # [E, B, D]
        return torch.baddbmm(self.p("unembed.b_U")[:, None, :], x, self.p("unembed.W_U"))

    def flops_per_example(self) -> float:
        """Forward multiply-adds x 2 for one example (the work actually done), for GFLOP/s reports."""
        c = self.cfg
        T, D, H, dh, M = c.n_ctx, c.d_model, c.n_heads, c.d_head, c.d_mlp
        full = T * (3 * D * H * dh + H * dh * D + 2 * D * M) + 2 * H * T * T * dh
        last = T * 2 * D * H * dh + (D * H * dh + H * dh * D + 2 * D * M) + 2 * H * T * dh
        emb = T * c.d_vocab * D + D * c.d_vocab_out
        return 2.0 * ((c.n_layers - 1) * full + last + emb)
