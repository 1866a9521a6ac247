"""DiscoveryEngine: the two indexes over one catalogue, their persistence and their updates.

On disk (``directory``)::

    manifest.json         the commit point: model id, ceiling, catalogue hash, generation
    gen-<id>/names/       Tantivy name index
    gen-<id>/vectors-<n>/ the vector index's own files
    gen-<id>/docs-<n>.json the catalogue the generation was built from
    gen-<id>/journal-<n>.jsonl tools added and removed since, one operation a line

Lifecycle:

1. ``build`` writes a whole generation into a ``.building-*`` directory, renames
   it to ``gen-<id>`` and only then replaces ``manifest.json`` (``os.replace``),
   so a reader sees the old index or the new one, never a half-built one.
2. ``open`` reads the manifest and the generation it names; anything missing,
   truncated or inconsistent is an :class:`IndexCorruptError`.
3. ``open_or_build`` reuses the persisted index when the model, the ceiling and
   the catalogue hash all match, and rebuilds otherwise (or when it is corrupt).
4. ``add`` / ``remove`` update both indexes in place, append the operation to
   the journal and replace the manifest last (it counts the journal lines it
   vouches for). ``open`` replays those lines over the saved vectors, so a
   small update never rewrites a large index; once the journal holds more
   than :data:`COMPACT_AFTER` tools, the vectors and the catalogue are saved
   whole under new names and the journal starts again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import msgspec

from chalie.discovery.cascade import DEFAULT_K, FindResult, run_cascade
from chalie.discovery.embedder import Embedder
from chalie.discovery.names import NameIndex
from chalie.discovery.types import IndexCorruptError, ToolDoc
from chalie.discovery.vector import FORMAT as VECTOR_FORMAT
from chalie.discovery.vector import VectorIndex, cut_settings

log = logging.getLogger("chalie.discovery")

MANIFEST: Final = "manifest.json"
FORMAT: Final = 1
# Embedding dominates a build; progress is reported once per batch of tools.
BUILD_BATCH: Final = 256
MAX_MANIFEST_BYTES: Final = 1_000_000
STALE_BUILD_SECONDS: Final = 3600
# Replaying the journal re-embeds its tools at open; past this many, save whole.
COMPACT_AFTER: Final = 256
_encode = msgspec.json.Encoder().encode

Progress = Callable[[int, int], None]


def doc_record(doc: ToolDoc) -> dict[str, Any]:
    return {
        "name": doc.name,
        "summary": doc.summary,
        "examples": list(doc.examples),
        "tooltip": doc.tooltip,
        "source": doc.source,
    }


def doc_from_record(raw: Any) -> ToolDoc:
    if not isinstance(raw, dict):
        raise ValueError("a catalogue record is not an object")
    name, summary = raw.get("name"), raw.get("summary")
    examples = raw.get("examples", [])
    if not isinstance(name, str) or not name or not isinstance(summary, str):
        raise ValueError("a catalogue record lacks name or summary")
    if not isinstance(examples, list) or not all(isinstance(e, str) for e in examples):
        raise ValueError(f"{name}: examples must be a list of strings")
    tooltip, source = raw.get("tooltip", ""), raw.get("source", "")
    if not isinstance(tooltip, str) or not isinstance(source, str):
        raise ValueError(f"{name}: tooltip and source must be strings")
    return ToolDoc(name, summary, tuple(examples), tooltip, source)


def doc_digest(doc: ToolDoc) -> bytes:
    return hashlib.sha256(_encode(doc_record(doc))).digest()


def combine_digests(digests: Mapping[str, bytes]) -> str:
    """The catalogue hash from per-tool digests, so an update rehashes only what changed."""
    digest = hashlib.sha256()
    for name in sorted(digests):
        digest.update(digests[name])
    return digest.hexdigest()


def catalogue_hash(docs: Iterable[ToolDoc]) -> str:
    """A digest of everything the indexes are built from, independent of order."""
    return combine_digests({d.name: doc_digest(d) for d in docs})


def _unique(docs: Sequence[ToolDoc]) -> dict[str, ToolDoc]:
    """Name → doc; a later doc with the same name replaces an earlier one."""
    out: dict[str, ToolDoc] = {}
    for doc in docs:
        if not isinstance(doc, ToolDoc):
            raise TypeError(f"expected ToolDoc, got {type(doc).__name__}")
        if not doc.name or not doc.name.strip():
            raise ValueError("a tool doc needs a name")
        out[doc.name] = doc
    return out


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(_encode(data))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest, checked for shape; IndexCorruptError when absent or garbled."""
    path = directory / MANIFEST
    try:
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            raise IndexCorruptError(f"{path} is implausibly large")
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise IndexCorruptError(f"no discovery index in {directory} (no {MANIFEST})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise IndexCorruptError(f"{path} is unreadable: {exc}") from None
    wanted = {
        "format": int,
        "model_id": str,
        "ceiling": float,
        "catalogue_hash": str,
        "generation": str,
        "vectors": str,
        "docs": str,
        "count": int,
        "journal": str,
        "journal_bytes": int,
    }
    if not isinstance(raw, dict):
        raise IndexCorruptError(f"{path} is not a JSON object")
    for key, kind in wanted.items():
        value = raw.get(key)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = raw[key] = float(value)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise IndexCorruptError(f"{path}: field {key!r} is missing or not {kind.__name__}")
    if raw["format"] != FORMAT:
        raise IndexCorruptError(f"{path}: index format {raw['format']} is not {FORMAT}")
    for key in ("generation", "vectors", "docs", "journal"):
        part = raw[key]
        if "/" in part or "\\" in part or part.startswith(".") or not part:
            raise IndexCorruptError(f"{path}: field {key!r} is not a plain directory name")
    return raw


class DiscoveryEngine:
    """Exact, keyword and vector rungs over one catalogue; thread-safe.

    Not persisted when built without a directory (tests, the eval command).
    """

    def __init__(
        self,
        docs: dict[str, ToolDoc],
        names: NameIndex,
        vectors: VectorIndex,
        embedder: Embedder,
        *,
        directory: Path | None = None,
        manifest: dict[str, Any] | None = None,
    ) -> None:
        self._docs = docs
        self._names = names
        self._vectors = vectors
        self.embedder = embedder
        self.directory = directory
        self._manifest = manifest
        self._journal_tools = 0
        self._digests = {name: doc_digest(doc) for name, doc in docs.items()}
        self._lock = threading.RLock()

    # -- facts ------------------------------------------------------------
    @property
    def model_id(self) -> str:
        return self.embedder.model_id

    @property
    def ceiling(self) -> float:
        return float(self._vectors.ceiling)

    @property
    def catalogue_hash(self) -> str:
        with self._lock:
            return combine_digests(self._digests)

    @property
    def docs(self) -> dict[str, ToolDoc]:
        with self._lock:
            return dict(self._docs)

    def __len__(self) -> int:
        return len(self._docs)

    def __contains__(self, name: object) -> bool:
        return name in self._docs

    # -- building ---------------------------------------------------------
    @classmethod
    def build(
        cls,
        docs: Sequence[ToolDoc],
        embedder: Embedder,
        *,
        directory: Path | None = None,
        progress: Progress | None = None,
        ceiling: float | None = None,
        reuse: bool = True,
        kind: str = "tools",
        learned: Mapping[str, Sequence[str]] | None = None,
    ) -> DiscoveryEngine:
        """A fresh engine over ``docs``; persisted atomically into ``directory`` if given.

        ``learned`` gives tools' learned phrases (chalie.discovery.learning); without
        it a reused index keeps the phrases it holds and a fresh one has none.

        With ``reuse``, the vectors of the index already in ``directory`` (same
        model, same layout, readable) seed the new generation, so only tools
        whose text changed are embedded again; the old generation is not touched.
        """
        catalogue = _unique(docs)
        ordered = sorted(catalogue.values(), key=lambda d: d.name)
        total = len(ordered)
        started = time.monotonic()
        todo = ordered
        previous = cls._previous(directory, embedder) if reuse and directory else None
        if previous is None:
            vectors = VectorIndex(embedder, ceiling=ceiling)
            if learned:
                vectors.preset_learned(learned)
        else:
            held = previous._docs
            vectors = previous._vectors
            vectors.calibrate(ceiling)
            gone = [name for name in held if name not in catalogue]
            if gone:
                vectors.remove(gone)
            todo = [d for d in ordered if held.get(d.name) != d]
            if learned is not None:
                for name in sorted(set(learned) | set(vectors.learned())):
                    vectors.set_learned(name, learned.get(name, ()))
            log.info("rebuilding with %d of %d %s changed", len(todo) + len(gone), total, kind)
        if progress:
            progress(total - len(todo), total)
        for start in range(0, len(todo), BUILD_BATCH):
            chunk = todo[start : start + BUILD_BATCH]
            vectors.upsert(chunk)
            if progress:
                progress(total - len(todo) + start + len(chunk), total)
        if directory is None:
            names = NameIndex.create()
            names.upsert(ordered, fresh=True)
            log.info(
                "built an in-memory index of %d %s in %.1fs",
                total,
                kind,
                time.monotonic() - started,
            )
            return cls(catalogue, names, vectors, embedder)

        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        staging = directory / f".building-{uuid.uuid4().hex}"
        staging.mkdir(mode=0o700)
        try:
            names = NameIndex.create(staging / "names")
            names.upsert(ordered, fresh=True)
            vectors.save(staging / "vectors-0")
            _write_json_atomic(staging / "docs-0.json", [doc_record(d) for d in ordered])
            generation = f"gen-{uuid.uuid4().hex[:16]}"
            os.replace(staging, directory / generation)
            _fsync_dir(directory)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        manifest = {
            "format": FORMAT,
            "model_id": embedder.model_id,
            "dim": int(embedder.dim),
            "vector_format": VECTOR_FORMAT,
            "ceiling": float(vectors.ceiling),
            "catalogue_hash": catalogue_hash(ordered),
            "generation": generation,
            "vectors": "vectors-0",
            "docs": "docs-0.json",
            "count": total,
            "journal": "journal-0.jsonl",
            "journal_bytes": 0,
            "built_at": time.time(),
        }
        _write_json_atomic(directory / MANIFEST, manifest)
        _sweep(directory, keep=generation)
        # The name index moved with the rename, so it is reopened at its new path;
        # the vectors in memory are exactly what was saved.
        names = NameIndex.open(directory / generation / "names")
        engine = cls(catalogue, names, vectors, embedder, directory=directory, manifest=manifest)
        log.info(
            "built the index of %d %s in %s in %.1fs",
            total,
            kind,
            directory,
            time.monotonic() - started,
        )
        return engine

    @classmethod
    def _previous(cls, directory: Path, embedder: Embedder) -> DiscoveryEngine | None:
        """The index already in ``directory``, if its vectors can seed a rebuild."""
        try:
            manifest = read_manifest(directory)
            if manifest.get("vector_format") != VECTOR_FORMAT:
                return None
            return cls.open(directory, embedder)
        except IndexCorruptError:
            return None

    @classmethod
    def open(cls, directory: Path, embedder: Embedder) -> DiscoveryEngine:
        """The persisted engine; IndexCorruptError if anything about it is wrong."""
        manifest = read_manifest(directory)
        if manifest["model_id"] != embedder.model_id:
            raise IndexCorruptError(
                f"index in {directory} was built with {manifest['model_id']!r}, "
                f"not {embedder.model_id!r}"
            )
        gen = directory / manifest["generation"]
        if not gen.is_dir():
            raise IndexCorruptError(f"index generation {gen} is missing")
        try:
            raw_docs = json.loads((gen / manifest["docs"]).read_text(encoding="utf-8"))
            if not isinstance(raw_docs, list):
                raise ValueError("the catalogue is not a list")
            base = _unique([doc_from_record(r) for r in raw_docs])
            docs, journal_tools, learned = _replay(
                base, gen / manifest["journal"], manifest["journal_bytes"]
            )
        except (OSError, UnicodeDecodeError, ValueError, TypeError) as exc:
            raise IndexCorruptError(f"catalogue in {gen} is unreadable: {exc}") from None
        if (
            len(docs) != manifest["count"]
            or catalogue_hash(docs.values()) != manifest["catalogue_hash"]
        ):
            raise IndexCorruptError(f"catalogue in {gen} does not match its manifest")
        names = NameIndex.open(gen / "names")
        try:
            vectors = VectorIndex.load(gen / manifest["vectors"], embedder)
        except IndexCorruptError:
            raise
        except Exception as exc:  # a vector file can fail in many ways; all mean the same here
            raise IndexCorruptError(f"vector index in {gen} is unreadable: {exc}") from exc
        if sorted(docs) != names.all_names():
            raise IndexCorruptError(f"name index in {gen} does not match its catalogue")
        if len(vectors) != len(base):
            raise IndexCorruptError(
                f"vector index in {gen} holds {len(vectors)} tools, the catalogue {len(base)}"
            )
        gone = [name for name in base if name not in docs]
        changed = [doc for name, doc in docs.items() if base.get(name) != doc]
        if gone:
            vectors.remove(gone)
        if changed:
            vectors.upsert(changed)
        for name, phrases in learned.items():
            vectors.set_learned(name, phrases)
        engine = cls(docs, names, vectors, embedder, directory=directory, manifest=manifest)
        engine._journal_tools = journal_tools
        return engine

    @classmethod
    def open_or_build(
        cls,
        directory: Path,
        docs: Sequence[ToolDoc],
        embedder: Embedder,
        *,
        progress: Progress | None = None,
        kind: str = "tools",
    ) -> DiscoveryEngine:
        """Reuse the persisted index when nothing changed; rebuild it otherwise.

        ``kind`` ("tools", "skills") names what the index holds in its log lines.
        """
        reason = cls.stale_reason(directory, docs, embedder)
        if reason is None:
            try:
                return cls.open(directory, embedder)
            except IndexCorruptError as exc:
                reason = str(exc)
        if reason and (directory / MANIFEST).exists():
            log.warning("rebuilding the discovery index in %s: %s", directory, reason)
        return cls.build(docs, embedder, directory=directory, progress=progress, kind=kind)

    @staticmethod
    def stale_reason(directory: Path, docs: Sequence[ToolDoc], embedder: Embedder) -> str | None:
        """Why the persisted index cannot serve ``docs`` with ``embedder`` (None: it can)."""
        try:
            manifest = read_manifest(directory)
        except IndexCorruptError as exc:
            return str(exc)
        if manifest["model_id"] != embedder.model_id:
            return f"the embedding model changed ({manifest['model_id']} → {embedder.model_id})"
        if manifest.get("vector_format") != VECTOR_FORMAT:
            old = manifest.get("vector_format")
            return f"the vector layout changed (format {old} → {VECTOR_FORMAT})"
        calibrated = cut_settings(embedder.model_id)[0]
        if abs(manifest["ceiling"] - calibrated) > 1e-9:
            return f"the distance ceiling changed ({manifest['ceiling']} → {calibrated})"
        if manifest["catalogue_hash"] != catalogue_hash(_unique(docs).values()):
            return "the catalogue changed"
        return None

    # -- serving ----------------------------------------------------------
    def find(
        self, queries: Sequence[str], *, k: int = DEFAULT_K, mentions: bool = False
    ) -> FindResult:
        """Run the cascade for every entry (``mentions``: a framework seed's message, see
        chalie.discovery.cascade.mentioned); raises QueryError or IndexCorruptError."""
        with self._lock:
            result = run_cascade(
                queries, self._names, self._vectors, self._docs, k=k, mentions=mentions
            )
            result.definitions.update(
                (d.name, self._digests[d.name].hex()[:32]) for d in result.injected
            )
            return result

    def definition(self, name: str) -> str | None:
        """The digest of a tool's current definition (what ``FindResult.definitions`` holds)."""
        with self._lock:
            digest = self._digests.get(name)
            return None if digest is None else digest.hex()[:32]

    def get(self, name: str) -> ToolDoc | None:
        return self._docs.get(name)

    # -- incremental updates ----------------------------------------------
    def missing_texts(self, docs: Sequence[ToolDoc]) -> list[str]:
        """The texts adding ``docs`` would embed: embed them off the index's owner (the
        embedder is thread-safe) and hand the vectors to :meth:`add` as ``embedded``."""
        fresh = _unique(docs)
        with self._lock:
            changed = [d for d in fresh.values() if self._docs.get(d.name) != d]
            return self._vectors.missing_texts(changed) if changed else []

    def add(self, docs: Sequence[ToolDoc], *, embedded: Mapping[str, Any] | None = None) -> None:
        """Add or replace tools in both indexes without a rebuild; ``embedded`` (text -> its
        vector) spares embedding what :meth:`missing_texts` named."""
        fresh = _unique(docs)
        if not fresh:
            return
        with self._lock:
            changed = [d for d in fresh.values() if self._docs.get(d.name) != d]
            if not changed:
                return
            self._vectors.upsert(changed, embedded=embedded)
            self._names.upsert(changed)
            for doc in changed:
                self._docs[doc.name] = doc
                self._digests[doc.name] = doc_digest(doc)
            self._persist({"op": "add", "docs": [doc_record(d) for d in changed]}, len(changed))

    def set_learned(self, name: str, phrases: Sequence[str]) -> bool:
        """Replace one tool's learned phrases in place (journaled); True when anything changed."""
        with self._lock:
            if not self._vectors.set_learned(name, phrases):
                return False
            held = list(self._vectors.learned().get(name, ()))
            self._persist({"op": "learned", "name": name, "phrases": held}, 1)
            return True

    def learned(self) -> dict[str, tuple[str, ...]]:
        with self._lock:
            return self._vectors.learned()

    def remove(self, names: Iterable[str]) -> None:
        """Drop tools from both indexes; unknown names are ignored."""
        with self._lock:
            gone = [n for n in dict.fromkeys(names) if n in self._docs]
            if not gone:
                return
            self._vectors.remove(gone)
            self._names.remove(gone)
            for name in gone:
                del self._docs[name]
                del self._digests[name]
            self._persist({"op": "remove", "names": gone}, len(gone))

    def _persist(self, operation: dict[str, Any], size: int) -> None:
        """Journal one update (or save whole when the journal is long), then the manifest."""
        if self.directory is None or self._manifest is None:
            return
        old = self._manifest
        gen = self.directory / old["generation"]
        if self._journal_tools + size > COMPACT_AFTER:
            self._save_whole()
            return
        line = _encode(operation) + b"\n"
        path = gen / old["journal"]
        try:
            with open(path, "r+b" if path.exists() else "wb") as fh:
                # bytes past what the manifest vouches for are a torn write: drop them
                fh.truncate(old["journal_bytes"])
                fh.seek(old["journal_bytes"])
                fh.write(line)
                fh.flush()
                os.fsync(fh.fileno())
            manifest = {
                **old,
                "catalogue_hash": combine_digests(self._digests),
                "count": len(self._docs),
                "journal_bytes": old["journal_bytes"] + len(line),
            }
            _write_json_atomic(self.directory / MANIFEST, manifest)
        except OSError as exc:
            raise IndexCorruptError(f"could not persist the index update in {gen}: {exc}") from exc
        self._manifest = manifest
        self._journal_tools += size

    def _save_whole(self) -> None:
        """Save the vectors and the catalogue under new names with an empty journal."""
        assert self.directory is not None and self._manifest is not None
        old = self._manifest
        gen = self.directory / old["generation"]
        serial = int(old["vectors"].rsplit("-", 1)[-1]) + 1 if old["vectors"][-1:].isdigit() else 1
        ordered = sorted(self._docs.values(), key=lambda d: d.name)
        names = {
            "vectors": f"vectors-{serial}",
            "docs": f"docs-{serial}.json",
            "journal": f"journal-{serial}.jsonl",
        }
        try:
            self._vectors.save(gen / names["vectors"])
            _write_json_atomic(gen / names["docs"], [doc_record(d) for d in ordered])
            manifest = {
                **old,
                **names,
                "catalogue_hash": catalogue_hash(ordered),
                "count": len(ordered),
                "journal_bytes": 0,
                "ceiling": float(self._vectors.ceiling),
            }
            _write_json_atomic(self.directory / MANIFEST, manifest)
        except OSError as exc:
            raise IndexCorruptError(f"could not persist the index update in {gen}: {exc}") from exc
        self._manifest = manifest
        self._journal_tools = 0
        shutil.rmtree(gen / old["vectors"], ignore_errors=True)
        for stale in (old["docs"], old["journal"]):
            with contextlib.suppress(OSError):
                (gen / stale).unlink()


def _replay(
    base: dict[str, ToolDoc], journal: Path, length: int
) -> tuple[dict[str, ToolDoc], int, dict[str, list[str]]]:
    """The catalogue after the journal's first ``length`` bytes, how many tools they touch,
    and the learned phrases they set (tool → its phrases after the last such line)."""
    docs = dict(base)
    learned: dict[str, list[str]] = {}
    if length == 0:
        return docs, 0, learned
    with open(journal, "rb") as fh:
        data = fh.read(length)
    if len(data) != length or not data.endswith(b"\n"):
        raise ValueError(f"{journal.name} is shorter than its manifest says")
    touched = 0
    for line in data.splitlines():
        op = json.loads(line)
        if not isinstance(op, dict):
            raise ValueError("a journal line is not an object")
        if op.get("op") == "add" and isinstance(op.get("docs"), list):
            for record in op["docs"]:
                doc = doc_from_record(record)
                docs[doc.name] = doc
            touched += len(op["docs"])
        elif op.get("op") == "remove" and isinstance(op.get("names"), list):
            for name in op["names"]:
                if not isinstance(name, str):
                    raise ValueError("a removed name is not a string")
                docs.pop(name, None)
            touched += len(op["names"])
        elif (
            op.get("op") == "learned"
            and isinstance(op.get("name"), str)
            and isinstance(op.get("phrases"), list)
            and all(isinstance(p, str) for p in op["phrases"])
        ):
            learned[op["name"]] = list(op["phrases"])
            touched += 1
        else:
            raise ValueError(f"unknown journal operation {str(op.get('op'))[:20]!r}")
    return docs, touched, learned


def _sweep(directory: Path, *, keep: str) -> None:
    """Remove generations the manifest no longer names, and abandoned builds."""
    for child in directory.iterdir():
        if child.name == keep or not child.is_dir():
            continue
        if child.name.startswith("gen-"):
            shutil.rmtree(child, ignore_errors=True)
        elif child.name.startswith(".building-"):
            # another process may be building right now; only clear what was abandoned
            with contextlib.suppress(OSError):
                if time.time() - child.stat().st_mtime > STALE_BUILD_SECONDS:
                    shutil.rmtree(child, ignore_errors=True)


def registry_docs(registry: Iterable[Any]) -> list[ToolDoc]:
    """The discoverable abilities of a registry (``chalie.calls.registry.Entry`` items) as ToolDocs.

    A remote MCP proxy names its server in a ``mcp_server`` class attribute;
    its source then reads ``mcp:<server>``, which the exact rung uses to tell
    a bare tool name owned by two servers apart.
    """
    out: list[ToolDoc] = []
    for entry in registry:
        cls = entry.cls
        if not getattr(cls, "discoverable", True):
            continue
        server = getattr(cls, "mcp_server", None)
        if isinstance(server, str) and server:
            source = f"mcp:{server}"
        else:
            source = "builtin" if str(entry.source).startswith("abilities") else str(entry.source)
        out.append(
            ToolDoc(
                name=cls.name,
                summary=cls.summary,
                examples=tuple(cls.examples),
                tooltip=cls.tooltip,
                source=source,
            )
        )
    return out
