"""Shared fixtures: one forkserver of lenslab children, and the uninterrupted reference runs."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from killharness import Harness, exec_run, run_files, train_argv

# a modular-addition run small enough to train in well under a second: 5 evaluations, checkpoints
# thinned after the first (ckpt-density 1: epochs 0, 1, 2, 4), so every kind of file gets written several times


@pytest.fixture(scope="session")
def harness(tmp_path_factory):
    return Harness(tmp_path_factory.mktemp("harness"))


@pytest.fixture(scope="session")
def reference(harness):
    """The uninterrupted run, made by a real ``python -m lenslab.cli`` process."""
    o = exec_run(train_argv("reference"), harness.cwd)
    assert o.rc == 0, o.stderr
    return run_files(harness.cwd / "reference")


@pytest.fixture(scope="session")
def probe(harness):
    """The same run in a forked child, recording its write events: ``(events, files)``."""
    o = harness.run(train_argv("probe"), record=harness.logs / "probe-events.jsonl")
    assert o.rc == 0, o.stderr
    return o.events, run_files(harness.cwd / "probe")
