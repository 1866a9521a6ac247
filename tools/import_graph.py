"""Draw the import graph of Chalie's packages, from the code, as an SVG picture.

Each box is a component: a folder of ``chalie`` (``chalie.calls``, ``chalie.mcp``...),
the public contract at its top (``chalie``: ability, result, services, errors), the
actors' kit (``actors.base``: actor, future, child_ref, directory, timers, host, loop),
each folder of actors, the executors, the abilities, the CLI and the composition root.
An arrow A -> B means some module of A imports some module of B (at any depth in the
file). Rows are the layers, bottom to top: core, abilities, actors, app; inside the
core, its folders in their order (CORE_FOLDERS). Every arrow points down or sideways;
one that runs up (red) is one of UPWARD (``tests/test_layers.py`` checks the same rules
on the modules).

Run: python3 tools/import_graph.py [--check]   (writes docs/import-graph.svg; --check
fails when the committed picture is not the one the code gives)
"""

from __future__ import annotations

import argparse
import ast
import functools
import sys
from collections.abc import Iterator
from pathlib import Path
from xml.sax.saxutils import escape

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "import-graph.svg"
PACKAGES = ("chalie", "abilities", "actors", "chalie_app")
LAYERS = {"chalie": 0, "abilities": 1, "actors": 2, "chalie_app": 3}
LAYER_NAMES = ("core (chalie/)", "abilities/", "actors/", "app (chalie_app/)")
# The core's folders, bottom to top: a folder's modules import the folders below it
# and the public contract at chalie/'s top (ability, result, services, errors), never a
# folder above it, but for the imports of UPWARD (tests/test_layers.py checks both).
CORE_FOLDERS = (
    "net",
    "store",
    "wire",
    "process",
    "gate",
    "calls",
    "workers",
    "providers",
    "schedule",
    "discovery",
    "mcp",
    "accounts",
    "personal",
    "web",
    "conversation",
    "mcp_server",
    "memory",
    "chat",
    "brain",
)
# The imports that run up the core's order, each with why it stays.
UPWARD = {
    ("chalie.process.startup", "chalie.providers.probe"): (
        "what `chalie run` prints names the model servers it probed"
    ),
    ("chalie.process.telemetry", "chalie.providers.types"): (
        "a model request's span reads the provider's response type"
    ),
    ("chalie.store.store_place", "chalie.mcp.secrets"): (
        "the store's password may come from the 0600 secrets file (a function-level import)"
    ),
}
# The actors' kit (the base every actor module builds on) stands at actors/'s top level
# beside a few one-module features; every other actor module is in a folder named as the
# core's folder it serves.
ACTOR_KIT = frozenset({"actor", "future", "child_ref", "directory", "timers", "host", "loop"})
ACTOR_GROUPS = {"example_writer": "discovery"}


def component(module: str) -> str:
    """The box a module belongs to."""
    parts = module.split(".")
    top = parts[0]
    if top == "chalie":
        if len(parts) > 2 or (len(parts) == 2 and (ROOT / "chalie" / parts[1]).is_dir()):
            return f"chalie.{parts[1]}"
        return "chalie"
    if top == "actors":
        if len(parts) == 1 or (len(parts) == 2 and parts[1] in ACTOR_KIT):
            return "actors.base"
        return f"actors.{ACTOR_GROUPS.get(parts[1], parts[1])}"
    if top == "chalie_app":
        if len(parts) >= 2 and parts[1] == "cli":
            return "chalie_app.cli"
        return "chalie_app"
    return top


def core_rank(box: str) -> int:
    """A core box's place in CORE_FOLDERS (the contract, ``chalie``, above them all)."""
    name = box.split(".", 1)[1] if "." in box else ""
    return CORE_FOLDERS.index(name) if name in CORE_FOLDERS else len(CORE_FOLDERS)


@functools.cache
def imports_of(path: Path) -> tuple[frozenset[str], frozenset[str]]:
    """What a file imports, at any depth (function-level and TYPE_CHECKING imports
    included): the modules, and every ``module.name`` its ``from module import name``
    lines name. One parse a file, shared by the picture and ``tests/test_layers.py``;
    only the small answer is kept, never the tree."""
    found: set[str] = set()
    names: set[str] = set()
    for node in _statements(ast.parse(path.read_text(), filename=str(path)).body):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return frozenset(found), frozenset(names)


