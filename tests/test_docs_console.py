"""Every console example in docs/ runs as written, is checked by a named test, or says
why it is an illustration (tests/console.py), so the docs cannot drift again (issue 34:
docs/conversations.rst's first conversation had gone stale and failed)."""

from __future__ import annotations

import re

import pytest

from tests.console import DOCS, ROOT, Block, all_blocks, missing, run

BLOCKS = all_blocks()
RUNS = [b for b in BLOCKS if b.mark == "runs"]
# A command shown outside a console block: a literal block of commands cannot be checked.
LOOSE = re.compile(r"^\s+(\$ |chalie |curl |TOKEN=|python3? -m )")


def test_every_console_block_says_what_it_is() -> None:
    assert len(BLOCKS) >= 6
    unmarked = [b.where for b in BLOCKS if not b.mark]
    assert unmarked == [], "mark each with '.. console: runs|checked by ...|illustration: why'"
    for b in BLOCKS:
        assert b.commands, f"{b.where}: a console block without a $ command"
        if b.mark == "illustration":
            assert len(b.detail.split()) >= 4, f"{b.where}: say why it is not run"


def test_every_checked_block_names_a_test_that_reads_it() -> None:
    for b in (b for b in BLOCKS if b.mark == "checked"):
        file, _, name = b.detail.partition("::")
        source = (ROOT / file).read_text()
        assert f"def {name}(" in source, f"{b.where}: no test {b.detail}"
        assert b.path.name in source, f"{b.where}: {file} does not read {b.path.name}"


def test_commands_are_shown_only_in_console_blocks() -> None:
    inside = {(b.path, n) for b in BLOCKS for n in range(b.line, b.end + 1)}
    loose = [
        f"{path.name}:{n}: {text.strip()[:60]}"
        for path in sorted(DOCS.glob("*.rst"))
        for n, text in enumerate(path.read_text().splitlines(), 1)
        if LOOSE.match(text) and (path, n) not in inside
    ]
    assert loose == [], "show commands in a '.. code-block:: console' block"


def test_a_shown_line_matches_with_ellipses() -> None:
    out = 'first\n{"injected":[{"name":"clock","summary":"x"}],"kinds":[]}\nlast'
    assert missing(['{"injected":[{"name":"clock",...}],...}', "last"], out) == []
    assert missing(["{...clockwork...}"], out) == ["{...clockwork...}"]


@pytest.mark.slow
@pytest.mark.parametrize("block", RUNS, ids=[b.where for b in RUNS])
def test_the_example_runs_as_written(block: Block) -> None:
    done = run(block)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{block.where} failed:\n{output}"
    gone = missing(block.shown, output)
    assert gone == [], f"{block.where}: not printed: {gone}\n{output}"
