"""Fixtures: a tiny MPSP model trained in-process, and a fake run directory with checkpoints."""

from __future__ import annotations

import warnings

import pytest
import torch

from lenslab.tasks import MPSPTask, make_mpsp_splits
from lenslab.training.config import mpsp_run_config
from lenslab.training.presets import build_model, mpsp_model_config
from lenslab.training.runio import append_jsonl, atomic_write_json, save_checkpoint, save_splits

warnings.filterwarnings("ignore", message=".*HookedTransformer is deprecated.*")

TASK = MPSPTask(label="sum2", shortcut="max", seq_len=4, n_values=8)


def accuracy(model, tokens, labels) -> float:
    with torch.no_grad():
        return float((model(tokens)[:, -1].argmax(-1) == labels).float().mean())


def train(model, splits, steps: int, lr: float = 3e-3, batch: int = 256, seed: int = 0, on_eval=None, eval_every: int = 0):
    """Plain AdamW on the train split; ``on_eval(step, model)`` every ``eval_every`` steps."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    g = torch.Generator().manual_seed(seed)
    x, y = splits["train_tokens"], splits["train_labels"]
    model.train()
    for step in range(1, steps + 1):
        idx = torch.randint(0, len(x), (batch,), generator=g)
        loss = torch.nn.functional.cross_entropy(model(x[idx])[:, -1], y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if eval_every and step % eval_every == 0 and on_eval is not None:
            model.eval()
            on_eval(step, model)
            model.train()
    return model.eval()


@pytest.fixture(scope="session")
def splits():
    return make_mpsp_splits(TASK, 0.9, n_train=1024, n_val=128, n_adv=128, seed=0)


@pytest.fixture(scope="session")
def model_kwargs():
    return mpsp_model_config(TASK, n_layers=2, n_heads=2)


@pytest.fixture(scope="session")
def trained(splits, model_kwargs):
    """A 2L 2-head model trained 300 steps: it has learned (at least) the shortcut."""
    model = build_model(model_kwargs, seed=0)
    return train(model, splits, steps=300)


def write_fake_run(run_dir, splits, model_kwargs, steps: int = 120, eval_every: int = 40):
    """A run directory in the lenslab-run/1 format, with a checkpoint + metrics per evaluation."""
    config = mpsp_run_config(
        seq_len=TASK.seq_len,
        n_values=TASK.n_values,
        n_train=1024,
        n_val=128,
        n_adv=128,
        ratio=0.9,
        layers=model_kwargs["n_layers"],
        heads=model_kwargs["n_heads"],
        epochs=steps,
        eval_every=eval_every,
    )
    atomic_write_json(run_dir / "config.json", {**config, "model": model_kwargs})
    save_splits(run_dir, splits)
    model = build_model(model_kwargs, seed=1)

    def on_eval(step, m):
        save_checkpoint(run_dir, step, m, model_kwargs)
        append_jsonl(
            run_dir / "metrics.jsonl",
            {
                "epoch": step,
                "train_acc": accuracy(m, splits["train_tokens"], splits["train_labels"]),
                "validation_acc": accuracy(m, splits["validation_tokens"], splits["validation_labels"]),
                "adv_acc": accuracy(m, splits["adv_tokens"], splits["adv_labels"]),
                "grad_conflict": -0.5 + step / 1000,
                "grad_amplification": 9.0,
            },
        )

    on_eval(0, model.eval())
    train(model, splits, steps=steps, seed=1, on_eval=on_eval, eval_every=eval_every)
    return run_dir


@pytest.fixture(scope="session")
def fake_run(tmp_path_factory, splits, model_kwargs):
    return write_fake_run(tmp_path_factory.mktemp("run") / "demo", splits, model_kwargs)
