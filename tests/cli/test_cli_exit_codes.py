"""The two exit-code slips of issue 27: ``lenslab traps`` on a run with an unreadable checkpoint exits 2
after printing the rows it could (the bad file named on stderr), and ``lenslab inspect BAD_PATH`` prints
nothing but its one error line."""

from __future__ import annotations

import json

from test_cli_train import TINY, run_cli


def tiny_run(tmp_path, capsys):
    out = tmp_path / "run"
    rc, _, err = run_cli(capsys, "train", *TINY, "--epochs", "4", "--eval-every", "2", "--out", str(out), "--no-progress")
    assert rc == 0, err
    return out


def test_traps_exits_2_and_names_a_truncated_checkpoint(tmp_path, capsys):
    out = tiny_run(tmp_path, capsys)
    ckpts = sorted((out / "checkpoints").glob("[0-9]*.safetensors"), key=lambda p: int(p.stem))
    assert len(ckpts) >= 2
    bad = ckpts[-1]
    bad.write_bytes(bad.read_bytes()[:100])  # truncated mid-header
    rc, stdout, err = run_cli(capsys, "traps", str(out), "--workers", "1", "--no-progress", "--json")
    assert rc == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("lenslab: error: 1 of ") and bad.name in lines[0]
    doc = json.loads(stdout)  # the readable checkpoints are still reported
    good = [c for c in doc["checkpoints"] if not c.get("error")]
    assert len(good) == len(ckpts) - 1 and all(c["matrices"] for c in good)
    # the table form too: rows first, then the one line
    rc, stdout, err = run_cli(capsys, "traps", str(out), "--workers", "1", "--no-progress")
    assert rc == 2 and "W_in" in stdout and bad.name in err


def test_traps_on_a_clean_run_exits_0(tmp_path, capsys):
    out = tiny_run(tmp_path, capsys)
    rc, stdout, err = run_cli(capsys, "traps", str(out), "--workers", "1", "--no-progress", "--json")
    assert rc == 0, err
    assert all(not c.get("error") for c in json.loads(stdout)["checkpoints"])


def test_inspect_bad_path_prints_only_the_error(tmp_path, capsys):
    rc, stdout, err = run_cli(capsys, "inspect", str(tmp_path / "nope"))
    assert rc == 2 and stdout == ""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("lenslab: error:"), err
