"""Run a ``lenslab`` command in a child process and SIGKILL it at a chosen moment; then check the run.

    h = Harness()                                     # a forkserver that has imported lenslab once
    events = h.run(argv, record=log).events           # every fsync / rename the command makes, in order
    h.run(argv, fault=Fault(12, "tear"))              # SIGKILL at write event 12, after cutting the file short
    h.run(argv, kill_after=0.8)                       # SIGKILL from outside after 0.8 s
    how, out = recover(h, argv)                       # the user's next step: the same command with --resume

Any command line works (``train``, ``train --seeds``, ``sweep``, ...): ``argv`` is what follows
``lenslab``. Children are forked from a forkserver that imported lenslab once (an exec'd
``python -m lenslab.cli`` spends seconds importing transformer_lens); ``exec_run`` runs the real
console entry point for comparison. Every child uses one torch thread, so runs compare bitwise.

Fault points are the write system calls of ``training.runio``: every ``os.fsync`` (of a temp
file, of ``metrics.jsonl`` after an append, of a directory) and every ``os.replace``. Actions:

- ``kill``: SIGKILL just before the call (the bytes written so far are in the page cache, as after
  a real kill -9; only a power cut could lose them, and that is not what this tests);
- ``tear``: cut the file being synced at a seeded random length (a temp file anywhere in
  ``[0, size)``, an appended file inside its last line), then SIGKILL: what a kill in the middle
  of ``write`` leaves;
- ``after``: let the call finish, then SIGKILL (between two files);
- ``pause``: touch ``Fault.marker`` and sleep until killed (a writer caught in the act).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRELOAD = ["torch", "lenslab.training.trainer", "lenslab.training.run", "lenslab.cli"]
ACTIONS = ("kill", "tear", "after")
_TMP = re.compile(r"^(\..+?)\.[^.]+\.tmp$")


@dataclass(frozen=True)
class Fault:
    """Where to act: write event number ``event``, or the ``nth`` event ``op`` on ``file``."""

    event: int | None = None  # index of the write event (0-based) at which to act
    action: str = "kill"  # kill | tear | after | pause
    seed: int = 0  # where a tear cuts
    file: str | None = None  # or: an event_name, e.g. "metrics.jsonl", "checkpoints/.1.safetensors.*.tmp"
    op: str = "fsync"
    nth: int = 0
    marker: str | None = None  # pause: file to create once paused

    def matches(self, i: int, op: str, file: str, seen: dict) -> bool:
        if self.file is None:
            return i == self.event
        if (op, file) != (self.op, self.file):
            return False
        seen["hits"] = seen.get("hits", -1) + 1
        return seen["hits"] == self.nth


@dataclass
class Outcome:
    rc: int | None
    killed: bool
    stderr: str
    events: list[dict] = field(default_factory=list)

    @property
    def last_line(self) -> str:
        lines = [line for line in self.stderr.strip().splitlines() if line.strip()]
        return lines[-1] if lines else ""


# -- inside the child ------------------------------------------------------------------
def event_name(path: str) -> str:
    """``checkpoints/.3.safetensors.*.tmp``-style name of a synced / renamed path (run-relative)."""
    p = Path(path)
    name = p.name
    m = _TMP.match(name)
    if m:
        name = f"{m.group(1)}.*.tmp"
    return f"checkpoints/{name}" if p.parent.name == "checkpoints" else name


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # not reached


def _tear(path: str, seed: int) -> None:
    """Cut ``path`` where a kill in the middle of its last write could have left it."""
    p = Path(path)
    if not p.is_file():
        return  # a directory: nothing to cut
    data = p.read_bytes()
    if not data:
        return
    if p.name.endswith(".tmp"):
        lo = 0
    else:  # an append: somewhere inside the last line
        lo = data.rfind(b"\n", 0, len(data) - 1) + 1
    os.truncate(p, random.Random(seed).randrange(lo, len(data)))


def install_faults(fault: Fault | None, record: str | None) -> None:
    """Wrap ``os.fsync`` and ``os.replace`` of this process with the fault / recording hook."""
    real_fsync, real_replace = os.fsync, os.replace
    counter = {"n": 0}
    seen: dict = {}

    def hook(op: str, path: str, do):
        i = counter["n"]
        counter["n"] += 1
        name = event_name(path)
        if record:
            with open(record, "a") as f:
                f.write(json.dumps({"i": i, "op": op, "file": name}) + "\n")
        if fault is not None and fault.matches(i, op, name, seen):
            if fault.action == "kill":
                _die()
            elif fault.action == "tear":
                if op == "fsync":  # only a file being written can be torn; a rename is atomic (kill before it)
                    _tear(path, fault.seed)
                _die()
            elif fault.action == "after":
                do()
                _die()
            elif fault.action == "pause":
                Path(fault.marker).touch()
                while True:
                    time.sleep(1)
        return do()

    def fsync(fd):
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            path = "?"
        return hook("fsync", path, lambda: real_fsync(fd))

    def replace(src, dst, **kw):
        return hook("replace", str(dst), lambda: real_replace(src, dst, **kw))

    os.fsync, os.replace = fsync, replace


def _child(argv: list[str], cwd: str, log: str, fault: Fault | None, record: str | None) -> None:
    os.chdir(cwd)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    import torch

    torch.set_num_threads(1)
    install_faults(fault, record)
    from lenslab.cli import main

    try:
        rc = main(list(argv))
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 2
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


# -- the parent ------------------------------------------------------------------------
class Harness:
    """Children forked from one forkserver that preloaded lenslab (fast), each in ``cwd``.

    A script that uses it needs the ``if __name__ == "__main__":`` guard (multiprocessing).
    """

    def __init__(self, cwd: str | Path | None = None):
        self.cwd = Path(cwd or tempfile.mkdtemp(prefix="killharness-"))
        self.logs = Path(tempfile.mkdtemp(prefix="killharness-logs-"))
        for p in (str(REPO), str(Path(__file__).parent)):
            if p not in sys.path:
                sys.path.insert(0, p)
        self.ctx = multiprocessing.get_context("forkserver")
        self.ctx.set_forkserver_preload(PRELOAD)
        self.n = 0

    def start(self, argv: list[str], fault: Fault | None = None, record: str | Path | None = None):
        """Start a child; returns ``(process, log path)``."""
        self.n += 1
        log = self.logs / f"{self.n}.log"
        p = self.ctx.Process(target=_child, args=(list(argv), str(self.cwd), str(log), fault, str(record) if record else None))
        p.start()
        return p, log

    def run(
        self,
        argv: list[str],
        fault: Fault | None = None,
        record: str | Path | None = None,
        kill_after: float | None = None,
        timeout: float = 600,
    ) -> Outcome:
        """Run ``lenslab *argv`` to its end, or until the fault / the ``kill_after`` timer kills it."""
        p, log = self.start(argv, fault, record)
        p.join(kill_after if kill_after is not None else timeout)
        if p.is_alive():
            p.kill()  # SIGKILL
            p.join()
        events = []
        if record and Path(record).exists():
            events = [json.loads(line) for line in Path(record).read_text().splitlines()]
        rc = p.exitcode
        stderr = log.read_text(errors="replace") if log.exists() else ""
        return Outcome(rc=rc, killed=rc == -signal.SIGKILL, stderr=stderr, events=events)


def exec_run(argv: list[str], cwd: str | Path, timeout: float = 600) -> Outcome:
    """``python -m lenslab.cli *argv`` in a fresh interpreter (one torch thread, like the forked children)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    p = subprocess.run(
        [sys.executable, "-m", "lenslab.cli", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return Outcome(rc=p.returncode, killed=p.returncode == -signal.SIGKILL, stderr=p.stderr)


def out_dir(argv: list[str], cwd: Path) -> Path:
    return cwd / argv[argv.index("--out") + 1]


def recover(h: Harness, argv: list[str], fault: Fault | None = None) -> tuple[str, Outcome]:
    """What a user does after a crash: the same command with ``--resume`` (a sweep: the same command).

    A kill before ``config.json`` exists leaves nothing to resume (the CLI says so); then the
    plain command is run again. Returns ``("resumed" | "restarted", outcome)``.
    """
    if argv and argv[0] == "sweep":  # a sweep resumes by running the same command again
        return "resumed", h.run(argv, fault=fault)
    o = h.run([*argv, "--resume"], fault=fault)
    if o.rc == 2 and "holds no run to resume" in o.last_line:
        return "restarted", h.run(argv, fault=fault)
    return "resumed", o


# -- checks ------------------------------------------------------------------------------
def run_files(run_dir: str | Path) -> dict[str, bytes]:
    """Every file of a run directory by relative path (the lock excluded)."""
    root = Path(run_dir)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".lock"}


def diff_runs(got: dict[str, bytes], want: dict[str, bytes]) -> list[str]:
    """Files missing, extra or with different bytes (empty: bitwise the same run)."""
    out = [f"missing {k}" for k in sorted(set(want) - set(got))]
    out += [f"extra {k}" for k in sorted(set(got) - set(want))]
    out += [f"differs {k}" for k in sorted(set(got) & set(want)) if got[k] != want[k]]
    return out


def check_after_kill(out: str | Path, reference: dict[str, bytes]) -> list[str]:
    """Problems with a killed command's ``--out`` folder (empty: fine).

    The folder is one run directory (``train``), or holds several (``train --seeds``: ``seed_<s>/``;
    ``sweep``: ``<cell>/seed_<s>/`` beside ``sweep.json`` and ``results.*``). Every run directory in
    it is checked by ``check_run_after_kill`` against its part of the reference; every other file
    must be bitwise the reference's (written atomically, so complete or absent).
    """
    out = Path(out)
    if (out / "config.json").is_file():
        return check_run_after_kill(out, reference)
    runs = sorted(p.parent for p in out.rglob("config.json"))
    problems = []
    for d in runs:
        prefix = f"{d.relative_to(out)}/"
        part = {k.removeprefix(prefix): v for k, v in reference.items() if k.startswith(prefix)}
        problems += [f"{prefix}: {p}" for p in check_run_after_kill(d, part)]
    inside = tuple(f"{d.relative_to(out)}/" for d in runs)
    for rel, data in run_files(out).items():
        if rel.startswith(inside) or any(part.startswith(".") for part in Path(rel).parts):
            continue
        if reference.get(rel) != data:
            problems.append(f"{rel} is not bitwise the reference file")
    return problems


def check_run_after_kill(run_dir: str | Path, reference: dict[str, bytes]) -> list[str]:
    """Problems with one killed run directory (empty: fine).

    Once it has a config it opens with ``Run.open``; every metrics row it yields is the reference
    run's row for that epoch (a torn line never parses); the summary parses; every checkpoint loads
    into the model; and every file in place other than config / summary / metrics is bitwise the
    reference's (atomic writes: a file is complete or absent). Temp files are left to the resume.
    """
    from lenslab.training.errors import RunError
    from lenslab.training.run import Run

    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        return []
    problems = []
    try:
        run = Run.open(run_dir)
        want_rows = {r["epoch"]: r for r in read_jsonl_bytes(reference.get("metrics.jsonl", b""))}
        for row in run.metrics:
            if row != want_rows.get(row["epoch"]):
                problems.append(f"metrics row for epoch {row['epoch']} is not the reference row")
        run.summary  # noqa: B018 (parses)
        for _ in run.iter_models():
            pass  # each checkpoint loads and passes the layout / finiteness checks
    except RunError as e:
        problems.append(f"unreadable after kill: {e}")
    for rel, data in run_files(run_dir).items():
        if Path(rel).name.startswith(".") or rel in (
            "metrics.jsonl",
            "config.json",
            "summary.json",
            "checkpoints/resume.safetensors",
        ):
            continue
        if reference.get(rel) != data:
            problems.append(f"{rel} is not bitwise the reference file")
    return problems


def read_jsonl_bytes(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def lock_probe(run_dir: str, go: str, done: str, result: str) -> None:
    """Child for lock races: wait for ``go``, try the run lock, write won/refused, hold it until ``done``."""
    from lenslab.training.errors import RunError
    from lenslab.training.runio import RunLock

    while not Path(go).exists():
        time.sleep(0.001)
    try:
        lock = RunLock(run_dir).acquire()
    except RunError as e:
        Path(result).write_text(f"refused {e}")
        os._exit(0)
    Path(result).write_text("won")
    while not Path(done).exists():
        time.sleep(0.01)
    lock.release()
    os._exit(0)


# The small modadd run the reliability tests kill (in a uniquely named module: a plain
# ``from conftest import`` resolves to whichever conftest pytest imported first).
MODADD = [
    "train",
    "--task",
    "modadd",
    "--p",
    "11",
    "--train-frac",
    "0.5",
    "--epochs",
    "4",
    "--eval-every",
    "1",
    "--ckpt-density",
    "1",
    "--no-progress",
]


def train_argv(out: str) -> list[str]:
    return [*MODADD, "--out", out]
