"""Sweeps: packing, resumability, the Wilson table, and a real local Ray instance vs the local executor."""

import json

import pytest
from scipy.stats import norm

from lenslab.training.errors import ConfigError, RunError
from lenslab.training.run import Run
from lenslab.training.sweep import pack, plan_sweep, run_sweep, wilson

TINY = {"seq_len": 4, "n_values": 8, "n_train": 512, "n_val": 128, "n_adv": 128, "batch_size": 256, "eval_every": 2}


def _plan(out, epochs=2, **kw):
    grid = {"layers": [1], "heads": [1, 2], "ratios": [0.5, 0.9], "seeds": [0, 1], "ensemble_size": 4}
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
    assert not (straight / "results.html").exists()  # training returns tables; the figure is the report layer's
    from lenslab.sweep_figures import write_sweep_figure

    assert "<div" in write_sweep_figure(straight, rows).read_text() == (straight / "results.html").read_text()

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
    with pytest.raises(RunError, match="different sweep.*eval_every"):  # same cell and seed, other settings
        run_sweep(
            plan_sweep(tmp_path / "s", layers=[1], heads=[1], ratios=[0.9], seeds=[0], epochs=2, **{**TINY, "eval_every": 1}),
            workers=1,
            progress=False,
        )
    with pytest.raises(ConfigError, match="twice"):
        _plan(tmp_path / "t", seeds=[0, 0])


def test_grid_axes_name_cells_by_value_and_reach_the_configs(tmp_path):
    tiny = {k: v for k, v in TINY.items() if k not in ("seq_len", "n_values", "batch_size")}
    plan = plan_sweep(
        tmp_path / "s",
        layers=[1],
        heads=[1],
        ratios=[0.9],
        seeds=[0],
        seq_lens=[4, 5],
        n_values=[8, 16],
        batch_sizes=[256, 0],
        lrs=[1e-3, 3e-3],
        ensemble_size=4,
        epochs=1,
        **tiny,
    )
    assert len(plan["members"]) == 16
    for m in plan["members"]:
        task, train, model = m["config"]["task"], m["config"]["train"], m["config"]["model"]
        name = m["out"].split("/")[0]
        # the name carries every value that differs from mpsp_run_config's default, and only those
        assert ("-len4" in name) == (task["seq_len"] == 4) and "-len5" not in name
        assert ("-v8" in name) == (task["n_values"] == 8) and "-v16" not in name
        assert ("-bfull" in name) == (train["batch_size"] is None) and ("-b256" in name) == (train["batch_size"] == 256)
        assert ("-lr0.003" in name) == (train["lr"] == 3e-3)
        assert model["n_ctx"] == task["seq_len"] + 1 and model["d_vocab"] == task["n_values"] + 1
    # an ensemble shares the architecture, the task's shape and the batch size
    for job in pack(plan):
        keys = {(m.config["task"]["seq_len"], m.config["task"]["n_values"], m.config["train"]["batch_size"]) for m in job}
        assert len(keys) == 1
    # one value still works as a plain setting, and names stay those of a sweep without axes
    assert _plan(tmp_path / "u", heads=[1])["members"][0]["out"] == "L1H1-r0.5-wd0.1-len4-v8-b256/seed_0"
    old_style = plan_sweep(tmp_path / "v", layers=[2], heads=[2], ratios=[0.9], seeds=[0], epochs=1)
    assert old_style["members"][0]["out"] == "L2H2-r0.9-wd0.1/seed_0"


