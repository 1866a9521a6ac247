from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.fixture_mcp.rig import Rig


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    try:
        yield r
    finally:
        r.close()
