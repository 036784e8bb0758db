"""The ``lenslab`` command line. It parses arguments and calls the packages; no logic of its own.

Every command: progress and logs on stderr; ``--json`` prints exactly one JSON document on
stdout; bad input prints one line ``lenslab: error: ...`` and exits 2 (no traceback);
Ctrl-C saves what it can and exits 130.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def cmd_inspect(a: argparse.Namespace) -> dict:
    """``lenslab inspect``: write a run's inspection report; returns what the CLI prints."""
    from lenslab.report import write_inspection
    from lenslab.training.run import Run

    run = Run.open(a.run_dir)  # a bad path fails here, before any progress line
    _log(f"inspecting {a.run_dir} (ablation, cross-split patching, fingerprints, evolution)")
    result, path = write_inspection(run)
    if not a.json:
        print(f"report: {path}")
        phase = result.get("phase") or {}
        print(
            f"phase 1 from epoch {phase.get('phase1_epoch')}; phase 2 (adv rising while validation >= 99%) from epoch {phase.get('phase2_epoch')}"
        )
    return {"report": str(path), **result}


def cmd_traps(a: argparse.Namespace) -> dict:
    """``lenslab traps``: correlation traps and HTSR alpha per matrix and checkpoint; returns the table and any unreadable files."""
    from lenslab.interp.spectral import format_traps_table, traps_command

    result = traps_command(
        a.path,
        mode=a.mode,
        seed=a.seed,
        n_shuffles=a.n_shuffles,
        jsd=a.jsd,
        workers=a.workers,
        executor=a.executor,
        progress=not a.no_progress,
    )
    if not a.json:
        print(format_traps_table(result))
    bad = [c for c in result["checkpoints"] if c.get("error")]
    if bad:  # the rows that could be read are out; then one line naming the bad files, and exit 2
        if a.json:
            print(json.dumps(result, indent=2, default=str))
        first = bad[0]
        more = f" (and {len(bad) - 1} more; see their 'error' fields)" if len(bad) > 1 else ""
        raise UserError(
            f"{len(bad)} of {len(result['checkpoints'])} checkpoints could not be read: {first['checkpoint']}: {first['error']}{more}"
        )
    return result


class UserError(Exception):
    """A bad command line; printed as one line."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (not usage + error)."""

    def error(self, message: str):
        self.exit(2, f"lenslab: error: {message} (see: {self.prog} --help)\n")


def _seeds(text: str) -> list[int]:
    """``3`` or ``0-7`` or ``0,2,5``."""
    out: list[int] = []
    for part in text.split(","):
        if len(out) > MAX_SEEDS:
            break
        if "-" in part:
            a, b = part.split("-", 1)
            if not (a.isdigit() and b.isdigit()) or int(a) > int(b):
                raise argparse.ArgumentTypeError(f"bad seed range {part!r}: use A-B with A <= B")
            if int(b) - int(a) >= MAX_SEEDS:
                raise argparse.ArgumentTypeError(
                    f"seed range {part!r} has {int(b) - int(a) + 1} seeds; at most {MAX_SEEDS} per command"
                )
            out.extend(range(int(a), int(b) + 1))
        elif part.isdigit():
            out.append(int(part))
        else:
            raise argparse.ArgumentTypeError(f"bad seed {part!r}: use non-negative integers like 0, 0-7 or 0,3")
    if len(out) > MAX_SEEDS:
        raise argparse.ArgumentTypeError(f"{len(out)} seeds; at most {MAX_SEEDS} per command")
    return out


MAX_SEEDS = 10_000


def _dtype(text: str) -> str:
    from lenslab.training.spec import DTYPE_NAMES

    if text not in DTYPE_NAMES:
        raise argparse.ArgumentTypeError(f"dtype {text!r}: choose {' or '.join(DTYPE_NAMES)}")
    return text


