"""Small configs shared by the training tests."""

from lenslab.training.config import modadd_run_config, mpsp_run_config


def tiny_config(**train):
    """A 1L1H model on a small MPSP task that learns the shortcut in ~20 epochs."""
    kw = {"epochs": 4, "eval_every": 2, "lr": 3e-3, "batch_size": 256}
    kw.update(train)
    return mpsp_run_config(seq_len=4, n_values=8, n_train=1536, n_val=256, n_adv=256, layers=1, heads=1, **kw)


def tiny_modadd(**train):
    kw = {"epochs": 6, "eval_every": 2}
    kw.update(train)
    return modadd_run_config(p=11, train_frac=0.5, **kw)
