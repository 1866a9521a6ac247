"""``python -m tools.fake_llm SCRIPT [--port N]``: serve a script until interrupted."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgspec

from tools.fake_llm.script import load_script
from tools.fake_llm.server import FakeModelServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.fake_llm", description=__doc__)
    parser.add_argument("script", help="a JSON script file (see tools/fake_llm/script.py)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        script = load_script(Path(args.script).read_bytes())
    except (OSError, msgspec.DecodeError) as exc:
        print(f"fake_llm: cannot use {args.script}: {exc}", file=sys.stderr)
        return 1
    server = FakeModelServer(script, host=args.host, port=args.port)
    print(f"scripted model listening on {server.url}", flush=True)
    print(f'  openai:    base_url = "{server.url}/v1"', flush=True)
    print(f'  ollama:    base_url = "{server.url}"', flush=True)
    print(f'  anthropic: base_url = "{server.url}"', flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
