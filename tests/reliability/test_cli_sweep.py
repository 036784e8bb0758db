"""Bad-input sweep: hypothesis generates command lines for every ``lenslab`` subcommand (found by
introspecting ``build_parser()``, so new commands are covered), and each one exits 0, or non-zero
with a one-line ``lenslab: error: ...`` and no traceback, and writes nothing outside its ``--out``
(or the run it inspects). Runs ``lenslab.cli.main`` in-process, in a fresh working directory.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import pickle
import shutil
import signal
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parents[1] / "training"))
from helpers import tiny_modadd

from lenslab.cli import build_parser, main
from lenslab.training.trainer import train

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_TIMEOUT_S = 120  # an example that runs longer is a hang (a budget flag that escaped its bound)
TINY_MPSP = [
    "--seq-len",
    "4",
    "--n-values",
    "8",
    "--n-train",
    "64",
    "--n-val",
    "32",
    "--n-adv",
    "32",
    "--layers",
    "1",
    "--heads",
    "1",
    "--epochs",
    "1",
    "--eval-every",
    "1",
    "--batch-size",
    "32",
]
TINY_MODADD = ["--task", "modadd", "--p", "11", "--train-frac", "0.5", "--epochs", "1", "--eval-every", "1"]
# what makes a valid run of a known command tiny (alternatives); generated flags come after and override it
BASE = {
    "train": [TINY_MPSP, TINY_MODADD],
    "traps": [["--workers", "1"]],
    "sweep": [
        [
            "--layers",
            "1",
            "--heads",
            "1",
            "--ratios",
            "0.5",
            "--seeds",
            "0",
            *TINY_MPSP[:10],
            "--epochs",
            "1",
            "--eval-every",
            "1",
            "--batch-size",
            "32",
            "--ensemble-size",
            "1",
            "--out",
            "sweep-out",
        ]
    ],
}
# flags that size the work: valid values stay tiny; commands without a BASE get only invalid ones
BUDGET = {
    "epochs",
    "n_train",
    "n_val",
    "n_adv",
    "seq_len",
    "n_values",
    "layers",
    "heads",
    "p",
    "seeds",
    "ensemble_size",
    "batch_size",
    "n_shuffles",
    "workers",
    "ratios",
    "weight_decay",
}
TINY_INTS = [-1, 0, 1, 2]
HUGE_INTS = {"seq_len": 10**4}  # 10**12 for the rest; seq_len: see the report (n_values**seq_len is computed before any bound)
FLOATS = [math.nan, math.inf, -math.inf, -1.0, 0.0, 0.5, 1e-3, 1e300]
STRINGS = ["x", "", "-", "sum2", "max", "first", "0", "0-1", "1,0", "2-1", "-1", "0-", "nan", "é", "a b", "cpu", "cuda:7", "meta"]
PATHS = [
    "run",
    "run/checkpoints/2.safetensors",
    "run/config.json",
    "run/metrics.jsonl",
    "missing",
    "garbage.safetensors",
    "evil.pt",
    "shards",
    ".",
    "run/checkpoints",
]


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Inputs every example starts from: a tiny run, garbage, a pickle, a shard folder."""
    root = tmp_path_factory.mktemp("sweepworld")
    train(tiny_modadd(epochs=2, eval_every=1), root / "run", progress=False)
    (root / "garbage.safetensors").write_bytes(b"\x07" * 100)
    (root / "evil.pt").write_bytes(pickle.dumps({"a": 1}, protocol=2))
    (root / "shards").mkdir()
    shutil.copy(root / "run" / "checkpoints" / "2.safetensors", root / "shards" / "model-00001.safetensors")
    return root


def _value(draw, name: str, action: argparse.Action, tiny_ok: bool):
    if action.choices is not None:
        return draw(st.sampled_from([*map(str, action.choices), "nope"]))
    kind = getattr(action.type, "__name__", None)
    huge = HUGE_INTS.get(name, 10**12)
    if kind == "int":
        return str(draw(st.sampled_from(TINY_INTS + [huge] if tiny_ok else [-1, huge])))
    if kind == "float":
        return repr(draw(st.sampled_from(FLOATS if tiny_ok else [math.nan, -1.0, 1e300])))
    if name in ("out", "run_dir", "path"):
        return draw(st.sampled_from(["out", "run", "garbage.safetensors", "evil.pt", "runs/x", "."]))
    return draw(st.sampled_from(STRINGS if tiny_ok else ["x", "-1", "", "2-1"]))


