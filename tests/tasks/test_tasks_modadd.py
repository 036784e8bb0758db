from __future__ import annotations

import pytest

from lenslab.tasks import ModAddTask, TaskError, make_modadd_splits


def test_modadd_covers_every_pair_once_with_correct_labels():
    task = ModAddTask(p=11, train_frac=0.3)
    s = make_modadd_splits(task, seed=2)
    rows = s["train_tokens"].tolist() + s["test_tokens"].tolist()
    labels = s["train_labels"].tolist() + s["test_labels"].tolist()
    assert len(s["train_tokens"]) == round(0.3 * 121)
    assert sorted((a, b) for a, b, _ in rows) == [(a, b) for a in range(11) for b in range(11)]
    for (a, b, eq), y in zip(rows, labels):
        assert eq == 11 and y == (a + b) % 11


def test_modadd_seeded():
    a = make_modadd_splits(ModAddTask(p=7), seed=1)["train_tokens"]
    b = make_modadd_splits(ModAddTask(p=7), seed=1)["train_tokens"]
    c = make_modadd_splits(ModAddTask(p=7), seed=2)["train_tokens"]
    assert a.tolist() == b.tolist() and a.tolist() != c.tolist()


@pytest.mark.parametrize("kw", [{"p": 1}, {"train_frac": 0.0}, {"train_frac": 1.0}, {"p": 5000}])
def test_modadd_bad_parameters(kw):
    with pytest.raises(TaskError):
        ModAddTask(**kw)
