"""Shared fixtures: a synthetic shard folder and a tiny modular-addition run directory (helpers: spectral_helpers)."""

from __future__ import annotations

import json

import pytest
import torch
from spectral_helpers import P, write_shard_folder

from lenslab.tasks import ModAddTask, make_modadd_splits
from lenslab.training.config import modadd_run_config
from lenslab.training.presets import build_model, modadd_model_config
from lenslab.training.runio import append_jsonl, save_checkpoint, save_splits


@pytest.fixture
def shard_folder(tmp_path):
    """``(folder, tensors)``: see ``spectral_helpers.write_shard_folder``."""
    return tmp_path, write_shard_folder(tmp_path)


@pytest.fixture(scope="session")
def modadd_kwargs() -> dict:
    return modadd_model_config(ModAddTask(p=P))


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory, modadd_kwargs):
    """A run with checkpoints at epochs 0 and 10; epoch 10 has planted spikes in W_in."""
    d = tmp_path_factory.mktemp("run")
    task = ModAddTask(p=P)
    cfg = {**modadd_run_config(p=P, train_frac=0.3), "model": modadd_kwargs}  # the config builder's schema
    (d / "config.json").write_text(json.dumps(cfg))
    save_splits(d, make_modadd_splits(task, seed=0))
    model = build_model(modadd_kwargs, seed=0)
    save_checkpoint(d, 0, model, modadd_kwargs)
    append_jsonl(d / "metrics.jsonl", {"epoch": 0, "train_acc": 0.1, "test_acc": 0.05})
    with torch.no_grad():
        w = model.blocks[0].mlp.W_in
        w.view(-1)[:3] = torch.tensor([3.0, -2.5, 2.0])  # W_in entries have std ~ 1/sqrt(128) ≈ 0.09
    save_checkpoint(d, 10, model, modadd_kwargs)
    append_jsonl(d / "metrics.jsonl", {"epoch": 10, "train_acc": 1.0, "test_acc": 0.5})
    return d
