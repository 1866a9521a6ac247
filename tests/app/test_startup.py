"""A person's first minutes: ``chalie run`` says where things are and whether each model
answers, a model error names the model, its URL and the next step, and a Ctrl-C at the
terminal stops everything without a traceback (issue 34, section 1)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from chalie.process.config import ModelConfig
from chalie.providers.client import next_step
from chalie.providers.types import ProviderError
from tests.daemon_process import DaemonProcess, short_home
from tools.fake_llm.script import load_script
from tools.fake_llm.server import MODEL_NAME, FakeModelServer
from tools.waiting import wait_until

ECHO = {"on_user": {"text": "You said: {last_user}"}}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def default_port_listens() -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", 11434)) == 0


def started_lines(daemon: DaemonProcess) -> list[str]:
    text = wait_until(
        lambda: daemon.log() if "  stop: Ctrl-C here" in daemon.log() else None,
        timeout=30,
        what="the start-up lines",
    )
    return [line for line in text.splitlines() if not line.startswith("{")]


@pytest.mark.slow
def test_with_no_model_run_says_so_and_ask_names_the_model_its_url_and_the_next_step(
    tmp_path: Path,
) -> None:
    if default_port_listens():
        pytest.skip("something listens on Ollama's default port here")
    home = short_home()
    (home / "config.toml").write_text("[mcp_server]\nport = 0\n[chat]\nport = 0\n")
    daemon = DaemonProcess(home, tmp_path / "daemon.log").start()
    try:
        lines = started_lines(daemon)
        text = "\n".join(lines)
        assert lines[0].startswith(f"chalie: daemon {daemon.pid} on {home}")
        assert f"(config: {home / 'config.toml'})" in lines[0]
        assert "no model is configured (no [models.default] in config.toml)" in text
        assert (
            "model default: llama3.1 at http://127.0.0.1:11434/v1 (openai): not answering" in text
        )
        assert "next: start a model server at http://127.0.0.1:11434/v1" in text
        assert "until a model answers, turns fail" in text
        assert "brain: http://127.0.0.1:" in text and "mcp server: http://127.0.0.1:" in text
        # Said once, on the terminal: the JSON log has the probe too, as data.
        assert text.count("model default:") == 1
        probes = [r for r in daemon.log_lines() if r.get("msg") == "model probe"]
        assert [(r["model"], r["verdict"]) for r in probes] == [("default", "down")]

        asked = daemon.cli_process("ask", "hello")
        assert asked.returncode == 1
        said = asked.stdout + asked.stderr
        assert "model default (llama3.1 at http://127.0.0.1:11434/v1)" in said, said
        assert "next: start a model server at http://127.0.0.1:11434/v1" in said, said
    finally:
        assert daemon.signal(signal.SIGTERM) == 0


@pytest.mark.slow
def test_each_configured_model_gets_its_verdict_at_start(tmp_path: Path) -> None:
    home = short_home()
    with FakeModelServer(load_script(json.dumps(ECHO))) as model:
        gone = closed_port()
        (home / "config.toml").write_text(
            "[mcp_server]\nport = 0\n[chat]\nport = 0\n"
            f'[models.default]\nbase_url = "{model.url}/v1"\nmodel = "{MODEL_NAME}"\n'
            f'[models.other]\nbase_url = "{model.url}/v1"\nmodel = "nosuch"\n'
            f'[models.gone]\nprovider = "ollama"\nbase_url = "http://127.0.0.1:{gone}"\n'
        )
        daemon = DaemonProcess(home, tmp_path / "daemon.log").start()
        try:
            text = "\n".join(started_lines(daemon))
            assert (
                f"model default: {MODEL_NAME} at {model.url}/v1 (openai): "
                "answers, and has the model\n" in text
            )
            assert (
                f"model other: nosuch at {model.url}/v1 (openai): answers, but does not list "
                f"nosuch (it lists: {MODEL_NAME}); next: check [models.other] model = 'nosuch'"
            ) in text
            assert (
                f"model gone: llama3.1 at http://127.0.0.1:{gone} (ollama): not answering" in text
            )
            assert "no model is configured" not in text
            assert daemon.cli_process("ask", "hello").stdout.strip().endswith("You said: hello")
        finally:
            assert daemon.signal(signal.SIGTERM) == 0


@pytest.mark.slow
def test_ctrl_c_at_the_terminal_stops_the_daemon_and_its_workers_without_a_traceback(
    tmp_path: Path,
) -> None:
    home = short_home()
    (home / "config.toml").write_text("[mcp_server]\nport = 0\n[chat]\nport = 0\n")
    log_path = tmp_path / "daemon.log"
    daemon = DaemonProcess(home, log_path)
    env = {**os.environ, "CHALIE_HOME": str(home)}
    with open(log_path, "ab") as out:
        # A terminal's foreground job: its own process group, as a shell makes it.
        daemon.proc = subprocess.Popen(
            [sys.executable, "-m", "chalie", "--home", str(home), "run"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            env=env,
            process_group=0,
        )
    try:
        from tests.slow import require_slow

        require_slow("a daemon process")
        daemon.wait_ready()
        workers = wait_until(
            lambda: [
                w["pid"]
                for w in (daemon.status()["workers"] or {}).get("workers", [])  # type: ignore[union-attr]
                if w.get("state") == "idle"
            ],
            timeout=30,
            what="ready workers",
        )
        assert workers
        os.killpg(daemon.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
        assert daemon.wait(60) == 0
    finally:
        daemon.kill()
    log = daemon.log()
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log
    assert "received SIGINT; stopping" in log
    for pid in workers:
        assert (
            not os.path.exists(f"/proc/{pid}")
            or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
        )


def test_the_next_step_fits_what_went_wrong() -> None:
    cfg = ModelConfig(provider="ollama", model="qwen3:4b", api_key_env="MY_KEY")

    def step(code: str, status: int | None = None) -> str:
        return next_step("default", cfg, ProviderError(code, "", retryable=False, status=status))

    assert step("model-rejected", 401) == "check the key in $MY_KEY ([models.default] api_key_env)"
    assert "ollama pull qwen3:4b" in step("model-rejected", 404)
    assert "provider = 'ollama'" in step("model-bad-response")
    assert "overloaded" in step("model-unreachable", 503)
    assert step("model-unreachable").startswith("start a model server at http://127.0.0.1:11434")
    keyless = ModelConfig()
    assert "set [models.x] api_key_env" in next_step(
        "x", keyless, ProviderError("model-rejected", "", retryable=False, status=403)
    )
