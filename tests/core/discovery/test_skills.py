"""Skills: shipped playbooks parse, user ones override, bad files are reported, search works."""

from __future__ import annotations

from pathlib import Path

import pytest

from chalie.discovery.embedder import load_embedder
from chalie.discovery.engine import DiscoveryEngine
from chalie.discovery.skills import (
    MAX_SKILL_BYTES,
    SkillError,
    SkillLibrary,
    builtin_skills_dir,
    parse_skill,
)

# Starts processes, loads a model or builds indexes: deselect with -m "not slow".
pytestmark = pytest.mark.slow

GOOD = """---
name: water_the_plants
summary: Keep the house plants alive while the user is away.
examples:
  - remind me about the plants
  - "who waters the ficus"
---
1. List the plants.
2. Set reminders.
"""


def test_the_shipped_playbooks_are_real_and_parse() -> None:
    library = SkillLibrary.load([(builtin_skills_dir(), "builtin")])
    assert library.failures == []
    assert len(library) >= 3
    for skill in library:
        assert skill.origin == "builtin"
        assert len(skill.examples) >= 5
        assert len(skill.body) > 500  # a playbook, not a placeholder
        assert skill.text.startswith(f"# {skill.name}\n")


def test_front_matter_scalars_lists_and_quotes() -> None:
    skill = parse_skill(GOOD, path="x.md")
    assert skill.name == "water_the_plants"
    assert skill.examples == ("remind me about the plants", "who waters the ficus")
    assert skill.body.startswith("1. List the plants.")
    doc = skill.doc()
    assert doc.source == "skill:user" and doc.summary == skill.summary


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("no front matter at all", "front-matter fence"),
        ("---\nname: x_y\nsummary: s\n", "no closing"),
        ("---\nsummary: s\n---\nbody", "name must be"),
        ("---\nname: Bad Name\nsummary: s\n---\nbody", "name must be"),
        ("---\nname: ok_name\n---\nbody", "summary must be"),
        ("---\nname: ok_name\nsummary: s\n---\n   \n", "body is empty"),
        ("---\nname: ok_name\nsummary: s\n- stray\n---\nbody", "list item outside"),
        ("---\nname: ok_name\nname: again\nsummary: s\n---\nbody", "appears twice"),
        ("---\nname ok\n---\nbody", "expected 'key: value'"),
        (
            "---\nname: ok_name\nsummary: s\nexamples:\n  - " + "x" * 300 + "\n---\nbody",
            "each example",
        ),
    ],
)
def test_malformed_playbooks_are_refused_with_the_rule(text: str, message: str) -> None:
    with pytest.raises(SkillError, match=message):
        parse_skill(text, path="bad.md")


def test_a_user_playbook_replaces_a_shipped_one_and_bad_files_are_reported(tmp_path: Path) -> None:
    user = tmp_path / "skills"
    user.mkdir()
    (user / "plan_a_trip.md").write_text(GOOD.replace("water_the_plants", "plan_a_trip"))
    (user / "broken.md").write_text("not a skill")
    (user / "huge.md").write_text("---\n" + "x" * (MAX_SKILL_BYTES + 1))
    (user / "binary.md").write_bytes(b"\xff\xfe\x00")
    library = SkillLibrary.standard(tmp_path)
    trip = library.get("plan_a_trip")
    assert trip is not None and trip.origin == "user"
    assert {Path(f.path).name for f in library.failures} == {"broken.md", "huge.md", "binary.md"}
    assert library.get("research_a_question") is not None  # the others still load


def test_the_engine_finds_playbooks_by_name_and_by_described_task() -> None:
    library = SkillLibrary.load([(builtin_skills_dir(), "builtin")])
    engine = DiscoveryEngine.build(library.docs(), load_embedder())
    assert engine.find(["plan_a_trip"]).names == ["plan_a_trip"]
    assert engine.find(["organise a week in Japan with my family"]).names[0] == "plan_a_trip"
    found = engine.find(["the meeting has people in Berlin and Sydney, pick a time"]).names
    assert found[0] == "schedule_across_time_zones"
