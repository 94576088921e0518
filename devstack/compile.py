"""Compile the run-semantics core and the fast parser with mypyc (``make compile``).

The modules in ``MODULES`` are built into ``build/mypyc/`` beside the packages, with a
manifest of the source digests they were built from; ``prism.schemas._compiled`` uses
the build only while every digest still matches (``PRISM_CORE``: auto, compiled, pure).
The sources stay the one truth: the same tests run on both builds (``make test``).

Needs a C compiler and the interpreter's headers; about a minute on two cores.

    python -m prism.devstack.compile            # build, replacing any earlier build
    python -m prism.devstack.compile --check    # exit 1 unless the build matches the sources
    PRISM_CORE=pure prism-pipeline worker       # run the Python source all the same
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from prism.schemas._compiled import BUILD_DIR, MANIFEST, build_problem, source_digest

ROOT = BUILD_DIR.parent.parent  # the checkout: pipeline/, schemas/, ...
GROUP = "prism_core"  # mypyc's shared library: prism_core__mypyc<suffix>
# What the step spends its time in (bench/README.md): every module of the core, and the
# parser that feeds it. Not the package __init__s: they choose the build.
MODULES = (
    *(
        f"prism.pipeline.core.{p.stem}"
        for p in sorted((ROOT / "pipeline" / "core").glob("_*.py"))
        if p.stem != "__init__"
    ),
    "prism.schemas._fast",
)

_SETUP = """\
import sys
from setuptools import setup
from mypyc.build import mypycify
paths = sys.argv[1:]
setup(
    name="prism-core-compiled",
    ext_modules=mypycify(
        ["--explicit-package-bases", "--namespace-packages", "--ignore-missing-imports", *paths],
        opt_level="3",
        group_name={group!r},
    ),
    script_args=["build_ext", "--build-lib", "out", "--build-temp", "tmp"],
)
"""


def source_of(module: str) -> Path:
    """``prism.pipeline.core._run`` -> ``<checkout>/pipeline/core/_run.py``."""
    return ROOT.joinpath(*module.split(".")[1:]).with_suffix(".py")


def build(out: Path = BUILD_DIR, modules: Sequence[str] = MODULES, verbose: bool = False) -> Path:
    """Compile ``modules`` into ``out`` (replaced whole when the build succeeds)."""
    digests = {m: source_digest(source_of(m)) for m in modules}
    with tempfile.TemporaryDirectory(prefix="prism-mypyc-") as tmp:
        work = Path(tmp)
        # mypy names a module by its path: the packages under their installed names.
        tree = work / "prism"
        tree.mkdir()
        for top in sorted({m.split(".")[1] for m in modules}):
            (tree / top).symlink_to(ROOT / top, target_is_directory=True)
        (work / "setup_mypyc.py").write_text(_SETUP.format(group=GROUP))
        paths = [str(Path(*m.split("."))) + ".py" for m in modules]
        done = subprocess.run(
            [sys.executable, "setup_mypyc.py", *paths],
            cwd=work,
            env={**os.environ, "MYPYPATH": str(work)},
            capture_output=not verbose,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            tail = "" if verbose else (done.stdout + done.stderr)[-4000:]
            raise RuntimeError(f"mypyc failed (exit {done.returncode}):\n{tail}")
        built = work / "out"
        suffix = str(sysconfig.get_config_var("EXT_SUFFIX"))
        manifest = {
            "group": f"{GROUP}__mypyc",
            "suffix": suffix,
            "modules": {
                m: {"source": os.path.relpath(source_of(m), out), "sha256": digests[m]}
                for m in modules
            },
        }
        for m in modules:
            if not Path(built.joinpath(*m.split(".")).as_posix() + suffix).is_file():
                raise RuntimeError(f"mypyc built no extension for {m}")
        (built / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        out.parent.mkdir(parents=True, exist_ok=True)
        old = out.with_name(out.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if out.exists():
            out.rename(old)
        shutil.move(str(built), out)
        shutil.rmtree(old, ignore_errors=True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m prism.devstack.compile",
        description=__doc__.split("\n\n")[0],
        epilog="examples:\n  python -m prism.devstack.compile\n"
        "  python -m prism.devstack.compile --check\n"
        "  PRISM_CORE=compiled pytest tests/unit   # fails unless the build is current",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, default=BUILD_DIR, help="build folder (%(default)s)")
    parser.add_argument(
        "--check", action="store_true", help="only say whether the build is current"
    )
    parser.add_argument(
        "--verbose", action="store_true", help="show mypyc's and the compiler's output"
    )
    args = parser.parse_args(argv)
    if args.check:
        problem = build_problem(args.out)
        print(problem or f"the build at {args.out} matches the sources")
        return 1 if problem else 0
    print(
        f"compiling {len(MODULES)} modules with mypyc into {args.out} (about a minute)", flush=True
    )
    started = time.monotonic()
    try:
        build(args.out, verbose=args.verbose)
    except (RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    problem = build_problem(args.out)
    if problem:  # a source changed while it compiled
        print(f"error: {problem}", file=sys.stderr)
        return 1
    print(f"built in {time.monotonic() - started:.0f} s; PRISM_CORE=auto (the default) uses it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
