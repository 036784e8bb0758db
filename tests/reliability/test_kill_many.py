"""kill -9 during ``train --seeds`` (one ensemble, several run directories) and ``sweep`` (several
ensembles, plus ``sweep.json`` and ``results.*``): after any kill every member opens, the rerun
finishes (``--resume`` for train, the same command for a sweep), and the whole ``--out`` folder is
bitwise the uninterrupted one made by a separate ``python -m lenslab.cli`` process.

Event names are relative to the run directory that writes them, so the n-th event on a file
picks a member: members of one ensemble write in turn, epoch by epoch.
``tests/stress/kill_stress.py --argv "sweep ..."`` tries many more kill points.
"""

from __future__ import annotations

import pytest
from killharness import Fault, check_after_kill, diff_runs, exec_run, out_dir, recover, run_files

TINY = ["--seq-len", "4", "--n-values", "8", "--n-train", "512", "--n-val", "64", "--n-adv", "64", "--batch-size", "256"]
# 2 cells x 2 seeds in ensembles of 2: two jobs, run one after the other in the sweep's process (--workers 1:
# the harness's fault hooks live in that process)
SWEEP = [
    "sweep",
    "--layers",
    "1",
    "--heads",
    "1",
    "--ratios",
    "0.5,0.9",
    "--seeds",
    "0-1",
    "--ensemble-size",
    "2",
    "--workers",
    "1",
    *TINY,
    "--epochs",
    "2",
    "--eval-every",
    "1",
    "--no-progress",
]
SEEDS = [
    "train",
    "--seeds",
    "0-1",
    "--task",
    "modadd",
    "--p",
    "11",
    "--train-frac",
    "0.5",
    "--epochs",
    "2",
    "--eval-every",
    "1",
    "--no-progress",
]
COMMANDS = {"sweep": SWEEP, "seeds": SEEDS}

# (command, case id, file, op, n-th such event, action)
CASES = [
    ("sweep", "plan-torn", ".sweep.json.*.tmp", "fsync", 0, "tear"),  # before any member exists
    ("sweep", "member-metrics-torn", "metrics.jsonl", "fsync", 4, "tear"),  # first job, a member's 3rd row
    ("sweep", "second-job-checkpoint-torn", "checkpoints/.1.safetensors.*.tmp", "fsync", 2, "tear"),
    ("sweep", "between-jobs", "summary.json", "replace", 7, "after"),  # first job's last summary, second not started
    ("sweep", "results-torn", ".results.json.*.tmp", "fsync", 0, "tear"),  # every member done, the table half-written
    ("seeds", "second-member-checkpoint-torn", "checkpoints/.1.safetensors.*.tmp", "fsync", 1, "tear"),
    ("seeds", "summary-before-rename", "summary.json", "replace", 3, "kill"),
]


@pytest.fixture(scope="module")
def references(harness):
    """Per command: the exec'd reference folder's files, and a forked probe's write events."""
    out = {}
    for name, argv in COMMANDS.items():
        o = exec_run([*argv, "--out", f"ref-{name}"], harness.cwd)
        assert o.rc == 0, o.stderr
        probe = harness.run([*argv, "--out", f"probe-{name}"], record=harness.logs / f"probe-{name}.jsonl")
        assert probe.rc == 0, probe.stderr
        ref = run_files(harness.cwd / f"ref-{name}")
        assert diff_runs(run_files(harness.cwd / f"probe-{name}"), ref) == []  # forked == exec'd, byte for byte
        out[name] = (ref, probe.events)
    return out


def _nth(events: list[dict], file: str, op: str, n: int) -> int:
    return [e["i"] for e in events if e["file"] == file and e["op"] == op][n]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_kill_then_rerun_gives_the_uninterrupted_folder(harness, references, case):
    command, name, file, op, n, action = case
    reference, events = references[command]
    argv = [*COMMANDS[command], "--out", f"kill-{command}-{name}"]
    run = out_dir(argv, harness.cwd)
    event = _nth(events, file, op, n)
    killed = harness.run(argv, fault=Fault(event, action, seed=event))
    assert killed.killed, killed.stderr
    assert check_after_kill(run, reference) == []
    _, done = recover(harness, argv)
    assert done.rc == 0, done.stderr
    assert diff_runs(run_files(run), reference) == []


def test_sweep_killed_from_outside_and_again_in_its_rerun(harness, references):
    reference, events = references["sweep"]
    argv = [*SWEEP, "--out", "kill-sweep-twice"]
    run = out_dir(argv, harness.cwd)
    assert harness.run(argv, fault=Fault(_nth(events, "metrics.jsonl", "fsync", 2), "kill", seed=3)).killed
    assert check_after_kill(run, reference) == []
    # the rerun skips nothing of the unfinished first job; cut it at its next checkpoint write
    assert harness.run(argv, fault=Fault(file="checkpoints/.2.safetensors.*.tmp", action="tear", seed=4)).killed
    assert check_after_kill(run, reference) == []
    harness.run(argv, kill_after=0.3)  # may or may not land before the end
    assert check_after_kill(run, reference) == []
    _, done = recover(harness, argv)
    assert done.rc == 0, done.stderr
    assert diff_runs(run_files(run), reference) == []
