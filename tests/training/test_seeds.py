"""``lenslab.training.seeds``: many seeds of one config, E at a time (the library under ``train --seeds``)."""

from __future__ import annotations

import pytest
from helpers import tiny_config

from lenslab.training.errors import ConfigError
from lenslab.training.run import Run
from lenslab.training.seeds import seed_dirs, train_seeds
from lenslab.training.sweep import chunked


def test_chunked_keeps_order_and_the_short_tail():
    assert chunked(list(range(7)), 3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert chunked([], 3) == []


def test_bad_seeds_and_sizes_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ConfigError, match="twice"):
        seed_dirs(tmp_path, [0, 1, 0])
    outs = seed_dirs(tmp_path, [0, 1])
    with pytest.raises(ConfigError, match="ensemble-size 0"):
        train_seeds([tiny_config(seed=s, epochs=1) for s in (0, 1)], outs, ensemble_size=0, progress=False)
    assert not any(tmp_path.iterdir())


def test_three_seeds_two_at_a_time_each_get_their_own_run(tmp_path):
    outs = seed_dirs(tmp_path, [0, 1, 2])
    logged = []
    summaries = train_seeds(
        [tiny_config(seed=s, epochs=2) for s in (0, 1, 2)], outs, ensemble_size=2, progress=False, log=logged.append
    )
    assert len(summaries) == 3 and [o.name for o in outs] == ["seed_0", "seed_1", "seed_2"]
    for s, out in enumerate(outs):
        run = Run.open(out)
        assert run.config["train"]["seed"] == s and run.metrics[-1]["epoch"] == 2
    assert any("2 at a time" in m for m in logged)
