"""Operating the index: rebuild through a running daemon, the offline path's lock, its state in
status, corrupt files on the command line, and log lines that name what they index."""

from __future__ import annotations

import json
import logging
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest
from click.testing import CliRunner

from actors.discovery import DiscoveryActor, DiscoveryHandle, index_dirs
from chalie.calls.registry import Registry
from chalie.discovery.embedder import Embedder, load_embedder
from chalie.discovery.engine import MANIFEST, DiscoveryEngine
from chalie.discovery.state import IndexState, describe
from chalie.discovery.types import ToolDoc
from chalie.process.daemon import instance_lock
from chalie_app.cli import cli
from tests.daemon_process import DaemonProcess, short_home
from tools.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return load_embedder()


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry.collect(entry_points=False)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    home = short_home()
    d = DaemonProcess(home, tmp_path / "daemon.log").start()
    yield d
    try:
        d.signal(signal.SIGTERM)
    finally:
        d.kill()
        shutil.rmtree(home, ignore_errors=True)


def generation(home: Path) -> str:
    tools_dir, _ = index_dirs(home)
    return str(json.loads((tools_dir / MANIFEST).read_text())["generation"])


def test_index_rebuild_beside_a_running_daemon_is_done_by_the_daemon(
    daemon: DaemonProcess,
) -> None:
    wait_until(lambda: "discovery index: ready" in daemon.cli("status").stdout, 60)
    before = generation(daemon.home)
    out = daemon.cli_process("index", "rebuild")
    assert out.returncode == 0, out.stderr
    assert "the daemon indexed" in out.stdout
    after = generation(daemon.home)
    assert after != before
    tools_dir, _ = index_dirs(daemon.home)
    assert sorted(p.name for p in tools_dir.glob("gen-*")) == [after]
    # the daemon serves the new generation: a find through it works, status says so
    found = daemon.cli("tools", "call", "find_tools", 'query=["clock"]', input="")
    assert found.stdout.startswith("[find_tools(status=success, injected=1"), found.stdout
    status = json.loads(daemon.cli("status", "--json").stdout)
    assert status["discovery"]["state"] == "ready"
    assert status["discovery"]["rebuild"]["phase"] == "done"
    assert "discovery index: ready" in daemon.cli("status").stdout
    # learned examples go through the daemon while it runs (its index follows them)
    listed = daemon.cli("discovery", "examples", "list")
    assert listed.returncode == 0 and "no learned examples" in listed.stdout
    forgot = daemon.cli("discovery", "examples", "forget", "clock")
    assert forgot.returncode == 0 and "forgot 0 examples" in forgot.stdout


def test_the_offline_rebuild_is_refused_while_another_process_holds_the_lock() -> None:
    home = short_home()
    try:
        with instance_lock(home):
            result = CliRunner().invoke(cli, ["--home", str(home), "index", "rebuild"])
        assert result.exit_code == 1
        assert "holds the lock" in result.output
        assert "Traceback" not in result.output
        assert not (home / "index" / "tools" / MANIFEST).exists()
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_a_corrupt_generation_is_one_line_and_exit_1(tmp_path: Path) -> None:
    runner = CliRunner()
    env = {"CHALIE_HOME": str(tmp_path)}
    assert runner.invoke(cli, ["index", "rebuild"], env=env).exit_code == 0
    tools_dir, _ = index_dirs(tmp_path)
    (tools_dir / generation(tmp_path) / "vectors-0" / "vectors.json").write_text("garbage")
    result = runner.invoke(cli, ["tools", "find", "clock"], env=env)
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    assert [line for line in result.stderr.splitlines() if line.strip()] == [
        line for line in result.stderr.splitlines() if line.startswith("Error: discovery index")
    ]
    assert "chalie index rebuild" in result.stderr


def test_a_corrupt_manifest_is_searched_in_memory_with_a_warning(tmp_path: Path) -> None:
    runner = CliRunner()
    env = {"CHALIE_HOME": str(tmp_path)}
    assert runner.invoke(cli, ["index", "rebuild"], env=env).exit_code == 0
    tools_dir, _ = index_dirs(tmp_path)
    (tools_dir / MANIFEST).write_text('{"format": 1')
    result = runner.invoke(cli, ["tools", "find", "--json", "clock"], env=env)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["injected"][0]["name"] == "clock"
    assert result.stderr.startswith("warning: not using the index in")
    assert "manifest.json is unreadable" in result.stderr


