"""SIGKILL a lenslab command at many moments and check that nothing is lost; prints a JSON summary.

    .venv/bin/python tests/stress/kill_stress.py                 # >= 50 kill points on a tiny train run
    .venv/bin/python tests/stress/kill_stress.py --points 120 --seed 1
    .venv/bin/python tests/stress/kill_stress.py --argv "train --seeds 0-1 --task modadd --p 11 --epochs 4 --eval-every 1"

Kill points: write events of the command (every fsync and rename it makes, from a recorded run)
times the actions of ``killharness`` (kill before / tear / kill after), sampled with a seed so
that every file kind and action is covered; plus SIGKILLs from outside at seeded random times,
and chains where the resume is killed too. After each kill the run must open (``Run.open``),
hold only complete files, and ``--resume`` must finish bitwise equal to the uninterrupted run
made by a separate ``python -m lenslab.cli`` process. Not collected by pytest (no test_ prefix).
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reliability"))

from killharness import ACTIONS, Fault, Harness, check_after_kill, diff_runs, exec_run, out_dir, recover, run_files

DEFAULT = "train --task modadd --p 11 --train-frac 0.5 --epochs 6 --eval-every 1 --ckpt-density 2 --no-progress"


def _kind(event: dict) -> str:
    """What a fault hits: ``metrics.jsonl append``, ``<epoch>.safetensors temp-file write``, ``summary.json rename`` ..."""
    name = Path(event["file"]).name
    if "." not in name:
        return "directory fsync"
    tmp = name.endswith(".tmp")
    name = name.removeprefix(".").removesuffix(".*.tmp")
    if name.split(".")[0].isdigit():
        name = "<epoch>.safetensors"
    return f"{name} {'temp-file write' if tmp else 'append' if event['op'] == 'fsync' else 'rename'}"


def _actions(event: dict) -> list[str]:
    if event["op"] == "replace" or "." not in Path(event["file"]).name:
        return ["kill", "after"]
    return list(ACTIONS)


def with_out(argv: list[str], out: str) -> list[str]:
    argv = list(argv)
    if "--out" in argv:
        argv[argv.index("--out") + 1] = out
    else:
        argv += ["--out", out]
    return argv


def plan(events: list[dict], n_points: int, rng: random.Random, duration: float) -> list[tuple[str, object]]:
    """``("fault", Fault)`` / ``("timer", seconds)`` / ``("chain", (Fault, Fault))``, covering every kind first."""
    pairs = [(e, a) for e in events for a in _actions(e)]
    rng.shuffle(pairs)
    seen, first, rest = set(), [], []
    for e, a in pairs:
        key = (_kind(e), a)
        (rest if key in seen else first).append((e, a))
        seen.add(key)
    n_timer = max(4, n_points // 8)
    n_chain = max(3, n_points // 12)
    n_fault = max(0, n_points - n_timer - n_chain)
    chosen = (first + rest)[:n_fault]
    points: list[tuple[str, object]] = [("fault", Fault(e["i"], a, seed=rng.randrange(1 << 30))) for e, a in chosen]
    points += [("timer", rng.uniform(0.02, duration)) for _ in range(n_timer)]  # within an uninterrupted run's time
    files = sorted({e["file"] for e in events})
    for _ in range(n_chain):
        first_kill = Fault(rng.randrange(len(events)), rng.choice(["kill", "tear"]), seed=rng.randrange(1 << 30))
        second = Fault(file=rng.choice(files), nth=0, action=rng.choice(["kill", "tear", "after"]), seed=rng.randrange(1 << 30))
        points.append(("chain", (first_kill, second)))
    return points


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--argv", default=DEFAULT, help="the lenslab command line to kill (without 'lenslab', without --out)")
    ap.add_argument("--points", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.time()
    rng = random.Random(args.seed)
    base = shlex.split(args.argv)
    h = Harness()
    ref = exec_run(with_out(base, "reference"), h.cwd)
    if ref.rc != 0:
        sys.exit(f"the reference run failed: {ref.last_line}")
    reference = run_files(h.cwd / "reference")
    probe = h.run(with_out(base, "probe"), record=h.logs / "events.jsonl")  # also starts the forkserver
    t_probe = time.time()
    h.run(with_out(base, "timed"))
    duration = time.time() - t_probe
    events = probe.events
    d = diff_runs(run_files(h.cwd / "probe"), reference)
    assert probe.rc == 0 and d == [], f"a forked run differs from the exec'd one: {d[:6]}"

    by_fault: dict[str, Counter] = defaultdict(Counter)
    outcomes, failures = Counter(), []
    for n, (kind, spec) in enumerate(plan(events, args.points, rng, duration)):
        argv = with_out(base, f"p{n}")
        run = out_dir(argv, h.cwd)
        if kind == "fault":
            label = f"{spec.action} at {_kind(events[spec.event])}"
            first = h.run(argv, fault=spec)
        elif kind == "timer":
            label = "SIGKILL from outside at a random time"
            first = h.run(argv, kill_after=spec)
        else:
            label = "kill, then kill the resume"
            first = h.run(argv, fault=spec[0])
        problems = check_after_kill(run, reference) if first.killed else []
        if kind == "chain" and first.killed:
            second = h.run([*argv, "--resume"], fault=spec[1])
            problems += check_after_kill(run, reference) if second.killed else []
        how, done = recover(h, argv)
        lost = diff_runs(run_files(run), reference) if done.rc == 0 else [f"recovery failed: {done.last_line}"]
        c = by_fault[label]
        c["tried"] += 1
        c["killed"] += int(first.killed)
        c["lost"] += int(bool(problems or lost))
        outcomes[how if first.killed else "finished before the kill"] += 1
        if problems or lost:
            failures.append({"point": n, "fault": label, "spec": repr(spec), "after_kill": problems, "after_resume": lost[:5]})
        print(
            f"[{n}] {label}: {'LOST ' + str((problems + lost)[:2]) if problems or lost else 'ok'} ({how})",
            file=sys.stderr,
            flush=True,
        )
    summary = {
        "command": "lenslab " + " ".join(base),
        "reference": "python -m lenslab.cli (separate process); kills in forked children of one forkserver",
        "write_events_per_run": len(events),
        "uninterrupted_child_seconds": round(duration, 2),
        "kill_points": sum(c["tried"] for c in by_fault.values()),
        "killed": sum(c["killed"] for c in by_fault.values()),
        "by_fault": {k: dict(v) for k, v in sorted(by_fault.items())},
        "recovery": dict(outcomes),
        "runs_with_anything_lost": len(failures),
        "failures": failures,
        "seconds": round(time.time() - t0, 1),
    }
    print(json.dumps(summary, indent=2))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
