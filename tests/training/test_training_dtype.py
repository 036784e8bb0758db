"""``train.dtype`` float64: the math, the files, the readers, resume, older runs and refusals.

References are independent: a plain TransformerLens model built with
``HookedTransformerConfig(dtype=torch.float64)`` and trained by a hand-written AdamW loop, and
the float32 run of the same config (to show the float64 run really computes in float64).
"""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
import torch.nn.functional as F
from helpers import tiny_config, tiny_modadd
from safetensors.torch import load_file
from transformer_lens import HookedTransformer, HookedTransformerConfig

from lenslab.training.config import mpsp_run_config, with_init
from lenslab.training.errors import ConfigError, RunError
from lenslab.training.run import Run
from lenslab.training.runio import read_header, read_jsonl
from lenslab.training.trainer import Interrupted, check_dtype_device, epoch_generator, train


def _tl(model_kwargs: dict, dtype: torch.dtype) -> HookedTransformer:
    return HookedTransformer(HookedTransformerConfig(**model_kwargs, dtype=dtype))


def _reference_float64_loop(cfg: dict, splits: dict, epochs: int) -> HookedTransformer:
    """TransformerLens in float64 from the float32 init of the seed (upcast), full-batch AdamW, the trainer's data order."""
    t = cfg["train"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(t["seed"])
        init = HookedTransformer(HookedTransformerConfig(**cfg["model"])).state_dict()
    model = _tl(cfg["model"], torch.float64)
    model.load_state_dict({k: v.double() if v.dtype.is_floating_point else v for k, v in init.items()})
    opt = torch.optim.AdamW(model.parameters(), lr=t["lr"], betas=tuple(t["betas"]), weight_decay=t["weight_decay"])
    tokens, labels = splits["train_tokens"], splits["train_labels"]
    for epoch in range(1, epochs + 1):
        perm = torch.randperm(len(tokens), generator=epoch_generator(t["seed"], epoch))
        loss = F.cross_entropy(model(tokens[perm])[:, -1], labels[perm])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def test_float64_run_is_float64_everywhere_and_matches_a_plain_float64_loop(tmp_path):
    cfg = tiny_modadd(epochs=3, eval_every=1, dtype="float64")
    train(cfg, tmp_path / "f64", progress=False)
    train(tiny_modadd(epochs=3, eval_every=1), tmp_path / "f32", progress=False)
    stored = json.loads((tmp_path / "f64" / "config.json").read_text())
    assert stored["train"]["dtype"] == "float64" and "dtype" not in stored["model"]
    layout, _ = read_header(tmp_path / "f64" / "checkpoints" / "3.safetensors")
    assert {d for d, _ in layout.values()} - {"BOOL"} == {"F64"}  # BOOL: the causal-mask buffers
    resume_layout, _ = read_header(tmp_path / "f64" / "checkpoints" / "resume.safetensors")
    assert {d for k, (d, _) in resume_layout.items() if not k.endswith(".step")} - {"BOOL"} == {
        "F64"
    }  # weights and AdamW moments
    run = Run.open(tmp_path / "f64")
    model = run.model()
    assert run.dtype == torch.float64 and model.cfg.dtype == torch.float64
    assert all(p.dtype == torch.float64 for p in model.parameters())

    ref = _reference_float64_loop(cfg, run.splits, 3)
    got = load_file(str(tmp_path / "f64" / "checkpoints" / "3.safetensors"))
    f32 = load_file(str(tmp_path / "f32" / "checkpoints" / "3.safetensors"))
    gap32 = 0.0
    for k, v in ref.named_parameters():
        v = v.detach()
        # float64 sums in another order (the embedding backward, BLAS blocking): ~1e-16 relative per
        # operation, ~1e-15 on the weights after 3 steps; 1e-12 leaves room for any CPU's kernels.
        torch.testing.assert_close(got[k], v, atol=1e-12, rtol=0, msg=lambda m, k=k: f"{k}: {m}")
        gap32 = max(gap32, float((f32[k].double() - v).abs().max()))
    assert gap32 > 1e-9  # the float32 run is measurably elsewhere: the float64 run did not compute in float32

    rows = read_jsonl(tmp_path / "f64" / "metrics.jsonl")
    with torch.no_grad():
        logits = ref(run.splits["train_tokens"])[:, -1]
    # the trainer averages hits in float32 (as it always has): 0.15 is 0.15000000596
    assert rows[-1]["train_acc"] == pytest.approx(
        float((logits.argmax(-1) == run.splits["train_labels"]).double().mean()), rel=1e-7
    )
    # same forward on the same weights (within 1e-12): the mean loss agrees far below float32 resolution
    assert rows[-1]["train_loss"] == pytest.approx(float(F.cross_entropy(logits, run.splits["train_labels"])), rel=1e-10)


def test_float64_resume_after_ctrl_c_is_bitwise_identical(tmp_path):
    cfg = tiny_config(epochs=6, dtype="float64")
    train(cfg, tmp_path / "straight", progress=False)

    def ctrl_c(row):
        if row["epoch"] == 2:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(Interrupted):
        train(cfg, tmp_path / "cut", progress=False, on_eval=ctrl_c)
    train(cfg, tmp_path / "cut", resume=True, progress=False)
    a, b = tmp_path / "straight", tmp_path / "cut"
    assert read_jsonl(a / "metrics.jsonl") == read_jsonl(b / "metrics.jsonl")
    names = sorted(p.name for p in (a / "checkpoints").iterdir())
    assert names == sorted(p.name for p in (b / "checkpoints").iterdir()) and "6.safetensors" in names
    for n in names:
        assert (a / "checkpoints" / n).read_bytes() == (b / "checkpoints" / n).read_bytes(), n


def test_a_run_written_before_dtype_existed_opens_and_resumes_as_float32(tmp_path):
    train(tiny_config(epochs=4), tmp_path / "straight", progress=False)
    old = tmp_path / "old"
    train(tiny_config(epochs=2), old, progress=False)
    raw = json.loads((old / "config.json").read_text())
    for key in ("dtype", "eval_schedule", "n_evals"):
        del raw["train"][key]
    (old / "config.json").write_text(json.dumps(raw))
    run = Run.open(old)
    assert run.config["train"]["dtype"] == "float32" and run.config["train"]["eval_schedule"] == "linear"
    assert next(run.model().parameters()).dtype == torch.float32
    cfg = run.config
    cfg["train"]["epochs"] = 4
    train(cfg, old, resume=True, progress=False)
    for n in ("4.safetensors", "resume.safetensors"):
        assert (old / "checkpoints" / n).read_bytes() == (tmp_path / "straight" / "checkpoints" / n).read_bytes()


def test_resume_whose_state_is_in_another_dtype_is_refused(tmp_path):
    train(tiny_config(epochs=2), tmp_path, progress=False)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["train"]["dtype"] = "float64"
    (tmp_path / "config.json").write_text(json.dumps(raw))
    before = (tmp_path / "metrics.jsonl").read_bytes()
    cfg = Run.open(tmp_path).config
    cfg["train"]["epochs"] = 4
    with pytest.raises(RunError, match="resume state is float32 but the run's config says train.dtype float64") as e:
        train(cfg, tmp_path, resume=True, progress=False)
    assert "\n" not in str(e.value)
    assert (tmp_path / "metrics.jsonl").read_bytes() == before
    with pytest.raises(RunError, match="has dtype F32, expected F64"):
        Run.open(tmp_path).model()


def test_bad_dtype_and_a_device_without_float64_are_one_line_errors():
    with pytest.raises(ConfigError, match="dtype='float16' is not supported: use one of float32, float64"):
        mpsp_run_config(dtype="float16")
    # MPS has no float64 (and this machine may have no MPS at all): either way one ConfigError line
    with pytest.raises(ConfigError, match="device mps cannot compute in float64") as e:
        check_dtype_device("float64", torch.device("mps"))
    assert "\n" not in str(e.value) and len(str(e.value)) < 400
    check_dtype_device("float64", torch.device("cpu"))


def test_init_from_a_float32_run_into_a_float64_run(tmp_path):
    train(tiny_modadd(epochs=2), tmp_path / "src", progress=False)
    cfg = with_init(tiny_modadd(epochs=1, dtype="float64", weight_decay=0.0), tmp_path / "src")
    train(cfg, tmp_path / "dst", progress=False)
    src = load_file(str(tmp_path / "src" / "checkpoints" / "2.safetensors"))
    dst0 = load_file(str(tmp_path / "dst" / "checkpoints" / "0.safetensors"))
    assert all(torch.equal(dst0[k], v.double()) for k, v in src.items() if v.dtype.is_floating_point)
