"""training.spec: the typed run config, its one bounds table, and run directories written before it existed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lenslab.tasks.errors import TaskError
from lenslab.training.config import (
    FLAG_PLACES,
    config_from_flags,
    default_run_dir,
    modadd_run_config,
    mpsp_run_config,
    resume_config,
)
from lenslab.training.errors import ConfigError, RunError
from lenslab.training.presets import mpsp_model_config
from lenslab.training.run import Run
from lenslab.training.runio import atomic_write_json, read_config
from lenslab.training.spec import (
    ABSENT,
    LEGACY_TRAIN,
    MODEL_LIMITS,
    MLPSpec,
    MNISTSpec,
    ModAddSpec,
    ModelSpec,
    MPSPSpec,
    RunSpec,
    TrainSpec,
    check_field,
    params,
)

FIXTURES = Path(__file__).parents[1] / "fixtures"
V1_RUNS = [FIXTURES / "run_v1", FIXTURES / "run_v1_modadd"]  # written by lenslab 0.1.0 before training.spec existed


@pytest.mark.parametrize("run_dir", V1_RUNS, ids=lambda p: p.name)
def test_a_run_written_before_the_spec_loads_and_round_trips_byte_for_byte(run_dir, tmp_path):
    raw = (run_dir / "config.json").read_bytes()
    run = Run.open(run_dir)
    spec = RunSpec.from_dict(json.loads(raw))
    assert spec.to_dict() == run.config == json.loads(raw)
    atomic_write_json(tmp_path / "config.json", spec.to_dict())  # how the trainer writes config.json
    assert (tmp_path / "config.json").read_bytes() == raw
    assert RunSpec.from_dict(spec.to_dict()) == spec
    assert run.summary["status"] == "complete" and [r["epoch"] for r in run.metrics][-1] == 2


def test_the_v1_mpsp_fixture_still_builds_its_model_and_splits():
    run = Run.open(FIXTURES / "run_v1")
    assert run.epochs() == [2]
    model = run.model()
    assert model.cfg.n_layers == 1 and model.cfg.n_heads == 1
    assert run.splits["train_tokens"].shape == (64, 6)
    assert sum((FIXTURES / d).stat().st_size for d in FIXTURES.rglob("*") if (FIXTURES / d).is_file()) < 200_000


def test_builders_write_exactly_the_spec_dict():
    cfg = mpsp_run_config(ratio=0.5, layers=1, heads=1, epochs=3, batch_size=None, weight_decay=0)
    assert RunSpec.from_dict(cfg).to_dict() == cfg
    assert list(cfg) == ["format", "lenslab_version", "task", "model", "train"]
    assert list(cfg["train"]) == list(params(TrainSpec))
    assert cfg["train"]["batch_size"] is None and cfg["train"]["betas"] == [0.9, 0.999]
    m = modadd_run_config(p=11)
    assert RunSpec.from_dict(m).to_dict() == m and m["train"]["batch_size"] is None and m["train"]["betas"] == [0.9, 0.98]
    assert TrainSpec.for_task("modadd") == RunSpec.from_dict(modadd_run_config()).train


def test_a_legacy_config_gets_the_values_it_trained_with(tmp_path):
    cfg = json.loads((FIXTURES / "run_v1" / "config.json").read_text())
    for k in LEGACY_TRAIN:
        del cfg["train"][k]
    assert RunSpec.from_dict(cfg).train.dtype == "float32" and "dtype" not in cfg["train"]  # from_dict never mutates
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert read_config(tmp_path)["train"]["eval_schedule"] == "linear"


def test_absent_optional_model_fields_stay_absent():
    cfg = mpsp_run_config()
    del cfg["model"]["act_fn"], cfg["model"]["default_prepend_bos"]
    spec = RunSpec.from_dict(cfg)
    assert spec.model.act_fn is ABSENT and spec.to_dict() == cfg


@pytest.mark.parametrize(
    "build,exc,needle",
    [
        (lambda: TrainSpec(epochs=-2), ConfigError, "epochs=-2 must be an integer in [0, 10000000]"),
        (lambda: TrainSpec(lr=float("nan")), ConfigError, "lr=nan must be a number in [1e-12, 10]"),
        (lambda: TrainSpec(betas=(0.9,)), ConfigError, "betas=(0.9,) must be two numbers in [0, 1)"),
        (lambda: TrainSpec(betas=(0.9, 1.0)), ConfigError, "beta=1.0 must be a number in [0, 0.999999]"),
        (lambda: TrainSpec(dtype="float16"), ConfigError, "dtype='float16' is not supported: use one of float32, float64"),
        (lambda: TrainSpec(n_evals=True), ConfigError, "n_evals=True must be an integer"),
        (lambda: TrainSpec.for_task("mpsp", momentum=0.9), ConfigError, "unknown training setting(s) ['momentum']"),
        (lambda: MPSPSpec(ratio=1.5), TaskError, "ratio=1.5 is outside [0, 1]"),
        (lambda: MPSPSpec(seq_len=65), ConfigError, "seq_len=65 must be an integer in [2, 64]"),
        (lambda: MPSPSpec(label="sum7"), TaskError, "unknown label"),
        (lambda: MPSPSpec(seed=-1), ConfigError, "data seed=-1 must be an integer in [0, 2**63 - 1]"),
        (lambda: ModAddSpec(p=5000), ConfigError, "p=5000 must be an integer in [2, 4096]"),
        (lambda: ModAddSpec(train_frac=1.0), TaskError, "train_frac=1.0"),
        (lambda: mpsp_model_config(MPSPSpec().rule, n_layers=0), ConfigError, "layers=0 must be an integer in [1, 64]"),
        (lambda: mpsp_model_config(MPSPSpec().rule, n_heads=3), ConfigError, "not divisible by heads=3"),
        (
            lambda: mpsp_run_config(seq_len=4, layers=1, heads=1, n_train=0),
            ConfigError,
            "n_train=0 must be an integer in [1, 2**26]",
        ),
    ],
)
def test_errors_name_the_value_and_the_range(build, exc, needle):
    with pytest.raises(exc) as e:
        build()
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_one_bounds_table_for_builders_and_loaders():
    """The model presets and the run-directory loader read the same bounds (they used to disagree on heads)."""
    assert MODEL_LIMITS["n_heads"] == (params(ModelSpec)["n_heads"].lo, params(ModelSpec)["n_heads"].hi)
    hi = MODEL_LIMITS["n_heads"][1]
    check_field(ModelSpec, "n_heads", hi)
    with pytest.raises(ConfigError, match=rf"heads={hi + 1} must be an integer in \[1, {hi}\]"):
        mpsp_model_config(MPSPSpec().rule, n_heads=hi + 1, d_model=hi * 2)


def test_a_config_file_gets_the_loader_errors(tmp_path):
    cfg = mpsp_run_config()
    for edit, exc, needle in [
        (lambda c: c["task"].update(ratio=2.0), RunError, "ratio=2.0 is outside"),
        (lambda c: c["train"].update(extra=1), RunError, "train block: missing [], unknown ['extra']"),
        (lambda c: c["model"].update(n_layers=0), ConfigError, "model.n_layers=0 must be an integer in [1, 64]"),
        (lambda c: c["model"].update(n_ctx=3), RunError, "needs n_ctx >= 6"),
        (lambda c: c.update(init={"from": "x"}), RunError, "malformed 'init' block"),
        (lambda c: c.update(format="other"), RunError, "not a lenslab run"),
    ]:
        bad = json.loads(json.dumps(cfg))
        edit(bad)
        (tmp_path / "config.json").write_text(json.dumps(bad))
        with pytest.raises(exc) as e:
            read_config(tmp_path)
        assert str(tmp_path / "config.json") in str(e.value) and needle in str(e.value), str(e.value)


def test_the_cli_flags_are_the_spec_fields():
    flags = {
        p.flag for cls in (MPSPSpec, ModAddSpec, MNISTSpec, ModelSpec, MLPSpec, TrainSpec) for p in params(cls).values() if p.flag
    }
    assert set(FLAG_PLACES) | {"epochs"} == flags | {"task"}
    cfg = config_from_flags({"task": "modadd", "p": 7, "batch_size": 0, "betas": (0.8, 0.9)})
    assert cfg["train"]["batch_size"] is None and cfg["train"]["betas"] == [0.8, 0.9] and cfg["task"]["p"] == 7
    with pytest.raises(ConfigError, match="--ratio is an mpsp flag"):
        config_from_flags({"task": "modadd", "ratio": 0.5})
    assert default_run_dir(mpsp_run_config(ratio=0.5)) == Path("runs/mpsp-sum2-max-r0.5-2L2H-s0")
    help_text = subprocess.run(
        [sys.executable, "-m", "lenslab.cli", "train", "--help"], capture_output=True, text=True, check=True
    ).stdout
    help_text = re.sub(r"\s+", " ", help_text)
    assert "(in [1, 128]; default 2)" in help_text and "default mpsp 150, modadd 3000" in help_text


def test_resume_config_checks_flags_against_the_stored_run():
    given = {"ratio": 0.9, "epochs": 5, "layers": 1}
    cfg = resume_config(FIXTURES / "run_v1", given)
    assert cfg["train"]["epochs"] == 5
    with pytest.raises(ConfigError, match=r"--ratio 0.5 differs from the run's task.ratio=0.9"):
        resume_config(FIXTURES / "run_v1", {"ratio": 0.5})
    with pytest.raises(ConfigError, match="epochs=-1"):
        resume_config(FIXTURES / "run_v1", {"epochs": -1})