def _statements(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """Every statement, at any depth (an import is one): bodies are walked, expressions,
    most of a tree's nodes, are not."""
    for node in body:
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(node, field, None)
            if isinstance(inner, list):
                yield from _statements(inner)


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__main__":
                continue  # the program's door (python -m chalie), at the top of the house
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def edges() -> tuple[list[str], set[tuple[str, str]]]:
    mods = modules()
    nodes = sorted({component(m) for m in mods})
    found: set[tuple[str, str]] = set()
    for name, path in mods.items():
        for target in imports_of(path)[0]:
            if target.split(".")[0] in PACKAGES and target != "chalie.__main__":
                a, b = component(name), component(target)
                if a != b:
                    found.add((a, b))
    return nodes, found


def draw(nodes: list[str], links: set[tuple[str, str]]) -> str:
    box_w, box_h, gap_x, gap_y, margin, label_w, per_row = 150, 26, 12, 70, 24, 130, 7
    layer_of = {n: LAYERS[n.split(".")[0]] for n in nodes}
    # within a layer, a box sits above the boxes of its layer it imports
    level: dict[str, int] = {}

    def depth(n: str, seen: frozenset[str] = frozenset()) -> int:
        if n not in level:
            if layer_of[n] == LAYERS["chalie"]:
                level[n] = core_rank(n)
                return level[n]
            below = sorted(
                b for a, b in links if a == n and layer_of[b] == layer_of[n] and b not in seen
            )
            level[n] = 1 + max((depth(b, seen | {n}) for b in below), default=-1)
        return level[n]

    rows: list[tuple[int, list[str]]] = []
    for layer in sorted(set(layer_of.values())):
        # the fewest rows of at most per_row boxes; the lower a box's imports, the lower it
        members = sorted((n for n in nodes if layer_of[n] == layer), key=lambda n: (depth(n), n))
        count = -(-len(members) // per_row)
        size = -(-len(members) // count)
        for i in range(count):
            part = members[i * size : (i + 1) * size]
            # the core's folders keep their order along a row; other layers read by name
            rows.append((layer, part if layer == LAYERS["chalie"] else sorted(part)))
    width = margin * 2 + label_w + per_row * (box_w + gap_x)
    height = margin * 2 + len(rows) * (box_h + gap_y)
    where: dict[str, tuple[float, float]] = {}
    first_y: dict[int, float] = {}
    for index, (layer, row) in enumerate(rows):
        y = height - margin - (index + 1) * (box_h + gap_y) + gap_y / 2
        first_y.setdefault(layer, y)
        span = len(row) * (box_w + gap_x) - gap_x
        x0 = label_w + margin + (width - label_w - 2 * margin - span) / 2
        for i, n in enumerate(row):
            where[n] = (x0 + i * (box_w + gap_x), y)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" font-size="11">',
        '<defs><marker id="a" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" '
        'markerHeight="6" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#667"/></marker></defs>',
        f'<rect width="{width:.0f}" height="{height:.0f}" fill="white"/>',
    ]
    for layer, y in sorted(first_y.items()):
        out.append(
            f'<text x="{margin}" y="{y + box_h / 2 + 4:.0f}" font-weight="bold">'
            f"{LAYER_NAMES[layer]}</text>"
        )
    for a, b in sorted(links):
        (xa, ya), (xb, yb) = where[a], where[b]
        up = LAYERS[b.split(".")[0]] > LAYERS[a.split(".")[0]] or (
            a.startswith("chalie.") and b.startswith("chalie.") and core_rank(b) > core_rank(a)
        )
        colour = "#c00" if up else "#8a94a6"
        if ya == yb:  # within a row: a curve above the boxes
            x1, x2, y1 = xa + box_w / 2, xb + box_w / 2, ya
            top = ya - 14 - abs(x2 - x1) / 14
            path = f"M{x1:.0f},{y1:.0f} Q{(x1 + x2) / 2:.0f},{top:.0f} {x2:.0f},{y1:.0f}"
        else:
            x1, y1 = xa + box_w / 2, ya + (box_h if yb > ya else 0)
            x2, y2 = xb + box_w / 2, yb + (0 if yb > ya else box_h)
            path = f"M{x1:.0f},{y1:.0f} L{x2:.0f},{y2:.0f}"
        out.append(
            f'<path d="{path}" fill="none" stroke="{colour}" stroke-width="0.7" '
            f'marker-end="url(#a)" opacity="0.6"/>'
        )
    for n in nodes:
        x, y = where[n]
        out.append(
            f'<rect x="{x:.0f}" y="{y:.0f}" width="{box_w}" height="{box_h}" rx="4" '
            f'fill="#eef3fb" stroke="#456"/>'
        )
        out.append(
            f'<text x="{x + box_w / 2:.0f}" y="{y + box_h / 2 + 4:.0f}" '
            f'text-anchor="middle">{escape(n)}</text>'
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true", help="Fail when docs/ is stale.")
    args = parser.parse_args()
    picture = draw(*edges())
    if args.check:
        if not OUT.exists() or OUT.read_text() != picture:
            print(f"{OUT.relative_to(ROOT)} is stale: run python3 tools/import_graph.py")
            return 1
        return 0
    OUT.write_text(picture)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
