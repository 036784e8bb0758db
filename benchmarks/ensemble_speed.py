"""Seed-epochs per second on the 2L paper model: plain TransformerLens loop vs lenslab's trainers.

    .venv/bin/python benchmarks/ensemble_speed.py [--sizes 1,4,8,16] [--epochs 1] [--device cpu] [--seq-len 5] [--batch-size 512|full]

All in one run, so the ratios compare like with like on a shared machine. Measured per loop:
training steps only (batch 512 unless --batch-size; seconds per epoch = per step x steps per epoch), no evaluation,
timed round-robin over the loops and reported as the minimum of several rounds, so that load
from other processes on a shared machine hits every loop alike. Loops:

- ``plain_tl``: ``HookedTransformer`` + ``torch.optim.AdamW``, full forward, loss at the readout;
- ``single_trainer``: ``training.trainer.train`` (includes its two evaluations with gradient
  probes, at epoch 0 and at the end, so it is an upper bound on its per-epoch cost);
- ``ensemble_E``: ``StackedTransformer`` + ``StackedAdamW``, the inner loop of
  ``training.ensemble.train_ensemble``, with E members;
- ``ensemble_E_xPproc``: P such ensembles stepping at once in P processes with cores/P threads
  each, which is how ``lenslab sweep --workers P`` uses the machine (default P = 2 on CPU).

Also the achieved GFLOP/s (forward work actually done x 3 for forward + backward) beside the
machine's large-matmul GFLOP/s (2048^2 sgemm), measured here too, and the CPU's model and nominal
fp32 peak (``cpu_fp32_peak``), with each loop's fraction of both. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lenslab.tasks import MPSPTask, make_mpsp_splits
from lenslab.training.config import mpsp_run_config
from lenslab.training.ensemble import ensemble_step
from lenslab.training.presets import build_model
from lenslab.training.stacked import StackedTransformer
from lenslab.training.stacked_adamw import StackedAdamW
from lenslab.training.trainer import epoch_generator, train


def sgemm_gflops(dev: torch.device, n: int = 2048, reps: int = 10) -> float:
    a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
    a @ b
    _sync(dev)
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    _sync(dev)
    return 2 * n**3 * reps / (time.perf_counter() - t) / 1e9


def cpu_fp32_peak(cpuinfo: str | None = None, cores: int | None = None) -> dict:
    """The CPU's nominal fp32 peak: cores x clock x flops per cycle from its widest FMA datapath
    (512-bit: 16 fp32 lanes, 256-bit: 8, x 2 for multiply-add, x 2 FMA units per core, assumed: the
    VM does not say how many a core has), from /proc/cpuinfo. AMD's Zen 4 (family 25) runs AVX-512
    on 256-bit datapaths, so it counts 8 lanes although it reports ``avx512f``. A nominal ceiling,
    not a measurement; the sgemm figure beside it is what large matmuls reach here."""
    import os

    flags, mhz, vendor, family = set(), None, None, None
    try:
        if cpuinfo is None:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        for line in cpuinfo.splitlines():
            key, _, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key == "flags" and not flags:
                flags = set(value.split())
            elif key == "cpu MHz" and mhz is None:
                mhz = float(value)
            elif key == "vendor_id" and vendor is None:
                vendor = value
            elif key == "cpu family" and family is None:
                family = int(value)
    except (OSError, ValueError):
        pass
    isa = "avx512f" if "avx512f" in flags else "avx2+fma" if {"avx2", "fma"} <= flags else "sse"
    bits = {"avx512f": 512, "avx2+fma": 256, "sse": 128}[isa]
    if isa == "avx512f" and vendor == "AuthenticAMD" and family is not None and family < 26:
        bits = 256  # Zen 4 splits each 512-bit operation into two 256-bit halves
    lanes = bits // 32
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    peak = None if mhz is None else cores * mhz / 1e3 * lanes * 2 * 2
    return {
        "isa": isa,
        "vendor": vendor,
        "cpu_family": family,
        "fma_datapath_bits": bits,
        "cores": cores,
        "mhz": mhz,
        "fp32_peak_gflops_nominal": None if peak is None else round(peak, 1),
    }


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def plain_tl_stepper(cfg, splits, dev):
    """One AdamW step of the plain TransformerLens loop per call."""
    model = build_model(cfg["model"], seed=0, device=str(dev))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    tokens, labels = splits["train_tokens"].to(dev), splits["train_labels"].to(dev)
    n, bs = len(tokens), cfg["train"]["batch_size"]
    perm = torch.randperm(n, generator=epoch_generator(0, 1)).to(dev)
    state = {"s": 0}

    def step():
        s = state["s"] = (state["s"] + bs) % n
        idx = perm[s : s + bs]
        loss = F.cross_entropy(model(tokens[idx])[:, -1], labels[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def ensemble_stepper(cfg, splits, E, dev):
    """One step of the ensemble engine's inner loop (E members) per call."""
    stack = StackedTransformer.from_models([build_model(cfg["model"], seed=s) for s in range(E)]).to(dev)
    params = list(stack.params)
    opt = StackedAdamW(params, [1e-3] * E, [0.1] * E, (0.9, 0.999))
    tokens = splits["train_tokens"].to(dev).expand(E, -1, -1).contiguous()
    labels = splits["train_labels"].to(dev).expand(E, -1).contiguous()
    n, bs = tokens.shape[1], cfg["train"]["batch_size"]
    perm = torch.stack([torch.randperm(n, generator=epoch_generator(s, 1)) for s in range(E)]).to(dev)
    state = {"s": 0}

    def step():
        s = state["s"] = (state["s"] + bs) % n
        ensemble_step(stack, opt, tokens, labels, perm[:, s : s + bs])

    return step, stack.flops_per_example()


