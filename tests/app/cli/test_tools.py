"""`chalie tools list`: the registered abilities, and descriptors exactly as the model sees them."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from chalie.calls.registry import Registry
from chalie_app.cli import cli


def run(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--home", str(tmp_path / "home"), *args])
    return result.exit_code, result.stdout, result.stderr


def test_tools_list_prints_every_registered_ability(tmp_path: Path) -> None:
    code, out, _ = run(tmp_path, "tools", "list")
    assert code == 0
    names = [line.split()[0] for line in out.splitlines()]
    assert {"clock", "calculator"} <= set(names)


def test_tools_list_json_is_exactly_the_model_descriptors(tmp_path: Path) -> None:
    code, out, _ = run(tmp_path, "tools", "list", "--json")
    assert code == 0
    expected = Registry.collect(dropin=tmp_path / "home" / "abilities").descriptors()
    assert json.loads(out) == expected
    clock = next(d for d in json.loads(out) if d["name"] == "clock")
    assert set(clock) == {"name", "description", "input_schema"}
    assert "act_summary" in clock["input_schema"]["required"]


def test_a_broken_config_is_one_clear_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text("workers = [unclosed\n")
    code, _, err = run(tmp_path, "tools", "list")
    assert code == 1
    assert err.startswith("Error: ") and "config.toml" in err and len(err.strip().splitlines()) == 1


def test_a_duplicate_dropin_is_a_clear_error(tmp_path: Path) -> None:
    drop = tmp_path / "home" / "abilities"
    drop.mkdir(parents=True)
    (drop / "clash.py").write_text(
        "from chalie.ability import Ability\n"
        "class C(Ability):\n"
        "    name = 'calculator'\n    summary = 's'\n    tooltip = 't'\n"
        "    examples = ('a', 'b', 'c', 'd', 'e', 'f')\n"
    )
    code, _, err = run(tmp_path, "tools", "list")
    assert code == 1 and "two abilities named 'calculator'" in err


def test_unknown_options_are_usage_errors(tmp_path: Path) -> None:
    code, _, err = run(tmp_path, "tools", "list", "--bogus" * 1000)
    assert code == 2 and "No such option" in err
