"""A quick look at a configured model: does its server answer, and does it have the model?

The daemon probes each ``[models.NAME]`` once at start (``chalie run`` prints
the verdicts). A probe is one ``GET`` of the server's model list (OpenAI
``/models``, Ollama ``/api/tags``, Anthropic ``/v1/models``), with the key the
configuration names and through the proxy a model request would use, within
a few seconds. It never sends a prompt and costs no tokens.

Verdicts (:class:`Probe`): ``ok`` (the model is listed), ``answers`` (the
server answered but its list could not tell), ``missing`` (the list lacks the
model), ``refused`` (HTTP 401/403 or another error status), ``down`` (no
connection, or no answer in time). Each carries the one sentence to show and,
unless ``ok``, the next step (:func:`chalie.providers.client.next_step`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec

from chalie.process.config import ModelConfig
from chalie.providers.client import ModelClient, next_step
from chalie.providers.http import HttpError
from chalie.providers.types import ProviderError

Verdict = Literal["ok", "answers", "missing", "refused", "down"]
PROBE_SECONDS: Final = 3.0
MAX_LIST: Final = 4 * 1024 * 1024
# Where each wire format's server lists its models (under the configured base URL).
LIST_PATHS: Final = {"openai": "/models", "ollama": "/api/tags", "anthropic": "/v1/models"}


@dataclass(frozen=True)
class Probe:
    name: str
    config: ModelConfig
    verdict: Verdict
    detail: str  # what was seen, one clause
    next_step: str | None = None

    @property
    def line(self) -> str:
        """``model NAME: MODEL at URL (provider): detail[; next: step]``."""
        cfg = self.config
        head = f"model {self.name}: {cfg.model} at {cfg.base_url} ({cfg.provider}): {self.detail}"
        return head if self.next_step is None else f"{head}; next: {self.next_step}"


def listed(provider: str, data: Any) -> set[str] | None:
    """The model names a list answer holds; None when it is not a list we know."""
    if not isinstance(data, dict):
        return None
    items = data.get("models" if provider == "ollama" else "data")
    if not isinstance(items, list):
        return None
    names: set[str] = set()
    for item in items:
        if isinstance(item, dict):
            for key in ("id", "name", "model"):
                value = item.get(key)
                if isinstance(value, str):
                    names.add(value)
    return names


def _has(names: set[str], model: str) -> bool:
    # Ollama lists "llama3.1:latest" for a model asked for as "llama3.1".
    return model in names or f"{model}:latest" in names or model.removesuffix(":latest") in names


async def probe(name: str, config: ModelConfig, seconds: float = PROBE_SECONDS) -> Probe:
    """The verdict on ``[models.NAME]``; never raises (a failure is a verdict)."""
    client = ModelClient(name, config)
    try:
        return await _probe(client, seconds)
    finally:
        await client.aclose()


async def _probe(client: ModelClient, seconds: float) -> Probe:
    name, cfg = client.name, client.config

    def verdict(kind: Verdict, detail: str, error: ProviderError | None = None) -> Probe:
        step = None if error is None else next_step(name, cfg, error)
        return Probe(name, cfg, kind, detail, step)

    try:
        async with asyncio.timeout(seconds):
            http = client.http()
            headers = client.wire.headers(client.api_key())
            async with http.get(LIST_PATHS[cfg.provider], headers) as response:
                status = response.status
                body = await response.read(MAX_LIST) if status < 300 else b""
    except ProviderError as exc:
        return verdict("down", exc.message, exc)
    except TimeoutError:
        err = ProviderError("model-unreachable", "no answer", retryable=True)
        return verdict("down", f"no answer within {seconds:g} s", err)
    except HttpError as exc:
        err = ProviderError("model-unreachable", str(exc), retryable=True)
        return verdict("down", f"not answering ({exc})", err)
    if status in (401, 403):
        err = ProviderError("model-rejected", "", retryable=False, status=status)
        return verdict("refused", f"answers, but refuses the key (HTTP {status})", err)
    if status >= 300:
        return verdict("answers", f"answers (HTTP {status} for its model list; not checked)")
    try:
        names = listed(cfg.provider, msgspec.json.decode(body))
    except msgspec.DecodeError:
        names = None
    if names is None:
        return verdict("answers", "answers (its model list was not readable; not checked)")
    if _has(names, cfg.model):
        return verdict("ok", "answers, and has the model")
    err = ProviderError("model-rejected", "", retryable=False, status=404)
    shown = ", ".join(sorted(names)[:5]) or "none"
    return verdict("missing", f"answers, but does not list {cfg.model} (it lists: {shown})", err)


async def probe_all(models: dict[str, ModelConfig], seconds: float = PROBE_SECONDS) -> list[Probe]:
    """Every configured model probed at once, in name order."""
    names = sorted(models)
    return list(await asyncio.gather(*(probe(n, models[n], seconds) for n in names)))
