"""Issue 27 item 6: every public function and class in lenslab says what it does (``help()`` is not empty)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import lenslab


def _public(mod):
    for name, obj in vars(mod).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
            continue
        if inspect.isfunction(obj) or inspect.isclass(obj):
            yield name, obj


def test_every_public_function_and_class_has_a_docstring():
    missing, seen = [], 0
    for info in pkgutil.walk_packages(lenslab.__path__, "lenslab."):
        mod = importlib.import_module(info.name)
        for name, obj in _public(mod):
            seen += 1
            if not (obj.__doc__ or "").strip():
                missing.append(f"{mod.__name__}.{name}")
    assert seen > 200  # the walk really covered the package
    assert not missing, f"no docstring: {missing}"
