"""Fixtures of the actor tests: the dispatcher rig (``tests/actors/rig.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.actors.rig import Rig


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path)
