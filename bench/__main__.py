"""``python -m bench`` (``make bench``): every benchmark side by side, one table, one JSON file.

Example::

    .venv/bin/python -m bench --quick
    .venv/bin/python -m bench --only pipeline --events 100000 --rate 8000 --json /tmp/b.json
"""

from __future__ import annotations

import signal
import sys

from bench._harness import main


def _terminate(signum: int, _frame: object) -> None:
    # SIGTERM unwinds like Ctrl-C, so the broker and the worker subprocesses are stopped.
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminate)
    sys.exit(main())