@st.composite
def command_lines(draw, name: str, parser: argparse.ArgumentParser) -> list[str]:
    """``name``, its BASE, its positionals (input paths), then up to 4 generated flags (so one bad value is isolated)."""
    argv = [name, *draw(st.sampled_from(BASE.get(name, [[]])))]
    options = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.dest == "no_progress":
            continue
        if not action.option_strings:
            argv.append(draw(st.sampled_from(PATHS)))
        elif action.dest in BUDGET and name not in BASE:  # unknown work size: always bound it (invalidly)
            argv += [action.option_strings[-1], _value(draw, action.dest, action, tiny_ok=False)]
        else:
            options.append(action)
    for action in draw(st.lists(st.sampled_from(options), max_size=4, unique_by=lambda a: a.dest)) if options else []:
        flag = action.option_strings[-1]
        if action.nargs == 0:
            argv.append(flag)
        else:
            n = action.nargs if isinstance(action.nargs, int) else 1
            argv += [flag, *(_value(draw, action.dest, action, tiny_ok=True) for _ in range(n))]
    if draw(st.integers(0, 9)) == 0:
        argv.insert(draw(st.integers(1, len(argv))), draw(st.sampled_from(["--nope", "-x", "--", "extra"])))
    return [*argv, "--no-progress"]


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def _allowed_roots(argv: list[str], cwd: Path) -> list[Path]:
    """Where a command may write: its --out (default runs/), and the run an inspect reports on."""
    roots = [cwd / "runs"]
    if "--out" in argv[:-1]:
        roots.append((cwd / argv[argv.index("--out") + 1]).resolve())
    if argv[0] == "inspect":
        roots += [(cwd / a).resolve() for a in argv[1:] if (cwd / a).exists()]
    return roots


class _Timeout(Exception):
    pass


def run_in(cwd: Path, argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()

    def alarm(*_):
        raise _Timeout(f"{argv} ran over {EXAMPLE_TIMEOUT_S} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(EXAMPLE_TIMEOUT_S)
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as e:
                rc = e.code
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        os.chdir(old)
    return rc, out.getvalue(), err.getvalue()


# the test tools' own folders: hypothesis creates .hypothesis/ in the working directory on first use,
# so the first hypothesis test of a session (this one, when run alone) would see it appear
TOOL_DIRS = {".hypothesis", ".pytest_cache"}


def _repo_entries() -> list[str]:
    return sorted(p.name for p in REPO.iterdir() if p.name not in TOOL_DIRS)


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_every_command_line_exits_cleanly_and_writes_only_its_output(world, tmp_path_factory, name):
    parser = subcommands()[name]
    repo_before = _repo_entries()

    @settings(
        max_examples=30 if name == "train" else 15,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate],
    )  # no shrinking: report fast
    @given(command_lines(name, parser))
    def check(argv):
        cwd = tmp_path_factory.mktemp("cwd")
        for item in world.iterdir():
            (shutil.copytree if item.is_dir() else shutil.copy2)(item, cwd / item.name)
        before = _snapshot(cwd)
        rc, out, err = run_in(cwd, argv)
        assert "Traceback" not in err, (argv, err)
        if rc != 0:
            lines = [line for line in err.strip().splitlines() if line.strip()]
            assert lines and lines[-1].startswith("lenslab: error: "), (argv, rc, err)
            assert sum(line.startswith("lenslab: error") for line in lines) == 1, (argv, err)
        after = _snapshot(cwd)
        roots = _allowed_roots(argv, cwd)
        changed = [k for k in set(before) | set(after) if before.get(k) != after.get(k)]
        outside = [k for k in changed if not any((cwd / k).resolve().is_relative_to(r) for r in roots)]
        assert outside == [], (argv, outside)
        if "--json" in argv and rc == 0:
            import json

            json.loads(out)  # exactly one JSON document

    check()
    assert _repo_entries() == repo_before  # nothing landed in the repository
