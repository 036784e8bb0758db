"""The run directory: atomic writes, safetensors checkpoints, config checks, a writer lock.

Layout (the contract every tool reads; the README's "Run directory" section)::

    RUN/config.json          {"format", "lenslab_version", "task", "model", "train"[, "init"]}
    RUN/splits.safetensors   <split>_tokens / _labels / _shortcut (int64)
    RUN/checkpoints/<epoch>.safetensors   model state_dict (plain HookedTransformer keys)
    RUN/checkpoints/resume.safetensors    model + AdamW state of the last evaluation
    RUN/metrics.jsonl        one JSON object per evaluation
    RUN/summary.json         generalized?, first epoch at 100 % adv accuracy, final metrics, environment

Nothing here unpickles: checkpoints and splits are safetensors, configs are JSON checked
against a schema (``check_config``, from ``training.spec``), and a pickle given in their place is refused (``refuse_pickle``).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import platform
import re
import socket
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save

from lenslab.training.errors import RunError
from lenslab.training.spec import check_config

CKPT_FORMAT = "lenslab-checkpoint/1"
RESUME_FORMAT = "lenslab-resume/1"
CKPT_RE = re.compile(r"^(\d+)\.safetensors$")
PICKLE_SUFFIXES = {".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt"}
MAX_CONFIG_BYTES = 1 << 20
TMP_SUFFIX = ".tmp"


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
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
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
    """Write ``obj`` as indented JSON to ``path`` atomically (a temporary file, then a rename)."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def canonical_safetensors(data: bytes) -> bytes:
    """The same safetensors file with its JSON header's keys sorted.

    safetensors writes its header from a Rust HashMap whose order changes from process to
    process, so two identical checkpoints differ in bytes; sorted, they are bitwise equal.
    Data offsets are relative to the end of the header, so only the header is rewritten.
    """
    n = int.from_bytes(data[:8], "little")
    header = json.dumps(json.loads(data[8 : 8 + n]), sort_keys=True, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)  # safetensors aligns the data to 8 bytes
    return len(header).to_bytes(8, "little") + header + data[8 + n :]


