"""Two writers on one run directory: the second is refused by name; a killed writer's lock does not block."""

from __future__ import annotations

import time
from pathlib import Path

from killharness import Fault, diff_runs, lock_probe, out_dir, recover, run_files, train_argv

from lenslab.training.run import Run


def _wait_for(path: Path, timeout: float = 300) -> None:
    t0 = time.monotonic()
    while not path.exists():
        assert time.monotonic() - t0 < timeout, f"{path} never appeared"
        time.sleep(0.05)


def test_second_writer_refused_and_a_killed_writers_lock_recovered(harness, reference):
    argv = train_argv("lock")
    run = out_dir(argv, harness.cwd)
    marker = harness.logs / "lock-paused"
    writer, _ = harness.start(argv, fault=Fault(file="metrics.jsonl", nth=1, action="pause", marker=str(marker)))
    try:
        _wait_for(marker)  # the writer is inside its epoch-1 evaluation, holding the lock
        second = harness.run([*argv, "--resume"])
        assert second.rc == 2 and "Traceback" not in second.stderr
        assert second.last_line.startswith("lenslab: error: ")
        assert f"another lenslab process (pid {writer.pid} on " in second.last_line
        assert len(Run.open(run).metrics) >= 1  # readers need no lock
    finally:
        writer.kill()  # SIGKILL: no chance to clean up
        writer.join()
    assert f" {writer.pid}" in (run / ".lock").read_text()  # its lock file is still there ...
    how, done = recover(harness, argv)  # ... and does not block the resume
    assert (how, done.rc) == ("resumed", 0), done.stderr
    assert diff_runs(run_files(run), reference) == []


def test_racing_writers_on_a_leftover_lock_exactly_one_wins(harness, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").write_text("somehost 999999999\n")  # left by an older lenslab or a dead process
    go, done = tmp_path / "go", tmp_path / "done"
    results = [tmp_path / f"r{i}" for i in range(4)]
    procs = [harness.ctx.Process(target=lock_probe, args=(str(run), str(go), str(done), str(r))) for r in results]
    for p in procs:
        p.start()
    go.touch()
    for r in results:
        _wait_for(r, timeout=120)
    outcomes = [r.read_text() for r in results]
    done.touch()
    for p in procs:
        p.join()
    assert sorted(o.split()[0] for o in outcomes) == ["refused", "refused", "refused", "won"], outcomes
    assert all("another lenslab process" in o for o in outcomes if o != "won")
    assert not (run / ".lock").exists()  # released by the winner
