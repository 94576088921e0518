"""Which build of the hot modules runs: mypyc's compiled one or the Python source.

``make compile`` (``python -m prism.devstack.compile``) compiles the run-semantics core
(``prism.pipeline.core``) and the fast parser (``prism.schemas._fast``) with mypyc into
``build/mypyc/`` beside the packages, with ``manifest.json``: the SHA-256 of each source
it compiled and the interpreter's extension suffix. Each of the two packages calls
``use_compiled`` first thing. The build is used only when it matches the sources byte
for byte, so an edited module never runs as its stale build. ``PRISM_CORE`` chooses:

- ``auto`` (the default): the build when it exists and matches, else the source (a stale
  build is logged once);
- ``compiled``: the build, or ``CompiledCoreError`` naming what is missing or stale;
- ``pure``: the source, whatever is built (the fallback the same tests run against).

The build's modules go first on the package's ``__path__``, so ``import
prism.pipeline.core._run`` finds the compiled one; mypyc's shared library of the group is
loaded once, by path, under its own name. Installed from a wheel there is no build, and
the source runs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any

MODES = ("auto", "compiled", "pure")
BUILD_DIR = Path(__file__).resolve().parent.parent / "build" / "mypyc"
MANIFEST = "manifest.json"

log = logging.getLogger(__name__)


class CompiledCoreError(RuntimeError):
    """``PRISM_CORE=compiled`` and the build is missing, stale or for another interpreter."""


def mode() -> str:
    """``PRISM_CORE``, checked: one of ``MODES``."""
    value = os.environ.get("PRISM_CORE", "auto").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"PRISM_CORE={value!r}: expected one of {', '.join(MODES)}")
    return value


def source_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_problem(build: Path) -> str | None:
    """Why ``build`` cannot stand for the sources, or None.

    The whole group or none of it: compiled modules call each other directly, so one stale
    module would keep running in the others. Every module the manifest lists must have
    the digest it was built from, and the build must be for this interpreter."""
    manifest_path = build / MANIFEST
    if not manifest_path.is_file():
        return f"no compiled build at {build} (run `make compile`)"
    try:
        manifest: dict[str, Any] = json.loads(manifest_path.read_text())
        suffix, modules = manifest["suffix"], manifest["modules"]
        sources = {m: (build / entry["source"], entry["sha256"]) for m, entry in modules.items()}
    except (ValueError, KeyError, TypeError) as exc:
        return f"unreadable {manifest_path}: {exc!r}"
    if suffix != sysconfig.get_config_var("EXT_SUFFIX"):
        return f"the build at {build} is for {suffix}, not this interpreter"
    for module, (src, digest) in sources.items():
        if not src.is_file():
            return f"{module} was compiled from {src}, which is gone"
        if source_digest(src) != digest:
            return f"{module} changed since it was compiled ({src}; run `make compile`)"
    return None


_verdicts: dict[Path, str | None] = {}  # build folder -> build_problem, once per process


def use_compiled(path: list[str], package: str, build: Path = BUILD_DIR) -> bool:
    """Put ``package``'s compiled modules first on its ``path`` when ``PRISM_CORE`` and
    the build allow it; True when they are used."""
    chosen = mode()
    if chosen == "pure":
        return False
    if build not in _verdicts:
        _verdicts[build] = problem = build_problem(build)
        if problem is not None and chosen == "auto" and (build / MANIFEST).is_file():
            log.warning("running the Python source of the core: %s", problem)
    problem = _verdicts[build]
    if problem is not None:
        if chosen == "compiled":
            raise CompiledCoreError(f"PRISM_CORE=compiled: {problem}")
        return False
    folder = str(build.joinpath(*package.split(".")))
    if folder not in path:
        _load_group(build)
        path.insert(0, folder)
    return True


def _load_group(build: Path) -> None:
    """mypyc's shared library holds every compiled module's code; each module's own
    extension imports it by name, so it is loaded first, by path."""
    manifest = json.loads((build / MANIFEST).read_text())
    group: str = manifest["group"]
    if group in sys.modules:
        return
    lib = build / f"{group}{manifest['suffix']}"
    spec = importlib.util.spec_from_file_location(group, lib)
    if spec is None or spec.loader is None:
        raise CompiledCoreError(f"cannot load {lib}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[group] = module
    spec.loader.exec_module(module)
