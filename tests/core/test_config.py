"""config.toml: one typed Struct; a bad key or value is one line naming file, key, value, range."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from chalie.process.config import Config, ConfigError, EmbedderConfig, RayTaskConfig, WorkersConfig


def _load(home: Path, text: str) -> Config:
    (home / "config.toml").write_text(text)
    return Config.load(home)


def test_an_absent_file_gives_every_default_and_creates_nothing(tmp_path: Path) -> None:
    home = tmp_path / "missing"
    config = Config.load(home)
    assert not home.exists()
    assert config.home == home
    assert (config.workers, config.inline_threads, config.approval_expiry) == (2, 16, 300.0)
    assert config.abilities_dir == home / "abilities"
    assert config.embedder == EmbedderConfig()
    assert config.embedder.options() == {"backend": "onnx"}


@pytest.mark.parametrize(
    ("line", "key", "shown", "allowed"),
    [
        ("workers = 0", "workers", "0", "from 1 to 32"),
        ("workers = 500", "workers", "500", "from 1 to 32"),
        ("workers = 2.5", "workers", "2.5", "an integer"),
        ("workers = true", "workers", "true", "an integer"),
        ("inline_threads = 0", "inline_threads", "0", "from 1 to 256"),
        ("inline_threads = 100000000", "inline_threads", "100000000", "from 1 to 256"),
        ("approval_expiry = -1", "approval_expiry", "-1", "from 1 to 86400"),
        ("approval_expiry = nan", "approval_expiry", "nan", "from 1 to 86400"),
        ("approval_expiry = inf", "approval_expiry", "inf", "from 1 to 86400"),
        ("approval_expiry = '300'", "approval_expiry", '"300"', "a number"),
        ("abilities_dir = ''", "abilities_dir", '""', "a path"),
        ("embedder = 3", "embedder", "3", "a table"),
        ("[embedder]\nbackend = 'word2vec'", "embedder.backend", '"word2vec"', '"onnx"'),
        ("[embedder]\nthreads = 0", "embedder.threads", "0", "from 1 to 64"),
        ("[embedder]\nthreads = 1000", "embedder.threads", "1000", "from 1 to 64"),
        ("[embedder]\nidle_unload = -1", "embedder.idle_unload", "-1", "from 0 to 86400"),
        ("[outbox]\nmax_age = 0", "outbox.max_age", "0", "from 60 to 7776000"),
        ("[outbox]\nmax_rows = 0", "outbox.max_rows", "0", "from 1 to 1000000"),
        (
            "[models.small]\ntool_call_rescue = 'maybe'",
            "models.small.tool_call_rescue",
            '"maybe"',
            "auto",
        ),
        ("[models.small]\nanswer_nudge = 1", "models.small.answer_nudge", "1", "off"),
    ],
)
def test_a_bad_value_is_one_line_naming_key_value_and_range(
    tmp_path: Path, line: str, key: str, shown: str, allowed: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, line + "\n")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path / 'config.toml'}: {key} = {shown}: must be ")
    assert allowed in message


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("workrs = 2\n", "'workrs'"),
        ("[embedder]\nthread = 2\n", "'embedder.thread'"),
        ("[mystery]\nx = 1\n", "'mystery'"),
        ("home = '/elsewhere'\n", "'home'"),
    ],
)
def test_an_unknown_key_is_an_error_naming_the_key_and_the_file(
    tmp_path: Path, text: str, name: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, text)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(str(tmp_path / "config.toml"))
    assert f"unknown key {name}" in message


def test_a_backend_missing_its_fields_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"embedder.url and embedder.model"):
        _load(tmp_path, "[embedder]\nbackend = 'openai'\n")
    with pytest.raises(ConfigError, match=r"embedder.model"):
        _load(tmp_path, "[embedder]\nbackend = 'sentence-transformers'\n")
    ok = _load(
        tmp_path, "[embedder]\nbackend = 'openai'\nurl = 'http://127.0.0.1:1'\nmodel = 'm'\n"
    )
    assert ok.embedder.options() == {"backend": "openai", "url": "http://127.0.0.1:1", "model": "m"}


def test_broken_toml_and_unreadable_files_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid TOML") as caught:
        _load(tmp_path, "workers = [oops\n")
    assert "\n" not in str(caught.value)
    (tmp_path / "config.toml").unlink()
    (tmp_path / "config.toml").mkdir()
    with pytest.raises(ConfigError, match="cannot read it"):
        Config.load(tmp_path)
    (tmp_path / "config.toml").rmdir()
    (tmp_path / "config.toml").write_bytes(b"workers = '\xff'\n")
    with pytest.raises(ConfigError, match="cannot read it"):
        Config.load(tmp_path)


def test_good_values_are_taken_and_paths_are_relative_to_the_home(tmp_path: Path) -> None:
    config = _load(
        tmp_path,
        "workers = 4\ninline_threads = 8\napproval_expiry = 30\nabilities_dir = 'mine'\n"
        "[embedder]\nbackend = 'e5-multilingual'\nthreads = 2\n",
    )
    assert (config.workers, config.inline_threads) == (4, 8)
    assert config.approval_expiry == 30.0 and isinstance(config.approval_expiry, float)
    assert not math.isnan(config.approval_expiry)
    assert config.abilities_dir == tmp_path / "mine"
    assert config.embedder.options() == {"backend": "e5-multilingual", "threads": 2}


def test_the_abilities_env_var_is_the_default_drop_in_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHALIE_ABILITIES_DIR", str(tmp_path / "env-drop"))
    assert Config.load(tmp_path).abilities_dir == tmp_path / "env-drop"
    assert _load(tmp_path, "abilities_dir = 'file-drop'\n").abilities_dir == tmp_path / "file-drop"


def test_an_oversized_value_is_cut_in_the_message(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, f"[embedder]\nbackend = '{'x' * 5000}'\n")
    assert len(str(caught.value)) < len(str(tmp_path)) + 300


@pytest.mark.parametrize(
    "line",
    ["workers = 0", "inline_threads = 100000000", "approval_expiry = nan", "workers = 500"],
)
def test_run_with_a_bad_value_is_one_line_and_exit_1_before_anything_starts(
    tmp_path: Path, line: str
) -> None:
    from click.testing import CliRunner

    from chalie_app.cli import cli

    (tmp_path / "config.toml").write_text(line + "\n")
    result = CliRunner().invoke(cli, ["--home", str(tmp_path), "run"])
    assert result.exit_code == 1
    assert len(result.stderr.strip().splitlines()) == 1
    assert line.split(" = ")[0] in result.stderr and "must be" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]  # nothing started


# -- [workers]: the engine that runs the process abilities ---------------------------------


def test_workers_n_is_the_local_pool_and_a_workers_table_chooses_the_engine(
    tmp_path: Path,
) -> None:
    assert _load(tmp_path, "workers = 3\n").worker_settings == WorkersConfig(count=3)
    config = _load(
        tmp_path,
        '[workers]\nengine = "ray"\naddress = "10.0.0.5:6379"\n'
        "[workers.abilities.browser]\nnum_cpus = 0.5\nresources = { chromium = 1 }\n",
    )
    settings = config.worker_settings
    assert (settings.engine, settings.address, settings.count) == ("ray", "10.0.0.5:6379", 2)
    assert settings.abilities["browser"] == RayTaskConfig(num_cpus=0.5, resources={"chromium": 1.0})
    assert Config.load(tmp_path / "none").worker_settings.engine == "local"  # the default


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (
            '[workers]\nengine = "ray"',
            'config.toml: [workers]: workers.engine = "ray" needs workers.address',
        ),
        (
            '[workers]\nengine = "dask"',
            'config.toml: workers.engine = "dask": must be one of "local", "ray"',
        ),
        ("[workers]\ncount = 0", "config.toml: workers.count = 0: must be an integer from 1 to 32"),
        (
            '[workers]\naddress = "auto"',
            "config.toml: [workers]: workers.address and [workers.abilities] apply only with",
        ),
        (
            '[workers]\nengine = "ray"\naddress = "not an address"',
            'config.toml: workers.address = "not an address": must be a string matching',
        ),
        (
            '[workers]\nengine = "ray"\naddress = "auto"\n[workers.abilities.browser]\nfoo = 1',
            "config.toml: unknown key 'workers.abilities.browser.foo' (known keys here: num_cpus",
        ),
        (
            '[workers]\nengine = "ray"\naddress = "auto"\n'
            "[workers.abilities.browser]\nnum_cpus = -1",
            "config.toml: workers.abilities.browser.num_cpus = -1: must be a number from 0 to 1024",
        ),
        (
            '[workers]\nengine = "ray"\naddress = "auto"\n'
            "[workers.abilities.browser]\nresources = { CPU = 2 }",
            "config.toml: [workers.abilities.browser]: resources may not name Ray's own CPU",
        ),
        ("workers = 0", "config.toml: workers = 0: must be an integer from 1 to 32 or a table"),
    ],
)
def test_a_bad_workers_setting_is_one_line(tmp_path: Path, text: str, line: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, text + "\n")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(str(tmp_path / line)), message