def _at_least_one(text: str) -> int:
    """A count on the command line: an integer >= 1 (checked before any file is read)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} must be at least 1")
    return n


def _spec_flags() -> list[tuple[str, object]]:
    """``(flag, Param)`` of every config field that has a flag, in help order: task, mpsp task, model, modadd task, mnist task and MLP, training."""
    from lenslab.training.spec import TASK, MLPSpec, MNISTSpec, ModAddSpec, ModelSpec, MPSPSpec, TrainSpec, params

    out, seen = [(TASK.flag, TASK)], {TASK.flag}
    for cls in (MPSPSpec, ModelSpec, ModAddSpec, MNISTSpec, MLPSpec, TrainSpec):
        for p in params(cls).values():
            if p.flag and p.flag not in seen:
                seen.add(p.flag)
                out.append((p.flag, p))
    return out


def _flag_kind(p) -> type:
    return {"int": int, "float": float}.get(p.kind) or (type(p.default) if p.kind == "task" else str)


def _flag_help(p, *, listed: bool = False) -> str:
    """A flag's help from its field's metadata: what it is, its range or choices, its default."""
    text = ("comma list: " if listed else "") + p.help
    rng = p.range_text()
    if rng and p.kind in ("int", "float"):
        rng = ("0 or " if p.nullable else "") + ("each " if listed else "") + "in " + rng
    return f"{text} ({rng + '; ' if rng else ''}default {p.default_text()})"


def _add_train_args(p: argparse.ArgumentParser) -> None:
    """Flags default to 'not given' so that ``--resume`` can tell what the user asked for.

    Every config flag comes from its field in ``training.spec`` (type, choices, help, default).
    """
    S = argparse.SUPPRESS
    for flag, param in _spec_flags():
        kw: dict = {"default": S, "help": _flag_help(param)}
        if flag == "betas":
            kw.update(type=float, nargs=2)
        else:
            kw["type"] = _flag_kind(param)
        if param.kind == "choice" and param.validator is None:  # refused by argparse, naming the choices
            kw["choices"] = list(param.choices)
        p.add_argument("--" + flag.replace("_", "-"), **kw)
    p.add_argument("--device", default=None, help="cpu | cuda (default: cuda when available)")
    p.add_argument("--out", default=None, help="run directory (default runs/<task>-<settings>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out up to --epochs in total")
    p.add_argument(
        "--init-from",
        default=None,
        metavar="RUN_OR_CKPT",
        help="start from this run's last checkpoint (or this checkpoint file) with a fresh AdamW, "
        "e.g. to continue at another --weight-decay; flags not given are the source run's",
    )
    p.add_argument(
        "--seeds",
        type=_seeds,
        default=None,
        help="train these seeds at once (0-7 or 0,3,5) into OUT/seed_<s>/ with the ensemble engine",
    )
    p.add_argument(
        "--ensemble-size",
        type=int,
        default=None,
        help="members per stacked ensemble with --seeds (default: the fastest of 1, 2, 4, 8, 16, timed here on a few steps)",
    )


def _given(a: argparse.Namespace) -> dict:
    from lenslab.training.config import FLAG_PLACES

    return {k: v for k, v in vars(a).items() if k in FLAG_PLACES or k == "epochs"}


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _describe(summary: dict, out: Path) -> str:
    f = summary.get("final") or {}
    lines = [f"run: {out}  ({summary['status']}, {summary['epochs_completed']} epochs)"]
    if "generalized" in summary:
        lines.append(
            f"final accuracy  train {f.get('train_acc', float('nan')):.3f}  validation (r=1, shortcut) {f.get('validation_acc', float('nan')):.3f}"
            f"  adversarial (r=0, true rule) {f.get('adv_acc', float('nan')):.3f}"
        )
        if summary["generalized"]:
            lines.append(f"generalized: yes, 100% adversarial accuracy first at epoch {summary['first_generalized_epoch']}")
        else:
            lines.append(f"generalized: no (best adversarial accuracy {summary['max_adv_acc']:.3f})")
        if f.get("grad_conflict") is not None:
            lines.append(
                f"gradient conflict {f['grad_conflict']:+.3f}, amplification {f['grad_amplification']:.1f}x (anti / consistent)"
            )
    else:
        lines.append(f"final accuracy  train {f.get('train_acc', float('nan')):.3f}  test {f.get('test_acc', float('nan')):.3f}")
    return "\n".join(lines)


def cmd_train(a: argparse.Namespace) -> dict:
    """``lenslab train``: one run, or ``--seeds`` on stacked weights; returns what the CLI prints (the summary or summaries)."""
    from lenslab.training.config import config_from_flags, default_run_dir, init_config, resume_config
    from lenslab.training.trainer import train

    given = _given(a)
    if a.seeds is not None:
        if a.init_from:
            raise UserError("--init-from trains one run from one checkpoint; drop --seeds (or give --seed)")
        return _train_seeds(a, given)
    if a.ensemble_size is not None:
        raise UserError("--ensemble-size goes with --seeds (e.g. --seeds 0-7 --ensemble-size 4)")
    if a.resume:
        if not a.out:
            raise UserError("--resume needs --out DIR, the run to continue")
        out = Path(a.out)
        if not (out / "config.json").is_file():
            raise UserError(f"--resume: {out} holds no run to resume (no config.json)")
        cfg = resume_config(out, given)
        if a.init_from and (cfg.get("init") or {}).get("from") != str(_init_checkpoint(a.init_from)):
            raise UserError(
                f"--init-from {a.init_from} is not where {out} started from ({(cfg.get('init') or {}).get('from')}); drop --init-from to resume"
            )
    elif a.init_from:
        cfg = init_config(a.init_from, given)
        out = Path(a.out) if a.out else default_run_dir(cfg)
    else:
        cfg = config_from_flags(given)
        out = Path(a.out) if a.out else default_run_dir(cfg)
    _log(f"training into {out}")
    summary = train(cfg, out, resume=a.resume, progress=not a.no_progress, device=a.device)
    if not a.json:
        print(_describe(summary, out))
    return summary


def _init_checkpoint(source: str) -> Path:
    from lenslab.training.run import Run

    return Run.open(source).checkpoint_file().resolve()


def _train_seeds(a: argparse.Namespace, given: dict) -> dict:
    """``--seeds``: one run directory per seed under OUT, trained E at a time on stacked weights."""
    from lenslab.training.config import config_from_flags, default_seeds_dir, resume_config
    from lenslab.training.seeds import seed_dirs, train_seeds

    if "seed" in given:
        raise UserError("give either --seed or --seeds, not both")
    if a.out:
        root = Path(a.out)
    elif a.resume:
        raise UserError("--resume needs --out DIR, the folder holding seed_<s>/ runs")
    else:
        root = default_seeds_dir(given)
    outs = seed_dirs(root, a.seeds)
    configs = [
        resume_config(out, given) if a.resume and (out / "config.json").is_file() else config_from_flags({**given, "seed": s})
        for s, out in zip(a.seeds, outs)
    ]
    summaries = train_seeds(
        configs, outs, a.ensemble_size, resume=a.resume, progress=not a.no_progress, device=a.device, log=_log
    )
    result = {"root": str(root), "runs": {str(o): s for o, s in zip(outs, summaries)}}
    if not a.json:
        for out, summary in zip(outs, summaries):
            print(_describe(summary, out))
        if "generalized" in summaries[0]:
            gen = sum(bool(s["generalized"]) for s in summaries)
            print(f"generalized: {gen} of {len(summaries)} seeds")
    return result


def _list(kind):
    def parse(text: str) -> list:
        try:
            values = [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {kind.__name__}s (e.g. 1,2)") from None
        if not values:
            raise argparse.ArgumentTypeError("give at least one value")
        return values

    return parse


SWEEP_SETTINGS = (
    "label",
    "shortcut",
    "n_train",
    "n_val",
    "n_adv",
    "data_seed",
    "epochs",
    "eval_every",
    "ckpt_density",
    "dtype",
    "eval_schedule",
    "n_evals",
)


def _batch_size(text: str) -> int:
    """A batch size on the command line: a positive integer, or full / 0 for the whole train split."""
    if text.strip().lower() == "full":
        return 0
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a batch size: use a positive integer, or full (or 0) for the whole train split"
        ) from None


def cmd_sweep(a: argparse.Namespace) -> dict:
    """``lenslab sweep``: a resumable grid of cells × seeds; returns the outcome table."""
    from lenslab.training.sweep import plan_sweep, run_sweep

    if a.task == "modadd":
        return _sweep_modadd(a)
    stray = [f for f, v in (("--p", a.p), ("--train-frac", a.train_frac)) if v is not None]
    if stray:
        raise UserError(f"{stray[0]} is a modadd flag; add --task modadd")
    if a.dtype is not None and len(a.dtype) > 1:
        raise UserError(f"--dtype {','.join(a.dtype)}: an MPSP sweep trains in one dtype (a list is for --task modadd)")
    settings = {k: getattr(a, k) for k in SWEEP_SETTINGS if getattr(a, k) is not None}
    if "dtype" in settings:
        settings["dtype"] = settings["dtype"][0]
    axes = {"seq_lens": a.seq_len, "n_values": a.n_values, "batch_sizes": a.batch_size, "lrs": a.lr}
    plan = plan_sweep(
        a.out,
        a.layers or [1, 2],
        a.heads or [1, 2],
        a.ratios or [0.5, 0.9],
        a.seeds,
        a.weight_decay or [0.1],
        ensemble_size=a.ensemble_size,
        **axes,
        **settings,
    )
    g = plan["grid"]
    sizes = " x ".join(
        f"{len(g[k])} {k.replace('_', ' ')}" for k in g if k != "seeds" and (len(g[k]) > 1 or k in ("layers", "heads", "ratios"))
    )
    _log(f"sweep: {len(plan['members'])} runs ({sizes} x {len(g['seeds'])} seeds) into {a.out}, executor {a.executor}")
    rows = run_sweep(plan, executor=a.executor, workers=a.workers, progress=not a.no_progress, device=a.device)
    from lenslab.sweep_figures import write_sweep_figure

    write_sweep_figure(a.out, rows)
    if not a.json:
        from lenslab.training.outcomes import FAILURES

        _print_cells(
            rows,
            [
                ("runs", lambda r: r["runs"]),
                ("gen", lambda r: r["generalized"]),
                ("rate", lambda r: _fmt(r["rate"], ".2f")),
                ("Wilson 95%", lambda r: "-" if r["rate"] is None else f"[{r['wilson_low']:.2f}, {r['wilson_high']:.2f}]"),
                ("median 1st", lambda r: _fmt(r["median_first_generalized_epoch"], "g")),
                ("failed runs", lambda r: ", ".join(f"{r[f'failed_{o}']} {o}" for o in FAILURES if r.get(f"failed_{o}"))),
            ],
            a.out,
        )
    return {"out": a.out, "cells": rows}


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _print_cells(rows: list[dict], columns: list, out: str) -> None:
    """A sweep's cell table on stdout: the cell name, then ``columns`` (title, row -> value), then where the files are."""
    width = max([22] + [len(r["cell"]) for r in rows])
    table = [[str(get(r)) for _, get in columns] for r in rows]
    widths = [max([len(t)] + [len(row[i]) for row in table]) for i, (t, _) in enumerate(columns)]
    print(f"{'cell':<{width}}  " + "  ".join(f"{t:>{w}}" for (t, _), w in zip(columns, widths)))
    for r, row in zip(rows, table):
        print(f"{r['cell']:<{width}}  " + "  ".join(f"{v:>{w}}" for v, w in zip(row, widths)))
    print(
        f"tables: {Path(out) / 'results.csv'}, {Path(out) / 'results_runs.csv'}, {Path(out) / 'results.json'}; figure: {Path(out) / 'results.html'}"
    )


