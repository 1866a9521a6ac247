"""A throw-away PostgreSQL cluster on loopback, for the store tests and the store benchmark.

``PgCluster.start()`` runs Debian's ``initdb`` and ``pg_ctl`` (PostgreSQL 15,
``apt-get install -y postgresql``) as an unprivileged user: the ``postgres``
system user the package makes when this runs as root (initdb refuses root),
else the current user. The cluster lives in its own temp folder (its socket
too), listens on 127.0.0.1 only, on a free port, with ``fsync=off`` (a test
cluster: nothing in it outlives the run). ``stop()`` stops that cluster by its
data folder (``pg_ctl stop``) and removes the folder: Debian's own cluster and
any other are never touched.

Each test gets a database of its own (:meth:`PgCluster.new_database`), so one
cluster serves a whole session.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

BIN_DIRS = tuple(sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True))
_SERIAL = itertools.count(1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def bin_dir() -> Path | None:
    """The newest installed PostgreSQL's programs, or None when there is none."""
    for found in BIN_DIRS:
        if (found / "initdb").exists() and (found / "pg_ctl").exists():
            return found
    return None


class PgCluster:
    """One PostgreSQL server process and its data folder; ``url(db)`` reaches a database."""

    def __init__(self) -> None:
        found = bin_dir()
        if found is None:
            raise RuntimeError("PostgreSQL is not installed: apt-get install -y postgresql")
        self.bin = found
        self.port = free_port()
        self.tmp = Path(tempfile.mkdtemp(prefix="chpg-", dir="/tmp"))
        self.data = self.tmp / "data"
        self.log = self.tmp / "log"
        self._as: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.tmp, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self.started = False

    def _run(self, *argv: str, timeout: float = 60.0) -> None:
        done = subprocess.run(
            [*self._as, *argv],
            cwd="/tmp",
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{argv[0]} failed ({done.returncode}): {done.stderr}{log}")

    def start(self) -> PgCluster:
        self._run(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
            "--no-sync",
        )
        options = (
            f"-k {self.tmp} -p {self.port} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c max_connections=200"
        )
        # -l: without a log file the server keeps pg_ctl's stdout open (run() would hang).
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w",
            "-o", options, "start",
        )  # fmt: skip
        self.started = True
        return self

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh empty database's url (one per test: no state leaks between tests)."""
        import psycopg

        name = f"t{os.getpid()}_{next(_SERIAL)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}".encode())
        return self.url(name)

    def stop(self) -> None:
        if self.started:
            self.started = False
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w",
                      "stop")  # fmt: skip
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> PgCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
