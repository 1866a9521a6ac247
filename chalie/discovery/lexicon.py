"""The word check: does a find_tools entry hold words at all, or is it keyboard mash?

A small embedding model places any string somewhere, so "zzzz qqq" lands at a
distance from some tool that real paraphrases also reach. What real entries
have and mash lacks is *words*: an entry reaches the vector rung only when at
least half of its words are known, either English words (the whole-word
entries of the MiniLM tokenizer vocabulary we ship, about 22,700) or words of
the catalogue itself (so a tool called ``qreator`` is found by its name).
Words with letters outside ASCII are not judged (the vocabulary is English).
An entry that is mostly syntax (``for (i = 0; i < n; i++) {}``: at least
SYNTAX_SHARE of its visible characters are brackets, operators and the like)
names no action either, whatever the model.

Measured through the real cascade (tools/bench/bench_discovery_quality.py):
no MetaTool dev or assistant-40 query fails the check, while most random
letters and keyboard mash do. The word part is English and applies to the
English model only (``WORD_CHECK``); the multilingual backend relies on its
request gate and the syntax part.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Container
from importlib import resources
from typing import Final

from chalie.discovery.embedder import MINILM_MODEL_ID

# Models whose entries get the word check (English vocabulary).
WORD_CHECK: Final = frozenset({MINILM_MODEL_ID})
# At least this share of an entry's words must be known.
KNOWN_SHARE: Final = 0.5
# Real entries stay under 0.07 (MetaTool dev) and 0.14 ("run print(sum(range(10)))
# and tell me what comes out", assistant-40); pasted code mostly sits above 0.2.
SYNTAX_SHARE: Final = 0.15
_SYNTAX = frozenset("{}()[];=<>*#$\\|&^~`@")
_WORD = re.compile(r"[^\W_]+")
_ASCII_WORD = re.compile(r"[a-z0-9]+")


@functools.cache
def english_words() -> frozenset[str]:
    """The whole-word, lower-case alphanumeric entries of the shipped tokenizer's vocabulary."""
    path = resources.files("chalie.discovery") / "data" / "all-MiniLM-L6-v2" / "tokenizer.json"
    vocab = json.loads(path.read_text(encoding="utf-8"))["model"]["vocab"]
    return frozenset(w for w in vocab if _ASCII_WORD.fullmatch(w))


def words(text: str) -> list[str]:
    """The entry's words, lower-cased (letters and digits; punctuation splits)."""
    return _WORD.findall(text.lower())


def syntax_share(text: str) -> float:
    """The share of the entry's visible characters that are code syntax."""
    visible = [c for c in text if not c.isspace()]
    return sum(c in _SYNTAX for c in visible) / len(visible) if visible else 0.0


def has_words(
    text: str,
    catalogue: Container[str],
    stem: Callable[[str], str] | None = None,
    *,
    english: bool = True,
) -> bool:
    """True when the entry is not mostly syntax and (``english``) enough of its words are known.

    ``catalogue`` holds the catalogue's lexical terms; ``stem`` maps a word to
    the form those terms use. An entry with no word at all ("!!!?") has none.
    """
    found = words(text)
    if not found or syntax_share(text) >= SYNTAX_SHARE:
        return False
    if not english:
        return True
    known = english_words()
    hits = 0
    for word in found:
        if not word.isascii() or word in known or word in catalogue:
            hits += 1
        elif stem is not None and stem(word) in catalogue:
            hits += 1
    return hits >= KNOWN_SHARE * len(found)
