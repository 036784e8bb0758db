"""What a task's model reads and how it is scored: the one place the trainer looks at the task kind.

    obj = Objective.of(config)
    x = obj.inputs(splits, "train", device, dtype)     # tokens [n, pos] or pixels/255 [n, 784]
    logits = obj.logits(model, x[idx])                 # [batch, classes]
    loss = obj.loss(logits, labels[idx])               # the training loss (a mean)
    obj.example_losses(logits, labels)                 # [n]: one loss per example (evaluation)

Token tasks (MPSP, modular addition): the readout position's logits, cross-entropy. MNIST:
the MLP's outputs on ``pixels / 255``, and either MSE on one-hot targets (``torch.nn.MSELoss``'s
mean over batch and classes, as the predecessor trains) or cross-entropy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from lenslab.tasks.mnist import pixels_to_inputs
from lenslab.training.gradients import readout_logits


@dataclass(frozen=True)
class Objective:
    kind: str  # "tokens" | "images"
    loss_name: str  # "ce" | "mse"
    n_classes: int

    @classmethod
    def of(cls, config: dict) -> Objective:
        task, model = config["task"], config["model"]
        if task["name"] == "mnist":
            return cls("images", task["loss"], model["d_out"])
        return cls("tokens", "ce", model["d_vocab_out"])

    @property
    def input_part(self) -> str:
        return "_images" if self.kind == "images" else "_tokens"

    def split_names(self, splits: dict[str, Tensor]) -> list[str]:
        """The evaluated splits (the MPSP patching pairs ``counterfactual`` excluded), train first."""
        names = sorted(k[: -len(self.input_part)] for k in splits if k.endswith(self.input_part))
        return sorted((n for n in names if n != "counterfactual"), key=lambda n: n != "train")

    def inputs(self, splits: dict[str, Tensor], name: str, device: torch.device, dtype: torch.dtype) -> Tensor:
        x = splits[f"{name}{self.input_part}"].to(device)
        return pixels_to_inputs(x, dtype) if self.kind == "images" else x

    def logits(self, model: torch.nn.Module, x: Tensor) -> Tensor:
        return model(x) if self.kind == "images" else readout_logits(model, x)

    def loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        if self.loss_name == "mse":
            return F.mse_loss(logits, F.one_hot(labels, self.n_classes).to(logits.dtype))
        return F.cross_entropy(logits, labels)

    def example_losses(self, logits: Tensor, labels: Tensor) -> Tensor:
        if self.loss_name == "mse":
            return (logits - F.one_hot(labels, self.n_classes).to(logits.dtype)).pow(2).mean(-1)
        return F.cross_entropy(logits, labels, reduction="none")
