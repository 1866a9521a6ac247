"""The model client honours the standard proxy variables (issue 34): a person behind a
proxy reaches a cloud model; NO_PROXY and loopback go direct. (Web fetches and MCP keep
their own clients: chalie.web.http never reads these variables.)"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from chalie.providers.http import Proxy, proxy_from_environment
from tests.daemon_process import DaemonProcess, short_home
from tools.fake_llm.script import load_script
from tools.fake_llm.server import FakeModelServer
from tools.forward_proxy import ForwardProxy

ECHO = {"on_user": {"text": "You said: {last_user}"}}
PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    return monkeypatch


def test_the_standard_variables_choose_the_proxy(clean_env: pytest.MonkeyPatch) -> None:
    assert proxy_from_environment("https://api.example.com/v1") is None
    clean_env.setenv("HTTPS_PROXY", "http://user:p%40ss@proxy.corp:3128")
    clean_env.setenv("http_proxy", "proxy.corp:8080")
    https = proxy_from_environment("https://api.example.com/v1")
    assert https == Proxy("proxy.corp", 3128, "Basic dXNlcjpwQHNz")  # user:p@ss
    assert proxy_from_environment("http://models.lan:8000/v1") == Proxy("proxy.corp", 8080)
    # Loopback never goes through a proxy, whatever NO_PROXY says.
    for local in ("http://127.0.0.1:11434/v1", "http://localhost:1/v1", "http://[::1]:8/v1"):
        assert proxy_from_environment(local) is None
    clean_env.setenv("NO_PROXY", "example.com,.lan")
    assert proxy_from_environment("https://api.example.com/v1") is None
    assert proxy_from_environment("http://models.lan/v1") is None
    assert proxy_from_environment("https://api.openai.com/v1") is not None
    clean_env.delenv("NO_PROXY")
    clean_env.delenv("HTTPS_PROXY")
    clean_env.setenv("ALL_PROXY", "http://all.corp:1")
    assert proxy_from_environment("https://api.openai.com/v1") == Proxy("all.corp", 1)
    clean_env.setenv("ALL_PROXY", "socks5://all.corp:1")
    with pytest.raises(ValueError, match="only an http:// proxy"):
        proxy_from_environment("https://api.openai.com/v1")


@pytest.mark.slow
def test_a_model_behind_a_proxy_answers_and_no_proxy_goes_direct(
    tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    with FakeModelServer(load_script(json.dumps(ECHO))) as model:
        port = int(model.url.rsplit(":", 1)[1])
        with ForwardProxy(("127.0.0.1", port)) as proxy:
            home = short_home()
            # No resolver knows model.invalid: only the proxy can reach it.
            (home / "config.toml").write_text(
                "[mcp_server]\nport = 0\n[chat]\nport = 0\n"
                '[models.default]\nbase_url = "http://model.invalid/v1"\nmodel = "scripted"\n'
            )
            clean_env.setenv("HTTP_PROXY", f"http://who:secret@127.0.0.1:{proxy.port}")
            daemon = DaemonProcess(home, tmp_path / "daemon.log").start()
            try:
                asked = daemon.cli_process("ask", "hello")
                assert asked.stdout.strip().endswith("You said: hello"), asked
                assert "POST http://model.invalid/v1/chat/completions HTTP/1.1" in proxy.seen
                assert "GET http://model.invalid/v1/models HTTP/1.1" in proxy.seen  # the probe
                assert set(proxy.authorizations) == {"Basic d2hvOnNlY3JldA=="}
                assert "answers, and has the model" in daemon.log()
            finally:
                assert daemon.signal(signal.SIGTERM) == 0
            seen = len(proxy.seen)
            clean_env.setenv("NO_PROXY", "model.invalid")
            daemon = DaemonProcess(home, tmp_path / "daemon2.log").start()
            try:
                asked = daemon.cli_process("ask", "hello")
                assert asked.returncode == 1
                assert "model default (scripted at http://model.invalid/v1)" in asked.stderr + (
                    asked.stdout
                )
            finally:
                assert daemon.signal(signal.SIGTERM) == 0
            assert len(proxy.seen) == seen  # NO_PROXY: nothing went through it
