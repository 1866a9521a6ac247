"""The registry collects abilities with no registration call, and fails loudly and locally."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from chalie.calls.registry import DuplicateAbilityError, Registry, load_ref

ABILITY_SRC = """
from chalie.ability import Ability
from chalie.result import ToolResult

class {cls}(Ability):
    name = "{name}"
    summary = "A drop-in ability for tests."
    tooltip = "Drop-in"
    examples = ("one", "two", "three", "four", "five", "six")

    def run(self, params):
        return ToolResult.success("{name} ran")
"""


def write_ability(folder: Path, file: str, name: str, cls: str = "Dropped") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / file
    path.write_text(ABILITY_SRC.format(name=name, cls=cls))
    return path


def test_builtin_package_is_collected_without_registration() -> None:
    reg = Registry.collect(entry_points=False)
    assert {"clock", "calculator"} <= set(reg.names())
    assert reg.get("clock").ref == "abilities.clock:Clock"  # type: ignore[union-attr]


def test_dropin_folder_abilities_are_collected_and_loadable_by_ref(tmp_path: Path) -> None:
    path = write_ability(tmp_path / "drop", "greeter.py", "greeter_dropin")
    reg = Registry.collect(entry_points=False, dropin=tmp_path / "drop")
    entry = reg.get("greeter_dropin")
    assert entry is not None and entry.source == str(tmp_path / "drop" / "greeter.py")
    assert entry.ref == f"{path.resolve()}:Dropped"
    assert load_ref(entry.ref) is entry.cls


def test_duplicate_names_are_a_startup_error_naming_both_sources(tmp_path: Path) -> None:
    write_ability(tmp_path / "d", "a_clock.py", "clock", cls="OtherClock")
    with pytest.raises(DuplicateAbilityError) as info:
        Registry.collect(entry_points=False, dropin=tmp_path / "d")
    msg = str(info.value)
    assert "'clock'" in msg and "abilities.clock" in msg and "a_clock.py" in msg


def test_a_broken_module_is_reported_by_path_and_spares_the_others(tmp_path: Path) -> None:
    folder = tmp_path / "d"
    write_ability(folder, "good.py", "good_one")
    (folder / "broken.py").write_text("import this_module_does_not_exist\n")
    (folder / "invalid.py").write_text(ABILITY_SRC.format(name="Bad-Name", cls="Bad"))
    reg = Registry.collect(entry_points=False, dropin=folder)
    assert "good_one" in reg
    failed = {Path(f.path).name: f.error for f in reg.failures}
    assert "ModuleNotFoundError" in failed["broken.py"]
    assert "snake case" in failed["invalid.py"]


def test_entry_point_abilities_are_collected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    (site / "extpkg").mkdir(parents=True)
    (site / "extpkg" / "__init__.py").write_text(
        ABILITY_SRC.format(name="from_entry_point", cls="Ext")
    )
    dist = site / "extpkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: extpkg\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[chalie.abilities]\next = extpkg\nbad = extpkg_missing\n"
    )
    monkeypatch.syspath_prepend(str(site))
    reg = Registry.collect()
    assert reg.get("from_entry_point") is not None
    assert "entry point ext" in reg.get("from_entry_point").source  # type: ignore[union-attr]
    assert any("entry point bad" in f.path for f in reg.failures)


def test_private_and_abstract_classes_are_not_registered(tmp_path: Path) -> None:
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "_private.py").write_text(ABILITY_SRC.format(name="private_one", cls="P"))
    (folder / "base.py").write_text(
        textwrap.dedent("""
        from chalie.ability import Ability
        class Base(Ability):
            abstract = True
    """)
    )
    reg = Registry.collect(entry_points=False, dropin=folder)
    assert "private_one" not in reg
    assert not reg.failures


def test_runtime_add_and_remove() -> None:
    reg = Registry.collect(entry_points=False)
    entry = reg.remove("clock")
    assert entry is not None and "clock" not in reg
    reg.add(entry.cls, source="again")
    assert "clock" in reg
