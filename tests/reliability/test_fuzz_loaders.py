"""Fuzzed run files: corrupted, truncated, oversized-header, wrong-dtype/shape safetensors; configs
with missing, extra and absurd fields; garbled metrics. Every case loads or is one clean
``LenslabError`` line, and none allocates much memory (peak RSS measured around each case).
"""

from __future__ import annotations

import json
import math
import random
import shutil
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parents[1] / "training"))
from helpers import tiny_config

from lenslab.interp.spectral import traps_command
from lenslab.tasks.errors import LenslabError
from lenslab.training.presets import build_model
from lenslab.training.run import Run
from lenslab.training.runio import (
    load_checkpoint_into,
    load_splits,
    read_config,
    read_jsonl,
    read_safetensors,
)
from lenslab.training.spec import MAX_MODEL_BYTES, model_bytes
from lenslab.training.trainer import train

FUZZ = settings(max_examples=40, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
MEMORY_SLACK = 256 << 20  # a case may not raise the peak RSS by more than this


def _hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) << 10
    return 0


class bounded_memory:
    """Reset the peak RSS (Linux ``clear_refs``), run the block, check the peak rose by < ``MEMORY_SLACK``."""

    def __enter__(self):
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.base = _hwm()
        except OSError:
            self.base = None
        return self

    def __exit__(self, *exc):
        if self.base is not None:
            grew = _hwm() - self.base
            assert grew < MEMORY_SLACK, f"peak memory rose by {grew / 2**20:.0f} MiB"


def clean(call):
    """``call()`` returns normally or raises a one-line LenslabError; anything else fails the test."""
    try:
        with bounded_memory():
            return call()
    except LenslabError as e:
        assert "\n" not in str(e), str(e)
        return e


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A tiny MPSP run (splits with all four splits, shortcut labels, gradient probes)."""
    d = tmp_path_factory.mktemp("fuzzrun") / "run"
    train(tiny_config(epochs=1, eval_every=1, grad_probe_size=8), d, progress=False)
    return d


# -- safetensors -----------------------------------------------------------------------
def _header(data: bytes) -> tuple[int, dict]:
    n = int.from_bytes(data[:8], "little")
    return n, json.loads(data[8 : 8 + n])


def _with_header(data: bytes, header: dict, n: int) -> bytes:
    text = json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + data[8 + n :]


ABSURD = [None, True, -1, 0, 3, 10**9, 2**64, 1e308, math.nan, "x", "", [], {}, [1, 2], [10**12, 10**12], {"a": 1}]
DTYPES = ["F32", "F16", "BF16", "F64", "I64", "I32", "I8", "U8", "BOOL", "XX", 7]


@st.composite
def mutated(draw, data: bytes) -> bytes:
    """A mutation of a safetensors file: bytes (cut, flip, splice, length field) or its header (dtype, shape, offsets, keys)."""
    kind = draw(
        st.sampled_from(["truncate", "flip", "length", "dtype", "shape", "offsets", "drop", "extra", "metadata", "garbage"])
    )
    n, header = _header(data)
    names = sorted(k for k in header if k != "__metadata__")
    name = draw(st.sampled_from(names))
    if kind == "truncate":
        return data[: draw(st.integers(0, len(data) - 1))]
    if kind == "flip":
        out = bytearray(data)
        for _ in range(draw(st.integers(1, 8))):
            out[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return bytes(out)
    if kind == "length":
        value = draw(st.sampled_from([0, 1, n - 1, n + 1, len(data), 2**31, 2**63, 2**64 - 1]))
        return value.to_bytes(8, "little") + data[8:]
    if kind == "garbage":
        return draw(st.binary(min_size=0, max_size=64)) + data[draw(st.integers(0, 16)) :]
    header = json.loads(json.dumps(header))
    if kind == "dtype":
        header[name]["dtype"] = draw(st.sampled_from(DTYPES))
    elif kind == "shape":
        header[name]["shape"] = draw(st.sampled_from(ABSURD + [[0], [1, 1, 1], [10**6, 10**6], [-1]]))
    elif kind == "offsets":
        header[name]["data_offsets"] = draw(st.sampled_from(ABSURD + [[0, 0], [0, 2**40], [8, 4]]))
    elif kind == "drop":
        del header[name]
    elif kind == "extra":
        header[draw(st.text(min_size=1, max_size=12))] = {
            "dtype": draw(st.sampled_from(DTYPES)),
            "shape": [2, 2],
            "data_offsets": [0, 16],
        }
    elif kind == "metadata":
        header["__metadata__"] = draw(
            st.sampled_from([{"format": "other"}, {"model_hash": "0" * 16}, {"epoch": "x"}, {"format": 3}, [], "x"])
        )
    return _with_header(data, header, n)


def test_fuzzed_checkpoints_load_or_fail_cleanly(run_dir, tmp_path_factory):
    cfg = Run.open(run_dir).config
    data = (run_dir / "checkpoints" / "1.safetensors").read_bytes()
    model = build_model(cfg["model"], seed=0)
    work = tmp_path_factory.mktemp("ckpt")

    @FUZZ
    @given(mutated(data))
    def check(blob):
        path = work / "1.safetensors"
        path.write_bytes(blob)
        clean(lambda: read_safetensors(path))
        result = clean(lambda: load_checkpoint_into(model, path, cfg["model"]))
        if not isinstance(result, LenslabError):  # it loaded: then it is a valid, finite model of this config
            assert all(torch.isfinite(p).all() for p in model.parameters())

    check()


def test_fuzzed_splits_load_or_fail_cleanly(run_dir, tmp_path_factory):
    m = Run.open(run_dir).config["model"]
    data = (run_dir / "splits.safetensors").read_bytes()
    work = tmp_path_factory.mktemp("splits")

    @FUZZ
    @given(mutated(data))
    def check(blob):
        (work / "splits.safetensors").write_bytes(blob)
        result = clean(lambda: load_splits(work, n_ctx=m["n_ctx"], d_vocab=m["d_vocab"], n_classes=m["d_vocab_out"]))
        if not isinstance(result, LenslabError):
            assert all(t.dtype == torch.int64 for t in result.values())
            assert result["train_tokens"].shape[1] == m["n_ctx"] and int(result["train_tokens"].max()) < m["d_vocab"]

    check()


def test_fuzzed_shard_folders_give_errors_per_file_or_matrix(run_dir, tmp_path_factory):
    """``lenslab traps`` on a folder of shards (interp.spectral's adapter): SpectralError or error rows, nothing else."""
    data = (run_dir / "checkpoints" / "1.safetensors").read_bytes()
    work = tmp_path_factory.mktemp("shards")
    (work / "a.safetensors").write_bytes(data)

    @settings(FUZZ, max_examples=20)
    @given(mutated(data))
    def check(blob):
        (work / "b.safetensors").write_bytes(blob)
        result = clean(lambda: traps_command(work, workers=1, progress=False))
        if not isinstance(result, LenslabError):
            assert all("error" in r for c in result["checkpoints"] for r in c["matrices"])

    check()


# -- configs ---------------------------------------------------------------------------
def _paths(cfg: dict) -> list[tuple]:
    return [(k,) for k in cfg] + [(b, k) for b in ("task", "model", "train") for k in cfg[b]]


@st.composite
def config_edits(draw, cfg: dict):
    edits = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["del", "set", "add"]))
        path = draw(st.sampled_from(_paths(cfg)))
        if kind == "add":
            path = (*path[:-1], draw(st.text(min_size=1, max_size=10)))
        edits.append((kind, path, draw(st.sampled_from(ABSURD + [-(10**9)]))))
    return edits


