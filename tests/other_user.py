"""A second, real OS user for the tests whose attacker is another local user (issue 30).

Created with ``useradd`` when the tests run as root; elsewhere such a test is skipped, and
fails instead when the ``CI`` environment variable is set (CI runs as root: a skip there
would hide the test).
"""

from __future__ import annotations

import os
import pwd
import subprocess
from typing import Any, Final

import pytest

NAME: Final = "chalie-probe"


def other_user() -> pwd.struct_passwd:
    """The second user (created once, no home, no shell); skip or fail where it cannot be."""
    if os.geteuid() != 0:
        why = "a second OS user needs root (useradd)"
        if os.environ.get("CI"):
            pytest.fail(f"{why}: CI must run these tests as root")
        pytest.skip(why)
    try:
        return pwd.getpwnam(NAME)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", NAME],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(NAME)


def run_as(user: pwd.struct_passwd, argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as that user alone (its uid and gid, no supplementary groups)."""
    return subprocess.run(
        argv,
        user=user.pw_uid,
        group=user.pw_gid,
        extra_groups=[],
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "HOME": "/"},
        capture_output=True,
        text=True,
        check=False,
        **kw,
    )