def _sweep_modadd(a: argparse.Namespace) -> dict:
    """``lenslab sweep --task modadd``: weight decays x train fractions x dtypes x seeds."""
    from lenslab.training.sweep import plan_modadd_sweep, run_sweep

    stray = [
        f
        for f, v in (
            ("--layers", a.layers),
            ("--heads", a.heads),
            ("--ratios", a.ratios),
            ("--seq-len", a.seq_len),
            ("--n-values", a.n_values),
            ("--batch-size", a.batch_size),
            ("--label", a.label),
            ("--shortcut", a.shortcut),
            ("--n-train", a.n_train),
        )
        if v is not None
    ]
    if stray:
        raise UserError(
            f"{stray[0]} is an mpsp flag; a modadd sweep takes --p, --train-frac, --weight-decay, --dtype and --seeds"
        )
    if a.lr is not None and len(a.lr) > 1:
        raise UserError("--lr: a modadd sweep takes one learning rate")
    settings = {
        k: getattr(a, k)
        for k in ("epochs", "eval_every", "ckpt_density", "data_seed", "eval_schedule", "n_evals")
        if getattr(a, k) is not None
    }
    if a.lr is not None:
        settings["lr"] = a.lr[0]
    plan = plan_modadd_sweep(
        a.out,
        a.weight_decay or [1.0],
        a.seeds,
        a.train_frac or [0.3],
        a.dtype or ["float32"],
        p=a.p if a.p is not None else 113,
        ensemble_size=a.ensemble_size,
        **settings,
    )
    _log(f"sweep: {len(plan['members'])} modular-addition runs into {a.out}, executor {a.executor}")
    rows = run_sweep(plan, executor=a.executor, workers=a.workers, progress=not a.no_progress, device=a.device)
    from lenslab.sweep_figures import write_sweep_figure

    write_sweep_figure(a.out, rows)
    if not a.json:
        _print_cells(
            rows,
            [
                ("runs", lambda r: r["runs"]),
                ("grokked", lambda r: r["grokked"]),
                ("anti-grokked", lambda r: r["anti_grokked"]),
                ("best test", lambda r: _fmt(r["median_test_acc_best"], ".3f")),
                ("final test", lambda r: _fmt(r["median_test_acc_final"], ".3f")),
            ],
            a.out,
        )
    return {"out": a.out, "cells": rows}