def _apply(cfg: dict, edits) -> dict:
    cfg = json.loads(json.dumps(cfg))
    for kind, path, value in edits:
        node = cfg
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue
        if kind == "del":
            node.pop(path[-1], None)
        else:
            node[path[-1]] = value
    return cfg


def test_fuzzed_configs_are_checked_before_anything_is_built(run_dir, tmp_path_factory):
    good = json.loads((run_dir / "config.json").read_text())
    work = tmp_path_factory.mktemp("configs") / "run"
    shutil.copytree(run_dir, work)

    @FUZZ
    @given(config_edits(good))
    def check(edits):
        (work / "config.json").write_text(json.dumps(_apply(good, edits)))
        cfg = clean(lambda: read_config(work))
        if isinstance(cfg, LenslabError):
            return
        run = Run.open(work)
        clean(lambda: run.task)
        clean(lambda: run.model())
        clean(lambda: run.splits)

    check()


@pytest.mark.parametrize(
    "edit,needle",
    [
        ({"d_model": 10**9}, "d_model=1000000000"),
        ({"d_model": 8192, "d_mlp": 65536, "n_layers": 64}, "GiB"),  # each field in bounds, the whole too big
        ({"d_vocab": 1 << 20, "d_model": 8192, "d_vocab_out": 1 << 20}, "GiB"),  # embeddings count
        ({"n_ctx": 1 << 16, "n_layers": 8}, "GiB"),  # 8 causal masks of 4 GiB each
        ({"positional_embedding_type": "rotary"}, "positional_embedding_type"),
        ({"attn_only": 1}, "attn_only"),
    ],
)
def test_absurd_models_are_refused_without_allocating(run_dir, tmp_path, edit, needle):
    cfg = json.loads((run_dir / "config.json").read_text())
    cfg["model"].update(edit)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    err = clean(lambda: read_config(tmp_path))
    assert isinstance(err, LenslabError) and needle in str(err)


