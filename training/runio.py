"""The run directory: atomic writes, safetensors checkpoints, config checks, a writer lock.

Layout (the contract every tool reads; see ``../shared/DESIGN.md``)::

    RUN/config.json          {"format", "lenslab_version", "task", "model", "train"}
    RUN/splits.safetensors   <split>_tokens / _labels / _shortcut (int64)
    RUN/checkpoints/<epoch>.safetensors   model state_dict (plain HookedTransformer keys)
    RUN/checkpoints/resume.safetensors    model + AdamW state of the last evaluation
    RUN/metrics.jsonl        one JSON object per evaluation
    RUN/summary.json         generalized?, first epoch at 100 % adv accuracy, final metrics

Nothing here unpickles: checkpoints and splits are safetensors, configs are JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from training.errors import ConfigError, RunError

RUN_FORMAT = "lenslab-run/1"
CKPT_FORMAT = "lenslab-checkpoint/1"
RESUME_FORMAT = "lenslab-resume/1"
CKPT_RE = re.compile(r"^(\d+)\.safetensors$")
PICKLE_SUFFIXES = {".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt"}
MAX_CONFIG_BYTES = 1 << 20


# -- atomic writes ---------------------------------------------------------------------
def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file + fsync + rename: readers see old or new, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.fchmod(fd, 0o644)  # mkstemp creates 0600; run files are meant to be shared
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def atomic_save_safetensors(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.fchmod(fd, 0o644)
    os.close(fd)
    try:
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, tmp, metadata=metadata)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def append_jsonl(path: str | Path, obj: dict) -> None:
    """Append one JSON line and fsync. A torn last line is dropped by ``read_jsonl``."""
    line = json.dumps(obj, allow_nan=True) + "\n"
    with open(path, "ab") as f:
        f.write(line.encode())
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | Path) -> list[dict]:
    """All complete JSON lines; an incomplete final line (a killed writer) is ignored."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # torn final line: no trailing newline was written
                break
            raise RunError(f"{path}: line {i + 1} is not valid JSON; the file is corrupted") from None
    return rows


def rewrite_jsonl(path: str | Path, rows: list[dict]) -> None:
    atomic_write_bytes(path, "".join(json.dumps(r, allow_nan=True) + "\n" for r in rows).encode())


# -- safetensors reading with clear errors ---------------------------------------------
def _refuse_pickle(path: Path) -> None:
    if path.suffix.lower() in PICKLE_SUFFIXES:
        raise RunError(
            f"{path}: refusing to load a {path.suffix} (pickle) file: unpickling can run arbitrary code. "
            "If you trust it, convert it once with: python -c \"import torch, safetensors.torch as st; "
            f"st.save_file(torch.load('{path.name}', weights_only=True), '{path.stem}.safetensors')\""
        )
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise RunError(f"{path}: cannot read ({e.strerror})") from None
    if head[:2] == b"PK" or head[:1] == b"\x80":
        raise RunError(
            f"{path}: this is a pickle/zip (torch.save) file, not safetensors; lenslab never unpickles. "
            "Convert a trusted file with safetensors.torch.save_file(torch.load(path, weights_only=True), new_path)"
        )


