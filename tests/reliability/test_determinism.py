"""Same seed, two processes: bitwise the same splits, weights, metrics (and the same files)."""

from __future__ import annotations

from killharness import diff_runs, run_files

MPSP = [
    "train",
    "--seq-len",
    "4",
    "--n-values",
    "8",
    "--n-train",
    "256",
    "--n-val",
    "64",
    "--n-adv",
    "64",
    "--layers",
    "1",
    "--heads",
    "1",
    "--batch-size",
    "64",
    "--epochs",
    "2",
    "--eval-every",
    "1",
    "--no-progress",
]


def test_same_seed_same_run_across_processes_and_another_seed_differs(harness):
    runs = {}
    for name, extra in (("det-a", []), ("det-b", []), ("det-seed1", ["--seed", "1"]), ("det-data1", ["--data-seed", "1"])):
        o = harness.run([*MPSP, *extra, "--out", name])
        assert o.rc == 0, o.stderr
        runs[name] = run_files(harness.cwd / name)
    assert diff_runs(runs["det-a"], runs["det-b"]) == []
    assert {"splits.safetensors", "metrics.jsonl", "checkpoints/2.safetensors"} <= set(runs["det-a"])
    other_init = diff_runs(runs["det-seed1"], runs["det-a"])
    assert "differs splits.safetensors" not in other_init and "differs checkpoints/0.safetensors" in other_init
    assert "differs splits.safetensors" in diff_runs(runs["det-data1"], runs["det-a"])
