"""How many members per stacked ensemble train fastest here: measured, not a constant.

    size, rates = choose_ensemble_size(config, n_seeds=8)   # e.g. 4, {1: 9.1, 2: 14.0, 4: 17.2, 8: 12.3}

The best size depends on the machine (cores, caches, kernels), the model and the batch: on one
2-core machine E = 4 gave 3.6x the plain TransformerLens loop and E = 8 only 2.3x
(``benchmarks/ensemble_speed.py``). So ``lenslab train --seeds`` times a few AdamW steps of the
real model at each candidate size and keeps the fastest. A member's numbers do not depend on the
size (tested in ``tests/training/test_training_ensemble.py``), so the choice changes speed only.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

CANDIDATES = (1, 2, 4, 8, 16)
STOP_BELOW = 0.8  # stop trying larger sizes once one runs below this share of the best rate so far


def _stepper(config: dict, E: int, device: torch.device) -> Callable[[], None]:
    from lenslab.training.config import torch_dtype
    from lenslab.training.ensemble import ensemble_step
    from lenslab.training.objective import Objective
    from lenslab.training.presets import build_model
    from lenslab.training.spec import is_mlp_config
    from lenslab.training.stacked import StackedTransformer
    from lenslab.training.stacked_adamw import StackedAdamW
    from lenslab.training.stacked_mlp import StackedMLP

    t, m = config["train"], config["model"]
    dtype = torch_dtype(t)
    models = [build_model(m, seed=s, device=str(device), dtype=dtype) for s in range(E)]
    mlp = is_mlp_config(m)
    ens = (StackedMLP if mlp else StackedTransformer).from_models(models).to(device)
    opt = StackedAdamW(list(ens.params), [t["lr"]] * E, [t["weight_decay"]] * E, tuple(t["betas"]))
    n = t["batch_size"] or _train_size(config)
    g = torch.Generator().manual_seed(0)
    if mlp:  # pixels / 255 in [0, 1]
        inputs = torch.rand(E, n, m["d_in"], generator=g).to(device=device, dtype=dtype)
        labels = torch.randint(0, m["d_out"], (E, n), generator=g).to(device)
    else:
        inputs = torch.randint(0, m["d_vocab"], (E, n, m["n_ctx"]), generator=g).to(device)
        labels = torch.randint(0, m["d_vocab_out"], (E, n), generator=g).to(device)
    idx = torch.arange(n, device=device).expand(E, n).contiguous()
    obj = Objective.of(config)
    return lambda: ensemble_step(ens, opt, inputs, labels, idx, objective=obj)


def _train_size(config: dict) -> int:
    task = config["task"]
    if task["name"] == "mpsp":
        return task["n_train"]
    if task["name"] == "mnist":
        return task["n_per_class"] * task["n_classes"]
    from lenslab.tasks import ModAddTask

    return ModAddTask(p=task["p"], train_frac=task["train_frac"]).n_train


def choose_ensemble_size(
    config: dict,
    n_seeds: int,
    device: str | torch.device = "cpu",
    candidates: tuple[int, ...] = CANDIDATES,
    steps: int = 3,
    rounds: int = 2,
    timer: Callable[[], float] = time.perf_counter,
) -> tuple[int, dict[int, float]]:
    """The candidate size (<= n_seeds) with the most seed-steps per second, and every size's rate.

    Each size runs one warm-up step, then ``rounds`` rounds of ``steps`` steps; its time is the
    fastest round, so load from other processes hurts every size alike as little as possible.
    """
    dev = torch.device(device)
    sizes = [E for E in candidates if E <= n_seeds] or [n_seeds]
    rates: dict[int, float] = {}
    with torch.random.fork_rng(devices=[]):  # never touch the caller's RNG streams
        for E in sizes:
            step = _stepper(config, E, dev)
            step()
            best = float("inf")
            for _ in range(rounds):
                t0 = timer()
                for _ in range(steps):
                    step()
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                best = min(best, timer() - t0)
            rates[E] = E * steps / best if best > 0 else float("inf")
            if rates[E] < STOP_BELOW * max(rates.values()):
                break  # throughput falls with size from here on (memory-bound, e.g. full batch): larger stacks only cost time
    return max(rates, key=lambda E: (rates[E], -E)), rates
