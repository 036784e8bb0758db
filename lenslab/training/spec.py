"""The typed run config: frozen dataclasses for ``config.json``, validated once, in ``__post_init__``.

    spec = RunSpec.from_dict(json.loads(Path("runs/r09/config.json").read_text()))
    spec.task.ratio, spec.model.n_heads, spec.train.lr
    spec.to_dict()          # the same dict (same keys, same order, same values): config.json round-trips

``RunSpec`` holds a task spec (``MPSPSpec`` or ``ModAddSpec``), a ``ModelSpec`` (the
``HookedTransformerConfig`` kwargs lenslab builds), a ``TrainSpec`` and, for a run that starts
from another run's weights, an ``InitSpec``. Every field carries its metadata (a ``Param``):
the default, the bounds or choices, the help text and the command-line flag. That table is the
only place bounds live: the config builders (``training.config``), the model presets
(``training.presets``), the loaders (``runio.read_config``) and the CLI flags all read it.

Errors keep the project's style: one line naming the bad value and the allowed range. A spec
built directly raises ``ConfigError`` (a task rule: ``TaskError``); ``RunSpec.from_dict(cfg,
where=path)`` raises what a run directory's loader raised before (``RunError`` for the file,
``ConfigError`` for the model block), prefixed with ``where``.

This module imports no other ``lenslab.training`` module but ``errors``: it is the bottom of
the training package, so config, run and runio import it without cycles.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, no_type_check

from lenslab.tasks import LABELS, SHORTCUTS, ModAddTask, MPSPTask
from lenslab.tasks.errors import LenslabError
from lenslab.tasks.mnist import LOSSES, MNISTTask
from lenslab.tasks.splits import check_ratio
from lenslab.training.errors import ConfigError, RunError

VERSION = "0.1.0"
RUN_FORMAT = "lenslab-run/1"
TASKS = ("mpsp", "modadd", "mnist")
DTYPE_NAMES = ("float32", "float64")  # the precisions lenslab trains in (presets.DTYPES maps them to torch)
EVAL_SCHEDULES = ("linear", "log")
MAX_EVALS = 2000  # log_schedule is exact integer arithmetic: 0.05 s at 1000 evaluations, ~16 s at 10,000
MAX_MODEL_BYTES = 1 << 33  # 8 GiB of weights and buffers: refused before anything is built
SEED_MAX = 2**63 - 1
# what a config.json without these keys (written before they existed) trained with
LEGACY_TRAIN = {"dtype": "float32", "eval_schedule": "linear", "n_evals": 200}
CONFIG_KEYS = {"format", "lenslab_version", "task", "model", "train"}
OPTIONAL_CONFIG_KEYS = {"init"}  # present only in runs that start from another run's weights
INIT_KEYS = {"from", "epoch", "sha256"}


class _Absent:
    """An optional config key that the dict did not have (``to_dict`` leaves it out)."""

    _it: _Absent | None = None

    def __new__(cls):
        if cls._it is None:
            cls._it = super().__new__(cls)
        return cls._it

    def __repr__(self) -> str:
        return "ABSENT"

    def __reduce__(self):
        return (_Absent, ())


ABSENT: Any = _Absent()


# -- field metadata ------------------------------------------------------------------------
@dataclass(frozen=True)
class Param:
    """What one config field may hold, and how the CLI and the docs present it.

    ``kind``: "int" | "float" (bounds ``lo``..``hi``, inclusive), "choice" (exactly one of
    ``choices``, compared with their types: 1 is not True), or "task" (validated by the task
    object, ``MPSPTask`` / ``ModAddTask``; ``choices`` are then only shown). ``default`` is the
    default, or ``{"mpsp": ..., "modadd": ...}`` where the tasks differ. ``flag`` is the
    command-line flag's name (``--`` + flag with ``-`` for ``_``), None for none.
    """

    kind: str
    default: Any = None
    lo: float | None = None
    hi: float | None = None
    choices: tuple | None = None
    help: str = ""
    flag: str | None = None
    nullable: bool = False  # None is allowed (batch_size: full batch)
    optional: bool = False  # the key may be absent from config.json (HookedTransformerConfig's default applies)
    what: str | None = None  # the name errors use, where it is not the field's (the task's "seed" is the data seed)
    validator: Callable[[Any], Any] | None = None  # replaces the kind's check (ratio: tasks.splits.check_ratio)

    def default_for(self, task: str | None = None) -> Any:
        if isinstance(self.default, dict):
            return self.default[task or "mpsp"]
        return self.default

    def range_text(self) -> str:
        if self.kind in ("int", "float") and self.lo is not None:
            return f"[{fmt_bound(self.lo)}, {fmt_bound(self.hi)}]"
        if self.choices is not None:
            return " | ".join(str(c) for c in self.choices)
        return ""

    def default_text(self) -> str:
        def one(v):
            if v is None:
                return "full" if self.nullable else "none"
            if isinstance(v, (list, tuple)):
                return " ".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v)
            return f"{v:g}" if isinstance(v, float) else str(v)

        if isinstance(self.default, dict):
            return ", ".join(f"{task} {one(v)}" for task, v in self.default.items())
        return one(self.default)

    def check(self, value: Any, name: str) -> Any:
        """``value`` if it is allowed, else a one-line ``ConfigError`` naming it and the allowed range."""
        if value is None and self.nullable:
            return value
        if self.validator is not None:
            return self.validator(value)
        if self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int) or not self.lo <= value <= self.hi:
                raise ConfigError(f"{name}={value!r} must be an integer in {self.range_text()}")
        elif self.kind == "float":
            bad = isinstance(value, bool) or not isinstance(value, (int, float))
            if bad or not math.isfinite(value) or not self.lo <= value <= self.hi:
                raise ConfigError(f"{name}={value!r} must be a number in {self.range_text()}")
        elif self.kind == "choice" and not any(type(value) is type(c) and value == c for c in self.choices):
            raise ConfigError(f"{name}={value!r} is not supported: use one of {', '.join(str(c) for c in self.choices)}")
        return value


def fmt_bound(x: float) -> str:
    """A bound as people write it: 64, 1e-12, 2**26, 2**63 - 1."""
    if isinstance(x, int) and x >= 1 << 16:
        if x & (x - 1) == 0:
            return f"2**{x.bit_length() - 1}"
        if (x + 1) & x == 0:
            return f"2**{x.bit_length()} - 1"
    return f"{x:g}" if isinstance(x, float) else str(x)


def param(kind: str, default: Any = dataclasses.MISSING, *, required: bool = False, **meta: Any) -> Any:
    """A dataclass field whose metadata is a ``Param`` (``required``: no dataclass default)."""
    p = Param(kind, default=None if default is dataclasses.MISSING else default, **meta)
    if p.optional:  # absent unless given: to_dict writes back only what the config had
        return field(default=ABSENT, metadata={"param": p})
    if required or default is dataclasses.MISSING:
        return field(metadata={"param": p})
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: p.default_for(None), metadata={"param": p})
    return field(default=default, metadata={"param": p})


def params(cls) -> dict[str, Param]:
    """``{field name: Param}`` of a spec class, in field order."""
    return {f.name: f.metadata["param"] for f in dataclasses.fields(cls) if "param" in f.metadata}


def check_field(cls, name: str, value: Any, label: str | None = None) -> Any:
    """Check one value against ``cls``'s field ``name`` (for builders that take their own argument names)."""
    return params(cls)[name].check(value, label or name)


