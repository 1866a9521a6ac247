"""DiscoveryEngine lifecycle: persistence and reuse, rebuild on change, atomic builds,
incremental updates, and corrupt indexes surfacing as IndexCorruptError."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from chalie.calls.registry import Registry
from chalie.discovery import engine as engine_module
from chalie.discovery.embedder import Embedder, Matrix, load_embedder
from chalie.discovery.engine import MANIFEST, DiscoveryEngine, read_manifest, registry_docs
from chalie.discovery.types import IndexCorruptError, ToolDoc

# Starts processes, loads a model or builds indexes: deselect with -m "not slow".
pytestmark = pytest.mark.slow

DOCS = [
    ToolDoc(
        "get_weather",
        "Current weather conditions and the forecast for a city.",
        ("what's the weather in Paris", "is it raining in Seattle"),
        "Weather",
        "builtin",
    ),
    ToolDoc(
        "send_email",
        "Sends an email message to one or more recipients.",
        ("email Bob the report", "write to the team that I'm late"),
        "Send email",
        "builtin",
    ),
    ToolDoc(
        "currency_convert",
        "Converts an amount of money from one currency to another.",
        ("how many euros is 100 dollars", "convert 5000 yen to pounds"),
        "Currency",
        "builtin",
    ),
]
MORE = [
    ToolDoc(
        "_mcp_tracker_create_ticket",
        "Opens a new ticket in the bug tracker with a title and a description.",
        ("file a bug about the login page", "report this crash to the developers"),
        "New ticket",
        "mcp:tracker",
    ),
    ToolDoc(
        "_mcp_tracker_close_ticket",
        "Closes an existing ticket in the bug tracker.",
        ("mark the bug as fixed", "close issue 42"),
        "Close ticket",
        "mcp:tracker",
    ),
]


class RenamedModel:
    """The real embedder under another model id: what a model upgrade looks like to the index."""

    def __init__(self, inner: Embedder, model_id: str) -> None:
        self.inner, self.model_id, self.dim = inner, model_id, inner.dim

    def embed(self, texts: Sequence[str]) -> Matrix:
        return self.inner.embed(texts)


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return load_embedder()


@pytest.fixture
def built(tmp_path: Path, embedder: Embedder) -> tuple[Path, DiscoveryEngine]:
    directory = tmp_path / "index"
    return directory, DiscoveryEngine.build(DOCS, embedder, directory=directory)


def manifest(directory: Path) -> dict[str, object]:
    return dict(read_manifest(directory))


def test_a_build_persists_the_manifest_with_model_hash_and_ceiling(
    built: tuple[Path, DiscoveryEngine], embedder: Embedder
) -> None:
    directory, engine = built
    m = manifest(directory)
    assert m["model_id"] == embedder.model_id
    assert m["catalogue_hash"] == engine.catalogue_hash
    assert m["ceiling"] == engine.ceiling
    assert m["count"] == 3
    gen = directory / str(m["generation"])
    assert (gen / "names" / "meta.json").is_file()
    assert (gen / str(m["vectors"])).is_dir()
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700


def test_an_unchanged_catalogue_reuses_the_persisted_index(
    built: tuple[Path, DiscoveryEngine], embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory, _ = built
    before = manifest(directory)

    def no_build(*args: object, **kwargs: object) -> DiscoveryEngine:
        raise AssertionError("rebuilt an index that was current")

    monkeypatch.setattr(DiscoveryEngine, "build", no_build)
    reopened = DiscoveryEngine.open_or_build(directory, list(reversed(DOCS)), embedder)
    assert manifest(directory) == before
    assert reopened.find(["is it going to snow in Oslo"]).names[0] == "get_weather"


def test_a_changed_catalogue_is_rebuilt(
    built: tuple[Path, DiscoveryEngine], embedder: Embedder
) -> None:
    directory, _ = built
    before = manifest(directory)
    edited = [
        *DOCS[:2],
        ToolDoc("currency_convert", "Converts money between currencies.", (), "", "builtin"),
    ]
    engine = DiscoveryEngine.open_or_build(directory, edited, embedder)
    after = manifest(directory)
    assert after["generation"] != before["generation"]
    assert engine.get("currency_convert") == edited[2]
    # the old generation is gone, only the new one remains
    assert sorted(p.name for p in directory.iterdir() if p.name.startswith("gen-")) == [
        after["generation"]
    ]


def test_a_changed_model_is_rebuilt(
    built: tuple[Path, DiscoveryEngine], embedder: Embedder
) -> None:
    directory, _ = built
    other = RenamedModel(embedder, "some-other-model")
    with pytest.raises(IndexCorruptError):
        DiscoveryEngine.open(directory, other)
    assert DiscoveryEngine.stale_reason(directory, DOCS, other) is not None
    engine = DiscoveryEngine.open_or_build(directory, DOCS, other)
    assert manifest(directory)["model_id"] == "some-other-model"
    assert engine.model_id == "some-other-model"


def test_a_failed_build_leaves_the_served_index_untouched(
    built: tuple[Path, DiscoveryEngine], embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory, _ = built
    before = manifest(directory)

    def crash(self: object, directory: Path) -> None:
        Path(directory).mkdir(parents=True)
        (Path(directory) / "vectors.hnsw").write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(engine_module.VectorIndex, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        DiscoveryEngine.build([*DOCS, *MORE], embedder, directory=directory)
    monkeypatch.undo()
    assert manifest(directory) == before
    assert not [p for p in directory.iterdir() if p.name.startswith(".building-")]
    served = DiscoveryEngine.open(directory, embedder)
    assert sorted(served.docs) == sorted(d.name for d in DOCS)


def test_incremental_add_and_remove_update_both_indexes_and_persist(
    built: tuple[Path, DiscoveryEngine], embedder: Embedder
) -> None:
    directory, engine = built
    generation = manifest(directory)["generation"]
    engine.add(MORE)
    assert engine.find(["_mcp_tracker_close_ticket"]).entries[0].rung == "exact"
    assert engine.find(["ticket"]).entries[0].rung == "keyword"
    assert engine.find(["report a crash in the login page to the developers"]).names[0] == (
        "_mcp_tracker_create_ticket"
    )
    # no rebuild: same generation, the manifest now describes the larger catalogue
    m = manifest(directory)
    assert m["generation"] == generation
    assert m["count"] == 5
    reopened = DiscoveryEngine.open(directory, embedder)
    assert reopened.find(["create_ticket"]).names == ["_mcp_tracker_create_ticket"]

    engine.remove(["_mcp_tracker_create_ticket", "not_a_tool"])
    assert "_mcp_tracker_create_ticket" not in engine.find(["ticket"]).names
    assert engine.find(["create_ticket"]).entries[0].rung != "exact"
    assert "_mcp_tracker_create_ticket" not in engine.find(["create_ticket"]).names
    reopened = DiscoveryEngine.open(directory, embedder)
    assert len(reopened) == 4
    assert reopened.catalogue_hash == manifest(directory)["catalogue_hash"]


def test_replacing_a_tool_changes_what_it_is_found_for(embedder: Embedder) -> None:
    engine = DiscoveryEngine.build(DOCS, embedder)
    engine.add(
        [ToolDoc("send_email", "Plays music on the speaker.", ("put on some jazz",), "", "x")]
    )
    assert "send_email" in engine.find(["put on some jazz music"]).names
    assert len(engine) == 3


def test_a_garbled_manifest_is_a_corrupt_index(
    built: tuple[Path, DiscoveryEngine], embedder: Embedder
) -> None:
    directory, _ = built
    (directory / MANIFEST).write_text("{ not json")
    with pytest.raises(IndexCorruptError):
        DiscoveryEngine.open(directory, embedder)


def test_a_truncated_vector_file_is_a_corrupt_index(
    built: tuple[Path, DiscoveryEngine], embedder: Embedder
) -> None:
    directory, _ = built
    m = manifest(directory)
    hnsw = directory / str(m["generation"]) / str(m["vectors"]) / "vectors.hnsw"
    hnsw.write_bytes(hnsw.read_bytes()[:100])
    with pytest.raises(IndexCorruptError):
        DiscoveryEngine.open(directory, embedder)


def test_a_missing_name_index_is_a_corrupt_index(
    built: tuple[Path, DiscoveryEngine], embedder: Embedder
) -> None:
    directory, _ = built
    m = manifest(directory)
    for f in (directory / str(m["generation"]) / "names").iterdir():
        f.unlink()
    with pytest.raises(IndexCorruptError):
        DiscoveryEngine.open(directory, embedder)


def test_a_catalogue_that_disagrees_with_the_manifest_is_a_corrupt_index(
    built: tuple[Path, DiscoveryEngine], embedder: Embedder
) -> None:
    directory, _ = built
    m = manifest(directory)
    docs_file = directory / str(m["generation"]) / str(m["docs"])
    records = json.loads(docs_file.read_text())
    records[0]["summary"] = "tampered"
    docs_file.write_text(json.dumps(records))
    with pytest.raises(IndexCorruptError):
        DiscoveryEngine.open(directory, embedder)


def test_a_manifest_pointing_outside_the_directory_is_refused(
    built: tuple[Path, DiscoveryEngine], embedder: Embedder
) -> None:
    directory, _ = built
    m = manifest(directory)
    m["generation"] = "../../etc"
    (directory / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(IndexCorruptError):
        DiscoveryEngine.open(directory, embedder)


def test_open_or_build_recovers_from_a_corrupt_index(
    built: tuple[Path, DiscoveryEngine], embedder: Embedder
) -> None:
    directory, _ = built
    m = manifest(directory)
    (directory / str(m["generation"]) / str(m["vectors"]) / "vectors.npy").write_bytes(b"\0" * 10)
    engine = DiscoveryEngine.open_or_build(directory, DOCS, embedder)
    assert engine.find(["is it raining in Rome"]).names[0] == "get_weather"
    DiscoveryEngine.open(directory, embedder)  # what was rebuilt opens cleanly


def test_an_empty_catalogue_builds_and_finds_nothing(tmp_path: Path, embedder: Embedder) -> None:
    engine = DiscoveryEngine.build([], embedder, directory=tmp_path / "index")
    result = engine.find(["anything at all"])
    assert result.injected == [] and result.not_found[0]["reason"] == "no-match"
    assert len(DiscoveryEngine.open(tmp_path / "index", embedder)) == 0


def test_build_reports_progress_up_to_the_total(embedder: Embedder) -> None:
    seen: list[tuple[int, int]] = []
    DiscoveryEngine.build(DOCS, embedder, progress=lambda done, total: seen.append((done, total)))
    assert seen[0] == (0, 3) and seen[-1] == (3, 3)


def test_bad_docs_are_refused_before_anything_is_written(
    tmp_path: Path, embedder: Embedder
) -> None:
    with pytest.raises(TypeError):
        DiscoveryEngine.build([{"name": "x"}], embedder, directory=tmp_path / "i")  # type: ignore[list-item]
    with pytest.raises(ValueError):
        DiscoveryEngine.build([ToolDoc(" ", "blank")], embedder, directory=tmp_path / "i")
    assert not (tmp_path / "i" / MANIFEST).exists()


def test_registry_docs_take_discoverable_abilities_only() -> None:
    registry = Registry.collect(entry_points=False)
    names = {d.name for d in registry_docs(registry)}
    assert {"clock", "calculator"} <= names
    assert "find_tools" not in names and "find_skills" not in names


def test_vectors_come_from_the_real_embedder(embedder: Embedder) -> None:
    rows = embedder.embed(["hello"])
    assert rows.shape == (1, embedder.dim)
    assert np.isclose(np.linalg.norm(rows[0]), 1.0, atol=1e-4)


def test_small_updates_are_journaled_and_replayed_on_open(
    built: tuple[Path, DiscoveryEngine], embedder: Embedder
) -> None:
    directory, engine = built
    vectors_before = manifest(directory)["vectors"]
    engine.add(MORE[:1])
    engine.remove(["send_email"])
    m = manifest(directory)
    assert m["vectors"] == vectors_before  # the large files were not rewritten
    assert int(str(m["journal_bytes"])) > 0
    reopened = DiscoveryEngine.open(directory, embedder)
    assert sorted(reopened.docs) == [
        "_mcp_tracker_create_ticket",
        "currency_convert",
        "get_weather",
    ]
    hit = reopened.find(["report this crash to the developers please"])
    assert hit.names[0] == "_mcp_tracker_create_ticket"


def test_a_long_journal_is_compacted_into_a_whole_save(
    built: tuple[Path, DiscoveryEngine], embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory, engine = built
    monkeypatch.setattr(engine_module, "COMPACT_AFTER", 1)
    before = manifest(directory)
    engine.add(MORE)
    after = manifest(directory)
    assert after["vectors"] != before["vectors"] and after["journal_bytes"] == 0
    gen = directory / str(after["generation"])
    assert not (gen / str(before["vectors"])).exists()
    assert len(DiscoveryEngine.open(directory, embedder)) == 5


def test_a_torn_journal_tail_is_ignored_and_then_overwritten(
    built: tuple[Path, DiscoveryEngine], embedder: Embedder
) -> None:
    directory, engine = built
    engine.add(MORE[:1])
    m = manifest(directory)
    journal = directory / str(m["generation"]) / str(m["journal"])
    with open(journal, "ab") as fh:
        fh.write(b'{"op": "add", "docs": [{"na')  # a crash mid-append
    assert len(DiscoveryEngine.open(directory, embedder)) == 4
    engine.add(MORE[1:])
    reopened = DiscoveryEngine.open(directory, embedder)
    assert len(reopened) == 5


def test_a_journal_shorter_than_its_manifest_is_a_corrupt_index(
    built: tuple[Path, DiscoveryEngine], embedder: Embedder
) -> None:
    directory, engine = built
    engine.add(MORE)
    m = manifest(directory)
    journal = directory / str(m["generation"]) / str(m["journal"])
    journal.write_bytes(journal.read_bytes()[:-5])
    with pytest.raises(IndexCorruptError):
        DiscoveryEngine.open(directory, embedder)


class CountingModel:
    """The real embedder, counting the texts it is asked to embed."""

    def __init__(self, inner: Embedder) -> None:
        self.inner, self.model_id, self.dim = inner, inner.model_id, inner.dim
        self.texts = 0

    def embed(self, texts: Sequence[str]) -> Matrix:
        self.texts += len(texts)
        return self.inner.embed(texts)


def test_a_rebuild_embeds_only_the_tools_whose_text_changed(
    built: tuple[Path, DiscoveryEngine], embedder: Embedder
) -> None:
    directory, _ = built
    counting = CountingModel(embedder)
    edited = [
        DOCS[0],
        DOCS[1],
        ToolDoc("currency_convert", "Converts money between currencies.", (), "", "builtin"),
        MORE[0],
    ]
    engine = DiscoveryEngine.open_or_build(directory, edited, counting)
    # the edited tool's two cards, and the new tool's two cards, two example phrases
    # (each its own vector) and name; nothing of the unchanged two
    assert 0 < counting.texts <= 7
    assert sorted(engine.docs) == sorted(d.name for d in edited)
    assert engine.find(["file a bug about the login page"]).names[0] == MORE[0].name
    reopened = DiscoveryEngine.open(directory, embedder)
    assert reopened.catalogue_hash == engine.catalogue_hash
    assert reopened.find(["is it raining in Seattle"]).names[0] == "get_weather"


def test_a_cold_build_ignores_the_previous_index_when_asked(
    built: tuple[Path, DiscoveryEngine], embedder: Embedder
) -> None:
    directory, _ = built
    counting = CountingModel(embedder)
    DiscoveryEngine.build(DOCS, counting, directory=directory, reuse=False)
    assert counting.texts >= len(DOCS)