def test_bad_axes_are_refused_before_anything_is_written(tmp_path):
    kw = {"layers": [1], "heads": [1], "ratios": [0.9], "seeds": [0], "epochs": 1}
    with pytest.raises(ConfigError, match="seq lens twice"):
        plan_sweep(tmp_path / "a", seq_lens=[5, 5], **kw)
    with pytest.raises(ConfigError, match="batch size -1"):
        plan_sweep(tmp_path / "a", batch_sizes=[-1], **kw)
    with pytest.raises(ConfigError, match="larger than the train split"):
        plan_sweep(tmp_path / "a", batch_sizes=[100_000], **kw)
    # 4 values of 0..3 (256 sequences) can't hold 16,384 + 2,048 + 2,048 distinct ones; the error names the largest train split
    from lenslab.tasks import MPSPTask
    from lenslab.tasks.splits import n_consistent

    task = MPSPTask(seq_len=4, n_values=4)
    seqs = task.decode(list(range(task.n_sequences)))  # brute force: count the groups by enumeration
    have_c = int((task.labels(seqs) == task.shortcuts(seqs)).sum())
    have_a = len(seqs) - have_c
    best = max(n for n in range(300) if n_consistent(0.9, n) + 8 <= have_c and n - n_consistent(0.9, n) + 8 <= have_a)
    with pytest.raises(ConfigError, match=f"seq_len=4, n_values=4 .* largest train split .* n_train={best}:"):
        plan_sweep(tmp_path / "a", seq_lens=[4], n_values=[4], n_val=8, n_adv=8, **kw)
    assert not (tmp_path / "a").exists()


def test_a_grown_grid_keeps_finished_cells_and_adds_new_ones(tmp_path):
    root = tmp_path / "s"
    first = run_sweep(_plan(root, epochs=2, heads=[1], ratios=[0.9]), workers=1, progress=False)
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*.safetensors")}
    # a second command: another ratio and a longer horizon for it only; the first cell is not in this grid
    rows = run_sweep(_plan(root, epochs=4, heads=[1], ratios=[0.5]), workers=1, progress=False)
    assert {p: p.stat().st_mtime_ns for p in before} == before  # the finished cell was not touched
    assert sorted(r["cell"] for r in rows) == sorted([first[0]["cell"], first[0]["cell"].replace("-r0.9-", "-r0.5-")])
    by = {r["ratio"]: r for r in rows}
    assert (by[0.9]["epochs_max"], by[0.5]["epochs_max"]) == (2, 4) and by[0.9]["runs"] == by[0.5]["runs"] == 2
    stored = json.loads((root / "sweep.json").read_text())
    assert stored["grid"]["ratios"] == [0.5, 0.9] and len(stored["members"]) == 4


def test_results_say_how_each_run_ended(tmp_path):
    from lenslab.training.outcomes import OUTCOMES, run_outcome

    root = tmp_path / "s"
    rows = run_sweep(_plan(root, epochs=3, heads=[1]), workers=1, progress=False)
    doc = json.loads((root / "results.json").read_text())
    assert len(doc["runs"]) == 4
    for r in doc["runs"]:
        run = Run.open(root / r["cell"] / f"seed_{r['seed']}")
        last = run.metrics[-1]
        assert r["outcome"] in OUTCOMES and r == {
            "cell": r["cell"],
            **{k: r[k] for k in ("layers", "heads", "ratio", "weight_decay", "seq_len", "n_values", "batch_size", "lr", "seed")},
            **run_outcome(run),
        }
        assert (r["train_acc_final"], r["adv_acc_last"], r["validation_acc"]) == (
            last["train_acc"],
            last["adv_acc"],
            last["validation_acc"],
        )
    for c in rows:  # each failed run is counted once in its cell's breakdown
        runs = [r for r in doc["runs"] if r["cell"] == c["cell"]]
        fails = sum(c[k] for k in c if k.startswith("failed_"))
        assert fails == sum(1 for r in runs if r["outcome"] not in ("generalized", "transient"))
    header = (root / "results_runs.csv").read_text().splitlines()[0].split(",")
    assert header[:2] == ["cell", "layers"] and "outcome" in header and "adv_trend" in header


def test_a_second_sweep_process_on_the_folder_is_refused_and_a_killed_ones_leftovers_are_not(tmp_path):
    from lenslab.training.runio import RunLock

    plan = _plan(tmp_path / "s", epochs=1)
    # another process's lock (flock: per open file, so this holds against us too)
    with RunLock(tmp_path / "s"), pytest.raises(RunError, match="another lenslab process"):
        run_sweep(plan, workers=1, progress=False)
    assert not (tmp_path / "s" / "sweep.json").exists()
    # a sweep killed while writing its plan leaves only a temp file: the folder still counts as new
    (tmp_path / "s" / ".sweep.json.abc123.tmp").write_text('{"form')
    run_sweep(plan, workers=1, progress=False)
    assert sorted(p.name for p in (tmp_path / "s").iterdir() if p.name.startswith(".")) == []