def test_status_shows_a_failed_index_not_just_a_running_actor(
    tmp_path: Path, registry: Registry, embedder: Embedder
) -> None:
    tools_dir, _ = index_dirs(tmp_path)
    tools_dir.parent.mkdir(parents=True)
    tools_dir.write_text("this should be a directory")
    state = IndexState()
    ref = DiscoveryActor.start(registry=registry, home=tmp_path, embedder=embedder, state=state)
    try:
        handle = DiscoveryHandle(ref, state=state)
        assert handle.status()["ready"] is False  # orders the mailbox: on_start has run
        snap = handle.snapshot()
        assert snap["state"] == "failed" and snap["error"]
        assert describe(snap).startswith("discovery index: FAILED")
    finally:
        ref.stop()


class GatedEmbedder:
    """The real embedder, held at its second batch until the test lets it go on."""

    def __init__(self, inner: Embedder) -> None:
        self.inner, self.model_id, self.dim = inner, inner.model_id, inner.dim
        self.calls = 0
        self.held = threading.Event()
        self.go = threading.Event()

    def embed(self, texts: Any) -> Any:
        self.calls += 1
        if self.calls == 2:
            self.held.set()
            assert self.go.wait(30), "the test never let the build go on"
        return self.inner.embed(texts)


def test_a_stop_during_the_first_build_ends_the_build_between_batches(
    tmp_path: Path, embedder: Embedder
) -> None:
    from actors.process.supervisor import Supervisor
    from chalie.discovery.engine import BUILD_BATCH
    from chalie.process.supervision import ChildSpec

    docs = [
        ToolDoc(name=f"tool_{i}", summary=f"does thing number {i}", examples=(f"do {i}",))
        for i in range(BUILD_BATCH * 4)
    ]
    gated = GatedEmbedder(embedder)
    spec = ChildSpec(
        "discovery",
        lambda: DiscoveryActor.start(docs=docs, home=tmp_path, embedder=gated),
        shutdown=30.0,
    )
    tree = Supervisor.start([spec])
    assert gated.held.wait(60), "the build never reached its second batch"
    stopping = threading.Thread(target=tree.stop)  # waits for the child, as a daemon's stop does
    stopping.start()
    (child,) = [t for t in pykka.ActorRegistry.get_by_class(DiscoveryActor)]
    wait_until(lambda: child.actor_inbox.stop_requested.is_set(), 10, what="the stop request")
    gated.go.set()
    stopping.join(30)
    assert not stopping.is_alive() and not child.is_alive()
    # the batches after the request were never embedded, and nothing half-built is on disk
    assert gated.calls < 4
    tools_dir, _ = index_dirs(tmp_path)
    assert not (tools_dir / MANIFEST).exists()
    # the next start builds the whole index
    again = DiscoveryActor.start(docs=docs[:3], home=tmp_path, embedder=embedder)
    try:
        assert DiscoveryHandle(again).find(["do 2"]).names[0] == "tool_2"
    finally:
        again.stop()


def test_a_rebuild_job_reports_progress_and_a_second_start_follows_the_first(
    tmp_path: Path, registry: Registry, embedder: Embedder
) -> None:
    state = IndexState()
    ref = DiscoveryActor.start(registry=registry, home=tmp_path, embedder=embedder, state=state)
    try:
        handle = DiscoveryHandle(ref, state=state)
        first = handle.start_rebuild(reuse=False)
        second = handle.start_rebuild(reuse=False)
        assert first["started"] is True
        # the rebuild embeds every tool and skill anew: it is still running a moment later
        assert second["job_id"] == first["job_id"] and second["started"] is False
        done = wait_until(lambda: (state.job() or {}).get("phase") == "done" and state.job(), 60)
        assert done["total"] == done["done"] == done["tools"]
        assert done["error"] is None and done["tools"] >= 2 and done["skills"] >= 1
        assert handle.snapshot()["state"] == "ready"
    finally:
        ref.stop()


