"""The suite writes Python's bytecode caches, even where ``PYTHONDONTWRITEBYTECODE`` is set.

Imported first by the root conftest, so every module imported after it (ours, the test
modules with pytest's rewritten asserts) is compiled once and read from its cache at the
next run; the daemons, workers and child interpreters the tests start inherit the
environment without the variable. Measured on this machine's image, which sets it:
compiling every module and rewriting every test's asserts again at each run was about a
third of the fast suite's time (collection 12 s instead of 5 s).
"""

from __future__ import annotations

import os
import sys

sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
