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

Two ways to compute the per-member scalars (``device_resident``):

- host (the default off CUDA): step counts are Python ints and the scalars Python floats, as
  ``torch.optim.AdamW``'s default path computes them, copied to the device once per step: bitwise
  equal to ``torch.optim.AdamW`` on the CPU;
- device (the default on CUDA): step counts, learning rates, decays and bias corrections stay
  device tensors (float64), like ``torch.optim.AdamW(capturable=True)``: no host-to-device copy and
  no synchronisation per step, so the host can queue ahead and a CUDA graph can capture the whole
  step. ``beta ** t`` is then ``torch.pow`` on the device, which may differ from the host's in the
  last bit (tested to 1e-15 relative on the CPU).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lenslab.training.errors import ConfigError


class StackedAdamW:
    """AdamW over ``[E, ...]`` parameters, one lr and weight decay per member (see the module docstring)."""

    def __init__(
        self,
        params: list[Tensor],
        lr: list[float],
        weight_decay: list[float],
        betas: tuple[float, float],
        eps: float = 1e-8,
        device_resident: bool | None = None,
    ):
        self.params = list(params)
        E = self.params[0].shape[0]
        if len(lr) != E or len(weight_decay) != E:
            raise ConfigError(f"need one lr and one weight decay per member ({E}), got {len(lr)} and {len(weight_decay)}")
        self.lr = [float(x) for x in lr]
        self.wd = [float(x) for x in weight_decay]
        self.beta1, self.beta2 = float(betas[0]), float(betas[1])
        self.eps = float(eps)
        like = self.params[0]
        self.device_resident = like.device.type == "cuda" if device_resident is None else bool(device_resident)
        if self.device_resident:  # one copy each, here; none per step
            f64 = {"dtype": torch.float64, "device": like.device}
            self._t = torch.zeros(E, **f64)
            self._lr = torch.tensor(self.lr, **f64)
            self._decay = torch.tensor([1.0 - a * w for a, w in zip(self.lr, self.wd)], **f64).to(like.dtype)
        else:
            self._steps = [0] * E
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]

    @property
    def steps(self) -> list[int]:
        """Each member's step count (a device read in device-resident mode: for checkpoints, not per step)."""
        return [int(x) for x in self._t.tolist()] if self.device_resident else self._steps

    def _set_steps(self, e: int, n: int) -> None:
        if self.device_resident:
            self._t[e] = float(n)
        else:
            self._steps[e] = n

    def _device_scalars(self, active: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """(decay, -lr / bias_correction1, sqrt(bias_correction2)), [E] in the parameters' dtype, all on the device."""
        if active is None:
            self._t.add_(1.0)
        else:
            self._t.add_(active.to(self._t.dtype))
        t = self._t.clamp_min(1.0)
        dtype = self.params[0].dtype
        neg_step_size = (-self._lr / (1.0 - torch.pow(self.beta1, t))).to(dtype)
        bc2_sqrt = torch.sqrt(1.0 - torch.pow(self.beta2, t)).to(dtype)
        return self._decay, neg_step_size, bc2_sqrt

    @torch.no_grad()
    def step(self, grads: list[Tensor], active: list[bool] | Tensor | None = None) -> None:
        """One update. ``active``: a bool per member (a list, or a bool tensor on the device, which in
        device-resident mode keeps the step free of host-to-device copies)."""
        like = self.params[0]
        E = like.shape[0]
        if self.device_resident:
            act_t = None
            if active is not None and not (not isinstance(active, Tensor) and all(active)):  # an all-True list: no copy
                act_t = active if isinstance(active, Tensor) else torch.tensor(list(active), device=like.device)
                act_t = act_t.to(device=like.device, dtype=torch.bool)
            decay, neg_step_size, bc2_sqrt = self._device_scalars(act_t)
            keep = None if act_t is None else ~act_t  # always masked when given: checking all() would sync
        else:
            act = [True] * E if active is None else [bool(a) for a in active]
            for e in range(E):
                if act[e]:
                    self._steps[e] += 1
            # Per-member scalars computed in float64 (as torch does in Python), applied in the
            # parameters' dtype (float32 or float64), built once per step and viewed per parameter shape.
            per = torch.tensor(
                [
                    [1.0 - self.lr[e] * self.wd[e] for e in range(E)],
                    [-self.lr[e] / (1.0 - self.beta1 ** max(self._steps[e], 1)) for e in range(E)],
                    [math.sqrt(1.0 - self.beta2 ** max(self._steps[e], 1)) for e in range(E)],
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
        n = self.steps[e]
        if n == 0:
            return {}
        return {
            i: {"step": torch.tensor(float(n)), "exp_avg": m[e].clone(), "exp_avg_sq": v[e].clone()}
            for i, (m, v) in enumerate(zip(self.exp_avg, self.exp_avg_sq))
        }

    def load_member_state(self, e: int, state: dict[int, dict[str, Tensor]]) -> None:
        if not state:
            self._set_steps(e, 0)
            for m, v in zip(self.exp_avg, self.exp_avg_sq):
                m[e].zero_()
                v[e].zero_()
            return
        if set(state) != set(range(len(self.params))):
            raise ConfigError(f"optimizer state has {len(state)} tensors, the model {len(self.params)}")
        steps = {int(s["step"].item()) for s in state.values()}
        if len(steps) != 1:
            raise ConfigError(f"optimizer state has inconsistent step counts {sorted(steps)}")
        self._set_steps(e, steps.pop())
        for i, (m, v) in enumerate(zip(self.exp_avg, self.exp_avg_sq)):
            m[e].copy_(state[i]["exp_avg"])
            v[e].copy_(state[i]["exp_avg_sq"])
