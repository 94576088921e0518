"""The image's compiled core, its build step replayed outside Docker (no engine runs here).

The Dockerfile installs the project, then compiles the core into the installed package
with ``python -m prism.devstack.compile`` run against the install's ``purelib``, and runs
with ``PRISM_CORE=compiled``. Here the project's wheel is unpacked as an install (a
``site`` folder first on ``PYTHONPATH``, this interpreter's packages behind it), compiled
the same way, and a fleet is stepped through the core on both builds of that install:
the compiled one must load from the install's own build and give the same outputs, byte
for byte, as the source.
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.fixtures.wheel import project_wheel, run_ok

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


STEP = """
import hashlib, json, sys
import prism.pipeline.core as core, prism.schemas as schemas
from prism.pipeline.core import CoreConfig, InRecord, Intake
from prism.runtime.simulator import FleetConfig, simulate

fleet = simulate(FleetConfig(runs=150, seed=3))
values = [r.value for r in fleet.records if r.family == "agent"]
values[100:100] = [b"not json", b"{}", b'{"type": "agent_started"}', None]  # dead letters
intake = Intake(CoreConfig(grace_period_s=5))
digest = hashlib.sha256()
records = [InRecord(v, "prism.agent-events", 0, i) for i, v in enumerate(values)]
for start in range(0, len(records), 97):
    out = intake.step(0, records[start:start + 97], now=1_800_000_000.0 + start)
    intake.commit(0)
    digest.update(repr((out.ledger, out.closed, out.quarantined, out.dlq, out.limit_deaths,
                        sorted(out.state_writes.items()), sorted(out.stats.items()))).encode())
out = intake.finalize(1_900_000_000.0)
digest.update(repr((out.ledger, out.closed, sorted(out.stats.items()))).encode())
print(json.dumps({
    "digest": digest.hexdigest(), "events": len(records),
    "compiled": [core.COMPILED, schemas.COMPILED],
    "files": [sys.modules[m].__file__ for m in
              ("prism.pipeline.core._processor", "prism.schemas._fast", "prism.schemas")],
}))
"""


def test_the_installed_package_compiled_as_the_image_does_steps_as_the_source(
    tmp_path: Path,
) -> None:
    wheel = project_wheel(tmp_path / "dist")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    env = {k: v for k, v in os.environ.items() if k != "PRISM_CORE"}
    env["PYTHONPATH"] = str(site)  # the image: the install's purelib
    # The order rows come out in within a step follows set iteration, so the hash seed:
    # one seed for both builds, whose outputs then compare byte for byte.
    env["PYTHONHASHSEED"] = "0"
    run_ok([sys.executable, "-m", "prism.devstack.compile"], cwd=str(tmp_path), env=env)
    build = site / "prism" / "build" / "mypyc"
    assert (build / "manifest.json").is_file(), "the compile did not build into the install"

    runs = {}
    for mode in ("compiled", "pure"):
        out = run_ok(
            [sys.executable, "-c", STEP], cwd=str(tmp_path), env={**env, "PRISM_CORE": mode}
        )
        runs[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    compiled, pure = runs["compiled"], runs["pure"]
    assert compiled["events"] > 1000
    assert compiled["compiled"] == [True, True] and pure["compiled"] == [False, False]
    suffix = str(sysconfig.get_config_var("EXT_SUFFIX"))
    processor, fast, package = (Path(f) for f in compiled["files"])
    assert processor.is_relative_to(build) and processor.name == f"_processor{suffix}"
    assert fast.is_relative_to(build) and fast.name == f"_fast{suffix}"
    assert package.is_relative_to(site / "prism")  # the install's own package, not the checkout
    assert all(Path(f).is_relative_to(site / "prism") and f.endswith(".py") for f in pure["files"])
    assert compiled["digest"] == pure["digest"]