def atomic_save_safetensors(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """Atomically write ``tensors`` as a safetensors file with reproducible bytes."""
    data = save({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, metadata=metadata)
    atomic_write_bytes(path, canonical_safetensors(data))


def append_jsonl(path: str | Path, obj: dict) -> None:
    """Append one JSON line and fsync. A torn last line is dropped by ``read_jsonl``."""
    line = json.dumps(obj, allow_nan=True) + "\n"
    with open(path, "ab") as f:
        f.write(line.encode())
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | Path) -> list[dict]:
    """The metrics rows of ``path``: complete JSON objects with an integer ``epoch``.

    An incomplete final line (a writer killed mid-append) is ignored; a bad line anywhere else
    is one ``RunError``.
    """
    path = Path(path)
    if not path.exists():
        return []
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise RunError(f"{path}: cannot read ({e.strerror})") from None
    rows = []
    lines = raw.split(b"\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):  # bad JSON or UTF-8, too many digits, too deep
            if i == len(lines) - 1:  # torn final line: no trailing newline was written
                break
            raise RunError(f"{path}: line {i + 1} is not valid JSON; the file is corrupted") from None
        epoch = row.get("epoch") if isinstance(row, dict) else None
        if isinstance(epoch, bool) or not isinstance(epoch, int):
            raise RunError(f"{path}: line {i + 1} is not a metrics row (a JSON object with an integer 'epoch')")
        rows.append(row)
    return rows


def read_summary(run_dir: str | Path, strict: bool = True) -> dict | None:
    """``RUN/summary.json`` (the one reader of it): None when the run has none yet.

    ``strict``: a file that is not valid JSON is one ``RunError``. Not strict (progress polls, tables
    over many members, a resume): an unreadable, invalid or non-object summary reads as None.
    """
    path = Path(run_dir) / "summary.json"
    if not strict:
        try:
            s = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return s if isinstance(s, dict) else None
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise RunError(f"{path}: not valid JSON ({e})") from None


def rewrite_jsonl(path: str | Path, rows: list[dict]) -> None:
    """Replace ``path`` atomically with ``rows``, one JSON object per line (NaN allowed)."""
    atomic_write_bytes(path, "".join(json.dumps(r, allow_nan=True) + "\n" for r in rows).encode())


def read_json(path: str | Path, what: str = "JSON file", max_bytes: int = MAX_CONFIG_BYTES) -> Any:
    """A small JSON document; unreadable, oversized, non-UTF-8 or malformed input is one ``RunError``."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise RunError(f"{path}: {size:,} bytes is too large for a {what}")
        return json.loads(path.read_bytes())
    except OSError as e:
        raise RunError(f"{path}: cannot read ({e.strerror})") from None
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, int-digit limit, nesting
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise RunError(f"{path}: not a valid {what} ({msg})") from None


# -- refusing pickles ------------------------------------------------------------------
def _convert_hint(path: Path) -> str:
    return (
        'if you trust it, convert it once with: python -c "import torch, safetensors.torch as st; '
        f"st.save_file(torch.load('{path.name}', weights_only=True), '{path.stem}.safetensors')\""
    )


def _looks_like_pickle(path: Path) -> bool:
    """A torch.save zip or a raw pickle, and not a plausible safetensors file.

    A safetensors file starts with its header length (u64, little endian) and then ``{``; its
    first byte can be 0x80 (a pickle's first byte) too, so the ``{`` at offset 8 decides.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(9)
        size = path.stat().st_size
    except OSError as e:
        raise RunError(f"{path}: cannot read ({e.strerror})") from None
    if len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") <= size - 8:
        return False
    return head[:4] == b"PK\x03\x04" or (len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5)


def refuse_pickle(path: str | Path) -> None:
    """Raise a ``RunError`` saying why and how to convert, if ``path`` is a pickle (by name or content)."""
    path = Path(path)
    if path.suffix.lower() in PICKLE_SUFFIXES:
        raise RunError(
            f"{path}: refusing to load a {path.suffix} (pickle) file: unpickling can run arbitrary code; {_convert_hint(path)}"
        )
    if path.is_file() and _looks_like_pickle(path):
        raise RunError(
            f"{path}: this is a pickle/zip (torch.save) file, not safetensors; lenslab never unpickles; {_convert_hint(path)}"
        )


def refuse_pickle_inputs(*paths: str | Path | None) -> None:
    """The CLI's guard: any pickle file given as an input, or a weights folder that holds only pickles, is refused."""
    for p in paths:
        if p is None:
            continue
        p = Path(p)
        if p.is_file():
            refuse_pickle(p)
        elif p.is_dir() and not any(p.glob("*.safetensors")):  # a run has splits.safetensors
            pickles = sorted(q for q in p.iterdir() if q.suffix.lower() in PICKLE_SUFFIXES and q.is_file())
            if pickles:
                raise RunError(
                    f"{p}: holds only pickle weights ({pickles[0].name}{', ...' if len(pickles) > 1 else ''}) and no safetensors; "
                    f"lenslab never unpickles (it can run arbitrary code); {_convert_hint(pickles[0])}"
                )


# -- safetensors reading with clear errors ---------------------------------------------
DTYPE_NAMES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
Layout = dict[str, tuple[str, tuple[int, ...]]]  # tensor name -> (safetensors dtype, shape)


def _unreadable(path: Path, e: Exception) -> RunError:
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    return RunError(f"{path}: not a readable safetensors file ({msg})")


def read_header(path: str | Path) -> tuple[Layout, dict[str, str]]:
    """Names, dtypes and shapes (no tensor data is read) and the metadata of a safetensors file."""
    path = Path(path)
    if not path.is_file():
        raise RunError(f"{path}: no such file")
    refuse_pickle(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            layout = {k: (f.get_slice(k).get_dtype(), tuple(f.get_slice(k).get_shape())) for k in f.keys()}  # noqa: SIM118
            metadata = dict(f.metadata() or {})
    except Exception as e:  # noqa: BLE001 (safetensors raises several types for truncated/garbled files)
        raise _unreadable(path, e) from None
    return layout, metadata


def read_safetensors(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata of a safetensors file; any corruption becomes one ``RunError`` line."""
    path = Path(path)
    _, metadata = read_header(path)
    try:
        tensors = load_file(str(path))
    except Exception as e:  # noqa: BLE001
        raise _unreadable(path, e) from None
    return tensors, metadata


# -- config ----------------------------------------------------------------------------
# The schema (fields, bounds, choices) lives in training.spec; read_config checks against it.


def model_hash(model: dict) -> str:
    """A short, stable hash of a ``config['model']`` block (its sorted JSON)."""
    return hashlib.sha256(json.dumps(model, sort_keys=True).encode()).hexdigest()[:16]


def file_sha256(path: str | Path) -> str:
    """The sha256 hex digest of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_config(run_dir: str | Path) -> dict:
    """``RUN/config.json``, parsed and schema-checked (see ``check_config``)."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise RunError(f"{run_dir}: not a lenslab run directory (no config.json)")
    return check_config(read_json(path, "config"), str(path))


# -- checkpoints -----------------------------------------------------------------------
def checkpoint_path(run_dir: str | Path, epoch: int) -> Path:
    """Where the checkpoint of ``epoch`` lives: ``RUN/checkpoints/<epoch>.safetensors``."""
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
    """Write ``model``'s state dict as the checkpoint of ``epoch`` (atomic; safetensors, with the model's config hash)."""
    path = checkpoint_path(run_dir, epoch)
    meta = {"format": CKPT_FORMAT, "epoch": str(epoch), "model_hash": model_hash(model_kwargs)}
    atomic_save_safetensors(path, model.state_dict(), meta)
    return path


def check_layout(layout: Layout, model: torch.nn.Module, where: str) -> None:
    """Same names, shapes and dtypes as ``model``'s state dict; else one clear line."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(layout))
    extra = sorted(set(layout) - set(expected))
    if missing or extra:
        raise RunError(
            f"{where}: checkpoint does not match this run's model config "
            f"(missing {missing[:3]}{'...' if len(missing) > 3 else ''}, unexpected {extra[:3]}{'...' if len(extra) > 3 else ''})"
        )
    for k, v in expected.items():
        dtype, shape = layout[k]
        if shape != tuple(v.shape):
            raise RunError(
                f"{where}: {k} has shape {shape}, the config expects {tuple(v.shape)}: a checkpoint from a different config"
            )
        if dtype != DTYPE_NAMES.get(v.dtype):
            raise RunError(
                f"{where}: {k} has dtype {dtype}, expected {DTYPE_NAMES.get(v.dtype, v.dtype)}"
                + (
                    " (the run's config.json train.dtype); the checkpoint was written in another precision"
                    if v.dtype.is_floating_point
                    else ""
                )
            )


def check_state_dict(state: dict[str, torch.Tensor], model: torch.nn.Module, where: str) -> None:
    """Same keys, shapes and dtypes as ``model``, and finite values; else one clear line."""
    check_layout({k: (DTYPE_NAMES.get(t.dtype, str(t.dtype)), tuple(t.shape)) for k, t in state.items()}, model, where)
    for name, _ in model.named_parameters():
        if not torch.isfinite(state[name]).all():
            raise RunError(f"{where}: {name} contains NaN or inf")


def load_checkpoint_into(
    model: torch.nn.Module, path: str | Path, model_kwargs: dict | None = None, cast: bool = False
) -> dict[str, str]:
    """Load a model checkpoint into ``model`` after checking it (layout before reading any data); returns its metadata.

    The checkpoint's float tensors must have ``model``'s dtype (build the model with the run's
    ``train.dtype``); ``cast=True`` converts them instead (a run started from another run's
    weights in another precision, ``with_init``).
    """
    layout, meta = read_header(path)
    fmt = meta.get("format")
    if fmt not in (CKPT_FORMAT, RESUME_FORMAT, None):
        raise RunError(f"{path}: format {fmt!r} is not a lenslab checkpoint")
    if model_kwargs is not None and meta.get("model_hash") not in (None, model_hash(model_kwargs)):
        raise RunError(
            f"{path}: checkpoint was written for a different model config (hash {meta['model_hash']} != {model_hash(model_kwargs)})"
        )
    prefix = "model." if fmt == RESUME_FORMAT else ""
    layout = {k[len(prefix) :]: v for k, v in layout.items() if k.startswith(prefix)}
    want = {k: DTYPE_NAMES.get(v.dtype) for k, v in model.state_dict().items()}
    floats = {n for d, n in DTYPE_NAMES.items() if d.is_floating_point}
    if cast:
        layout = {
            k: (want[k] if k in want and d in floats and want[k] in floats else d, shape) for k, (d, shape) in layout.items()
        }
    check_layout(layout, model, str(path))
    tensors, _ = read_safetensors(path)
    tensors = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
    if cast:
        expected = model.state_dict()
        tensors = {k: v.to(expected[k].dtype) if v.dtype.is_floating_point else v for k, v in tensors.items()}
    check_state_dict(tensors, model, str(path))
    model.load_state_dict(tensors, strict=True)
    return meta


# -- splits ----------------------------------------------------------------------------
SPLIT_PARTS = ("tokens", "labels", "shortcut")


def save_splits(run_dir: str | Path, splits: dict[str, torch.Tensor]) -> None:
    """Write a run's splits (``<split>_tokens`` / ``_labels`` / ...) to ``RUN/splits.safetensors`` (atomic)."""
    atomic_save_safetensors(Path(run_dir) / "splits.safetensors", splits, {"format": "lenslab-splits/1"})


def _check_split_layout(path: Path, layout: Layout, n_ctx: int | None) -> None:
    """int64 ``<split>_tokens [n, n_ctx]`` with ``_labels [n]`` (and optional ``_shortcut [n]``), n >= 1, a train split."""
    splits = {}
    for name, (dtype, shape) in layout.items():
        split, _, part = name.rpartition("_")
        if not split or part not in SPLIT_PARTS:
            raise RunError(f"{path}: unexpected tensor {name!r}; a splits file holds <split>_tokens / _labels / _shortcut")
        if dtype != "I64":
            raise RunError(f"{path}: {name} has dtype {dtype}, expected I64 (int64)")
        splits.setdefault(split, {})[part] = shape
    if "train" not in splits:
        raise RunError(f"{path}: no train split (train_tokens / train_labels)")
    for split, parts in splits.items():
        tok = parts.get("tokens")
        if tok is None or len(tok) != 2 or tok[0] < 1 or (n_ctx is not None and tok[1] != n_ctx):
            raise RunError(
                f"{path}: {split}_tokens has shape {tok}, expected [n >= 1, {n_ctx if n_ctx is not None else 'n_ctx'}]"
            )
        for part in ("labels", "shortcut"):
            if (part in parts or part == "labels") and parts.get(part) != (tok[0],):
                raise RunError(
                    f"{path}: {split}_{part} has shape {parts.get(part)}, expected [{tok[0]}] (one per {split} sequence)"
                )


def load_splits(
    run_dir: str | Path, n_ctx: int | None = None, d_vocab: int | None = None, n_classes: int | None = None
) -> dict[str, torch.Tensor]:
    """The run's splits, after checking names, dtypes and shapes (before reading) and token / label ranges."""
    path = Path(run_dir) / "splits.safetensors"
    layout, _ = read_header(path)
    _check_split_layout(path, layout, n_ctx)
    tensors, _ = read_safetensors(path)
    for name, t in tensors.items():
        hi = d_vocab if name.endswith("_tokens") else n_classes
        if hi is not None and (t.min() < 0 or t.max() >= hi):
            raise RunError(f"{path}: {name} holds values outside [0, {hi}); the splits do not fit this run's model")
    return tensors


def load_image_splits(run_dir: str | Path, d_in: int, n_classes: int) -> dict[str, torch.Tensor]:
    """An image task's splits (MNIST): uint8 ``<split>_images [n, d_in]``, int64 ``_labels [n]`` in
    ``[0, n_classes)`` and ``_index [n]``, checked before any data is read."""
    path = Path(run_dir) / "splits.safetensors"
    layout, _ = read_header(path)
    splits: dict[str, dict] = {}
    for name, (dtype, shape) in layout.items():
        split, _, part = name.rpartition("_")
        want = {"images": "U8", "labels": "I64", "index": "I64"}.get(part)
        if not split or want is None:
            raise RunError(f"{path}: unexpected tensor {name!r}; an image splits file holds <split>_images / _labels / _index")
        if dtype != want:
            raise RunError(f"{path}: {name} has dtype {dtype}, expected {want}")
        splits.setdefault(split, {})[part] = shape
    if "train" not in splits:
        raise RunError(f"{path}: no train split (train_images / train_labels)")
    for split, parts in splits.items():
        img = parts.get("images")
        if img is None or len(img) != 2 or img[0] < 1 or img[1] != d_in:
            raise RunError(f"{path}: {split}_images has shape {img}, expected [n >= 1, {d_in}]")
        for part in ("labels", "index"):
            if (part in parts or part == "labels") and parts.get(part) != (img[0],):
                raise RunError(f"{path}: {split}_{part} has shape {parts.get(part)}, expected [{img[0]}]")
    tensors, _ = read_safetensors(path)
    for name, t in tensors.items():
        if name.endswith("_labels") and (t.min() < 0 or t.max() >= n_classes):
            raise RunError(f"{path}: {name} holds values outside [0, {n_classes}); the splits do not fit this run's model")
    return tensors


def load_run_splits(run_dir: str | Path, model_kwargs: dict) -> dict[str, torch.Tensor]:
    """``load_splits`` checked against the run's model: positions, token ids and label classes (MLP: image splits)."""
    m = model_kwargs
    if m.get("arch") == "mlp":
        return load_image_splits(run_dir, m["d_in"], m["d_out"])
    return load_splits(run_dir, n_ctx=m["n_ctx"], d_vocab=m["d_vocab"], n_classes=m["d_vocab_out"])


# -- where a run trained ---------------------------------------------------------------
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_environment(device: torch.device) -> dict:
    """Where a run trained: versions, CPU, torch threads and device, for ``summary.json``.

    A float trajectory is reproducible on the same machine, not across machines: another CPU
    (its SIMD kernels) or GPU can sum in another order, and a chaotic run (grokking) then drifts.
    This block lets two runs of the same config that disagree be told apart by where they ran.
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        tl_version = version("transformer_lens")
    except PackageNotFoundError:
        tl_version = None
    env = {
        "torch": torch.__version__,
        "transformer_lens": tl_version,
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
    }
    if device.type == "cuda":
        env["cuda_device"] = torch.cuda.get_device_name(device)
    return env


def carry_environment(run_dir: str | Path, env: dict, start: int) -> tuple[dict, str | None]:
    """``env`` for a run resuming at epoch ``start``, and a one-line note when it trained elsewhere.

    When the environment in the run's ``summary.json`` differs from ``env``, it is kept under
    ``env["earlier"]`` (with ``until_epoch``), so the summary says that the run changed machines
    (or threads, or library versions) and where. The note names what changed.
    """
    if start <= 0:
        return env, None
    old = (read_summary(run_dir, strict=False) or {}).get("environment")
    if not isinstance(old, dict):
        return env, None
    earlier = old.get("earlier", [])
    before = {k: v for k, v in old.items() if k != "earlier"}
    if before == env:
        return ({**env, "earlier": earlier} if earlier else env), None
    changed = ", ".join(
        f"{k} {before.get(k)!r} -> {env.get(k)!r}" for k in sorted(set(before) | set(env)) if before.get(k) != env.get(k)
    )
    note = (
        f"note: {run_dir} trained its first {start} epochs elsewhere ({changed}); "
        "from here on it may differ from a run that never moved"
    )
    return {**env, "earlier": [*earlier, {**before, "until_epoch": start}]}, note


# -- the writer lock -------------------------------------------------------------------
def is_temp_file_name(name: str) -> bool:
    """A ``.<name>.*.tmp`` file that ``atomic_write_*`` writes before its rename."""
    return name.startswith(".") and name.endswith(TMP_SUFFIX)


def remove_stale_temps(run_dir: str | Path) -> list[Path]:
    """Delete the ``.<name>.*.tmp`` files a killed writer left in ``run_dir`` and its ``checkpoints/``.

    Only safe while holding the run's lock (no other writer can own them); ``RunLock`` calls it.
    """
    removed = []
    for d in (Path(run_dir), Path(run_dir) / "checkpoints"):
        if not d.is_dir():
            continue
        for p in d.iterdir():
            if is_temp_file_name(p.name) and p.is_file():
                p.unlink(missing_ok=True)
                removed.append(p)
    return removed


class RunLock:
    """An exclusive ``flock`` on ``RUN/.lock`` (which names its holder's host and pid).

    The kernel drops the lock when its process dies, however it dies (kill -9 included), so a
    lock left by a killed writer never blocks the next one. On taking it, temp files that a
    killed writer left behind are removed.
    """

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / ".lock"
        self.fd: int | None = None

    @property
    def held(self) -> bool:
        return self.fd is not None

    def acquire(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(10):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                owner = os.pread(fd, 200, 0).decode(errors="replace").split()
                os.close(fd)
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise RunError(
                        f"{self.path}: cannot lock the run directory ({e.strerror}); use a local file system"
                    ) from None
                host, pid = (owner + ["?", "?"])[:2]
                raise RunError(
                    f"{self.path.parent}: another lenslab process (pid {pid} on {host}) is writing this run; "
                    "wait for it to finish or stop it (its lock goes away when it exits, even if killed)"
                ) from None
            try:  # the previous holder may have unlinked the file between our open and our flock
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{socket.gethostname()} {os.getpid()}\n".encode(), 0)
            self.fd = fd
            remove_stale_temps(self.path.parent)
            return self
        raise RunError(f"{self.path}: could not take the run lock (it keeps being replaced)")

    def release(self) -> None:
        if self.fd is not None:
            self.path.unlink(missing_ok=True)  # while still locked: a waiter holding the old file sees it is gone
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> RunLock:  # noqa: PYI034  (typing.Self needs Python 3.11; beartype rejects it outside a decorated class)
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