def test_a_rebuild_for_a_stopped_actor_fails_its_job_at_once(
    tmp_path: Path, registry: Registry, embedder: Embedder
) -> None:
    ref = DiscoveryActor.start(registry=registry, home=tmp_path, embedder=embedder)
    ref.stop()
    handle = DiscoveryHandle(ref)
    job = handle.start_rebuild()
    assert job["phase"] == "failed" and "not running" in job["error"]
    assert describe(handle.snapshot()).endswith(f"(last rebuild failed: {job['error']})")


def test_state_lines_for_every_phase() -> None:
    state = IndexState()
    assert describe(state.snapshot()) == "discovery index: loading"
    state.ready(tools=3, skills=1, model_id="m", ceiling=0.8)
    assert describe(state.snapshot()).startswith("discovery index: ready  3 tools  1 skills")
    job, new = state.begin_rebuild(reuse=True)
    assert new and state.begin_rebuild(reuse=False) == (job, False)
    state.progress(job.job_id, 2, 3)
    state.progress("another-job", 9, 9)  # a stale job's progress is ignored
    assert describe(state.snapshot()) == "discovery index: rebuilding  (rebuild 2/3)"
    state.end_rebuild(job.job_id)
    assert state.job() is not None and state.job()["phase"] == "done"  # type: ignore[index]
    assert describe(None) == "discovery index: unknown"


def test_the_skills_index_logs_say_skills(
    embedder: Embedder, caplog: pytest.LogCaptureFixture
) -> None:
    docs = [ToolDoc("plan_a_trip", "Steps to plan a trip.", ("plan my holiday",))]
    with caplog.at_level(logging.INFO, logger="chalie.discovery"):
        DiscoveryEngine.build(docs, embedder, kind="skills")
    built = [r.getMessage() for r in caplog.records if "built" in r.getMessage()]
    assert built and all("1 skills" in m and "tools" not in m for m in built)


@pytest.mark.parametrize(
    ("command", "args"),
    [
        ("index.rebuild", {"start": "yes"}),
        ("index.rebuild", {"reuse": 1}),
        ("index.rebuild", {"force": True}),
        ("discovery.examples", {"action": "drop"}),
        ("discovery.examples", {"action": "forget", "id": 0}),
        ("discovery.examples", {"action": "forget", "tool": "x" * 300}),
        ("discovery.examples", {}),
    ],
)
def test_malformed_discovery_control_requests_are_invalid_args(
    command: str, args: dict[str, Any]
) -> None:
    from chalie.process import control

    commands = {
        "index.rebuild": control.IndexRebuildArgs,
        "discovery.examples": control.DiscoveryExamplesArgs,
    }
    reply = control.parse_request(control.encode_request(command, args), commands)
    assert isinstance(reply, control.ControlReply)
    assert reply.error == control.INVALID_ARGS


def test_a_find_during_the_first_build_is_answered_at_once_with_when_to_retry(
    tmp_path: Path, embedder: Embedder
) -> None:
    """Issue 34: a find_tools entry sent while the index was building waited 20 s and
    failed with discovery-index-error; it is answered at once, saying when to retry."""
    import time

    from abilities.find_skills import FindSkills
    from abilities.find_tools import FindTools
    from chalie.discovery.engine import BUILD_BATCH
    from chalie.services import Services
    from tests.abilities.test_find_abilities import call

    docs = [
        ToolDoc(name=f"tool_{i}", summary=f"does thing number {i}", examples=(f"do {i}",))
        for i in range(BUILD_BATCH * 4)
    ]
    gated = GatedEmbedder(embedder)
    state = IndexState()
    ref = DiscoveryActor.start(docs=docs, home=tmp_path, embedder=gated, state=state)
    try:
        assert gated.held.wait(60), "the build never reached its second batch"
        handle = DiscoveryHandle(ref, state=state, timeout=20.0)
        services = Services(discovery=handle)
        began = time.monotonic()
        for ability in (FindTools, FindSkills):
            result = call(ability, services, {"query": ["do 2"]})
            assert result.code == "discovery-index-building", result
            assert "still being built" in result.body and "Retry" in (result.hint or "")
            assert 2 <= result.meta["retry_after"] <= 120
        assert time.monotonic() - began < 2  # not the 20 s a find waited behind the build
    finally:
        gated.go.set()
    try:
        wait_until(lambda: state.snapshot()["state"] == "ready", 60, what="the index ready")
        assert DiscoveryHandle(ref, state=state).find(["do 2"]).names[0] == "tool_2"
    finally:
        ref.stop()
