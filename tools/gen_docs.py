"""Generate the parts of docs/ that restate the code: the configuration keys, the error codes.

- docs/configuration.rst: every key of ``config.toml``, read from the config type
  (``chalie.process.config.Config``): its place, what it accepts (the same words the config's
  own error messages use), its default, and the comment written beside the field.
- docs/errors.rst: the error-code table, from the one table (``chalie.errors``).

Each is written between ``.. generated: begin`` and ``.. generated: end``; the prose
around it is kept. ``tests/test_docs.py`` fails when either is stale.

Run: python3 tools/gen_docs.py [--check]
"""

from __future__ import annotations

import argparse
import ast
import inspect
import sys
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chalie.errors import rst_rows  # noqa: E402
from chalie.process import config as cfg  # noqa: E402

BEGIN = ".. generated: begin"
END = ".. generated: end"


def _comments(cls: type) -> dict[str, str]:
    """Each field's comment in the class body: the ``#`` lines above it or beside it."""
    source = inspect.getsource(cls)
    lines = source.splitlines()
    found: dict[str, str] = {}
    for node in ast.parse(source).body[0].body:  # type: ignore[attr-defined]
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        above: list[str] = []
        i = node.lineno - 2
        while i >= 0 and lines[i].strip().startswith("#"):
            above.insert(0, lines[i].strip().lstrip("#").strip())
            i -= 1
        end_line = lines[(node.end_lineno or node.lineno) - 1]
        beside = end_line.split("  # ", 1)[1].strip() if "  # " in end_line else ""
        found[node.target.id] = " ".join([*above, beside]).strip()
    return found


def _default(value: Any) -> str:
    if value is msgspec.NODEFAULT:
        return "(required)"
    if value is None:
        return "(none)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_default(v) for v in value) + "]"
    if isinstance(value, float):
        return cfg._bound(value)
    return str(value)


def config_keys() -> list[tuple[str, str, str, str]]:
    """(key, accepts, default, description) for every key, in the type's order."""
    rows: list[tuple[str, str, str, str]] = []

    def walk(struct: mi.StructType, prefix: str) -> None:
        notes = _comments(struct.cls)
        for field in struct.fields:
            if field.encode_name == "home":
                continue  # the directory the file is read from, not a key of it
            info = cfg._unwrap(field.type)
            key = f"{prefix}{field.encode_name}"
            if isinstance(info, mi.StructType):
                walk(info, f"{key}.")
            elif isinstance(info, mi.DictType) and isinstance(info.value_type, mi.StructType):
                walk(info.value_type, f"{key}.NAME.")
            else:
                default = field.default
                if default is msgspec.NODEFAULT and field.default_factory is not msgspec.NODEFAULT:
                    default = field.default_factory()
                rows.append((key, cfg._allowed(info), _default(default), notes.get(field.name, "")))
                table = cfg._table_of(info)  # a value or a table (workers = 2 or [workers])
                if isinstance(table, mi.StructType):
                    walk(table, f"{key}.")

    top = mi.type_info(cfg.Config)
    assert isinstance(top, mi.StructType)
    walk(top, "")
    return rows


def _cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("*", "\\*").replace("`", "'") or "-"


def config_table() -> str:
    lines = [".. list-table::", "   :header-rows: 1", "", "   * - key", "     - accepts"]
    lines += ["     - default", "     - what it does"]
    for key, accepts, default, note in config_keys():
        lines += [f"   * - ``{key}``", f"     - {_cell(accepts)}", f"     - ``{default}``"]
        lines.append(f"     - {_cell(note)}")
    return "\n".join(lines)


def errors_table() -> str:
    header = "   * - code\n     - meaning\n     - when it happens"
    return ".. list-table::\n   :header-rows: 1\n\n" + header + "\n" + rst_rows()


def fill(path: Path, table: str) -> str:
    text = path.read_text()
    head, rest = text.split(BEGIN, 1)
    _old, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n\n{table}\n\n{END}{tail}"


TARGETS = {
    ROOT / "docs" / "configuration.rst": config_table,
    ROOT / "docs" / "errors.rst": errors_table,
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true", help="Fail when docs/ is stale.")
    args = parser.parse_args()
    stale = 0
    for path, make in TARGETS.items():
        new = fill(path, make())
        if args.check:
            if new != path.read_text():
                print(f"{path.relative_to(ROOT)} is stale: run python3 tools/gen_docs.py")
                stale += 1
        else:
            path.write_text(new)
            print(f"wrote {path.relative_to(ROOT)}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