def paper_setup(seq_len: int = 5, batch_size: int | None = 512) -> tuple[dict, dict]:
    """The 2L 2H paper model's run config (r = 0.9) and its splits; batch_size None = full batch."""
    cfg = mpsp_run_config(ratio=0.9, layers=2, heads=2, seq_len=seq_len)
    cfg["train"]["batch_size"] = batch_size or cfg["task"]["n_train"]
    t = cfg["task"]
    return cfg, make_mpsp_splits(
        MPSPTask(seq_len=t["seq_len"], n_values=t["n_values"]), 0.9, t["n_train"], t["n_val"], t["n_adv"], 0
    )


def _worker(conn, E: int, threads: int, device: str, setup: tuple) -> None:
    """A process holding its own E-member ensemble; runs one step per message (``lenslab sweep --workers P``)."""
    torch.set_num_threads(threads)
    cfg, splits = paper_setup(*setup)
    dev = torch.device(device)
    step, _ = ensemble_stepper(cfg, splits, E, dev)
    step()  # warm-up
    conn.send("ready")
    while conn.recv() == "step":
        step()
        _sync(dev)
        conn.send("done")


def multiprocess_stepper(E: int, processes: int, dev, setup: tuple):
    """One step of ``processes`` ensembles at once, each in its own process with cores/processes threads."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    threads = max(1, torch.get_num_threads() // processes)
    conns, procs = [], []
    for _ in range(processes):
        a, b = ctx.Pipe()
        pr = ctx.Process(target=_worker, args=(b, E, threads, str(dev), setup), daemon=True)
        pr.start()
        conns.append(a)
        procs.append(pr)
    for c in conns:
        assert c.recv() == "ready"

    def step():
        for c in conns:
            c.send("step")
        for c in conns:
            c.recv()

    def close():
        for c in conns:
            c.send("stop")
        for pr in procs:
            pr.join(10)

    return step, close, threads


def single_trainer(cfg, epochs, dev) -> float:
    with tempfile.TemporaryDirectory() as d:
        c = {**cfg, "train": {**cfg["train"], "epochs": epochs, "eval_every": 10**6}}
        t = time.perf_counter()
        train(c, Path(d) / "run", progress=False, device=str(dev))
        return (time.perf_counter() - t) / epochs


def interleaved(steppers: dict, steps: int, repeats: int, dev) -> dict[str, float]:
    """Seconds per step for each stepper: the minimum over ``repeats`` rounds, run round-robin
    so that load from other processes hits every variant alike."""
    best = {k: float("inf") for k in steppers}
    for f in steppers.values():
        f()  # warm-up
    for _ in range(repeats):
        for k, f in steppers.items():
            _sync(dev)
            t = time.perf_counter()
            for _ in range(steps):
                f()
            _sync(dev)
            best[k] = min(best[k], (time.perf_counter() - t) / steps)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,4,8,16")
    ap.add_argument("--epochs", type=int, default=1, help="epochs of the single-seed trainer's end-to-end run")
    ap.add_argument("--steps", type=int, default=8, help="AdamW steps per timing round")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved timing rounds (the minimum is reported)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--skip-single", action="store_true", help="skip the single-seed trainer")
    ap.add_argument("--seq-len", type=int, default=5, help="MPSP values per sequence (default 5)")
    ap.add_argument("--batch-size", default="512", help="batch size, or full (default 512)")
    ap.add_argument(
        "--processes",
        type=int,
        default=None,
        help="also time this many ensembles in parallel processes, as lenslab sweep --workers does (1: skip)",
    )
    a = ap.parse_args()
    dev = torch.device(a.device)
    if a.processes is None:
        a.processes = 1 if dev.type == "cuda" else 2
    setup = (a.seq_len, None if a.batch_size == "full" else int(a.batch_size))
    cfg, splits = paper_setup(*setup)
    t = cfg["task"]
    sizes = [int(x) for x in a.sizes.split(",")]
    out: dict = {
        "device": str(dev),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "model": f"2L 2H d_model 64 d_mlp 128, seq_len {a.seq_len} (n_ctx {a.seq_len + 1})",
        "n_train": t["n_train"],
        "batch_size": cfg["train"]["batch_size"],
        "steps_per_round": a.steps,
        "rounds": a.repeats,
        "sgemm_2048_gflops": round(sgemm_gflops(dev), 1),
    }
    if dev.type == "cpu":
        from lenslab.training.runio import run_environment

        out["cpu"] = run_environment(dev)["cpu"]
        out |= cpu_fp32_peak()
    steppers = {"plain_tl": plain_tl_stepper(cfg, splits, dev)}
    flops = {}
    for E in sizes:
        steppers[f"ensemble_{E}"], flops[E] = ensemble_stepper(cfg, splits, E, dev)
    closers = []
    if a.processes > 1:
        for E in sizes:
            steppers[f"ensemble_{E}_x{a.processes}proc"], close, threads = multiprocess_stepper(E, a.processes, dev, setup)
            closers.append(close)
    per_step = interleaved(steppers, a.steps, a.repeats, dev)
    for close in closers:
        close()
    steps_per_epoch = -(-t["n_train"] // cfg["train"]["batch_size"])
    tl = per_step["plain_tl"] * steps_per_epoch
    out["plain_tl"] = {"s_per_seed_epoch": round(tl, 4), "seed_epochs_per_s": round(1 / tl, 3)}
    for E in sizes:
        per_epoch = per_step[f"ensemble_{E}"] * steps_per_epoch
        out[f"ensemble_{E}"] = {
            "s_per_epoch": round(per_epoch, 4),
            "seed_epochs_per_s": round(E / per_epoch, 3),
            "x_plain_tl": round(tl / (per_epoch / E), 2),
            "gflops": round(3 * flops[E] * t["n_train"] * E / per_epoch / 1e9, 1),
        }
    if a.processes > 1:
        for E in sizes:
            per_epoch = per_step[f"ensemble_{E}_x{a.processes}proc"] * steps_per_epoch
            n = E * a.processes
            out[f"ensemble_{E}_x{a.processes}proc"] = {
                "members": n,
                "threads_per_process": threads,
                "s_per_epoch": round(per_epoch, 4),
                "seed_epochs_per_s": round(n / per_epoch, 3),
                "x_plain_tl": round(tl / (per_epoch / n), 2),
                "gflops": round(3 * flops[E] * t["n_train"] * n / per_epoch / 1e9, 1),
            }
    if not a.skip_single:
        st = single_trainer(cfg, a.epochs, dev)
        out["single_trainer"] = {
            "s_per_seed_epoch": round(st, 4),
            "seed_epochs_per_s": round(1 / st, 3),
            "x_plain_tl": round(tl / st, 2),
            "note": f"end to end over {a.epochs} epoch(s), including 2 evaluations with gradient probes; not interleaved",
        }
    keys = [k for k in out if k.startswith("ensemble_")]
    best = max(keys, key=lambda k: out[k]["seed_epochs_per_s"])
    out["best"] = best
    out["best_x_plain_tl"] = out[best]["x_plain_tl"]
    out["target_x_plain_tl"] = 3.0
    for k in keys:  # how much of the machine the ensembles use: the sgemm rate and the nominal peak
        out[k]["fraction_of_sgemm"] = round(out[k]["gflops"] / out["sgemm_2048_gflops"], 3)
        if out.get("fp32_peak_gflops_nominal"):
            out[k]["fraction_of_peak"] = round(out[k]["gflops"] / out["fp32_peak_gflops_nominal"], 3)
    out["best_fraction_of_peak"] = out[best].get("fraction_of_peak")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