def cmd_demo(a: argparse.Namespace) -> dict:
    """``lenslab demo``: train the small demo run (or reuse it) and write its report; returns the run, summary and report path."""
    from lenslab.training.config import mpsp_run_config
    from lenslab.training.trainer import train

    out = Path(a.out)
    cfg = mpsp_run_config(ratio=0.9, layers=2, heads=2, epochs=a.epochs, seed=a.seed)
    resume = (out / "config.json").is_file()
    _log(
        f"lenslab demo: 2-layer, 2-head MPSP model (sum2 label, max shortcut, seq_len 5, values 0..15), r = 0.9, {a.epochs} epochs, seed {a.seed}"
    )
    _log(f"run directory: {out}" + ("  (found: resuming / reusing it)" if resume else ""))
    summary = train(cfg, out, resume=resume, progress=not a.no_progress)
    result = {"run": str(out), "summary": summary}
    if not a.json:
        print(_describe(summary, out))
        print(
            "what it shows: validation accuracy (all shortcut-consistent) near 1.0 means the shortcut was learned; "
            "adversarial accuracy (all anti-shortcut) is the true rule. 'phase 2' is when adversarial rises while validation stays ~1."
        )
        print(f"metrics per evaluation: {out / 'metrics.jsonl'}")
    from lenslab.report import write_inspection

    _log("inspecting the run ...")
    _inspection, report = write_inspection(out)
    result["report"] = str(report)
    if not a.json:
        print(f"report (open it in a browser, works offline): {report}")
    return result