class _Spec:
    """Shared by the block specs: field-by-field validation and the dict form."""

    PREFIX: ClassVar[str] = ""  # errors name "model.n_heads", but "lr" (as the config builders always have)

    def _check_fields(self) -> None:
        for name, p in params(type(self)).items():
            value = getattr(self, name)
            if value is ABSENT and p.optional:
                continue
            checked = p.check(value, self.PREFIX + (p.what or name))
            if checked is not value:
                object.__setattr__(self, name, checked)

    def to_dict(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is ABSENT:
                continue
            out[f.metadata.get("key", f.name)] = list(v) if isinstance(v, tuple) else v
        return out

    @classmethod
    def keys(cls) -> set[str]:
        return {f.metadata.get("key", f.name) for f in dataclasses.fields(cls)}

    @classmethod
    def required_keys(cls) -> set[str]:
        return {f.metadata.get("key", f.name) for f in dataclasses.fields(cls) if not f.metadata["param"].optional}


# -- the task --------------------------------------------------------------------------------
def _task_name(name: str) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if v != name:
            raise ConfigError(f"task.name={v!r} must be one of {', '.join(TASKS)}")
        return v

    return check


SIZE_MAX = 1 << 26
TASK = Param("choice", "mpsp", choices=TASKS, help="the task", flag="task")  # which spec: MPSPSpec or ModAddSpec


@no_type_check  # validates raw JSON/CLI values itself, in __post_init__, with a readable ConfigError
@dataclass(frozen=True)
class MPSPSpec(_Spec):
    """An MPSP task and its splits (``config["task"]`` with ``name="mpsp"``)."""

    name: str = param("choice", "mpsp", choices=TASKS, validator=_task_name("mpsp"))
    label: str = param("task", "sum2", choices=tuple(LABELS), help="mpsp label", flag="label")
    shortcut: str = param("task", "max", choices=SHORTCUTS, help="mpsp shortcut", flag="shortcut")
    ratio: float = param("float", 0.9, lo=0.0, hi=1.0, help="spurious ratio r", flag="ratio", validator=check_ratio)
    seq_len: int = param("int", 5, lo=2, hi=64, help="mpsp values per sequence", flag="seq_len")
    n_values: int = param("int", 16, lo=2, hi=1 << 20, help="mpsp values are 0..n-1", flag="n_values")
    seed: int = param(
        "int", 0, lo=0, hi=SEED_MAX, what="data seed", help="seed of the splits, fixed per experiment", flag="data_seed"
    )
    n_train: int = param("int", 16_384, lo=1, hi=SIZE_MAX, help="train split size", flag="n_train")
    n_val: int = param("int", 2_048, lo=1, hi=SIZE_MAX, help="validation split size", flag="n_val")
    n_adv: int = param("int", 2_048, lo=1, hi=SIZE_MAX, help="adversarial split size", flag="n_adv")

    def __post_init__(self) -> None:
        self._check_fields()  # seq_len and n_values are bounded before MPSPTask computes n_values**seq_len
        self.rule  # noqa: B018 (label, shortcut, and a sequence space that fits int64 ids)

    @property
    def rule(self) -> MPSPTask:
        """The task object (the rule, no data)."""
        return MPSPTask(label=self.label, shortcut=self.shortcut, seq_len=self.seq_len, n_values=self.n_values)


@no_type_check  # validates raw JSON/CLI values itself, in __post_init__, with a readable ConfigError
@dataclass(frozen=True)
class ModAddSpec(_Spec):
    """Modular addition (``config["task"]`` with ``name="modadd"``)."""

    name: str = param("choice", "modadd", choices=TASKS, validator=_task_name("modadd"))
    p: int = param("int", 113, lo=2, hi=4096, help="modadd modulus", flag="p")
    train_frac: float = param("task", 0.3, help="modadd train fraction, strictly between 0 and 1", flag="train_frac")
    seed: int = param(
        "int", 0, lo=0, hi=SEED_MAX, what="data seed", help="seed of the splits, fixed per experiment", flag="data_seed"
    )

    def __post_init__(self) -> None:
        self._check_fields()
        self.rule  # noqa: B018 (train_frac, and splits that are not empty)

    @property
    def rule(self) -> ModAddTask:
        return ModAddTask(p=self.p, train_frac=self.train_frac)


@no_type_check  # validates raw JSON/CLI values itself, in __post_init__, with a readable ConfigError
@dataclass(frozen=True)
class MNISTSpec(_Spec):
    """MNIST digits for paper 2's MLP (``config["task"]`` with ``name="mnist"``): ``tasks.mnist``."""

    name: str = param("choice", "mnist", choices=TASKS, validator=_task_name("mnist"))
    n_per_class: int = param("int", 100, lo=1, hi=499, help="mnist train images per class (the rest is test)", flag="n_per_class")
    n_classes: int = param("int", 10, lo=2, hi=10, help="mnist digits used, 0..n-1", flag="n_classes")
    loss: str = param("choice", "mse", choices=LOSSES, help="mnist loss: mse on one-hot targets, or ce", flag="loss")
    seed: int = param(
        "int", 0, lo=0, hi=SEED_MAX, what="data seed", help="seed of the splits, fixed per experiment", flag="data_seed"
    )

    def __post_init__(self) -> None:
        self._check_fields()
        self.rule  # noqa: B018

    @property
    def rule(self) -> MNISTTask:
        return MNISTTask(n_per_class=self.n_per_class, n_classes=self.n_classes, loss=self.loss)


TASK_SPECS: dict[str, type[MPSPSpec | ModAddSpec | MNISTSpec]] = {"mpsp": MPSPSpec, "modadd": ModAddSpec, "mnist": MNISTSpec}


# -- the model -------------------------------------------------------------------------------
@no_type_check  # validates raw JSON/CLI values itself, in __post_init__, with a readable ConfigError
@dataclass(frozen=True)
class ModelSpec(_Spec):
    """``HookedTransformerConfig`` kwargs (``config["model"]``), bounded before anything is allocated.

    The optional fields may be absent from a config.json (then ``HookedTransformerConfig``'s
    default, their ``Param.default``, applies); they are ``ABSENT`` here and ``to_dict`` leaves them out.
    """

    PREFIX: ClassVar[str] = "model."

    n_layers: int = param("int", 2, required=True, lo=1, hi=64, help="mpsp model layers", flag="layers")
    d_model: int = param("int", 64, required=True, lo=1, hi=8192)
    n_heads: int = param("int", 2, required=True, lo=1, hi=128, help="mpsp heads per layer", flag="heads")
    d_head: int = param("int", 32, required=True, lo=1, hi=8192)
    d_mlp: int = param("int", 128, required=True, lo=1, hi=65536)
    d_vocab: int = param("int", required=True, lo=2, hi=1 << 20)
    d_vocab_out: int = param("int", required=True, lo=2, hi=1 << 20)
    n_ctx: int = param("int", required=True, lo=1, hi=1 << 16)
    # optional: the default is HookedTransformerConfig's, the choices are what lenslab builds
    act_fn: str = param("choice", "relu", choices=("relu", "gelu", "gelu_new", "silu", "solu_ln"), optional=True)
    normalization_type: str | None = param("choice", "LN", choices=(None, "LN", "LNPre"), optional=True)
    positional_embedding_type: str = param("choice", "standard", choices=("standard", "shortformer"), optional=True)
    attn_only: bool = param("choice", False, choices=(False, True), optional=True)
    default_prepend_bos: bool = param("choice", True, choices=(False, True), optional=True)

    def __post_init__(self) -> None:
        self._check_fields()
        need = model_bytes(self.to_dict())
        if need > MAX_MODEL_BYTES:
            raise ConfigError(
                f"the model would take ~{need / 2**30:.1f} GiB (weights and attention masks); "
                f"refusing to allocate it (limit {MAX_MODEL_BYTES / 2**30:.0f} GiB)"
            )

    @classmethod
    def from_dict(cls, model: Any) -> ModelSpec:
        """A ``ModelSpec`` of a ``config["model"]`` dict (absent optional fields stay absent)."""
        if not isinstance(model, dict):
            raise ConfigError("'model' must be an object of HookedTransformerConfig fields")
        unknown = set(model) - cls.keys()
        if unknown:
            raise ConfigError(f"unknown model field(s) {sorted(unknown)}; allowed: {sorted(cls.keys())}")
        for key in params(cls):
            if key not in model and not params(cls)[key].optional:
                raise ConfigError(f"model field {key!r} is missing")
        return cls(**{k: model.get(k, ABSENT) for k in params(cls)})


def model_bytes(model: dict) -> int:
    """An upper bound on what ``HookedTransformer(config)`` allocates: float32 weights plus the causal masks."""
    d, L, h, dh, ctx = model["d_model"], model["n_layers"], model["n_heads"], model["d_head"], model["n_ctx"]
    mlp = 0 if model.get("attn_only") else 2 * d * model["d_mlp"] + model["d_mlp"] + d
    per_layer = 4 * h * d * dh + 3 * h * dh + d + mlp + 4 * d
    params_ = model["d_vocab"] * d + ctx * d + L * per_layer + 2 * d + (d + 1) * model["d_vocab_out"]
    return 4 * params_ + L * ctx * ctx  # masks: one [n_ctx, n_ctx] bool buffer per layer


@no_type_check  # validates raw JSON/CLI values itself, in __post_init__, with a readable ConfigError
@dataclass(frozen=True)
class MLPSpec(_Spec):
    """The hooked MLP (``config["model"]`` with ``arch="mlp"``): ``training.mlp.HookedMLP``.

    ``n_layers`` linear layers ``d_in -> d_hidden -> ... -> d_out``; every parameter of the
    ``nn.Linear`` init is multiplied by ``init_scale`` (the predecessor: 8).
    """

    PREFIX: ClassVar[str] = "model."

    arch: str = param("choice", "mlp", choices=("mlp",))
    d_in: int = param("int", 784, lo=1, hi=1 << 20)
    d_hidden: int = param("int", 200, lo=1, hi=1 << 16, help="mnist MLP width", flag="d_hidden")
    n_layers: int = param("int", 3, lo=2, hi=64)
    d_out: int = param("int", 10, lo=2, hi=1 << 16)
    act_fn: str = param("choice", "relu", choices=("relu", "gelu", "tanh"))
    init_scale: float = param("float", 8.0, lo=1e-6, hi=1e6, help="mnist MLP: every init parameter times this", flag="init_scale")

    def __post_init__(self) -> None:
        self._check_fields()
        dims = [self.d_in, *[self.d_hidden] * (self.n_layers - 1), self.d_out]
        need = 4 * sum(a * b + b for a, b in itertools.pairwise(dims))
        if need > MAX_MODEL_BYTES:
            raise ConfigError(f"the MLP would take ~{need / 2**30:.1f} GiB of weights; refusing to allocate it")

    @classmethod
    def from_dict(cls, model: Any) -> MLPSpec:
        if not isinstance(model, dict):
            raise ConfigError("'model' must be an object of MLP fields")
        unknown, missing = set(model) - cls.keys(), cls.keys() - set(model)
        if unknown or missing:
            raise ConfigError(
                f"MLP model block: missing {sorted(missing)}, unknown {sorted(unknown)}; expected {sorted(cls.keys())}"
            )
        return cls(**model)


def is_mlp_config(model: Any) -> bool:
    """Whether a ``config["model"]`` block is the hooked MLP's (else HookedTransformerConfig kwargs)."""
    return isinstance(model, dict) and model.get("arch") == "mlp"


def model_spec_from_dict(model: Any) -> ModelSpec | MLPSpec:
    """The typed model block: ``MLPSpec`` for ``arch='mlp'``, else ``ModelSpec`` (HookedTransformerConfig kwargs)."""
    return MLPSpec.from_dict(model) if is_mlp_config(model) else ModelSpec.from_dict(model)


# -- training ----------------------------------------------------------------------------------
def _betas(v: Any) -> tuple[float, float]:
    if not (isinstance(v, (list, tuple)) and len(v) == 2):
        raise ConfigError(f"betas={v!r} must be two numbers in [0, 1)")
    for b in v:
        Param("float", lo=0.0, hi=0.999999).check(b, "beta")
    return tuple(v)


@no_type_check  # validates raw JSON/CLI values itself, in __post_init__, with a readable ConfigError
@dataclass(frozen=True)
class TrainSpec(_Spec):
    """The optimisation (``config["train"]``). Defaults are MPSP's; ``TrainSpec.for_task("modadd")`` gives modadd's.

    MPSP: AdamW lr 1e-3, weight decay 0.1, betas (0.9, 0.999), batch 512, eval every 5 epochs.
    Modular addition: the standard grokking recipe, AdamW lr 1e-3, weight decay 1.0, betas
    (0.9, 0.98), full batch (``batch_size=None``), eval every 50 epochs.
    MNIST MLP: the predecessor's, AdamW lr 5e-4, weight decay 0, betas (0.9, 0.999), batch 200.
    """

    epochs: int = param(
        "int",
        {"mpsp": 150, "modadd": 3000, "mnist": 2000},
        lo=0,
        hi=10_000_000,
        help="total epochs (mnist: one epoch is one pass, train size / batch steps)",
        flag="epochs",
    )
    lr: float = param(
        "float", {"mpsp": 1e-3, "modadd": 1e-3, "mnist": 5e-4}, lo=1e-12, hi=10.0, help="AdamW learning rate", flag="lr"
    )
    weight_decay: float = param(
        "float", {"mpsp": 0.1, "modadd": 1.0, "mnist": 0.0}, lo=0.0, hi=100.0, help="AdamW weight decay", flag="weight_decay"
    )
    betas: tuple[float, float] = param(
        "float",
        {"mpsp": (0.9, 0.999), "modadd": (0.9, 0.98), "mnist": (0.9, 0.999)},
        lo=0.0,
        hi=0.999999,
        help="AdamW betas",
        flag="betas",
        validator=_betas,
    )
    batch_size: int | None = param(
        "int",
        {"mpsp": 512, "modadd": None, "mnist": 200},
        lo=1,
        hi=1 << 24,
        nullable=True,
        help="batch size, 0 = full batch",
        flag="batch_size",
    )
    eval_every: int = param(
        "int", {"mpsp": 5, "modadd": 50, "mnist": 100}, lo=1, hi=10_000_000, help="epochs between evaluations", flag="eval_every"
    )
    seed: int = param("int", 0, lo=0, hi=SEED_MAX, help="model init + data order seed", flag="seed")
    ckpt_density: int = param(
        "int", 16, lo=1, hi=1_000_000, help="evaluations checkpointed before thinning starts", flag="ckpt_density"
    )
    grad_probe_size: int = param("int", 256, lo=1, hi=1 << 16, help="examples per gradient-conflict probe")
    dtype: str = param(
        "choice",
        "float32",
        choices=DTYPE_NAMES,
        flag="dtype",
        help="precision of weights, AdamW state, arithmetic and checkpoints",
    )
    eval_schedule: str = param(
        "choice",
        "linear",
        choices=EVAL_SCHEDULES,
        flag="eval_schedule",
        help="linear: every --eval-every epochs; log: --n-evals log-spaced epochs, each checkpointed",
    )
    n_evals: int = param(
        "int", 200, lo=1, hi=MAX_EVALS, help="evaluations (after epoch 0) with --eval-schedule log", flag="n_evals"
    )

    def __post_init__(self) -> None:
        self._check_fields()

    @classmethod
    def for_task(cls, task: str, **settings: Any) -> TrainSpec:
        """The defaults of ``task``, overridden by ``settings`` (None: the default; but ``batch_size=None`` is full batch)."""
        ps = params(cls)
        unknown = set(settings) - set(ps)
        if unknown:
            raise ConfigError(f"unknown training setting(s) {sorted(unknown)}; known: {sorted(ps)}")
        values = {k: p.default_for(task) for k, p in ps.items()}
        values.update({k: v for k, v in settings.items() if v is not None or k == "batch_size"})
        return cls(**values)


# -- the init block and the whole run ------------------------------------------------------------
@no_type_check  # validates raw JSON/CLI values itself, in __post_init__, with a readable ConfigError
@dataclass(frozen=True)
class InitSpec(_Spec):
    """``{"from": checkpoint path, "epoch": int, "sha256": hex}``: the weights a run starts from."""

    source: str = field(metadata={"key": "from", "param": Param("str")})
    epoch: int = field(metadata={"param": Param("int", lo=0, hi=SEED_MAX)})
    sha256: str = field(metadata={"param": Param("str")})

    def __post_init__(self) -> None:
        check_init_block(self.to_dict())

    @classmethod
    def from_dict(cls, init: Any, where: str = "config.json") -> InitSpec:
        check_init_block(init, where)
        return cls(source=init["from"], epoch=init["epoch"], sha256=init["sha256"])


def check_init_block(init: Any, where: str = "config.json") -> dict:
    """``{"from": checkpoint path, "epoch": int, "sha256": hex}``: the weights a run starts from."""
    ok = (
        isinstance(init, dict)
        and set(init) == INIT_KEYS
        and isinstance(init["from"], str)
        and init["from"]
        and isinstance(init["epoch"], int)
        and not isinstance(init["epoch"], bool)
        and init["epoch"] >= 0
        and isinstance(init["sha256"], str)
        and re.fullmatch(r"[0-9a-f]{64}", init["sha256"]) is not None
    )
    if not ok:
        raise RunError(
            f"{where}: malformed 'init' block {init!r}; expected {{'from': checkpoint path, 'epoch': int, 'sha256': 64 hex digits}}"
        )
    return init


@no_type_check  # validates raw JSON/CLI values itself, in __post_init__, with a readable ConfigError
@dataclass(frozen=True)
class RunSpec:
    """A whole run config: ``RunSpec.from_dict(cfg).to_dict() == cfg`` for every config.json lenslab writes."""

    task: MPSPSpec | ModAddSpec | MNISTSpec
    model: ModelSpec | MLPSpec
    train: TrainSpec
    init: InitSpec | None = None
    format: str = RUN_FORMAT
    lenslab_version: Any = VERSION  # not checked: any version's run loads (ABSENT where a config lacks it)

    def __post_init__(self) -> None:
        if self.format != RUN_FORMAT:
            raise ConfigError(f"format {self.format!r} is not {RUN_FORMAT!r}; not a lenslab run")
        if (
            not isinstance(self.task, (MPSPSpec, ModAddSpec, MNISTSpec))
            or not isinstance(self.model, MLPSpec if isinstance(self.task, MNISTSpec) else ModelSpec)
            or not isinstance(self.train, TrainSpec)
        ):
            raise ConfigError(
                "a RunSpec holds a task spec, a model spec (MLPSpec for mnist, ModelSpec otherwise) and a TrainSpec"
            )
        if isinstance(self.task, MNISTSpec) and (self.model.d_in, self.model.d_out) != (
            self.task.rule.d_in,
            self.task.rule.d_out,
        ):
            raise ConfigError(
                f"the MLP maps {self.model.d_in} -> {self.model.d_out}, but mnist with n_classes={self.task.n_classes} "
                f"needs {self.task.rule.d_in} -> {self.task.rule.d_out}"
            )
        if isinstance(self.task, MPSPSpec) and self.task.seq_len + 1 > self.model.n_ctx:
            raise ConfigError(
                f"seq_len={self.task.seq_len} needs n_ctx >= {self.task.seq_len + 1} (values + readout), "
                f"but the model has n_ctx={self.model.n_ctx}"
            )

    @property
    def name(self) -> str:
        return self.task.name

    def to_dict(self) -> dict:
        out: dict = {"format": self.format}
        if self.lenslab_version is not ABSENT:
            out["lenslab_version"] = self.lenslab_version
        out.update(task=self.task.to_dict(), model=self.model.to_dict(), train=self.train.to_dict())
        if self.init is not None:
            out["init"] = self.init.to_dict()
        return out

    @classmethod
    def from_dict(cls, cfg: Any, where: str | None = None) -> RunSpec:
        """The spec of a config dict, checked field by field; ``cfg`` is not modified.

        Train settings added after a run was written (``LEGACY_TRAIN``) take the values it trained with.
        With ``where`` (the file), errors are those of a run directory's loader, prefixed with it:
        ``RunError``, but ``ConfigError`` for the model block. Without, ``ConfigError`` / ``TaskError``.
        """
        run_error = RunError if where is not None else ConfigError
        pre = f"{where}: " if where is not None else ""
        if not isinstance(cfg, dict):
            raise run_error(f"{pre}expected a JSON object")
        if cfg.get("format") != RUN_FORMAT:
            raise run_error(f"{pre}format {cfg.get('format')!r} is not {RUN_FORMAT!r}; not a lenslab run")
        unknown = sorted(set(cfg) - CONFIG_KEYS - OPTIONAL_CONFIG_KEYS)
        if unknown:
            raise run_error(
                f"{pre}unknown top-level field(s) {unknown}; a run config has {sorted(CONFIG_KEYS)} (and optionally {sorted(OPTIONAL_CONFIG_KEYS)})"
            )
        init = InitSpec.from_dict(cfg["init"], where or "config") if "init" in cfg else None
        for key in ("task", "model", "train"):
            if not isinstance(cfg.get(key), dict):
                raise run_error(f"{pre}missing or malformed {key!r} block")
        try:
            model = model_spec_from_dict(cfg["model"])
        except LenslabError as e:
            raise ConfigError(f"{where or 'model config'}: {e}") from None
        name = cfg["task"].get("name")
        if name not in TASK_SPECS:
            raise run_error(f"{pre}task.name={name!r} must be one of {', '.join(TASKS)}")
        task_cls = TASK_SPECS[name]
        train = {**LEGACY_TRAIN, **cfg["train"]}  # a run written before the key existed trained with this value
        for block, d, known in (("task", cfg["task"], task_cls.keys()), ("train", train, TrainSpec.keys())):
            missing, extra = sorted(known - set(d)), sorted(set(d) - known)
            if missing or extra:
                raise run_error(f"{pre}{block} block: missing {missing}, unknown {extra}; expected exactly {sorted(known)}")
        try:
            return cls(
                task=task_cls(**cfg["task"]),
                model=model,
                train=TrainSpec(**train),
                init=init,
                format=cfg["format"],
                lenslab_version=cfg.get("lenslab_version", ABSENT),
            )
        except LenslabError as e:
            if where is None:
                raise
            raise RunError(f"{where}: {e}") from None


# -- the dict-form checks (what runio.read_config and the trainers call) ------------------------
def check_model_kwargs(model: Any, where: str = "config.json") -> dict:
    """Validate the ``"model"`` block before building anything (no huge allocations); ``ConfigError``."""
    try:
        model_spec_from_dict(model)
    except LenslabError as e:
        raise ConfigError(f"{where}: {e}") from None
    return model


def check_config(cfg: Any, where: str = "config.json") -> dict:
    """Schema check of a whole run config (fields, types, bounds) before anything is built; returns ``cfg``.

    Train settings added after a run was written (``LEGACY_TRAIN``: dtype, eval_schedule,
    n_evals) are filled in, in place, with the values that run trained with.
    """
    RunSpec.from_dict(cfg, where)
    for key, value in LEGACY_TRAIN.items():
        cfg["train"].setdefault(key, value)
    return cfg


# the names and defaults the model fields' optional entries mean (HookedTransformerConfig's), for docs and runio
MODEL_LIMITS = {k: (p.lo, p.hi) for k, p in params(ModelSpec).items() if p.kind == "int"}
MODEL_CHOICES = {k: (p.default, p.choices) for k, p in params(ModelSpec).items() if p.kind == "choice"}
MODEL_KEYS = set(MODEL_LIMITS) | set(MODEL_CHOICES)
