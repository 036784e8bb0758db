"""Sweeps: packing, resumability, the Wilson table, and a real local Ray instance vs the local executor."""

import json

import pytest
from scipy.stats import norm

from training.errors import ConfigError, RunError
from training.run import Run
from training.sweep import pack, plan_sweep, run_sweep, wilson

TINY = dict(seq_len=4, n_values=8, n_train=512, n_val=128, n_adv=128, batch_size=256, eval_every=2)


def _plan(out, epochs=2, **kw):
    grid = dict(layers=[1], heads=[1, 2], ratios=[0.5, 0.9], seeds=[0, 1], ensemble_size=4)
    grid.update(kw)
    return plan_sweep(out, epochs=epochs, **grid, **TINY)


def test_wilson_matches_the_closed_form():
    for k, n in [(0, 16), (5, 16), (16, 16), (77, 100)]:
        z = norm.ppf(0.975)
        p = k / n
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z / (1 + z * z / n) * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5
        lo, hi = wilson(k, n)
        assert lo == pytest.approx(centre - half, abs=1e-12) and hi == pytest.approx(centre + half, abs=1e-12)


def test_packing_groups_by_architecture_and_mixes_ratios(tmp_path):
    plan = _plan(tmp_path / "s", ensemble_size=8)
    jobs = pack(plan)
    assert sorted(len(j) for j in jobs) == [4, 4]  # per heads value: 2 ratios x 2 seeds
    for job in jobs:
        assert len({m.cell.heads for m in job}) == 1
        assert {m.cell.ratio for m in job} == {0.5, 0.9}


def test_sweep_table_resume_extension_and_skip(tmp_path):
    straight = tmp_path / "straight"
    rows = run_sweep(_plan(straight, epochs=4, heads=[1]), progress=False)  # default workers: a process per job here
    assert [r["runs"] for r in rows] == [2, 2]
    # an independent count of the table from the members' own summaries
    for r in rows:
        sums = [Run.open(straight / r["cell"] / f"seed_{s}").summary for s in (0, 1)]
        assert r["generalized"] == sum(bool(s["generalized"]) for s in sums)
    assert (straight / "results.csv").read_text().splitlines()[0].startswith("cell,layers,heads,ratio")
    assert "<div" in (straight / "results.html").read_text()

    grown = tmp_path / "grown"
    run_sweep(_plan(grown, epochs=2, heads=[1]), workers=1, progress=False)
    run_sweep(_plan(grown, epochs=4, heads=[1]), workers=1, progress=False)  # extends every member to 4 epochs
    for m in _plan(grown, heads=[1])["members"]:
        a, b = Run.open(straight / m["out"]), Run.open(grown / m["out"])
        assert a.metrics == b.metrics, m["out"]  # in-process (grown) == worker processes (straight), too

    before = {p: p.stat().st_mtime_ns for p in grown.rglob("*.safetensors")}
    run_sweep(_plan(grown, epochs=4, heads=[1]), workers=1, progress=False)  # all done: nothing retrained
    assert {p: p.stat().st_mtime_ns for p in grown.rglob("*.safetensors")} == before


def test_a_different_sweep_in_the_same_folder_is_refused(tmp_path):
    run_sweep(_plan(tmp_path / "s", ratios=[0.9], heads=[1], seeds=[0]), workers=1, progress=False)
    with pytest.raises(RunError, match="different sweep"):
        run_sweep(_plan(tmp_path / "s", ratios=[0.5], heads=[1], seeds=[0]), workers=1, progress=False)
    with pytest.raises(ConfigError, match="twice"):
        _plan(tmp_path / "t", seeds=[0, 0])


def test_a_second_sweep_process_on_the_folder_is_refused_and_a_killed_ones_leftovers_are_not(tmp_path):
    from training.runio import RunLock

    plan = _plan(tmp_path / "s", epochs=1)
    with RunLock(tmp_path / "s"):  # another process's lock (flock: per open file, so this holds against us too)
        with pytest.raises(RunError, match="another lenslab process"):
            run_sweep(plan, workers=1, progress=False)
    assert not (tmp_path / "s" / "sweep.json").exists()
    # a sweep killed while writing its plan leaves only a temp file: the folder still counts as new
    (tmp_path / "s" / ".sweep.json.abc123.tmp").write_text('{"form')
    run_sweep(plan, workers=1, progress=False)
    assert sorted(p.name for p in (tmp_path / "s").iterdir() if p.name.startswith(".")) == []


def test_ray_executor_gives_the_local_results(tmp_path):
    ray = pytest.importorskip("ray")
    plan_kw = dict(heads=[1], ratios=[0.5, 0.9], seeds=[0, 1], ensemble_size=2)
    local = run_sweep(_plan(tmp_path / "local", **plan_kw), workers=1, progress=False)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = run_sweep(_plan(tmp_path / "ray", **plan_kw), executor="ray", workers=2, progress=False)
    finally:
        ray.shutdown()
    assert local == remote
    for m in _plan(tmp_path / "local", **plan_kw)["members"]:
        a = Run.open(tmp_path / "local" / m["out"]).metrics
        b = Run.open(tmp_path / "ray" / m["out"]).metrics
        assert [r["epoch"] for r in a] == [r["epoch"] for r in b]
        for ra, rb in zip(a, b):
            assert ra["adv_acc"] == rb["adv_acc"] and ra["train_loss"] == pytest.approx(rb["train_loss"], abs=1e-6)
    assert json.loads((tmp_path / "ray" / "results.json").read_text())["cells"] == remote