def build_parser() -> argparse.ArgumentParser:
    """The ``lenslab`` argument parser (every subcommand and option)."""
    parser = _Parser(prog="lenslab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, metavar="{train,inspect,traps,sweep,demo}")
    sub.required = True
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print exactly one JSON document on stdout")
    common.add_argument("--no-progress", action="store_true", help="no progress bars")

    p = sub.add_parser("train", parents=[common], help="train one model into a run directory")
    _add_train_args(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("inspect", parents=[common], help="ablation, patching, fingerprints -> RUN_DIR/report.html")
    p.add_argument("run_dir")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("traps", parents=[common], help="correlation traps per weight matrix (weights only)")
    p.add_argument("path", help="a run directory, one checkpoint, or a folder of safetensors shards")
    p.add_argument("--mode", choices=["robust", "weightwatcher"], default="robust")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--n-shuffles", type=_at_least_one, default=1, help="shuffles per matrix, reported with their spread (default 1)"
    )
    p.add_argument("--jsd", action="store_true", help="also run the trap-replacement JSD ablation")
    p.add_argument("--workers", type=_at_least_one, default=2, help="processes (default 2)")
    p.add_argument("--executor", choices=["local", "ray"], default="local")
    p.set_defaults(func=cmd_traps)

    p = sub.add_parser(
        "sweep",
        parents=[common],
        help="seed sweep: MPSP (layers x heads x r x ...) or modadd (weight decay x train fraction x dtype), packed into ensembles",
    )
    spec = dict(_spec_flags())
    p.add_argument(
        "--task",
        choices=list(spec["task"].choices),
        default=spec["task"].default,
        help="mpsp (default): layers x heads x r x ...; modadd: weight decay x train fraction x dtype",
    )
    for flag, kind, grid in (("layers", int, "1,2"), ("heads", int, "1,2")):  # the sweep's own grid defaults
        p.add_argument(
            f"--{flag}",
            type=_list(kind),
            default=None,
            help=f"mpsp: comma list, each in {spec[flag].range_text()} (default {grid})",
        )
    p.add_argument(
        "--ratios",
        type=_list(float),
        default=None,
        help=f"mpsp: comma list of r, each in {spec['ratio'].range_text()} (default 0.5,0.9)",
    )
    p.add_argument("--seeds", type=_seeds, default=list(range(8)), help="0-31 or 0,3,5 (default 0-7)")
    for flag in ("weight_decay", "train_frac", "seq_len", "n_values", "lr"):  # axes: comma lists
        p.add_argument(
            "--" + flag.replace("_", "-"),
            type=_list(_flag_kind(spec[flag])),
            default=None,
            help=_flag_help(spec[flag], listed=True),
        )
    p.add_argument(
        "--batch-size",
        type=_list(_batch_size),
        default=None,
        help=_flag_help(spec["batch_size"], listed=True).replace("0 =", "full (or 0) ="),
    )
    p.add_argument(
        "--eval-schedule", choices=list(spec["eval_schedule"].choices), default=None, help=_flag_help(spec["eval_schedule"])
    )
    for flag in ("p", *(f for f in SWEEP_SETTINGS if f not in ("dtype", "eval_schedule"))):  # those two: above/below
        p.add_argument("--" + flag.replace("_", "-"), type=_flag_kind(spec[flag]), default=None, help=_flag_help(spec[flag]))
    p.add_argument(
        "--dtype", type=_list(_dtype), default=None, help=_flag_help(spec["dtype"]) + "; modadd: a comma list is an axis"
    )
    p.add_argument("--out", required=True, help="sweep folder: OUT/sweep.json, OUT/<cell>/seed_<s>/, OUT/results.*")
    p.add_argument("--executor", choices=["local", "ray"], default="local")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="ensembles trained at once (local processes or Ray tasks; default: one per core on CPU, 1 on CUDA)",
    )
    p.add_argument(
        "--ensemble-size", type=int, default=None, help="members per stacked ensemble (default: training.ensemble.SWEEP_ENSEMBLE)"
    )
    p.add_argument("--device", default=None, help="cpu | cuda (default: cuda when available)")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("demo", parents=[common], help="the main job on defaults: train a 2L MPSP model at r=0.9")
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The ``lenslab`` command: parse, run, print; returns the exit code (2 for bad input, one line on stderr)."""
    warnings.filterwarnings("ignore", message=".*HookedTransformer is deprecated.*")
    parser = build_parser()
    a = parser.parse_args(argv)
    from lenslab.tasks.errors import LenslabError
    from lenslab.training.trainer import Interrupted

    try:
        from lenslab.training.runio import refuse_pickle_inputs

        refuse_pickle_inputs(*(getattr(a, k, None) for k in ("run_dir", "path", "out", "init_from")))  # never unpickle an input
        result = a.func(a)
    except (LenslabError, UserError) as e:
        print("lenslab: error: " + " ".join(str(e).splitlines()), file=sys.stderr)  # one line, always
        return 2
    except MemoryError:
        print("lenslab: error: out of memory: the request is too large for this machine; lower the sizes", file=sys.stderr)
        return 2
    except Interrupted as e:
        print(f"lenslab: {e}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("lenslab: interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        print(f"lenslab: error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
