"""A benchmark run against another checkout's daemon code (``--code DIR``): the figures
before a change, in the same run, with this checkout's scripts, prompts and judges."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Final

HERE: Final = Path(__file__).resolve().parents[2]
CODE_PACKAGES: Final = ("chalie", "actors", "abilities", "chalie_app")
CODE_ENV: Final = "BENCH_CODE"


def running_other_code() -> str | None:
    """The checkout this process runs the daemon's code from (None: this one)."""
    return os.environ.get(CODE_ENV)


def reexec_with(script: Path, code: Path, argv: list[str]) -> int:
    """Run ``script`` again with the daemon's packages from ``code`` and tools/ from here.

    A daemon started from such a process must not run with a checkout as its current
    folder: ``python -m`` puts that folder first on the import path.
    """
    root = Path(tempfile.mkdtemp(prefix="bench-code-"))
    for name in CODE_PACKAGES:
        (root / name).symlink_to(code / name)
    (root / "tools").symlink_to(HERE / "tools")
    env = {**os.environ, "PYTHONPATH": str(root), CODE_ENV: str(code)}
    rest = [a for a in argv if a != "--code" and a != str(code)]
    return subprocess.call([sys.executable, str(script), *rest], env=env)
