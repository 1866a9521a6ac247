"""The evaluation harness and ``chalie discovery eval``: loading, scoring, the real find path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from chalie.discovery.cascade import MAX_ENTRY_CHARS
from chalie.discovery.embedder import load_embedder
from chalie.discovery.engine import DiscoveryEngine
from chalie.discovery.evaluate import (
    MAX_PROSE_CHARS,
    EvalDataError,
    EvalQuery,
    QueryOutcome,
    evaluate,
    fit_entry,
    format_report,
    load_catalogue,
    load_queries,
    score,
)
from chalie.discovery.types import ToolDoc
from chalie_app.cli import cli

# Starts processes, loads a model or builds indexes: deselect with -m "not slow".
pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parents[4] / "shared" / "data" / "discovery"
if not DATA.is_dir():
    DATA = Path("/work/shared/data/discovery")


def write(path: Path, rows: list[object]) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_a_catalogue_takes_both_shapes(tmp_path: Path) -> None:
    path = write(
        tmp_path / "tools.jsonl",
        [
            {"name": "get_weather", "description": "Weather for a city."},
            "",
            {"name": "set_timer", "summary": "Start a timer.", "examples": ["timer for 5 min"]},
        ],
    )
    docs = load_catalogue(path)
    assert docs == [
        ToolDoc("get_weather", "Weather for a city.", (), source="eval"),
        ToolDoc("set_timer", "Start a timer.", ("timer for 5 min",), source="eval"),
    ]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (['{"name": "a", "description": "x"', ""], ":1: not JSON"),
        ([{"name": "a", "description": "x"}, [1, 2]], ":2: expected a JSON object"),
        ([{"description": "x"}], "'name' must be a non-empty string"),
        ([{"name": "a", "description": 7}], "'description' must be a string"),
        ([{"name": "a", "summary": "x"}, {"name": "a", "summary": "y"}], "appears twice"),
        ([{"name": "a", "summary": "x", "examples": "one"}], "'examples' must be a list"),
        ([{"name": "a", "summary": "x", "examples": [""]}], "every example"),
        ([{"name": "a" * 500, "summary": "x"}], "longer than"),
        ([""], "no tools"),
    ],
)
def test_a_malformed_catalogue_names_the_problem(
    tmp_path: Path, rows: list[object], message: str
) -> None:
    with pytest.raises(EvalDataError, match=message):
        load_catalogue(write(tmp_path / "tools.jsonl", rows))


def test_a_tool_without_a_description_is_found_by_its_name(tmp_path: Path) -> None:
    tools = write(
        tmp_path / "tools.jsonl",
        [
            {"name": "get_weather_forecast"},
            {"name": "send_email", "description": None},
            {"name": "set_timer", "description": ""},
            {"name": "translate_text", "description": "Translate " + "text " * 2000},
        ],
    )
    docs = load_catalogue(tools)
    assert [d.summary for d in docs[:3]] == ["", "", ""]
    assert len(docs[3].summary) <= MAX_PROSE_CHARS
    queries = write(
        tmp_path / "q.jsonl",
        [
            {"query": "weather forecast for tomorrow", "gold": ["get_weather_forecast"]},
            {"query": "send an email to Bob " + "please " * 1000, "gold": ["send_email"]},
        ],
    )
    loaded = load_queries(queries, known={d.name for d in docs})
    report = evaluate(DiscoveryEngine.build(docs, load_embedder()), loaded, tools=len(docs))
    assert report.truncated == 1
    assert report.recall_at_1 == 100.0


def test_a_missing_file_is_an_eval_data_error(tmp_path: Path) -> None:
    with pytest.raises(EvalDataError, match="not found"):
        load_catalogue(tmp_path / "absent.jsonl")
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(EvalDataError, match="unreadable"):
        load_queries(tmp_path / "bin.jsonl")


def test_queries_are_checked_against_the_catalogue(tmp_path: Path) -> None:
    path = write(
        tmp_path / "q.jsonl",
        [
            {"query": "rain?", "gold": ["get_weather"], "type": "single"},
            {"query": "hello", "gold": [], "type": "none"},
            {"query": "both", "gold": ["get_weather", "set_timer"]},
        ],
    )
    queries = load_queries(path, known={"get_weather", "set_timer"})
    assert [q.type for q in queries] == ["single", "none", "multi"]
    with pytest.raises(EvalDataError, match="not in the catalogue"):
        load_queries(path, known={"get_weather"})


@pytest.mark.parametrize(
    "row",
    [
        {"query": "x", "gold": ["a"], "type": "none"},
        {"query": "x", "gold": [], "type": "single"},
        {"query": "x", "gold": "a"},
        {"query": "x", "gold": ["a"], "type": "maybe"},
        {"query": "", "gold": ["a"]},
    ],
)
def test_an_inconsistent_query_is_refused(tmp_path: Path, row: dict[str, object]) -> None:
    with pytest.raises(EvalDataError):
        load_queries(write(tmp_path / "q.jsonl", [row]))


def test_a_long_query_is_cut_at_a_word_boundary() -> None:
    text = "find " + "cheap flights to somewhere warm " * 20
    entry, cut = fit_entry(text)
    assert cut
    assert len(entry) <= MAX_ENTRY_CHARS
    assert text.startswith(entry)
    assert not entry.endswith(" ")
    assert fit_entry("  short\n query ") == ("short query", False)


def outcome(gold: tuple[str, ...], found: tuple[str, ...], kind: str = "single") -> QueryOutcome:
    return QueryOutcome("q", gold, kind, found, "vector" if found else "none", 0.001, False)


def test_the_figures_follow_their_definitions() -> None:
    report = score(
        [
            outcome(("a",), ("a", "b")),  # rank 1
            outcome(("a",), ("b", "c", "a")),  # rank 3
            outcome(("a",), ("b", "c", "d", "e", "f", "a")),  # rank 6: outside R@5
            outcome(("a", "b"), ("a", "x", "y", "z", "w", "b"), "multi"),  # half within R@5
            outcome((), (), "none"),
            outcome((), ("junk",), "none"),
        ]
    )
    assert report.tool_queries == 4 and report.none_queries == 2
    assert report.recall_at_1 == pytest.approx(100 * (1 + 0 + 0 + 0.5) / 4)
    assert report.recall_at_3 == pytest.approx(100 * (1 + 1 + 0 + 0.5) / 4)
    assert report.recall_at_5 == pytest.approx(100 * (1 + 1 + 0 + 0.5) / 4)
    assert report.mrr_at_10 == pytest.approx(100 * (1 + 1 / 3 + 1 / 6 + 1) / 4)
    assert report.none_empty == 50.0
    assert report.rungs == {"none": 1, "vector": 5}
    assert [m.found[0] for m in report.misses(5)] == ["b", "a"]
    assert "R@5  62.5" in format_report(report)


def test_evaluate_drives_the_real_cascade() -> None:
    docs = [
        ToolDoc("get_weather", "Current weather and the forecast for a city.", ("rain in Paris",)),
        ToolDoc("set_timer", "Start a countdown timer.", ("timer for ten minutes",)),
        ToolDoc("send_email", "Compose and send an email.", ("email Bob",)),
    ]
    engine = DiscoveryEngine.build(docs, load_embedder())
    queries = [
        EvalQuery("set_timer", ("set_timer",), "single"),  # the exact-name rung
        EvalQuery("will I need an umbrella tomorrow", ("get_weather",), "single"),
        EvalQuery("x" * 300, ("send_email",), "single"),  # too long: cut, still answered
        EvalQuery("\x00\x01", ("send_email",), "single"),  # find_tools refuses it: a miss
    ]
    report = evaluate(engine, queries, tools=len(docs))
    assert report.rungs.get("exact") == 1
    assert report.outcomes[0].found[0] == "set_timer"
    assert report.outcomes[1].found[0] == "get_weather"
    assert report.truncated == 1
    assert report.outcomes[3].rung == "refused" and report.outcomes[3].found == ()
    assert report.latency_p50_ms > 0


def test_the_eval_command_reports_assistant_40_end_to_end(tmp_path: Path) -> None:
    root = DATA / "assistant-40"
    if not (root / "tools.jsonl").is_file():
        pytest.skip(f"evaluation data not found in {DATA}")
    result = CliRunner().invoke(
        cli,
        [
            "--home",
            str(tmp_path / "home"),
            "discovery",
            "eval",
            "--tools",
            str(root / "tools.jsonl"),
            "--queries",
            str(root / "queries.jsonl"),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    assert figures["tools"] == 40 and figures["tool_queries"] == 80
    assert figures["none_queries"] == 20
    # the published figure: paraphrased queries find their tool within the top 3
    assert figures["recall_at_3"] >= 95
    assert 0 <= figures["none_empty"] <= 100
    assert figures["model_id"] == load_embedder().model_id


def test_the_eval_command_names_a_bad_line(tmp_path: Path) -> None:
    tools = write(tmp_path / "tools.jsonl", [{"name": "a", "summary": "x"}, "{oops"])
    queries = write(tmp_path / "q.jsonl", [{"query": "x", "gold": ["a"]}])
    result = CliRunner().invoke(
        cli,
        [
            "--home",
            str(tmp_path / "home"),
            "discovery",
            "eval",
            "--tools",
            str(tools),
            "--queries",
            str(queries),
        ],
    )
    assert result.exit_code == 1
    assert "tools.jsonl:2: not JSON" in result.stderr


LEARN_TOOLS = [
    {"name": "horoscope", "description": "Daily horoscope for a star sign."},
    {"name": "zodiac_facts", "description": "Facts about the signs of the zodiac."},
    {"name": "get_weather", "description": "Current weather and forecast for a city."},
]


def run_eval(tmp_path: Path, *extra: str) -> Any:
    tools = write(tmp_path / "tools.jsonl", list(LEARN_TOOLS))
    return CliRunner().invoke(
        cli,
        ["--home", str(tmp_path / "home"), "discovery", "eval", "--tools", str(tools), *extra],
    )


def test_learn_from_feeds_the_real_learning_path_before_scoring(tmp_path: Path) -> None:
    asked = "what's in the cards for Sagittarius this week"
    learn = write(
        tmp_path / "learn.jsonl",
        [
            {"query": asked, "gold": ["horoscope"]},
            {"query": "I like the sea", "gold": [], "type": "none"},  # never learned from
        ],
    )
    queries = write(tmp_path / "q.jsonl", [{"query": asked, "gold": ["horoscope"]}])
    result = run_eval(tmp_path, "--queries", str(queries), "--learn-from", str(learn), "--json")
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout)
    assert figures["recall_at_1"] == 100.0
    assert figures["learning"].startswith("learned from 2 queries")
    assert "added 1" in figures["learning"]


def test_folds_cross_validate_over_the_queries(tmp_path: Path) -> None:
    rows = [
        {"query": f"horoscope reading number {i} for leo", "gold": ["horoscope"]} for i in range(6)
    ]
    queries = write(tmp_path / "q.jsonl", rows)
    result = run_eval(tmp_path, "--queries", str(queries), "--folds", "3")
    assert result.exit_code == 0, result.output
    assert "3-fold cross-validated learning" in result.stdout


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--folds", "3", "--learn-from", "LEARN"], "pick one"),
        (["--folds", "1"], "--folds"),
        (["--folds", "3", "--ceiling", "0.8"], "calibration"),
        (["--learn-from", "MISSING"], "not found"),
        (["--learn-from", "BADGOLD"], "not in the catalogue"),
    ],
)
def test_bad_learning_options_are_one_line(tmp_path: Path, extra: list[str], message: str) -> None:
    queries = write(tmp_path / "q.jsonl", [{"query": "stars", "gold": ["horoscope"]}])
    learn = write(tmp_path / "learn.jsonl", [{"query": "stars", "gold": ["horoscope"]}])
    bad = write(tmp_path / "bad.jsonl", [{"query": "stars", "gold": ["nope"]}])
    paths = {"LEARN": str(learn), "MISSING": str(tmp_path / "absent.jsonl"), "BADGOLD": str(bad)}
    result = run_eval(tmp_path, "--queries", str(queries), *[paths.get(e, e) for e in extra])
    assert result.exit_code in (1, 2)
    assert message in result.output
    assert "Traceback" not in result.output
