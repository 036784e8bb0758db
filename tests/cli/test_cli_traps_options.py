"""``lenslab traps`` refuses bad counts on the command line, before it reads a run: exit 2, one line."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("flag,value", [("--n-shuffles", "0"), ("--workers", "0"), ("--n-shuffles", "-3"), ("--workers", "x")])
def test_bad_counts_exit_2_with_one_line(tmp_path, flag, value):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")  # would fail later as a bad run: the option must be refused first
    p = subprocess.run(  # noqa: PLW1510 -- the exit code is the assertion
        [sys.executable, "-m", "lenslab.cli", "traps", str(run), flag, value], capture_output=True, text=True, cwd=tmp_path
    )
    assert p.returncode == 2
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("lenslab: error:") and flag in lines[0], p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""
