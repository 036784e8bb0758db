"""TransformerLens's deprecation warnings are errors under the test suite (pyproject's filterwarnings), except
HookedTransformer's own notice: the design card asks for HookedTransformer, and lenslab pins transformer_lens<4."""

from __future__ import annotations

import importlib
import sys

import pytest


def test_a_deprecated_transformer_lens_import_fails_the_tests(monkeypatch):
    monkeypatch.delitem(sys.modules, "transformer_lens.utils", raising=False)
    with pytest.raises(DeprecationWarning, match="utilities"):
        importlib.import_module("transformer_lens.utils")


def test_lenslab_imports_and_builds_models_without_one():
    from lenslab.training.config import mpsp_run_config
    from lenslab.training.presets import build_model

    for name in ("ablation", "patching", "visual", "fingerprints", "spectral"):
        importlib.import_module(f"lenslab.interp.{name}")
    build_model(mpsp_run_config(layers=1, heads=1)["model"], seed=0)
