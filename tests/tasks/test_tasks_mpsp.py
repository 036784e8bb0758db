"""MPSP tasks and splits against brute-force references."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lenslab.tasks import MPSPTask, TaskError, make_mpsp_splits, n_consistent
from lenslab.tasks.splits import check_ratio


def brute_label(seq, k):
    total = 0
    for v in seq:
        total += v
    return total % k


def brute_shortcut(seq, k, shortcut):
    if shortcut == "first":
        return seq[0] % k
    best = seq[0]
    for v in seq:
        best = max(best, v)
    return best % k


@pytest.mark.parametrize("label,shortcut", list(itertools.product(["sum2", "sum3"], ["max", "first"])))
def test_labels_and_shortcuts_match_brute_force(label, shortcut):
    task = MPSPTask(label=label, shortcut=shortcut, seq_len=4, n_values=7)
    k = task.k
    seqs = np.array(list(itertools.product(range(7), repeat=4)))
    got_l, got_s = task.labels(seqs), task.shortcuts(seqs)
    for i, seq in enumerate(seqs.tolist()):
        assert got_l[i] == brute_label(seq, k)
        assert got_s[i] == brute_shortcut(seq, k, shortcut)
    consistent = sum(brute_label(s, k) == brute_shortcut(s, k, shortcut) for s in seqs.tolist())
    assert task.count_groups() == (consistent, len(seqs) - consistent)


def test_tokens_put_values_first_and_readout_last():
    task = MPSPTask(seq_len=3, n_values=5)
    toks = task.tokens(np.array([[4, 0, 2]]))
    assert toks.tolist() == [[4, 0, 2, 5]]
    assert task.n_ctx == 4 and task.d_vocab == 6


def test_encode_decode_round_trip():
    task = MPSPTask(seq_len=4, n_values=6)
    ids = np.arange(6**4)
    assert np.array_equal(task.encode(task.decode(ids)), ids)


@settings(max_examples=40, deadline=None)
@given(
    ratio=st.floats(0.0, 1.0),
    label=st.sampled_from(["sum2", "sum3"]),
    shortcut=st.sampled_from(["max", "first"]),
    n_train=st.integers(1, 300),
    n_val=st.integers(1, 60),
    n_adv=st.integers(1, 60),
    seed=st.integers(0, 2**32),
)
def test_exact_ratio_and_disjoint_splits(ratio, label, shortcut, n_train, n_val, n_adv, seed):
    task = MPSPTask(label=label, shortcut=shortcut, seq_len=4, n_values=6)
    s = make_mpsp_splits(task, ratio, n_train, n_val, n_adv, seed)
    k = task.k
    # independent recount of the groups from the raw tokens
    train_vals = s["train_tokens"][:, :-1].tolist()
    consistent = sum(brute_label(x, k) == brute_shortcut(x, k, shortcut) for x in train_vals)
    assert consistent == int(np.floor(ratio * n_train + 0.5))
    assert len(train_vals) == n_train
    for x in s["validation_tokens"][:, :-1].tolist():
        assert brute_label(x, k) == brute_shortcut(x, k, shortcut)
    for x in s["adv_tokens"][:, :-1].tolist():
        assert brute_label(x, k) != brute_shortcut(x, k, shortcut)
    sets = {name: {tuple(r) for r in s[f"{name}_tokens"].tolist()} for name in ("train", "validation", "adv")}
    for name, rows in sets.items():
        assert len(rows) == len(s[f"{name}_tokens"]), f"duplicate sequences in {name}"
    assert not sets["train"] & sets["validation"]
    assert not sets["train"] & sets["adv"]
    assert not sets["validation"] & sets["adv"]
    assert (s["train_tokens"][:, -1] == task.readout_token).all()


def test_counterfactual_partners_are_minimal_anti_shortcut_and_not_train():
    task = MPSPTask(label="sum2", shortcut="max", seq_len=4, n_values=6)
    s = make_mpsp_splits(task, 0.9, 400, 100, 50, seed=3)
    train = {tuple(r) for r in s["train_tokens"].tolist()}
    for clean, cf in zip(s["validation_tokens"].tolist(), s["counterfactual_tokens"].tolist()):
        assert brute_label(cf[:-1], 2) != brute_shortcut(cf[:-1], 2, "max")
        assert tuple(cf) not in train
        d = sum(a != b for a, b in zip(clean, cf))
        if d > 1:  # then no single-token edit may exist (brute force over all of them)
            for pos in range(4):
                for v in range(6):
                    y = list(clean[:-1])
                    y[pos] = v
                    assert not (brute_label(y, 2) != brute_shortcut(y, 2, "max") and tuple(y + [6]) not in train)
        assert d >= 1
    assert torch.equal(s["counterfactual_labels"], task_labels(s["counterfactual_tokens"]))


def task_labels(tokens):
    return tokens[:, :-1].sum(1) % 2


def test_all_zero_sequence_needs_two_edits():
    from lenslab.tasks.splits import counterfactual_partners

    task = MPSPTask(label="sum2", shortcut="max", seq_len=3, n_values=4)
    out = counterfactual_partners(task, np.zeros((1, 3), dtype=np.int64))
    assert (out[0] != 0).sum() == 2
    assert task.labels(out)[0] != task.shortcuts(out)[0]


def test_same_seed_same_splits_other_seed_differs():
    task = MPSPTask()
    a = make_mpsp_splits(task, 0.7, 2000, 100, 100, seed=5)
    b = make_mpsp_splits(task, 0.7, 2000, 100, 100, seed=5)
    c = make_mpsp_splits(task, 0.7, 2000, 100, 100, seed=6)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["train_tokens"], c["train_tokens"])


def test_large_space_uses_sampling_and_stays_exact():
    task = MPSPTask(seq_len=8, n_values=16)  # 4e9 sequences: rejection sampling path
    s = make_mpsp_splits(task, 0.25, 3000, 200, 200, seed=1)
    consistent = (s["train_labels"] == s["train_shortcut"]).sum().item()
    assert consistent == n_consistent(0.25, 3000) == 750
    assert len({tuple(r) for r in s["train_tokens"].tolist()}) == 3000


@pytest.mark.parametrize("ratio", [1.5, -0.1, float("nan")])
def test_bad_ratio_is_refused(ratio):
    with pytest.raises(TaskError, match="ratio"):
        make_mpsp_splits(MPSPTask(), ratio, 100, 10, 10)


def test_ratio_of_the_wrong_type_is_refused():
    # make_mpsp_splits is annotated ratio: float (checked under pytest); raw values (JSON, CLI) go through check_ratio
    with pytest.raises(TaskError, match="ratio"):
        check_ratio("0.5")


def test_below_chance_ratio_is_valid():
    s = make_mpsp_splits(MPSPTask(label="sum3"), 0.1, 1000, 10, 10)
    assert (s["train_labels"] == s["train_shortcut"]).sum() == 100


def test_split_larger_than_the_space_is_refused():
    with pytest.raises(TaskError, match="allow only"):
        make_mpsp_splits(MPSPTask(seq_len=3, n_values=4), 0.5, 100, 10, 10)


@pytest.mark.parametrize("kw", [{"label": "sum5"}, {"shortcut": "last"}, {"seq_len": 1}, {"n_values": 1}])
def test_bad_task_parameters(kw):
    with pytest.raises(TaskError):
        MPSPTask(**kw)
