"""Nothing is ever unpickled: a pickle given to any command is refused, saying why and how to convert.

The pickles here are booby-trapped: unpickling one creates a marker file, so "refused" is checked
by its effect, not only by the message.
"""

from __future__ import annotations

import pickle
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save

sys.path.insert(0, str(Path(__file__).parents[1] / "training"))
from helpers import tiny_modadd
from killharness import exec_run

from lenslab.cli import main
from lenslab.training.errors import RunError
from lenslab.training.run import Run
from lenslab.training.runio import load_checkpoint_into, load_splits, read_safetensors
from lenslab.training.trainer import train


class Trap:
    """Unpickling this calls ``open(marker, "w")``: the marker file appears if anything unpickles."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("world")
    marker = root / "UNPICKLED"
    run = root / "run"
    train(tiny_modadd(epochs=2, eval_every=1), run, progress=False)
    raw = pickle.dumps(Trap(marker), protocol=2)
    torch.save(Trap(marker), root / "zip.pt")
    zipped = (root / "zip.pt").read_bytes()
    files = {
        "zip.pt": zipped,
        "raw.pkl": raw,
        "raw-renamed.safetensors": raw,
        "zip-renamed.safetensors": zipped,
    }
    for name, data in files.items():
        (root / name).write_bytes(data)
    (root / "hf").mkdir()
    (root / "hf" / "pytorch_model.bin").write_bytes(zipped)
    (root / "hf" / "config.json").write_text("{}")  # a Hugging Face folder has one; not a lenslab run
    for name, where in (
        ("run-ckpt", "checkpoints/2.safetensors"),
        ("run-resume", "checkpoints/resume.safetensors"),
        ("run-splits", "splits.safetensors"),
    ):
        shutil.copytree(run, root / name)
        (root / name / where).write_bytes(zipped)
    shutil.copytree(run, root / "run-pt")
    (root / "run-pt" / "checkpoints" / "3.pt").write_bytes(zipped)
    return root, marker


def run_cli(capsys, argv):
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    return rc, capsys.readouterr().err


REFUSED = [  # (command, input relative to the world): must exit 2 with the pickle explanation
    ("inspect", "zip.pt"),
    ("inspect", "raw.pkl"),
    ("inspect", "run-pt/checkpoints/3.pt"),
    ("inspect", "zip-renamed.safetensors"),
    ("traps", "zip.pt"),
    ("traps", "raw-renamed.safetensors"),
    ("traps", "run-pt/checkpoints/3.pt"),
    ("traps", "hf"),
    ("train-resume", "zip.pt"),
    ("train-resume", "hf"),
    ("train-resume", "run-resume"),
    ("train-resume", "run-splits"),
]


@pytest.mark.parametrize("command,target", REFUSED, ids=[f"{c}:{t}" for c, t in REFUSED])
def test_commands_refuse_pickles_and_say_how_to_convert(world, capsys, command, target):
    root, marker = world
    path = str(root / target)
    argv = (
        ["train", "--resume", "--out", path, "--no-progress"] if command == "train-resume" else [command, path, "--no-progress"]
    )
    rc, err = run_cli(capsys, argv)
    last = err.strip().splitlines()[-1]
    assert rc == 2 and last.startswith("lenslab: error: ") and "Traceback" not in err
    assert "pickle" in last and ("never unpickles" in last or "arbitrary code" in last)
    assert "safetensors" in last and "convert" in last
    assert not marker.exists()


def test_traps_on_a_run_with_a_pickled_checkpoint_reports_it_and_unpickles_nothing(world, capsys):
    root, marker = world
    import json

    rc = main(["traps", str(root / "run-ckpt"), "--json", "--no-progress", "--workers", "1"])
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert rc == 2  # the rows it could read are printed, then one line names the bad checkpoint (issue 27)
    bad = [c for c in doc["checkpoints"] if c["checkpoint"].endswith("2.safetensors")]
    assert bad and bad[0]["error"] and not marker.exists()
    assert err.strip().splitlines()[-1].startswith("lenslab: error: 1 of ") and "2.safetensors" in err


@pytest.mark.parametrize("name", ["zip.pt", "raw.pkl", "raw-renamed.safetensors", "zip-renamed.safetensors"])
def test_library_loaders_refuse_pickles(world, name):
    root, marker = world
    model = Run.open(root / "run").new_model()
    for call in (lambda: read_safetensors(root / name), lambda: load_checkpoint_into(model, root / name)):
        with pytest.raises(RunError, match="pickle"):
            call()
    with pytest.raises(RunError, match="pickle"):
        load_splits(root / "run-splits")
    with pytest.raises(RunError, match="pickle"):
        Run.open(root / "run-pt" / "checkpoints" / "3.pt").model()
    assert not marker.exists()


def test_run_open_on_a_loose_pickle_names_the_reason(world):
    root, _ = world
    with pytest.raises(RunError, match="pickle"):
        Run.open(root / "zip.pt")


def test_a_safetensors_file_whose_first_byte_looks_like_pickle_still_loads(tmp_path):
    """The header length's low byte can be 0x80 (pickle's magic): content decides, not one byte."""
    for pad in range(64):
        data = save({"x": torch.arange(3.0)}, metadata={"pad": "p" * pad})
        if data[0] == 0x80:
            break
    else:
        pytest.fail("no padding gave a 0x80 first byte")
    (tmp_path / "w.safetensors").write_bytes(data)
    tensors, meta = read_safetensors(tmp_path / "w.safetensors")
    assert torch.equal(tensors["x"], torch.arange(3.0)) and meta["pad"] == "p" * pad


def test_no_truncation_of_a_checkpoint_loads(world, tmp_path):
    """Every proper prefix of a real checkpoint is an error, never a valid model (a half-written file)."""
    root, _ = world
    data = (root / "run" / "checkpoints" / "2.safetensors").read_bytes()
    n = int.from_bytes(data[:8], "little")
    edges = [0, 8, n, n + 8, len(data)]  # around the length field, the header's end and the file's end
    cuts = sorted({c for e in edges for c in range(e - 24, e) if 0 <= c < len(data)} | set(range(0, len(data), len(data) // 150)))
    model = Run.open(root / "run").new_model()
    path = tmp_path / "cut.safetensors"
    for cut in cuts:
        path.write_bytes(data[:cut])
        with pytest.raises(RunError, match="not a readable safetensors|no such file"):
            load_checkpoint_into(model, path)
    path.write_bytes(data)
    load_checkpoint_into(model, path)  # the whole file does load


def test_real_process_refuses_a_pickle(world):
    root, marker = world
    o = exec_run(["traps", str(root / "zip.pt")], cwd=root)
    assert o.rc == 2 and len(o.stderr.strip().splitlines()) == 1
    assert o.stderr.startswith("lenslab: error: ") and "pickle" in o.stderr and not marker.exists()
