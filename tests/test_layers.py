"""Layers, bottom to top: the core (chalie/), abilities, actors, the composition root and CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from chalie.process.control import NoArgs, encode_request
from chalie.process.routing import Route, Router
from chalie.wire.messages import ControlReply
from tools.import_graph import CORE_FOLDERS, UPWARD, imports_of

ROOT = Path(__file__).resolve().parent.parent


def imported_modules(path: Path) -> frozenset[str]:
    """Every module a file imports, at any depth (function-level imports included)."""
    return imports_of(path)[0]


def offenders(package: str, forbidden: tuple[str, ...]) -> list[str]:
    """Every import of a ``forbidden`` top-level package by a library module of ``package``.

    ``__main__.py`` is not a library module: ``python -m`` runs it and nothing imports
    it (checked below), so it is the program's door, at the top of the house.
    """
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        if path.name == "__main__.py":
            continue
        rel = path.relative_to(ROOT).as_posix()
        for module in imported_modules(path):
            if module.split(".")[0] in forbidden:
                bad.append(f"{rel} imports {module}")
    return bad


def test_the_core_imports_no_actor_no_ability_and_no_composition_root() -> None:
    assert offenders("chalie", ("actors", "abilities", "chalie_app")) == []


def upward_imports() -> set[tuple[str, str]]:
    """Every import of a core module from a core folder higher in CORE_FOLDERS."""
    found = set()
    for path in sorted((ROOT / "chalie").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if len(parts) < 3:
            continue  # the contract at chalie/'s top stands above every folder
        if parts[-1] == "__init__":
            parts.pop()
        me = ".".join(parts)
        for module in imported_modules(path):
            target = module.split(".")
            if target[0] != "chalie" or len(target) < 3 or target[1] == parts[1]:
                continue
            if CORE_FOLDERS.index(target[1]) > CORE_FOLDERS.index(parts[1]):
                found.add((me, module))
    return found


def test_every_folder_of_the_core_has_its_place_in_the_order() -> None:
    folders = {p.name for p in (ROOT / "chalie").iterdir() if p.is_dir() and p.name[0] != "_"}
    assert folders == set(CORE_FOLDERS)
    loose = {p.stem for p in (ROOT / "chalie").glob("*.py")}
    assert loose == {"__init__", "__main__", "ability", "result", "services", "errors"}


def test_the_cores_folders_import_only_the_folders_below_them() -> None:
    """Bottom to top: net, store, wire, process, gate, calls, workers, ... brain; each
    import running back up is listed with its reason, and a listed one still exists."""
    assert upward_imports() == set(UPWARD)


def test_the_actors_never_import_the_composition_root() -> None:
    assert offenders("actors", ("chalie_app",)) == []


def test_the_abilities_import_only_the_core() -> None:
    assert offenders("abilities", ("actors", "chalie_app")) == []


def test_no_module_imports_a_programs_door() -> None:
    doors = {"chalie.__main__", "chalie_app.__main__"}
    bad = [
        f"{path.relative_to(ROOT)} imports {module}"
        for package in ("chalie", "actors", "abilities", "chalie_app", "tools", "tests")
        for path in sorted((ROOT / package).rglob("*.py"))
        # Only a file that names __main__ can import one (the tests need no parse else).
        if "__main__" in path.read_text()
        for module in imported_modules(path)
        if module in doors
    ]
    assert bad == []


def test_the_tools_and_benchmarks_import_no_test_code() -> None:
    """What tests and benchmarks share lives in ``tools/``; tests build on it, never the reverse."""
    assert offenders("tools", ("tests",)) == []


def test_no_test_imports_a_conftest() -> None:
    """A conftest holds fixtures and hooks; a helper lives in a module named for it."""
    bad = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if "conftest" not in path.read_text():
            continue  # a file that never names one imports none (no parse needed)
        for module in imported_modules(path):
            if module.split(".")[-1] == "conftest":
                bad.append(f"{path.relative_to(ROOT).as_posix()} imports {module}")
    assert bad == []


def test_a_router_refuses_two_routes_for_one_command() -> None:
    def ok(_args: NoArgs) -> ControlReply:
        return ControlReply(ok=True)

    with pytest.raises(ValueError, match="two routes"):
        Router([Route("status", NoArgs, ok), Route("status", NoArgs, ok)])


def test_a_handler_fault_is_an_internal_error_reply() -> None:
    def broken(_args: NoArgs) -> ControlReply:
        raise KeyError("inside")

    router = Router([Route("status", NoArgs, broken)])
    parsed = router.parse(encode_request("status"))
    assert not isinstance(parsed, ControlReply)
    reply = router.run(*parsed)
    assert (reply.ok, reply.error) == (False, "internal-error")
    assert "KeyError" in reply.data["message"]
    unknown = router.parse(encode_request("nope"))
    assert isinstance(unknown, ControlReply) and unknown.error == "unknown-command"
    assert unknown.data["valid_values"] == ["status"]


def module_graph() -> dict[str, set[str]]:
    """Our modules and, for each, the modules of ours it imports (at any depth)."""
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found, names = imports_of(path)
        targets = found | names
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


PACKAGES = ("chalie", "actors", "abilities", "chalie_app")


def test_no_import_circle_anywhere() -> None:
    # Function-level and TYPE_CHECKING imports count: a circle is a circle.
    assert circles(module_graph()) == []


def test_the_circle_finder_sees_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
