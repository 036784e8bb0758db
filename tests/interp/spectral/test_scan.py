"""traps_command on shard folders, run directories, checkpoints and bad input; run rows; figures."""

from __future__ import annotations

import json
import sys
import types

import plotly.graph_objects as go
import pytest
from spectral_helpers import SPIKES, planted, same_result

from lenslab.interp.spectral import (
    SpectralError,
    detect_traps,
    esd_figure,
    format_traps_table,
    trap_count_figure,
    trap_counts_over_run,
    traps_command,
)


def test_shard_folder_scan(shard_folder):
    folder, tensors = shard_folder
    res = traps_command(folder, workers=2, progress=False)
    assert res["kind"] == "shards" and len(res["checkpoints"]) == 1
    rows = {r["name"]: r for r in res["checkpoints"][0]["matrices"]}
    for name, spikes in SPIKES.items():
        assert rows[name]["n_traps"] == len(spikes)
        # same numbers as analysing the tensor directly (independent of the streaming path); float64 eigen-solves
        # in a worker process vs here may use other thread counts: ~1e-13 relative, 1e-9 on any CPU
        assert rows[name]["lambda_plus"] == pytest.approx(detect_traps(tensors[name], name).lambda_plus, rel=1e-9)
    assert "NaN/inf" in rows["broken.weight"]["error"]
    skipped = {s["name"]: s["reason"] for s in res["checkpoints"][0]["skipped"]}
    assert "min(N, M) = 1" in skipped["tiny.weight"] and "1-D" in skipped["layers.0.mlp.up.bias"]
    for key in ("name", "N", "M", "n_traps", "lambda_plus", "threshold", "sigma", "traps"):
        assert key in rows["lm_head.weight"]
    text = format_traps_table(res)
    assert "layers.0.mlp.up.weight" in text and "error" in text and "tiny.weight" in text
    json.dumps(res)  # the --json output is serialisable


def test_workers_and_modes_agree(shard_folder):
    folder, _ = shard_folder
    one = traps_command(folder, workers=1, progress=False)
    two = traps_command(folder, workers=2, progress=False)
    assert same_result(one, two)
    ww = traps_command(folder, mode="weightwatcher", progress=False)
    assert {r["name"]: r["n_traps"] for r in ww["checkpoints"][0]["matrices"]}[
        "layers.0.mlp.up.weight"
    ] == 10  # 2 traps x 5 pooled shuffles (M = 64 < 100)


def test_ray_executor(shard_folder, monkeypatch):
    folder, _ = shard_folder
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(SpectralError, match="pip install"):
        traps_command(folder, executor="ray", progress=False)
    # the wiring, with a stand-in that runs remote functions inline
    fake = types.SimpleNamespace(is_initialized=lambda: True, get=lambda x: x, remote=lambda f: types.SimpleNamespace(remote=f))
    monkeypatch.setitem(sys.modules, "ray", fake)
    res = traps_command(folder, executor="ray", progress=False)
    assert same_result(res, traps_command(folder, progress=False))


def test_bad_paths(tmp_path):
    with pytest.raises(SpectralError, match="no such file"):
        traps_command(tmp_path / "missing")
    with pytest.raises(SpectralError, match="no \\*.safetensors"):
        traps_command(tmp_path)
    (tmp_path / "garbage.safetensors").write_bytes(b"\x00" * 40)
    with pytest.raises(SpectralError, match="not a readable safetensors"):
        traps_command(tmp_path / "garbage.safetensors", progress=False)
    with pytest.raises(SpectralError, match="mode"):
        traps_command(tmp_path, mode="nope")


def test_run_directory_and_checkpoint(run_dir, monkeypatch):
    from lenslab.interp.spectral import paths

    monkeypatch.setattr(paths, "JSD_NULL", 4)  # keep the test fast; the null's size is not under test here
    monkeypatch.setattr(paths, "JSD_PROBES", 64)
    res = traps_command(run_dir, progress=False)
    assert res["kind"] == "run" and [c["epoch"] for c in res["checkpoints"]] == [0, 10]
    counts = [{r["name"]: r["n_traps"] for r in c["matrices"]} for c in res["checkpoints"]]
    assert counts[0]["blocks.0.mlp.W_in"] == 0 and counts[1]["blocks.0.mlp.W_in"] == 3
    assert all(n == 0 for k, n in counts[1].items() if k != "blocks.0.mlp.W_in")  # fresh init: no traps
    one = traps_command(run_dir / "checkpoints" / "10.safetensors", progress=False, jsd=True)
    assert one["kind"] == "checkpoint" and one["checkpoints"][0]["matrices"] == res["checkpoints"][1]["matrices"]
    jsd = one["checkpoints"][0]["jsd"]
    assert len(jsd) == 3 and all(r["matrix"] == "blocks.0.mlp.W_in" and r["accuracy_change"] is not None for r in jsd)
    assert "jsd blocks.0.mlp.W_in" in format_traps_table(one)


