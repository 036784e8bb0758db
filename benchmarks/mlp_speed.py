"""MNIST-MLP training steps per second: a plain torch loop, lenslab's trainer path, and E seeds stacked.

    .venv/bin/python benchmarks/mlp_speed.py [--steps 15] [--rounds 3] [--threads 1,2] [--sizes 2,4,8]
        [--dtypes float32,float64] [--train-epochs 10] [--quick] [--out benchmarks/results_mlp_speed.json]

Paper 2's MLP (784-200-200-10, ReLU, init x8), AdamW lr 5e-4, MSE on one-hot targets, batch 200
of the 1,000 train digits of ``--task mnist`` (the real images, ``pixels / 255``). Loops, per dtype
and thread count (``torch.set_num_threads``), timed round-robin over every loop, dtype and thread
count (so load from other processes hits each alike) and reported as the best of ``--rounds``
rounds of ``--steps`` steps:

- ``plain``: ``nn.Sequential(Linear, ReLU, Linear, ReLU, Linear)`` + ``torch.optim.AdamW`` + ``F.mse_loss``;
- ``trainer``: the single-seed trainer's inner step (``lenslab train --task mnist``): ``HookedMLP``
  from ``build_model``, the trainer's AdamW, ``Objective.loss(Objective.logits(...))``, the loss sum,
  under ``deterministic_algorithms()``;
- ``stacked_E``: E seeds as one batched model: weights ``[E, d_in, d_out]``, ``torch.baddbmm``, each
  member on its own batch, one ``torch.optim.AdamW`` over the stacked parameters (AdamW is elementwise,
  so that is E independent AdamWs). ``seed_steps_per_s`` counts each member's step; ``x_trainer`` divides
  it by the trainer loop's steps/s of the same dtype and threads: above 1, stacking seeds pays.

Also ``trainer_train``: ``lenslab.training.trainer.train`` end to end for ``--train-epochs`` epochs
(5 steps each) into a temporary folder, with its 2 evaluations (epoch 0 and the last, 5,000 images
each) and checkpoints, so an upper bound on the per-step cost; not interleaved.

Every time is also taken as process CPU time (``cpu_ms_per_seed_step``): on a shared machine wall
time depends on the other processes, CPU time much less (it still counts OpenMP threads spinning).
``os.getloadavg()`` is recorded before and after. Prints one JSON document (``--out`` also writes it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lenslab.training.config import mnist_run_config
from lenslab.training.objective import Objective
from lenslab.training.presets import build_model
from lenslab.training.runio import run_environment
from lenslab.training.stacked_mlp import StackedMLP
from lenslab.training.trainer import _optimizer, deterministic_algorithms, epoch_generator, make_splits, train

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _cycle(n: int, bs: int, seed: int):
    """The next batch of rows of one fixed permutation, wrapping around (batch 200 of 1,000: 5 per pass)."""
    perm = torch.randperm(n, generator=epoch_generator(seed, 1))
    state = {"s": -bs}

    def nxt() -> torch.Tensor:
        state["s"] = (state["s"] + bs) % n
        return perm[state["s"] : state["s"] + bs]

    return nxt


def plain_stepper(cfg: dict, x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype):
    """The plain torch loop: nn.Sequential, AdamW, MSE on one-hot (what a reader would write)."""
    t, m = cfg["train"], cfg["model"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Linear(m["d_in"], m["d_hidden"]),
            nn.ReLU(),
            nn.Linear(m["d_hidden"], m["d_hidden"]),
            nn.ReLU(),
            nn.Linear(m["d_hidden"], m["d_out"]),
        ).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(m["init_scale"])
    opt = torch.optim.AdamW(model.parameters(), lr=t["lr"], betas=tuple(t["betas"]), weight_decay=t["weight_decay"])
    target = F.one_hot(y, m["d_out"]).to(dtype)
    nxt = _cycle(len(x), t["batch_size"], 0)

    def step():
        idx = nxt()
        loss = F.mse_loss(model(x[idx]), target[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def trainer_stepper(cfg: dict, splits: dict, dtype_name: str):
    """The single-seed trainer's inner step (trainer._loop), on the HookedMLP and its Objective."""
    t = {**cfg["train"], "dtype": dtype_name}
    model = build_model(cfg["model"], seed=0, device="cpu", dtype=dtype_name)
    opt = _optimizer(model, t)
    obj = Objective.of(cfg)
    x = obj.inputs(splits, "train", torch.device("cpu"), DTYPES[dtype_name])
    y = splits["train_labels"]
    nxt = _cycle(len(x), t["batch_size"], 0)
    loss_sum = torch.zeros((), dtype=DTYPES[dtype_name])
    model.train()

    def step():
        nonlocal loss_sum
        with deterministic_algorithms():
            idx = nxt()
            loss = obj.loss(obj.logits(model, x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss_sum += loss.detach()

    return step, model


def stacked_stepper(cfg: dict, splits: dict, E: int, dtype_name: str, check: list):
    """E seeds stacked: each member its own init (build_model(seed=s)) and its own batch order."""
    t, dtype = cfg["train"], DTYPES[dtype_name]
    members = [build_model(cfg["model"], seed=s, device="cpu", dtype=dtype_name) for s in range(E)]
    stack = StackedMLP.from_models(members)  # lenslab's (training.stacked_mlp), as the ensemble trainer uses
    opt = torch.optim.AdamW(stack.parameters(), lr=t["lr"], betas=tuple(t["betas"]), weight_decay=t["weight_decay"])
    obj = Objective.of(cfg)
    x = obj.inputs(splits, "train", torch.device("cpu"), dtype)
    y = splits["train_labels"]
    target = F.one_hot(y, cfg["model"]["d_out"]).to(dtype)
    nexts = [_cycle(len(x), t["batch_size"], s) for s in range(E)]
    with torch.no_grad():  # the stacked forward is each member's forward
        idx = torch.stack([n() for n in nexts])
        want = torch.stack([m(x[i]) for m, i in zip(members, idx)])
        check.append(float((stack(x[idx]) - want).abs().max() / want.abs().max()))

    def step():
        idx = torch.stack([n() for n in nexts])  # [E, batch]
        out = stack(x[idx])
        loss = (out - target[idx]).pow(2).mean((1, 2)).sum()  # each member's MSE mean; summed, gradients stay apart
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def _time(step, steps: int, threads: int) -> tuple[float, float]:
    torch.set_num_threads(threads)
    w, c = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    return (time.perf_counter() - w) / steps, (time.process_time() - c) / steps


def trainer_end_to_end(cfg: dict, dtype_name: str, threads: int, epochs: int) -> dict:
    torch.set_num_threads(threads)
    c = {**cfg, "train": {**cfg["train"], "dtype": dtype_name, "epochs": epochs, "eval_every": 10**6}}
    steps = epochs * -(-c["task"]["n_per_class"] * c["task"]["n_classes"] // c["train"]["batch_size"])
    with tempfile.TemporaryDirectory() as d:
        w, cpu = time.perf_counter(), time.process_time()
        train(c, Path(d) / "run", progress=False, device="cpu")
        w, cpu = time.perf_counter() - w, time.process_time() - cpu
    return {"steps": steps, "steps_per_s": round(steps / w, 2), "cpu_ms_per_step": round(1e3 * cpu / steps, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=15, help="AdamW steps per timing round (default 15)")
    ap.add_argument("--rounds", type=int, default=3, help="round-robin timing rounds; the best is kept (default 3)")
    ap.add_argument("--threads", default="1,2", help="torch thread counts, comma list (default 1,2)")
    ap.add_argument("--sizes", default="2,4,8", help="stacked seeds E, comma list (default 2,4,8)")
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--train-epochs", type=int, default=10, help="epochs of the end-to-end train() run (0: skip; default 10)")
    ap.add_argument("--quick", action="store_true", help="smoke test: 2 steps, 1 round, E=2, 1 thread, float32, 1-epoch train()")
    ap.add_argument("--out", default=None, help="also write the JSON here (e.g. benchmarks/results_mlp_speed.json)")
    a = ap.parse_args()
    if a.quick:
        a.steps, a.rounds, a.threads, a.sizes, a.dtypes, a.train_epochs = 2, 1, "1", "2", "float32", 1
    threads = [int(x) for x in a.threads.split(",")]
    sizes = [int(x) for x in a.sizes.split(",")]
    dtypes = a.dtypes.split(",")
    for d in dtypes:
        if d not in DTYPES:
            ap.error(f"--dtypes: {d!r} is not one of {', '.join(DTYPES)}")
    t0 = time.perf_counter()
    load_before = os.getloadavg()
    cfg = mnist_run_config()
    splits = make_splits(cfg)
    check: list[float] = []
    loops = {}
    for d in dtypes:
        x = splits["train_images"].to(DTYPES[d]) / 255.0
        loops[(d, "plain")] = plain_stepper(cfg, x, splits["train_labels"], DTYPES[d])
        loops[(d, "trainer")] = trainer_stepper(cfg, splits, d)[0]
        for E in sizes:
            loops[(d, f"stacked_{E}")] = stacked_stepper(cfg, splits, E, d, check)
    keys = [(d, th, name) for (d, name) in loops for th in threads]
    for d, th, name in keys:
        _time(loops[(d, name)], 1, th)  # warm-up, at every thread count
    best = {k: (float("inf"), float("inf")) for k in keys}
    for _ in range(a.rounds):
        for k in keys:
            w, c = _time(loops[(k[0], k[2])], a.steps, k[1])
            best[k] = (min(best[k][0], w), min(best[k][1], c))
    rows = []
    for d in dtypes:
        for th in threads:
            base_w, base_c = best[(d, th, "trainer")]
            plain_w = best[(d, th, "plain")][0]
            for name in ["plain", "trainer", *[f"stacked_{E}" for E in sizes]]:
                w, c = best[(d, th, name)]
                E = int(name.split("_")[1]) if name.startswith("stacked") else 1
                rows.append(
                    {
                        "dtype": d,
                        "threads": th,
                        "loop": name,
                        "seeds": E,
                        "steps_per_s": round(1 / w, 2),
                        "seed_steps_per_s": round(E / w, 2),
                        "x_plain": round((E / w) / (1 / plain_w), 3),
                        "x_trainer": round((E / w) / (1 / base_w), 3),
                        "cpu_ms_per_seed_step": round(1e3 * c / E, 3),
                        "x_trainer_cpu": round(base_c / (c / E), 3),
                    }
                )
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    end_to_end = []
    if a.train_epochs > 0:
        for d in dtypes:
            for th in threads:
                end_to_end.append({"dtype": d, "threads": th, **trainer_end_to_end(cfg, d, th, a.train_epochs)})
                print(json.dumps(end_to_end[-1]), file=sys.stderr, flush=True)
    verdict = {}
    for d in dtypes:
        for th in threads:
            stacked = [r for r in rows if r["dtype"] == d and r["threads"] == th and r["loop"].startswith("stacked")]
            top = max(stacked, key=lambda r: r["x_trainer"])
            verdict[f"{d}_{th}thread"] = {
                "best_stacked": top["loop"],
                "x_trainer": top["x_trainer"],
                "x_trainer_cpu": top["x_trainer_cpu"],
            }
    env = run_environment(torch.device("cpu"))
    out = {
        "benchmark": "mlp_speed",
        "device": "cpu",
        "cpu": env["cpu"],
        "cores": os.cpu_count(),
        "torch": env["torch"],
        "model": "784-200-200-10 ReLU MLP, init x8; AdamW lr 5e-4, betas (0.9, 0.999), wd 0; MSE on one-hot",
        "n_train": len(splits["train_images"]),
        "batch_size": cfg["train"]["batch_size"],
        "steps_per_round": a.steps,
        "rounds": a.rounds,
        "quick": a.quick,
        "loadavg_before": [round(v, 2) for v in load_before],
        "loadavg_after": [round(v, 2) for v in os.getloadavg()],
        "note": "training steps only (no evaluation); best of rounds, round-robin over loops, dtypes and threads; "
        "x_trainer > 1 means stacking E seeds beats training them one at a time with the single-seed trainer",
        "threads_note": "with the cores busy (load >= cores), 2 threads can be far slower than 1: each OpenMP region waits "
        "for the thread that the other process's time slice holds up; compare 1-thread rows on a loaded machine",
        "stacked_forward_rel_err_max": max(check),
        "results": rows,
        "trainer_train_end_to_end": end_to_end,
        "stacked_vs_one_at_a_time": verdict,
        "wall_s": None,
    }
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    text = json.dumps(out, indent=2)
    if a.out:
        Path(a.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
