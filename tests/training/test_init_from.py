"""Starting a run from another run's weights (``with_init`` / ``lenslab train --init-from``).

References are independent of the trainer: the source checkpoint's tensors read straight from its
safetensors file, and a hand-written AdamW loop on the same HookedTransformer.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from lenslab.cli import main
from lenslab.training.config import modadd_run_config, mpsp_run_config, with_init
from lenslab.training.errors import ConfigError, RunError
from lenslab.training.run import Run
from lenslab.training.trainer import epoch_generator, train

SRC = {"p": 7, "train_frac": 0.6, "lr": 3e-3, "eval_every": 5, "seed": 0}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    out = tmp_path_factory.mktemp("init") / "grok"
    train(modadd_run_config(epochs=20, **SRC), out, progress=False)
    return out


def test_epoch_zero_is_the_source_checkpoint_bitwise(source, tmp_path):
    cfg = with_init(modadd_run_config(epochs=5, **{**SRC, "weight_decay": 0.0}), source)
    assert cfg["init"]["epoch"] == 20 and cfg["init"]["from"].endswith("checkpoints/20.safetensors")
    train(cfg, tmp_path / "b", progress=False)
    want = load_file(source / "checkpoints" / "20.safetensors")
    got = load_file(tmp_path / "b" / "checkpoints" / "0.safetensors")
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert json.loads((tmp_path / "b" / "config.json").read_text())["init"] == cfg["init"]


def test_continuation_matches_a_hand_written_adamw_loop(source, tmp_path):
    """Full batch, fresh AdamW at weight decay 0: the trainer's epoch-6 weights = a plain loop's.

    The loop feeds the batch in the trainer's documented order (``epoch_generator``), so the
    sums run in the same order; fed unpermuted, 13 of 16,384 W_K entries differ by up to 3e-6.
    """
    epochs = 6
    cfg = with_init(modadd_run_config(epochs=epochs, **{**SRC, "weight_decay": 0.0, "eval_every": 3}), source)
    train(cfg, tmp_path / "b", progress=False)
    run = Run.open(source)
    model = run.model().train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.98), weight_decay=0.0)
    x, y = run.splits["train_tokens"], run.splits["train_labels"]
    for epoch in range(1, epochs + 1):
        perm = torch.randperm(len(x), generator=epoch_generator(0, epoch))
        loss = F.cross_entropy(model(x[perm])[:, -1], y[perm])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    got = load_file(tmp_path / "b" / "checkpoints" / f"{epochs}.safetensors")
    for k, v in model.state_dict().items():
        # same ops in the same order, but the run's process and this one may pick different kernels for
        # the batch (thread count, blocking): a few float32 ulps after these few steps, any CPU
        torch.testing.assert_close(got[k], v, rtol=1e-6, atol=1e-7)


def test_resume_and_restart_from_scratch_give_the_uninterrupted_run(source, tmp_path):
    cfg = with_init(modadd_run_config(epochs=6, **{**SRC, "weight_decay": 0.0, "eval_every": 2}), source)
    train(cfg, tmp_path / "whole", progress=False)
    half = {**cfg, "train": {**cfg["train"], "epochs": 2}}
    train(half, tmp_path / "resumed", progress=False)
    train(cfg, tmp_path / "resumed", resume=True, progress=False)
    train(half, tmp_path / "restarted", progress=False)
    (tmp_path / "restarted" / "checkpoints" / "resume.safetensors").unlink()  # as if killed before any resume state
    train(cfg, tmp_path / "restarted", resume=True, progress=False)
    for name in ("resumed", "restarted"):
        for e in (0, 2, 4, 6):
            a = (tmp_path / "whole" / "checkpoints" / f"{e}.safetensors").read_bytes()
            assert (tmp_path / name / "checkpoints" / f"{e}.safetensors").read_bytes() == a, (name, e)
        assert (tmp_path / name / "metrics.jsonl").read_bytes() == (tmp_path / "whole" / "metrics.jsonl").read_bytes()


def test_a_changed_source_is_refused_on_restart_but_not_needed_to_resume(source, tmp_path):
    copy = tmp_path / "src"
    train(modadd_run_config(epochs=5, **SRC), copy, progress=False)
    cfg = with_init(modadd_run_config(epochs=4, **{**SRC, "weight_decay": 0.0, "eval_every": 2}), copy)
    train({**cfg, "train": {**cfg["train"], "epochs": 2}}, tmp_path / "b", progress=False)
    ckpt = copy / "checkpoints" / "5.safetensors"
    ckpt.write_bytes(ckpt.read_bytes()[:-4] + b"\0\0\0\0")
    train(cfg, tmp_path / "b", resume=True, progress=False)  # the resume state holds the weights
    fresh = tmp_path / "c"
    with pytest.raises(RunError, match="has changed since"):
        train(cfg, fresh, progress=False)
    assert not fresh.exists()


def test_architecture_must_match(tmp_path):
    src = tmp_path / "src"
    tiny = {"seq_len": 4, "n_values": 8, "n_train": 512, "n_val": 128, "n_adv": 128, "epochs": 1, "eval_every": 1}
    train(mpsp_run_config(layers=1, heads=1, **tiny), src, progress=False)
    with pytest.raises(ConfigError, match=r"n_layers \(2 here, 1 there\)"):
        with_init(mpsp_run_config(layers=2, heads=1, **tiny), src)
    ok = with_init(mpsp_run_config(layers=1, heads=1, ratio=0.5, **tiny), src)  # another task setting is fine
    assert ok["init"]["epoch"] == 1


def run_cli(capsys, *argv):
    try:
        rc = main(list(argv))
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_inherits_the_source_settings_and_overrides_the_given_ones(source, tmp_path, capsys):
    out = tmp_path / "b"
    rc, _, err = run_cli(
        capsys, "train", "--init-from", str(source), "--weight-decay", "0", "--epochs", "4", "--out", str(out), "--no-progress"
    )
    assert rc == 0, err
    cfg = json.loads((out / "config.json").read_text())
    src = json.loads((source / "config.json").read_text())
    assert cfg["task"] == src["task"] and cfg["model"] == src["model"]
    assert cfg["train"] == {**src["train"], "weight_decay": 0.0, "epochs": 4}
    assert cfg["init"]["epoch"] == 20
    rc, _, err = run_cli(
        capsys, "train", "--init-from", str(source), "--epochs", "6", "--out", str(out), "--resume", "--no-progress"
    )
    assert rc == 0, err
    assert json.loads((out / "summary.json").read_text())["epochs_completed"] == 6


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--seeds", "0-1"], "drop --seeds"),
        (["--task", "mpsp"], "cannot carry over"),
        (["--label", "sum3"], "mpsp flag"),
    ],
)
def test_cli_refusals_are_one_line_and_write_nothing(source, tmp_path, capsys, extra, needle):
    out = tmp_path / "b"
    rc, _, err = run_cli(capsys, "train", "--init-from", str(source), *extra, "--out", str(out), "--no-progress")
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not out.exists()


def test_cli_refuses_a_missing_source_and_a_pickle(tmp_path, capsys):
    rc, _, err = run_cli(capsys, "train", "--init-from", str(tmp_path / "nope"), "--out", str(tmp_path / "b"))
    assert rc == 2 and "--init-from" in err and "no such" in err
    pkl = tmp_path / "w.pt"
    pkl.write_bytes(b"\x80\x04K\x01.")
    rc, _, err = run_cli(capsys, "train", "--init-from", str(pkl), "--out", str(tmp_path / "b"))
    assert rc == 2 and "pickle" in err
    assert not (tmp_path / "b").exists()


def test_ensemble_refuses_an_init_config(source, tmp_path):
    from lenslab.training.ensemble import train_ensemble

    cfg = with_init(modadd_run_config(epochs=2, **SRC), source)
    with pytest.raises(ConfigError, match="on its own"):
        train_ensemble([cfg], [tmp_path / "e"], progress=False)


def test_iter_models_epochs_filter(source):
    run = Run.open(source)
    got = [(e, {k: v.clone() for k, v in m.state_dict().items()}) for e, m in run.iter_models(epochs=[5, 20])]
    assert [e for e, _ in got] == [5, 20]
    for e, state in got:
        want = load_file(source / "checkpoints" / f"{e}.safetensors")
        assert all(torch.equal(state[k], want[k]) for k in want)
    with pytest.raises(RunError, match=r"no checkpoint for epoch\(s\) \[7\]"):
        list(run.iter_models(epochs=[5, 7]))