def test_model_bytes_bounds_what_transformer_lens_allocates():
    """The size check is an upper bound (within 2x) of the bytes a built model holds, weights and buffers."""
    rng = random.Random(0)
    for _ in range(12):
        m = {
            "n_layers": rng.randint(1, 3),
            "d_model": rng.choice([4, 8, 32]),
            "n_heads": rng.randint(1, 4),
            "d_head": rng.choice([2, 8]),
            "d_mlp": rng.choice([4, 64]),
            "d_vocab": rng.randint(2, 64),
            "d_vocab_out": rng.randint(2, 64),
            "n_ctx": rng.randint(1, 64),
            "act_fn": "relu",
            "normalization_type": rng.choice([None, "LN", "LNPre"]),
            "attn_only": rng.choice([False, True]),
            "positional_embedding_type": rng.choice(["standard", "shortformer"]),
        }
        held = sum(t.numel() * t.element_size() for t in build_model(m, seed=0).state_dict().values())
        assert held <= model_bytes(m) <= 2 * held, m
    assert MAX_MODEL_BYTES >= model_bytes(
        {**m, "d_model": 512, "d_mlp": 2048, "n_layers": 12, "d_head": 64, "n_heads": 8, "d_vocab": 50257, "n_ctx": 1024}
    )


@pytest.mark.parametrize(
    "text",
    [
        "[" * 200_000 + "]" * 200_000,  # nesting deeper than the recursion limit
        '{"format": "lenslab-run/1", "model": {"d_model": 1' + "0" * 6000 + "}}",  # more digits than int() takes
        b"\xff\xfe{}".decode("latin-1"),  # not UTF-8
        "",
        "{" * 10,
        "NaN",
        json.dumps({"format": "lenslab-run/1", "task": {}, "model": {}, "train": {}, "extra": 1}),
    ],
    ids=["deep", "digits", "not-utf8", "empty", "open-braces", "nan", "extra-top-level"],
)
def test_hostile_config_text_is_one_clean_error(tmp_path, text):
    (tmp_path / "config.json").write_bytes(text.encode("latin-1"))
    err = clean(lambda: read_config(tmp_path))
    assert isinstance(err, LenslabError) and str(tmp_path) in str(err)


def test_oversized_config_is_refused_unread(tmp_path):
    with open(tmp_path / "config.json", "wb") as f:
        f.truncate(10 << 30)  # 10 GiB, sparse
    err = clean(lambda: read_config(tmp_path))
    assert isinstance(err, LenslabError) and "too large" in str(err)


# -- metrics ---------------------------------------------------------------------------
def test_fuzzed_metrics_give_rows_or_one_error(run_dir, tmp_path_factory):
    data = (run_dir / "metrics.jsonl").read_bytes()
    good = read_jsonl(run_dir / "metrics.jsonl")
    work = tmp_path_factory.mktemp("metrics") / "metrics.jsonl"

    @FUZZ
    @given(st.integers(0, len(data)), st.binary(max_size=24), st.integers(0, 24))
    def check(at, insert, cut):
        work.write_bytes(data[:at] + insert + data[at + cut :])
        rows = clean(lambda: read_jsonl(work))
        if not isinstance(rows, LenslabError):
            assert all(isinstance(r, dict) and isinstance(r["epoch"], int) for r in rows)
        if not insert and not cut:  # untouched
            assert rows == good
        if at < len(data) and not insert and cut and data[at + cut :].count(b"\n") == 0:  # only the tail cut: a torn last line
            assert isinstance(rows, list) and rows == good[: len(rows)]

    check()


@pytest.mark.parametrize(
    "edit,needle",
    [
        (lambda s: s.update(train_labels=s["train_labels"][:-1]), "train_labels has shape"),
        (lambda s: s.update(adv_shortcut=s["adv_shortcut"][:3]), "adv_shortcut has shape"),
        (lambda s: s.update(train_tokens=s["train_tokens"][:, :-1]), "train_tokens has shape"),
        (lambda s: s.update(train_tokens=s["train_tokens"].int()), "dtype I32"),
        (lambda s: s.update(validation_labels=s["validation_labels"] + 1000), "outside [0,"),
        (lambda s: s.update(train_tokens=-s["train_tokens"]), "outside [0,"),
        (lambda s: s.pop("train_tokens"), "train_tokens has shape None"),
        (lambda s: s.update(extra=torch.zeros(2, dtype=torch.int64)), "unexpected tensor 'extra'"),
    ],
)
def test_consistent_but_wrong_splits_are_refused(run_dir, tmp_path, edit, needle):
    """Well-formed safetensors whose splits do not fit the run (what byte mutations rarely reach)."""
    from safetensors.torch import save_file

    m = Run.open(run_dir).config["model"]
    splits, _ = read_safetensors(run_dir / "splits.safetensors")
    edit(splits)
    save_file({k: v.contiguous() for k, v in splits.items()}, tmp_path / "splits.safetensors")
    err = clean(lambda: load_splits(tmp_path, n_ctx=m["n_ctx"], d_vocab=m["d_vocab"], n_classes=m["d_vocab_out"]))
    assert isinstance(err, LenslabError) and needle in str(err), err
