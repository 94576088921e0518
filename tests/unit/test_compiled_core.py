"""The mypyc build of the core is used only when it matches the sources (schemas/_compiled.py).

``make test`` runs the unit tests twice, ``PRISM_CORE=pure`` then ``PRISM_CORE=compiled``
after ``make compile``; the last test here proves which build each pass ran.
"""

from __future__ import annotations

import importlib
import json
import os
import sysconfig
from pathlib import Path

import pytest

from prism.pipeline import core
from prism.schemas import _compiled
from prism.schemas._compiled import (
    BUILD_DIR,
    MANIFEST,
    CompiledCoreError,
    build_problem,
    source_digest,
    use_compiled,
)

SUFFIX = str(sysconfig.get_config_var("EXT_SUFFIX"))


def _build(tmp_path: Path, source: bytes = b"X = 1\n", **manifest: object) -> Path:
    """A build folder whose manifest names one module compiled from ``src/_mod.py``."""
    src = tmp_path / "src" / "_mod.py"
    src.parent.mkdir(parents=True)
    src.write_bytes(source)
    build = tmp_path / "build"
    build.mkdir()
    entry = {"source": "../src/_mod.py", "sha256": source_digest(src)}
    body = {"group": "g__mypyc", "suffix": SUFFIX, "modules": {"pkg._mod": entry}} | manifest
    (build / MANIFEST).write_text(json.dumps(body))
    return build


def test_a_build_matching_its_sources_has_no_problem(tmp_path: Path) -> None:
    assert build_problem(_build(tmp_path)) is None


def test_an_edited_source_makes_the_build_stale_and_names_the_module(tmp_path: Path) -> None:
    build = _build(tmp_path)
    (tmp_path / "src" / "_mod.py").write_bytes(b"X = 2\n")
    assert "pkg._mod changed since it was compiled" in str(build_problem(build))


def test_a_missing_build_a_lost_source_or_another_interpreter_is_a_problem(
    tmp_path: Path,
) -> None:
    assert "no compiled build" in str(build_problem(tmp_path / "nothing"))
    build = _build(tmp_path)
    (tmp_path / "src" / "_mod.py").unlink()
    assert "which is gone" in str(build_problem(build))
    other = _build(tmp_path / "b", suffix=".cpython-39-x86_64-linux-gnu.so")
    assert "is for .cpython-39" in str(build_problem(other))
    (other / MANIFEST).write_text("{")
    assert "unreadable" in str(build_problem(other))


def test_prism_core_chooses_and_a_stale_build_is_never_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build = _build(tmp_path)
    (tmp_path / "src" / "_mod.py").write_bytes(b"X = 2\n")
    path = ["/src"]
    monkeypatch.setenv("PRISM_CORE", "compiled")
    with pytest.raises(CompiledCoreError, match=r"PRISM_CORE=compiled: pkg\._mod changed"):
        use_compiled(path, "pkg", build)
    monkeypatch.setenv("PRISM_CORE", "auto")
    assert use_compiled(path, "pkg", build) is False
    monkeypatch.setenv("PRISM_CORE", "pure")
    assert use_compiled(path, "pkg", _build(tmp_path / "fresh")) is False
    assert path == ["/src"]
    monkeypatch.setenv("PRISM_CORE", "fast")
    with pytest.raises(
        ValueError, match=r"PRISM_CORE=.fast.: expected one of auto, compiled, pure"
    ):
        _compiled.mode()


def _from_extension(module: object) -> bool:
    """Whether ``module`` was loaded from a compiled build (an extension module)."""
    return str(getattr(module, "__file__", "")).endswith(SUFFIX)


def test_this_process_runs_the_build_prism_core_asked_for() -> None:
    """The compiled pass of ``make test`` runs every compiled module from its extension; the
    pure pass runs none; ``auto`` runs the build exactly when it is current."""
    asked = _compiled.mode()
    current = build_problem(BUILD_DIR) is None
    expected = {"compiled": True, "pure": False, "auto": current}[asked]
    assert core.COMPILED is expected
    modules = json.loads((BUILD_DIR / MANIFEST).read_text())["modules"] if current else {}
    for name in modules or ["prism.pipeline.core._run", "prism.schemas._fast"]:
        module = importlib.import_module(name)
        assert _from_extension(module) is expected, (name, module.__file__, asked)
    if os.environ.get("PRISM_CORE") == "compiled":
        assert len(modules) >= 14  # the whole core and the fast parser
