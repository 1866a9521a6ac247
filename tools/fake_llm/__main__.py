"""``python -m tools.fake_llm SCRIPT [--port N] [--config FILE] [--detach --pid-file FILE]``.

Serves a script until interrupted. ``--config`` appends a ``[models.default]`` section
naming this server to a ``config.toml`` (its folder is created, 0700, as Chalie's data
directory would be), once the port is known; ``--detach`` serves in the background and
returns only when the server listens, so the next command may use it at once.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import msgspec

from tools.fake_llm.script import load_script
from tools.fake_llm.server import MODEL_NAME, FakeModelServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.fake_llm", description=__doc__)
    parser.add_argument("script", help="a JSON script file (see tools/fake_llm/script.py)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--config", help="append [models.default] naming this server here")
    parser.add_argument("--detach", action="store_true", help="serve in the background")
    parser.add_argument("--pid-file", help="with --detach: write the server's pid here")
    args = parser.parse_args(argv)
    try:
        script = load_script(Path(args.script).read_bytes())
    except (OSError, msgspec.DecodeError) as exc:
        print(f"fake_llm: cannot use {args.script}: {exc}", file=sys.stderr)
        return 1
    server = FakeModelServer(script, host=args.host, port=args.port)  # bound, not serving
    print(f"scripted model listening on {server.url}", flush=True)
    if args.config:
        config = Path(args.config)
        config.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with config.open("a") as out:
            out.write(f'\n[models.default]\nbase_url = "{server.url}/v1"\nmodel = "{MODEL_NAME}"\n')
        print(f"  [models.default] written to {config}", flush=True)
    else:
        print(f'  openai:    base_url = "{server.url}/v1"', flush=True)
        print(f'  ollama:    base_url = "{server.url}"', flush=True)
        print(f'  anthropic: base_url = "{server.url}"', flush=True)
    if args.detach:
        pid = os.fork()
        if pid:
            if args.pid_file:
                Path(args.pid_file).write_text(f"{pid}\n")
            print(f"  serving in the background (pid {pid})", flush=True)
            return 0
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
