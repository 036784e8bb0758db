"""Many seeds of one configuration, E at a time on stacked weights (``lenslab train --seeds``).

    result = train_seeds(configs, root)   # configs: one per seed; runs land in ROOT/seed_<s>/

The ensemble size is measured here for this model and batch when not given (the fastest size
differs by machine: ``calibrate.choose_ensemble_size``). Chunking is ``sweep.chunked``, the same
packing a sweep uses for one group of compatible members.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from lenslab.training.calibrate import choose_ensemble_size
from lenslab.training.ensemble import train_ensemble
from lenslab.training.errors import ConfigError
from lenslab.training.sweep import chunked
from lenslab.training.trainer import resolve_device


def seed_dirs(root: str | Path, seeds: list[int]) -> list[Path]:
    """``ROOT/seed_<s>`` for each seed; a seed listed twice is refused (each seed gets one directory)."""
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds lists a seed twice ({seeds}); each seed gets one run directory")
    return [Path(root) / f"seed_{s}" for s in seeds]


def train_seeds(
    configs: list[dict],
    outs: list[Path],
    ensemble_size: int | None = None,
    resume: bool = False,
    progress: bool = True,
    device: str | None = None,
    log: Callable[[str], None] = lambda msg: None,
) -> list[dict]:
    """Train ``configs[i]`` into ``outs[i]``, ``ensemble_size`` at a time; returns each run's summary."""
    if ensemble_size is not None and ensemble_size < 1:
        raise ConfigError(f"--ensemble-size {ensemble_size} must be >= 1")
    size = ensemble_size
    if size is None:
        size, rates = choose_ensemble_size(configs[0], len(configs), resolve_device(device))
        log("ensemble size: " + ", ".join(f"E={E} {r:.1f}" for E, r in rates.items()) + f" seed-steps/s measured; using {size}")
    log(f"training {len(configs)} seeds into {Path(outs[0]).parent}/seed_<s>/, {size} at a time on stacked weights")
    summaries: list[dict] = []
    for cfgs, dirs in zip(chunked(configs, size), chunked(outs, size)):
        summaries += train_ensemble(cfgs, dirs, resume=resume, progress=progress, device=device)
    return summaries
