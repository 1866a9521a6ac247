"""A scripted language-model server for tests and development.

Run it with ``python -m tools.fake_llm SCRIPT``.
"""

from tools.fake_llm.script import Script, Step, load_script
from tools.fake_llm.server import FakeModelServer

__all__ = ["FakeModelServer", "Script", "Step", "load_script"]
