"""Skills: step-by-step playbooks kept as Markdown files with front matter.

A skill file looks like::

    ---
    name: plan_a_trip
    summary: One sentence saying what the playbook is for.
    examples:
      - a phrase a user might say
      - another one
    ---
    # The playbook itself, in Markdown

Playbooks ship in ``abilities/skills/`` and users add their own in
``<home>/skills/``; a user playbook replaces a shipped one of the same name.
The same discovery engine indexes them (name → name index, summary and
examples → vector index); find_skills returns the whole text.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Final

from chalie.discovery.types import ToolDoc
from chalie.wire.tool_names import NAME_MAX, NAME_PATTERN

log = logging.getLogger("chalie.discovery.skills")

MAX_SKILL_BYTES: Final = 64_000
MAX_SUMMARY: Final = 500
MAX_EXAMPLES: Final = 12
MAX_EXAMPLE_CHARS: Final = 200
FENCE: Final = "---"


class SkillError(ValueError):
    """A playbook file is malformed; the message names the file and the rule."""


@dataclass(frozen=True)
class Skill:
    """One playbook: its front matter, its Markdown body and where it came from."""

    name: str
    summary: str
    examples: tuple[str, ...]
    body: str
    path: str
    origin: str  # "builtin" or "user"

    @property
    def text(self) -> str:
        """The full playbook as find_skills returns it."""
        return f"# {self.name}\n\n{self.summary}\n\n{self.body.strip()}\n"

    def doc(self) -> ToolDoc:
        return ToolDoc(
            name=self.name,
            summary=self.summary,
            examples=self.examples,
            tooltip=self.summary[:80],
            source=f"skill:{self.origin}",
        )


def _scalar(raw: str) -> str:
    value = raw.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        value = value[1:-1]
    return value.strip()


def parse_front_matter(text: str, where: str) -> tuple[dict[str, str | list[str]], str]:
    """The front matter (scalars and lists of scalars) and the body after it."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != FENCE:
        raise SkillError(f"{where}: a skill starts with a '---' front-matter fence")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == FENCE)
    except StopIteration:
        raise SkillError(f"{where}: the front matter has no closing '---'") from None
    fields: dict[str, str | list[str]] = {}
    current: str | None = None
    for number, line in enumerate(lines[1:end], start=2):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        stripped = line.strip()
        if stripped.startswith("- ") or stripped == "-":
            listed = fields.get(current) if current else None
            if not isinstance(listed, list):
                raise SkillError(f"{where}:{number}: a list item outside a list field")
            listed.append(_scalar(stripped[1:]))
            continue
        key, sep, value = line.partition(":")
        key = key.strip()
        if not sep or not key.isidentifier() or line[0].isspace():
            raise SkillError(f"{where}:{number}: expected 'key: value', got {line.strip()[:40]!r}")
        if key in fields:
            raise SkillError(f"{where}:{number}: {key!r} appears twice")
        if value.strip():
            fields[key] = _scalar(value)
            current = None
        else:
            fields[key] = []
            current = key
    return fields, "\n".join(lines[end + 1 :])


def parse_skill(text: str, *, path: str = "<text>", origin: str = "user") -> Skill:
    """A Skill from a playbook's text; SkillError naming the first broken rule."""
    fields, body = parse_front_matter(text, path)
    name, summary, examples = fields.get("name"), fields.get("summary"), fields.get("examples", [])
    if not isinstance(name, str) or not NAME_PATTERN.match(name) or len(name) > NAME_MAX:
        raise SkillError(
            f"{path}: name must be lowercase snake case, at most {NAME_MAX} characters"
        )
    if not isinstance(summary, str) or not summary or len(summary) > MAX_SUMMARY:
        raise SkillError(
            f"{path}: summary must be one non-empty line of at most {MAX_SUMMARY} characters"
        )
    if not isinstance(examples, list) or len(examples) > MAX_EXAMPLES:
        raise SkillError(f"{path}: examples must be a list of at most {MAX_EXAMPLES} phrases")
    if not all(e and len(e) <= MAX_EXAMPLE_CHARS for e in examples):
        raise SkillError(f"{path}: each example must be 1 to {MAX_EXAMPLE_CHARS} characters")
    if not body.strip():
        raise SkillError(f"{path}: the playbook body is empty")
    return Skill(name, summary, tuple(examples), body.strip() + "\n", path, origin)


def read_skill(path: Path, origin: str) -> Skill:
    try:
        size = path.stat().st_size
        if size > MAX_SKILL_BYTES:
            raise SkillError(f"{path}: larger than {MAX_SKILL_BYTES} bytes")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SkillError(f"{path}: unreadable: {exc}") from None
    return parse_skill(text, path=str(path), origin=origin)


def builtin_skills_dir() -> Path:
    """The playbooks shipped in the package (``abilities/skills``)."""
    return Path(str(resources.files("abilities") / "skills"))


@dataclass(frozen=True)
class SkillFailure:
    path: str
    error: str


class SkillLibrary:
    """Every playbook by name; later folders override earlier ones."""

    def __init__(self, skills: Iterable[Skill] = ()) -> None:
        self._skills: dict[str, Skill] = {}
        self.failures: list[SkillFailure] = []
        for skill in skills:
            self._skills[skill.name] = skill

    @classmethod
    def load(cls, folders: Iterable[tuple[Path, str]]) -> SkillLibrary:
        """Read ``*.md`` from each (folder, origin); a bad file is reported, not fatal."""
        library = cls()
        for folder, origin in folders:
            if not folder.is_dir():
                continue
            for path in sorted(folder.glob("*.md")):
                if path.name.startswith((".", "_")) or not path.is_file():
                    continue
                try:
                    skill = read_skill(path, origin)
                except SkillError as exc:
                    log.error("skipping skill: %s", exc)
                    library.failures.append(SkillFailure(str(path), str(exc)))
                    continue
                if skill.name in library._skills:
                    log.info(
                        "skill %s from %s replaces %s",
                        skill.name,
                        path,
                        library._skills[skill.name].path,
                    )
                library._skills[skill.name] = skill
        return library

    @classmethod
    def standard(cls, home: Path | None) -> SkillLibrary:
        """The shipped playbooks, then the user's ``<home>/skills``."""
        folders = [(builtin_skills_dir(), "builtin")]
        if home is not None:
            folders.append((home / "skills", "user"))
        return cls.load(folders)

    def get(self, name: str) -> Skill | None:
        return self._skills.get(name)

    def put(self, skill: Skill) -> None:
        """Add or replace one playbook (a connected MCP server's prompt)."""
        self._skills[skill.name] = skill

    def drop(self, names: Iterable[str]) -> None:
        for name in names:
            self._skills.pop(name, None)

    def docs(self) -> list[ToolDoc]:
        return [s.doc() for s in self]

    def __iter__(self) -> Iterator[Skill]:
        return iter(sorted(self._skills.values(), key=lambda s: s.name))

    def __len__(self) -> int:
        return len(self._skills)
