"""kill -9 during training loses nothing: after any kill the run opens, ``--resume`` finishes, and
the result is bitwise the uninterrupted run (made by a separate ``python -m lenslab.cli`` process).

A handful of kill points here; ``tests/stress/kill_stress.py`` tries every write event.
"""

from __future__ import annotations

import random

import pytest
from killharness import Fault, check_after_kill, diff_runs, out_dir, recover, run_files, train_argv


def nth_event(events: list[dict], file: str, op: str = "fsync", n: int = 0) -> int:
    """Index of the ``n``-th write event on ``file`` (a name as ``killharness.event_name`` writes it)."""
    hits = [e["i"] for e in events if e["file"] == file and e["op"] == op]
    return hits[n]


# (case id, file, op, n-th such event, action): the moments the issue names, and between files
CASES = [
    ("config-write", ".config.json.*.tmp", "fsync", 0, "tear"),  # before there is a run: restarted
    ("metrics-append-torn", "metrics.jsonl", "fsync", 2, "tear"),  # half a JSON line on disk
    ("checkpoint-torn", "checkpoints/.1.safetensors.*.tmp", "fsync", 0, "tear"),  # half a safetensors
    ("checkpoint-then-kill", "checkpoints/2.safetensors", "replace", 0, "after"),  # checkpoint new, resume state old
    ("resume-state-before-rename", "checkpoints/resume.safetensors", "replace", 3, "kill"),
    ("summary-torn", ".summary.json.*.tmp", "fsync", 2, "tear"),
]


def test_the_reference_runs_agree_across_processes(reference, probe):
    """A forked child and an exec'd ``python -m lenslab.cli`` write bitwise the same run."""
    assert diff_runs(probe[1], reference) == []
    assert "metrics.jsonl" in reference and "checkpoints/4.safetensors" in reference


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_kill_at_a_write_then_resume(harness, reference, probe, case):
    name, file, op, n, action = case
    argv = train_argv(f"kill-{name}")
    run = out_dir(argv, harness.cwd)
    event = nth_event(probe[0], file, op, n)
    killed = harness.run(argv, fault=Fault(event, action, seed=event))
    assert killed.killed, killed.stderr
    assert check_after_kill(run, reference) == []
    if action == "tear" and file == "metrics.jsonl":  # the torn line is on disk, and was not read as a row
        assert not (run / "metrics.jsonl").read_bytes().endswith(b"\n")
    how, done = recover(harness, argv)
    assert done.rc == 0, done.stderr
    assert how == ("restarted" if name == "config-write" else "resumed")
    assert diff_runs(run_files(run), reference) == []  # no temp files, no lock, same bytes


def test_a_resume_killed_again_and_a_kill_from_outside(harness, reference, probe):
    """Kill, kill the resume mid-checkpoint, then SIGKILL from outside at a seeded random time."""
    argv = train_argv("kill-chain")
    run = out_dir(argv, harness.cwd)
    assert harness.run(argv, fault=Fault(nth_event(probe[0], "metrics.jsonl", n=1), "tear", seed=1)).killed
    # the resume replays from epoch 0: cut its write of checkpoint 1
    assert harness.run([*argv, "--resume"], fault=Fault(file="checkpoints/.1.safetensors.*.tmp", action="tear", seed=2)).killed
    assert check_after_kill(run, reference) == []
    delay = random.Random(7).uniform(0.05, 0.6)
    harness.run([*argv, "--resume"], kill_after=delay)  # may or may not land before the end
    assert check_after_kill(run, reference) == []
    how, done = recover(harness, argv)
    assert (how, done.rc) == ("resumed", 0), done.stderr
    assert diff_runs(run_files(run), reference) == []
