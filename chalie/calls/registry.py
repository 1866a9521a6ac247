"""The registry: collects every concrete Ability subclass, with no registration call.

Sources, in order: the ``abilities`` package, installed ``chalie.abilities``
entry points, and the user's drop-in folder. Two abilities with one name is a
start-up error naming both sources. A module that fails to import is reported
by its path and does not take the others down.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import logging
import pkgutil
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from chalie.ability import Ability, descriptor_of

log = logging.getLogger("chalie.calls.registry")
ENTRY_POINT_GROUP = "chalie.abilities"


class DuplicateAbilityError(RuntimeError):
    """Two abilities claim one name."""


@dataclass(frozen=True)
class Entry:
    """One registered ability and where it came from."""

    cls: type[Ability]
    source: str  # human-readable origin: module path or file path
    ref: str  # import reference a worker process can load: "module:Qual" or "/file.py:Qual"

    @property
    def name(self) -> str:
        return self.cls.name


@dataclass(frozen=True)
class LoadFailure:
    path: str
    error: str


def abilities_in(module: ModuleType) -> list[type[Ability]]:
    """Concrete Ability subclasses defined in (not imported into) a module."""
    found = []
    for _, obj in inspect.getmembers(module, inspect.isclass):
        if (
            issubclass(obj, Ability)
            and obj.__module__ == module.__name__
            and not obj.__dict__.get("abstract", False)
        ):
            found.append(obj)
    return found


def _file_module_name(path: Path) -> str:
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
    return f"chalie_dropin_{path.stem}_{digest}"


def import_file(path: Path) -> ModuleType:
    """Import a drop-in file under a stable synthetic module name."""
    name = _file_module_name(path)
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def load_ref(ref: str) -> type[Ability]:
    """Resolve an import reference (``module:Qual`` or ``/path.py:Qual``) to its class."""
    target, _, qual = ref.rpartition(":")
    if not target or not qual:
        raise ImportError(f"bad ability reference {ref!r}")
    module = (
        import_file(Path(target)) if target.endswith(".py") else importlib.import_module(target)
    )
    obj: object = module
    for part in qual.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, Ability)):
        raise ImportError(f"{ref!r} is not an Ability")
    return obj


class Registry:
    """Name → Entry, thread-safe for the run-time additions MCP proxies make."""

    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}
        self._lock = threading.Lock()
        self.failures: list[LoadFailure] = []

    # -- collection -------------------------------------------------------
    @classmethod
    def collect(
        cls,
        *,
        package: str | None = "abilities",
        entry_points: bool = True,
        dropin: Path | None = None,
    ) -> Registry:
        reg = cls()
        if package:
            reg._collect_package(package)
        if entry_points:
            reg._collect_entry_points()
        if dropin is not None and dropin.is_dir():
            reg._collect_folder(dropin)
        return reg

    def _collect_package(self, package: str) -> None:
        try:
            pkg = importlib.import_module(package)
        except Exception as exc:  # the whole package failing is still only a report
            self._fail(package, exc)
            return
        self._add_module(pkg, pkg.__name__)
        for info in pkgutil.walk_packages(pkg.__path__, prefix=pkg.__name__ + "."):
            try:
                module = importlib.import_module(info.name)
            except Exception as exc:
                path = getattr(info.module_finder, "path", "")
                self._fail(str(Path(path) / (info.name.rsplit(".", 1)[-1] + ".py")), exc)
                continue
            self._add_module(module, module.__name__)

    def _collect_entry_points(self) -> None:
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                obj = ep.load()
            except Exception as exc:
                self._fail(f"entry point {ep.name} = {ep.value}", exc)
                continue
            if isinstance(obj, ModuleType):
                self._add_module(obj, f"entry point {ep.name} ({obj.__name__})")
            elif isinstance(obj, type) and issubclass(obj, Ability):
                self.add(obj, source=f"entry point {ep.name} ({ep.value})")
            else:
                self.failures.append(
                    LoadFailure(f"entry point {ep.name}", "is neither a module nor an Ability")
                )

    def _collect_folder(self, folder: Path) -> None:
        for path in sorted(folder.glob("*.py")):
            if path.name.startswith("_"):
                continue
            try:
                module = import_file(path.resolve())
            except Exception as exc:
                self._fail(str(path), exc)
                continue
            self._add_module(module, str(path), file=path.resolve())

    def _fail(self, path: str, exc: BaseException) -> None:
        log.error("could not load abilities from %s: %s: %s", path, type(exc).__name__, exc)
        self.failures.append(LoadFailure(path, f"{type(exc).__name__}: {exc}"))

    def _add_module(self, module: ModuleType, source: str, file: Path | None = None) -> None:
        for ability in abilities_in(module):
            ref_target = str(file) if file else module.__name__
            self.add(ability, source=source, ref=f"{ref_target}:{ability.__qualname__}")

    # -- the table --------------------------------------------------------
    def add(self, ability: type[Ability], *, source: str, ref: str | None = None) -> Entry:
        entry = Entry(ability, source, ref or f"{ability.__module__}:{ability.__qualname__}")
        with self._lock:
            old = self._entries.get(ability.name)
            if old is not None and old.cls is not ability:
                raise DuplicateAbilityError(
                    f"two abilities named {ability.name!r}: {old.source} "
                    f"({old.cls.__qualname__}) and {source} ({ability.__qualname__})"
                )
            self._entries[ability.name] = entry
        return entry

    def remove(self, name: str) -> Entry | None:
        with self._lock:
            return self._entries.pop(name, None)

    def get(self, name: str) -> Entry | None:
        return self._entries.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry]:
        with self._lock:
            entries = sorted(self._entries.values(), key=lambda e: e.name)
        return iter(entries)

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def descriptors(
        self, *, allow_async: bool = False, names: Iterable[str] | None = None
    ) -> list[dict[str, object]]:
        """Every descriptor (or those of ``names``), exactly as the model would see it, in
        name order."""
        chosen = [e.name for e in self]
        if names is not None:
            wanted = set(names)
            chosen = [name for name in chosen if name in wanted]
        return self.described(chosen, allow_async=allow_async)

    def described(
        self, names: Iterable[str], *, allow_async: bool = False
    ) -> list[dict[str, object]]:
        """The descriptors of the registered ones of ``names``, in the order given."""
        out = []
        for name in names:
            entry = self._entries.get(name)
            if entry is not None:
                out.append(descriptor_of(entry.cls, allow_async=allow_async))
        return out