def test_ray_executor_gives_the_local_results(tmp_path):
    ray = pytest.importorskip("ray")
    plan_kw = {"heads": [1], "ratios": [0.5, 0.9], "seeds": [0, 1], "ensemble_size": 2}
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
            # the same code in a Ray worker and locally: the worker may run another thread count, so the mean
            # loss (a float32 reduction, O(1)) may differ in its last bits; accuracies are counts, exact
            assert ra["adv_acc"] == rb["adv_acc"] and ra["train_loss"] == pytest.approx(rb["train_loss"], abs=1e-6)
    assert json.loads((tmp_path / "ray" / "results.json").read_text())["cells"] == remote


def test_a_plan_written_before_dtype_existed_still_grows(tmp_path):
    from lenslab.training.sweep import write_plan

    root = tmp_path / "s"
    write_plan(_plan(root, heads=[1], ratios=[0.9]))
    stored = json.loads((root / "sweep.json").read_text())
    for m in stored["members"]:  # what an older lenslab wrote: no dtype / eval_schedule / n_evals
        for k in ("dtype", "eval_schedule", "n_evals"):
            m["config"]["train"].pop(k)
    (root / "sweep.json").write_text(json.dumps(stored))
    merged = write_plan(_plan(root, heads=[1], ratios=[0.9, 0.5]))
    assert len(merged["members"]) == 4
    with pytest.raises(RunError, match="different sweep.*train.dtype"):
        write_plan(_plan(root, heads=[1], ratios=[0.9], dtype="float64"))


def test_a_modadd_sweep_crosses_weight_decay_fraction_and_dtype(tmp_path, capsys):
    from safetensors import safe_open

    from lenslab.cli import main

    out = tmp_path / "ma"
    rc = main(
        [
            "sweep",
            "--task",
            "modadd",
            "--p",
            "11",
            "--train-frac",
            "0.5",
            "--weight-decay",
            "0,1",
            "--dtype",
            "float32,float64",
            "--seeds",
            "0-1",
            "--epochs",
            "4",
            "--eval-every",
            "2",
            "--out",
            str(out),
            "--no-progress",
            "--json",
            "--workers",
            "1",
        ]
    )
    assert rc == 0
    cells = json.loads(capsys.readouterr().out)["cells"]
    assert sorted(c["cell"] for c in cells) == sorted(f"p11-f0.5-wd{wd}-{dt}" for wd in (0, 1) for dt in ("float32", "float64"))
    doc = json.loads((out / "results.json").read_text())
    for c in cells:
        runs = [Run.open(out / c["cell"] / f"seed_{s}") for s in (0, 1)]
        assert c["runs"] == 2
        assert c["grokked"] == sum(any(r["test_acc"] >= 0.95 for r in run.metrics) for run in runs)  # counted from the metrics
        want = "F64" if c["dtype"] == "float64" else "F32"
        ckpt = runs[0].checkpoints()[-1][1]
        with safe_open(ckpt, "pt") as f:
            keys = f.keys()  # safe_open is not iterable itself
            assert {f.get_slice(k).get_dtype() for k in keys} - {"BOOL", "I64"} == {want}  # masks and indices are not weights
    assert len(doc["runs"]) == 8 and {r["outcome"] for r in doc["runs"]} <= {"grokked", "anti-grokked", "memorized", "training"}
    plan = json.loads((out / "sweep.json").read_text())
    jobs = pack({**plan, "root": str(out)}, skip_done=False)
    assert sorted(len(j) for j in jobs) == [4, 4] and all(len({m.config["train"]["dtype"] for m in j}) == 1 for j in jobs)


def test_modadd_and_mpsp_flags_do_not_mix(tmp_path, capsys):
    from lenslab.cli import main

    assert main(["sweep", "--task", "modadd", "--layers", "2", "--out", str(tmp_path / "a")]) == 2
    assert "--layers is an mpsp flag" in capsys.readouterr().err
    assert main(["sweep", "--p", "11", "--out", str(tmp_path / "b")]) == 2
    assert "--p is a modadd flag" in capsys.readouterr().err
    assert main(["sweep", "--dtype", "float32,float64", "--out", str(tmp_path / "c")]) == 2
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists() and not (tmp_path / "c").exists()