def read_safetensors(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata of a safetensors file; any corruption becomes one ``RunError`` line."""
    path = Path(path)
    if not path.is_file():
        raise RunError(f"{path}: no such file")
    _refuse_pickle(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = dict(f.metadata() or {})
        tensors = load_file(str(path))
    except Exception as e:  # safetensors raises several types for truncated/garbled files
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise RunError(f"{path}: not a readable safetensors file ({msg})") from None
    return tensors, metadata


# -- config ----------------------------------------------------------------------------
MODEL_LIMITS = {  # generous bounds, checked before anything is allocated
    "n_layers": (1, 64),
    "d_model": (1, 8192),
    "n_heads": (1, 128),
    "d_head": (1, 8192),
    "d_mlp": (1, 65536),
    "d_vocab": (2, 1 << 20),
    "d_vocab_out": (2, 1 << 20),
    "n_ctx": (1, 1 << 16),
}
MODEL_KEYS = set(MODEL_LIMITS) | {
    "act_fn",
    "normalization_type",
    "positional_embedding_type",
    "attn_only",
    "default_prepend_bos",
}


def check_model_kwargs(model: Any, where: str = "config.json") -> dict:
    """Validate the ``"model"`` block before building anything (no huge allocations)."""
    if not isinstance(model, dict):
        raise ConfigError(f"{where}: 'model' must be an object of HookedTransformerConfig fields")
    unknown = set(model) - MODEL_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown model field(s) {sorted(unknown)}; allowed: {sorted(MODEL_KEYS)}")
    for key, (lo, hi) in MODEL_LIMITS.items():
        if key not in model:
            raise ConfigError(f"{where}: model field {key!r} is missing")
        v = model[key]
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ConfigError(f"{where}: model.{key}={v!r} must be an integer in [{lo}, {hi}]")
    n_params = model["n_layers"] * (4 * model["d_model"] * model["n_heads"] * model["d_head"] + 2 * model["d_model"] * model["d_mlp"])
    if n_params > 2e9:
        raise ConfigError(f"{where}: the model would have ~{n_params:.2e} parameters; refusing to allocate it")
    if model.get("act_fn", "relu") not in {"relu", "gelu", "gelu_new", "silu", "solu_ln"}:
        raise ConfigError(f"{where}: model.act_fn={model.get('act_fn')!r} is not supported")
    if model.get("normalization_type") not in {None, "LN", "LNPre"}:
        raise ConfigError(f"{where}: model.normalization_type={model.get('normalization_type')!r} must be null, 'LN' or 'LNPre'")
    return model


def model_hash(model: dict) -> str:
    return hashlib.sha256(json.dumps(model, sort_keys=True).encode()).hexdigest()[:16]


def read_config(run_dir: str | Path) -> dict:
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise RunError(f"{run_dir}: not a lenslab run directory (no config.json)")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise RunError(f"{path}: {path.stat().st_size:,} bytes is too large for a config")
    try:
        cfg = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise RunError(f"{path}: expected a JSON object")
    for key in ("task", "model", "train"):
        if not isinstance(cfg.get(key), dict):
            raise RunError(f"{path}: missing or malformed {key!r} block")
    if cfg.get("format") != RUN_FORMAT:
        raise RunError(f"{path}: format {cfg.get('format')!r} is not {RUN_FORMAT!r}; not a lenslab run")
    check_model_kwargs(cfg["model"], str(path))
    return cfg


# -- checkpoints -----------------------------------------------------------------------
def checkpoint_path(run_dir: str | Path, epoch: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"{epoch}.safetensors"


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """``(epoch, path)`` of every model checkpoint, in epoch order (resume state excluded)."""
    d = Path(run_dir) / "checkpoints"
    if not d.is_dir():
        return []
    found = []
    for p in d.iterdir():
        m = CKPT_RE.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return sorted(found)


def save_checkpoint(run_dir: str | Path, epoch: int, model: torch.nn.Module, model_kwargs: dict) -> Path:
    path = checkpoint_path(run_dir, epoch)
    meta = {"format": CKPT_FORMAT, "epoch": str(epoch), "model_hash": model_hash(model_kwargs)}
    atomic_save_safetensors(path, model.state_dict(), meta)
    return path


def check_state_dict(state: dict[str, torch.Tensor], model: torch.nn.Module, where: str) -> None:
    """Same keys, shapes and dtypes as ``model``, and finite values; else one clear line."""
    expected = model.state_dict()
    params = {name for name, _ in model.named_parameters()}
    missing = sorted(set(expected) - set(state))
    extra = sorted(set(state) - set(expected))
    if missing or extra:
        raise RunError(
            f"{where}: checkpoint does not match this run's model config "
            f"(missing {missing[:3]}{'...' if len(missing) > 3 else ''}, unexpected {extra[:3]}{'...' if len(extra) > 3 else ''})"
        )
    for k, v in expected.items():
        if tuple(state[k].shape) != tuple(v.shape):
            raise RunError(f"{where}: {k} has shape {tuple(state[k].shape)}, the config expects {tuple(v.shape)}: a checkpoint from a different config")
        if state[k].dtype != v.dtype:
            raise RunError(f"{where}: {k} has dtype {state[k].dtype}, expected {v.dtype}")
        if k in params and not torch.isfinite(state[k]).all():
            raise RunError(f"{where}: {k} contains NaN or inf")


def load_checkpoint_into(model: torch.nn.Module, path: str | Path, model_kwargs: dict | None = None) -> dict[str, str]:
    """Load a model checkpoint into ``model`` after checking it; returns its metadata."""
    tensors, meta = read_safetensors(path)
    if meta.get("format") not in (CKPT_FORMAT, None) and meta.get("format") != RESUME_FORMAT:
        raise RunError(f"{path}: format {meta.get('format')!r} is not a lenslab checkpoint")
    if meta.get("format") == RESUME_FORMAT:
        tensors = {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
    if model_kwargs is not None and meta.get("model_hash") not in (None, model_hash(model_kwargs)):
        raise RunError(f"{path}: checkpoint was written for a different model config (hash {meta['model_hash']} != {model_hash(model_kwargs)})")
    check_state_dict(tensors, model, str(path))
    model.load_state_dict(tensors, strict=True)
    return meta


# -- splits ----------------------------------------------------------------------------
def save_splits(run_dir: str | Path, splits: dict[str, torch.Tensor]) -> None:
    atomic_save_safetensors(Path(run_dir) / "splits.safetensors", splits, {"format": "lenslab-splits/1"})


def load_splits(run_dir: str | Path, n_ctx: int | None = None, d_vocab: int | None = None) -> dict[str, torch.Tensor]:
    path = Path(run_dir) / "splits.safetensors"
    tensors, _ = read_safetensors(path)
    for name, t in tensors.items():
        if t.dtype != torch.int64:
            raise RunError(f"{path}: {name} has dtype {t.dtype}, expected int64")
        if name.endswith("_tokens"):
            if t.ndim != 2 or (n_ctx is not None and t.shape[1] != n_ctx):
                raise RunError(f"{path}: {name} has shape {tuple(t.shape)}, expected [n, {n_ctx}]")
            if d_vocab is not None and t.numel() and (t.min() < 0 or t.max() >= d_vocab):
                raise RunError(f"{path}: {name} holds token ids outside [0, {d_vocab})")
    for name in [n for n in tensors if n.endswith("_tokens")]:
        split = name[: -len("_tokens")]
        if f"{split}_labels" not in tensors or tensors[f"{split}_labels"].shape[0] != tensors[name].shape[0]:
            raise RunError(f"{path}: {split}_labels is missing or has the wrong length")
    return tensors


# -- the writer lock -------------------------------------------------------------------
def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    """An exclusive lock file ``RUN/.lock`` holding ``host pid``; a dead owner's lock is recovered."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / ".lock"
        self.held = False

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = f"{socket.gethostname()} {os.getpid()}\n"
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                owner = self.path.read_text(errors="replace").split() if self.path.exists() else []
                host, pid = (owner + ["", ""])[:2]
                if host == socket.gethostname() and pid.isdigit() and not _pid_alive(int(pid)):
                    self.path.unlink(missing_ok=True)  # stale: its process is gone
                    continue
                if not pid:
                    self.path.unlink(missing_ok=True)  # empty lock from a writer killed mid-create
                    continue
                raise RunError(
                    f"{self.path.parent}: another lenslab process (pid {pid} on {host or '?'}) is writing this run; "
                    f"wait for it, or delete {self.path} if you are sure it is dead"
                ) from None
            with os.fdopen(fd, "w") as f:
                f.write(me)
                f.flush()
                os.fsync(f.fileno())
            self.held = True
            return self
        raise RunError(f"{self.path}: could not take the run lock")

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
