"""The data directory: a named folder keeps its mode; an unsafe one is one line, always."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from chalie.process.home import Home, HomeError
from chalie_app.cli import cli
from tests.daemon_process import short_home

COMMANDS = [
    ["status"],
    ["stop"],
    ["trail"],
    ["policy", "list"],
    ["tools", "list"],
    ["tools", "call", "clock"],
    ["run"],
]


def invoke(home: Path, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--home", str(home), *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a))
def test_a_home_others_can_write_is_refused_and_keeps_its_mode(
    tmp_path: Path, args: list[str]
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    code, out, err = invoke(shared, *args)
    assert code == 1 and out == ""
    assert err.strip().count("\n") == 0 and "writable by other users" in err
    assert mode(shared) == 0o1777
    assert os.listdir(shared) == []


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a))
def test_a_home_that_is_a_file_is_one_line_for_every_command(
    tmp_path: Path, args: list[str]
) -> None:
    home = tmp_path / "file"
    home.write_text("not a folder")
    code, _, err = invoke(home, *args)
    assert code == 1 and err.strip().count("\n") == 0 and "is not a directory" in err


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the folder to another user")
@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a))
def test_another_users_home_is_refused_in_one_line(tmp_path: Path, args: list[str]) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    code, _, err = invoke(theirs, *args)
    assert code == 1 and err.strip().count("\n") == 0 and "belongs to uid 65534" in err


def test_status_and_offline_commands_create_no_folder(tmp_path: Path) -> None:
    missing = tmp_path / "a" / "b"
    for args in (["status"], ["trail"], ["policy", "list"], ["tools", "list"], ["stop"]):
        invoke(missing, *args)
    assert not (tmp_path / "a").exists()


def test_an_existing_private_home_keeps_its_mode_and_a_new_one_is_created_0700(
    tmp_path: Path,
) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    os.chmod(mine, 0o750)
    assert Home(mine).create() == mine
    assert mode(mine) == 0o750
    fresh = tmp_path / "x" / "fresh"
    Home(fresh).create()
    assert mode(fresh) == 0o700


def test_a_home_the_daemon_cannot_write_is_a_one_line_start_up_error(tmp_path: Path) -> None:
    # As root every folder is writable: a folder under a file stands in for a read-only one.
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    with pytest.raises(HomeError, match=r"cannot (use|create) data directory"):
        Home(blocker / "home").create()
    code, _, err = invoke(blocker / "home", "run")
    assert code == 1 and err.strip().count("\n") == 0


@pytest.mark.slow
def test_run_on_an_unsafe_home_exits_1_with_one_line_and_no_traceback() -> None:
    home = short_home()
    try:
        os.chmod(home, 0o777)
        out = subprocess.run(
            [sys.executable, "-m", "chalie", "--home", str(home), "run"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.returncode == 1
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
        assert mode(home) == 0o777
    finally:
        os.chmod(home, 0o700)
        os.rmdir(home)


def test_the_layout_names_every_path_inside_the_home(tmp_path: Path) -> None:
    home = Home(tmp_path)
    paths = [
        home.config_file,
        home.db,
        home.lock_file,
        home.pid_file,
        home.control_socket,
        home.workers_dir,
        home.abilities_dir,
        home.skills_dir,
        *home.index_dirs,
    ]
    assert all(p.parent in (tmp_path, tmp_path / "index") for p in paths)
    assert len(set(paths)) == len(paths)


def test_help_names_the_environment_variable_and_where_home_goes() -> None:
    out = CliRunner().invoke(cli, ["--help"]).stdout
    assert "CHALIE_HOME" in out and "before or after the command" in out
