"""Benchmarks: each ``bench/bench_<name>.py`` has ``run(quick: bool = False) -> list[dict]``.

Rows are ``{"bench": ..., "metric": ..., "value": float, "unit": ...}``; ``python -m bench``
runs them all and prints a table (see ``bench/__main__.py``).
"""
