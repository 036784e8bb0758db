"""AdamW over stacked ``[E, ...]`` parameters, with a learning rate and weight decay per member.

It performs, element for element, the update of ``torch.optim.AdamW`` (the single-tensor CPU
path, ``amsgrad=False``, ``maximize=False``)::

    p   <- p * (1 - lr_e * wd_e)
    m   <- lerp(m, g, 1 - beta1)
    v   <- beta2 * v + (1 - beta2) * g * g
    p   <- p - (lr_e / (1 - beta1^t_e)) * m / (sqrt(v) / sqrt(1 - beta2^t_e) + eps)

with a step count ``t_e`` per member. ``active`` (a bool per member) leaves the inactive
members' parameters and moments untouched, so members that finished or diverged ride along.
The state of member ``e`` converts to and from a ``torch.optim.AdamW`` state (``member_state``,
``load_member_state``), which is how run directories stay resumable by either trainer.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lenslab.training.errors import ConfigError


class StackedAdamW:
    def __init__(
        self, params: list[Tensor], lr: list[float], weight_decay: list[float], betas: tuple[float, float], eps: float = 1e-8
    ):
        self.params = list(params)
        E = self.params[0].shape[0]
        if len(lr) != E or len(weight_decay) != E:
            raise ConfigError(f"need one lr and one weight decay per member ({E}), got {len(lr)} and {len(weight_decay)}")
        self.lr = [float(x) for x in lr]
        self.wd = [float(x) for x in weight_decay]
        self.beta1, self.beta2 = float(betas[0]), float(betas[1])
        self.eps = float(eps)
        self.steps = [0] * E
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]

    @torch.no_grad()
    def step(self, grads: list[Tensor], active: list[bool] | None = None) -> None:
        E = len(self.steps)
        act = [True] * E if active is None else list(active)
        for e in range(E):
            if act[e]:
                self.steps[e] += 1
        # Per-member scalars computed in float64 (as torch does in Python), applied in the
        # parameters' dtype (float32 or float64), built once per step and viewed per parameter shape.
        like = self.params[0]
        per = torch.tensor(
            [
                [1.0 - self.lr[e] * self.wd[e] for e in range(E)],
                [-self.lr[e] / (1.0 - self.beta1 ** max(self.steps[e], 1)) for e in range(E)],
                [math.sqrt(1.0 - self.beta2 ** max(self.steps[e], 1)) for e in range(E)],
            ],
            dtype=like.dtype,
            device=like.device,
        )
        decay, neg_step_size, bc2_sqrt = per
        keep = None if all(act) else ~torch.tensor(act, device=like.device)
        for p, g, m, v in zip(self.params, grads, self.exp_avg, self.exp_avg_sq):
            shape = (-1,) + (1,) * (p.dim() - 1)
            if keep is not None:
                old = (p.clone(), m.clone(), v.clone())
            p.mul_(decay.view(shape))
            m.lerp_(g, 1 - self.beta1)
            v.mul_(self.beta2).addcmul_(g, g, value=1 - self.beta2)
            denom = (v.sqrt() / bc2_sqrt.view(shape)).add_(self.eps)
            p.addcdiv_(m * neg_step_size.view(shape), denom)
            if keep is not None:
                k = keep.view(shape)
                p.copy_(torch.where(k, old[0], p))
                m.copy_(torch.where(k, old[1], m))
                v.copy_(torch.where(k, old[2], v))

    def member_state(self, e: int) -> dict[int, dict[str, Tensor]]:
        """Member ``e``'s moments in ``torch.optim.AdamW.state_dict()["state"]`` form."""
        if self.steps[e] == 0:
            return {}
        return {
            i: {"step": torch.tensor(float(self.steps[e])), "exp_avg": m[e].clone(), "exp_avg_sq": v[e].clone()}
            for i, (m, v) in enumerate(zip(self.exp_avg, self.exp_avg_sq))
        }

    def load_member_state(self, e: int, state: dict[int, dict[str, Tensor]]) -> None:
        if not state:
            self.steps[e] = 0
            for m, v in zip(self.exp_avg, self.exp_avg_sq):
                m[e].zero_()
                v[e].zero_()
            return
        if set(state) != set(range(len(self.params))):
            raise ConfigError(f"optimizer state has {len(state)} tensors, the model {len(self.params)}")
        steps = {int(s["step"].item()) for s in state.values()}
        if len(steps) != 1:
            raise ConfigError(f"optimizer state has inconsistent step counts {sorted(steps)}")
        self.steps[e] = steps.pop()
        for i, (m, v) in enumerate(zip(self.exp_avg, self.exp_avg_sq)):
            m[e].copy_(state[i]["exp_avg"])
            v[e].copy_(state[i]["exp_avg_sq"])
