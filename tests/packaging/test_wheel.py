"""The built wheel installs one top-level name, ``lenslab`` (issue 17): no ``tasks``/``training``/``interp`` in site-packages."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_installs_only_the_lenslab_namespace(tmp_path):
    # --no-build-isolation: the test environment's setuptools builds it (no network); --no-deps: only this project.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    (wheel,) = tmp_path.glob("lenslab-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"lenslab"}, sorted(top)
    # The three design folders travel inside the namespace, with their subpackages.
    for pkg in ("lenslab/tasks/__init__.py", "lenslab/training/trainer.py", "lenslab/interp/spectral/__init__.py"):
        assert pkg in names, pkg
    dist_info = (
        next(n for n in names if n.endswith(".dist-info/top_level.txt"))
        if any(n.endswith("top_level.txt") for n in names)
        else None
    )
    if dist_info:
        assert zipfile.ZipFile(wheel).read(dist_info).decode().split() == ["lenslab"]
