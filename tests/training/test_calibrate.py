"""The ensemble size is chosen by measured speed: the fastest candidate wins, sizes above the seed count are never tried."""

import torch
from helpers import tiny_config

from lenslab.training.calibrate import choose_ensemble_size


def _fake_steps(monkeypatch, seconds_per_step: dict[int, float]):
    """Replace the real step with one that advances a fake clock by ``seconds_per_step[E]``; returns (clock, sizes built)."""
    import lenslab.training.calibrate as cal

    clock = {"t": 0.0}
    made = []

    def fake_stepper(config, E, device):
        made.append(E)

        def step():
            clock["t"] += seconds_per_step[E]

        return step

    monkeypatch.setattr(cal, "_stepper", fake_stepper)
    return clock, made


def test_the_fastest_size_per_seed_wins(monkeypatch):
    seconds_per_step = {1: 0.010, 2: 0.012, 4: 0.016, 8: 0.060}  # seed-steps/s: 100, 167, 250, 133
    clock, made = _fake_steps(monkeypatch, seconds_per_step)
    size, rates = choose_ensemble_size(tiny_config(), n_seeds=8, timer=lambda: clock["t"], steps=3)
    assert size == 4
    assert made == [1, 2, 4, 8]  # 16 > 8 seeds: not tried
    for E, spp in seconds_per_step.items():  # seed-steps per second: E members x 1 / (seconds per step)
        assert abs(rates[E] - E / spp) < 1e-6 * rates[E]


def test_a_real_measurement_leaves_the_callers_rng_alone():
    torch.manual_seed(123)
    want = torch.rand(3)
    torch.manual_seed(123)
    size, rates = choose_ensemble_size(tiny_config(), n_seeds=2, steps=1, rounds=1)
    assert torch.equal(torch.rand(3), want)
    assert size in (1, 2) and set(rates) == {1, 2} and all(r > 0 for r in rates.values())


def test_sizes_past_a_clear_slowdown_are_not_tried(monkeypatch):
    clock, made = _fake_steps(monkeypatch, {1: 0.010, 2: 0.030, 4: 1.0})  # seed-steps/s: 100, 67 (< 0.8 x 100: stop)
    size, rates = choose_ensemble_size(tiny_config(), n_seeds=16, timer=lambda: clock["t"])
    assert size == 1 and made == [1, 2] and set(rates) == {1, 2}
