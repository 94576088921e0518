"""Each package's public surface: ``__all__`` is complete, resolvable, and free of internals.

Add a package to ``PACKAGES`` once its ``__init__`` lists its public names.
"""

from __future__ import annotations

import importlib
import types

import pytest

PACKAGES = [
    "schemas",
    "runtime",
    "prism.runtime.simulator",
    "sinks",
    "dashboards",
    "prism.pipeline.core",
    "prism.pipeline.worker",
    "prism.pipeline.replay",
    "prism.pipeline.report",
    "prism.pipeline.budgets",
    "prism.pipeline.traces",
]


@pytest.fixture(params=PACKAGES)
def package(request: pytest.FixtureRequest) -> types.ModuleType:
    return importlib.import_module(request.param)


def test_every_exported_name_exists(package: types.ModuleType) -> None:
    missing = [name for name in package.__all__ if not hasattr(package, name)]
    assert missing == []


def test_exports_have_no_duplicates(package: types.ModuleType) -> None:
    assert len(set(package.__all__)) == len(package.__all__)


def test_no_private_names_or_modules_are_exported(package: types.ModuleType) -> None:
    private = [name for name in package.__all__ if name.startswith("_")]
    modules = [
        name
        for name in package.__all__
        if isinstance(getattr(package, name, None), types.ModuleType)
    ]
    assert (private, modules) == ([], [])


def test_every_public_name_of_the_package_is_exported(package: types.ModuleType) -> None:
    public = {
        name
        for name, value in vars(package).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert sorted(public - set(package.__all__)) == []
