"""docs/ says what the code says: generated parts are fresh, nothing is missing."""

from __future__ import annotations

import re
from pathlib import Path

from chalie.errors import ERROR_CODES
from tools import gen_docs, import_graph

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def test_the_generated_tables_are_fresh() -> None:
    for path, make in gen_docs.TARGETS.items():
        assert gen_docs.fill(path, make()) == path.read_text(), (
            f"{path.name} is stale: run python3 tools/gen_docs.py"
        )


def test_every_config_key_is_documented_with_what_it_does() -> None:
    text = (DOCS / "configuration.rst").read_text()
    keys = gen_docs.config_keys()
    assert len(keys) > 50
    for key, _accepts, _default, note in keys:
        assert f"``{key}``" in text, key
        assert note, f"{key} has no comment in chalie/process/config.py"


def test_every_error_code_is_documented_with_its_meaning() -> None:
    text = (DOCS / "errors.rst").read_text()
    for e in ERROR_CODES:
        assert f"``{e.code}``\n     - {e.meaning}\n     - {e.when}" in text, e.code


def test_the_import_graph_picture_is_the_codes() -> None:
    nodes, links = import_graph.edges()
    assert import_graph.draw(nodes, links) == (DOCS / "import-graph.svg").read_text(), (
        "docs/import-graph.svg is stale: run python3 tools/import_graph.py"
    )
    layer = {n: import_graph.LAYERS[n.split(".")[0]] for n in nodes}
    assert [(a, b) for a, b in links if layer[b] > layer[a]] == []


def test_the_tree_in_the_docs_is_the_tree_in_the_code() -> None:
    from chalie_app import root

    text = (DOCS / "architecture.rst").read_text()
    listed = text.split(".. tree: begin", 1)[1].split(".. tree: end", 1)[0]
    documented = re.findall(r"^- ``([a-z_]+)``", listed, flags=re.M)
    in_code = [make.__name__.lstrip("_") for make in (*root.TREE, *root.LAST)]
    assert documented == in_code
    turns = root.TURNS
    nested = " ".join(listed.split("- ``conversations``", 1)[1].split("\n- ", 1)[0].split())
    assert f"one ``{turns.kind}`` child" in nested and f"``{turns.restart}``" in nested
    assert f"past {turns.intensity} restarts in {turns.period:g} s" in nested


def test_the_readme_names_the_children_of_the_tree_in_start_order() -> None:
    from chalie_app import root

    text = (DOCS.parent / "README.rst").read_text()
    paragraph = text.split("``chalie run`` is one process", 1)[1].split("\n\n", 1)[0]
    in_code = [make.__name__.lstrip("_") for make in (*root.TREE, *root.LAST)]
    assert re.findall(r"``([a-z_]+)``", paragraph) == in_code


def test_every_doc_is_listed_in_the_index() -> None:
    index = (DOCS / "index.rst").read_text()
    for path in sorted(DOCS.glob("*.rst")):
        if path.name != "index.rst":
            assert f":doc:`{path.stem}`" in index, path.name