def test_run_rows_and_figures(run_dir):
    rows = trap_counts_over_run(run_dir)
    r = rows.where(epoch=10, matrix="blocks.0.mlp.W_in")
    assert len(r) == 1 and r[0]["n_traps"] == 3 and r[0]["test_acc"] == 0.5 and r[0]["train_acc"] == 1.0
    assert len(rows) == 2 * 8
    assert r[0]["N"] == 512 and r[0]["M"] == 128  # W_in of the modadd model: d_mlp × d_model
    only = traps_command(run_dir, epochs=[10], progress=False)
    assert [c["epoch"] for c in only["checkpoints"]] == [10]
    kept = trap_counts_over_run(run_dir, max_checkpoints=2)  # 2 checkpoints: both kept
    assert [(x["epoch"], x["matrix"], x["n_traps"]) for x in kept] == [(x["epoch"], x["matrix"], x["n_traps"]) for x in rows]
    fig = trap_count_figure(rows)
    assert isinstance(fig, go.Figure)
    names = [t.name for t in fig.data]
    assert "test_acc" in names and "blocks.0.mlp.W_in" in names
    w = planted(512, 128, [40.0, 30.0], seed=1)
    fig2 = esd_figure(w, "w")
    assert isinstance(fig2, go.Figure) and len(fig2.data) == 2 and "2 traps" in json.dumps(fig2.to_plotly_json()["layout"])


def test_hf_folder_with_config_json_is_scanned_as_shards(shard_folder):
    """A Hugging Face folder has a config.json too; it is not a lenslab run and must not be refused as one."""
    folder, _ = shard_folder
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    res = traps_command(folder, progress=False)
    assert res["kind"] == "shards"
    assert {r["name"]: r["n_traps"] for r in res["checkpoints"][0]["matrices"]}["lm_head.weight"] == len(SPIKES["lm_head.weight"])


def test_a_lenslab_config_that_is_broken_is_still_read_as_a_run(shard_folder):
    folder, _ = shard_folder
    (folder / "config.json").write_text(json.dumps({"format": "lenslab-run/1"}))
    with pytest.raises(SpectralError, match="config.json"):
        traps_command(folder, progress=False)


def test_a_pickle_named_safetensors_in_a_shard_folder_is_refused(shard_folder):
    folder, _ = shard_folder
    (folder / "model-00002-of-00002.safetensors").write_bytes(b"\x80\x04K\x01.")  # pickle protocol 4, under a shard's name
    with pytest.raises(SpectralError, match="pickle.*never unpickles"):
        traps_command(folder, progress=False)


@pytest.mark.parametrize(
    "bad,match",
    [
        ({"n_shuffles": 0}, "n_shuffles"),
        ({"workers": 0}, "workers"),
        ({"executor": "dask"}, "executor"),
        ({"mode": "nope"}, "mode"),
        ({"seed": 1.5}, "seed"),
        ({"n_shuffles": True}, "n_shuffles"),
    ],
)
def test_every_option_is_checked_before_the_path_is_read(tmp_path, bad, match):
    """One check of all options, before any I/O: a missing path is not even looked at."""
    from jaxtyping import TypeCheckError

    from lenslab.interp.spectral.scan import ScanOptions

    # a float seed meets traps_command's `seed: int` annotation first when the checker runs (pytest)
    with pytest.raises((SpectralError, TypeCheckError), match=match):
        traps_command(tmp_path / "missing", progress=False, **bad)
    # ScanOptions itself (what traps_command builds first) refuses the same raw values
    opts = {k: v for k, v in bad.items() if k in ScanOptions.__dataclass_fields__}
    if opts:
        with pytest.raises(SpectralError, match=match):
            ScanOptions(**opts)


def test_jobs_are_frozen_dataclasses_and_the_library_path_is_typed(shard_folder):
    import dataclasses

    from lenslab.interp.spectral import ScanJob, ScanOptions, TrapScan, scan_path
    from lenslab.interp.spectral.scan import plan_files, shard_files

    folder, _ = shard_folder
    plan, _ = plan_files(shard_files(folder))
    job = ScanJob(plan[0][0], plan[0][1], "robust", 0, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.seed = 1  # type: ignore[misc]
    assert ScanOptions().workers == 2
    scan = scan_path(folder, workers=1, progress=False)
    assert isinstance(scan, TrapScan) and scan.kind == "shards" and len(scan.checkpoints) == 1
    assert scan.to_dict() == traps_command(folder, workers=1, progress=False)
    assert format_traps_table(scan) == format_traps_table(scan.to_dict())
