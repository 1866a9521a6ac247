"""The data directory: where it is, every path inside it, and whether it is safe to use.

``--home`` or ``CHALIE_HOME`` names it (default: the platform's user data dir).
Nothing here changes a folder the user named: :meth:`Home.create` makes the
directory 0700 only when it does not exist yet, and :meth:`Home.check` refuses
an existing one that is not a directory, belongs to another user, or that
other users can write (they could plant a socket, a pid file or an ability).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ENV_VAR: Final = "CHALIE_HOME"
ABILITIES_ENV_VAR: Final = "CHALIE_ABILITIES_DIR"

CONFIG_NAME: Final = "config.toml"
DB_NAME: Final = "chalie.db"
LOCK_NAME: Final = "chalie.lock"
PID_NAME: Final = "chalie.pid"
CONTROL_SOCKET_NAME: Final = "control.sock"
WORKERS_DIR_NAME: Final = "workers"
ABILITIES_DIR_NAME: Final = "abilities"
SKILLS_DIR_NAME: Final = "skills"
INDEX_DIR_NAME: Final = "index"
CACHE_DIR_NAME: Final = "cache"
# ``chalie brain open``'s page that carries the one-time sign-in link to the browser
# (0600: the link is never on a command line).
SIGN_IN_PAGE_NAME: Final = "brain-open.html"

# ipc paths are capped at 107 bytes by the kernel's sockaddr_un.
MAX_IPC_PATH: Final = 107


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in a file only its owner reads (0600 from its first
    byte, never through a link someone placed there; readers never see half of it)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


class HomeError(RuntimeError):
    """The data directory cannot be used; the message is the one line the operator sees."""


def index_dirs(home: Path) -> tuple[Path, Path]:
    """Where the tool and the skill indexes live in a data directory."""
    return home / INDEX_DIR_NAME / "tools", home / INDEX_DIR_NAME / "skills"


def personal_cache_file(home: Path) -> Path:
    """Where the calendar objects synced from people's accounts are kept across restarts."""
    return home / CACHE_DIR_NAME / "calendars.db"


def memory_index_dir(home: Path) -> Path:
    """Where the memory indexes live (apart from the tool and skill indexes)."""
    return home / INDEX_DIR_NAME / "memory"


@dataclass(frozen=True)
class Home:
    """One data directory, by path; building one touches nothing on disk."""

    root: Path

    @classmethod
    def locate(cls, explicit: str | os.PathLike[str] | None = None) -> Home:
        """The data directory the command line, the environment or the platform names."""
        raw = explicit or os.environ.get(ENV_VAR)
        if not raw:
            import platformdirs  # only for the default: most commands are given a directory

            raw = platformdirs.user_data_dir("chalie")
        return cls(Path(raw).expanduser().resolve())

    # -- the layout -----------------------------------------------------------------
    @property
    def config_file(self) -> Path:
        return self.root / CONFIG_NAME

    @property
    def db(self) -> Path:
        return self.root / DB_NAME

    @property
    def lock_file(self) -> Path:
        return self.root / LOCK_NAME

    @property
    def pid_file(self) -> Path:
        return self.root / PID_NAME

    @property
    def control_socket(self) -> Path:
        return self.root / CONTROL_SOCKET_NAME

    @property
    def workers_dir(self) -> Path:
        return self.root / WORKERS_DIR_NAME

    @property
    def abilities_dir(self) -> Path:
        return self.root / ABILITIES_DIR_NAME

    @property
    def skills_dir(self) -> Path:
        return self.root / SKILLS_DIR_NAME

    @property
    def index_dirs(self) -> tuple[Path, Path]:
        return index_dirs(self.root)

    @property
    def sign_in_page(self) -> Path:
        return self.root / SIGN_IN_PAGE_NAME

    # -- safety -------------------------------------------------------------------
    def exists(self) -> bool:
        return os.path.lexists(self.root)

    def check(self) -> None:
        """HomeError if the existing directory is unsafe or unusable; a missing one is fine."""
        try:
            st = os.stat(self.root)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise HomeError(f"cannot use data directory {self.root}: {exc.strerror}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise HomeError(f"data directory {self.root} is not a directory")
        if st.st_uid != os.geteuid():
            raise HomeError(
                f"data directory {self.root} belongs to uid {st.st_uid}, not to you "
                f"(uid {os.geteuid()}); choose your own with --home or {ENV_VAR}"
            )
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise HomeError(
                f"data directory {self.root} is writable by other users "
                f"(mode {stat.S_IMODE(st.st_mode):04o}); use a private folder "
                f"or `chmod go-w {self.root}`"
            )

    def secret_files(self) -> list[Path]:
        """Every file here that holds a secret or private data: tokens, the database and its
        journals, the MCP secrets, the configuration (keys), the calendar cache, the sign-in
        page, the MCP servers' logs."""
        named = [
            self.db,
            self.config_file,
            self.sign_in_page,
            self.root / "first-token",
            self.root / "mcp-secrets.json",
            personal_cache_file(self.root),
        ]
        found = [p for base in named for p in (base, Path(f"{base}-wal"), Path(f"{base}-shm"))]
        logs = self.root / "logs"
        if logs.is_dir() and not logs.is_symlink():
            found.extend(sorted(logs.glob("*.log")))
        return found

    def secure(self) -> tuple[list[tuple[Path, int]], int | None]:
        """Make every secret file 0600 (as ``chalie.db`` is made): the files whose mode was
        looser, with that mode; and the home's own mode when other users can read or enter
        it (None: they cannot). A link is never followed (its target is not ours to change)."""
        fixed: list[tuple[Path, int]] = []
        for path in self.secret_files():
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                continue
            mode = stat.S_IMODE(st.st_mode)
            if mode & 0o077:
                try:
                    os.chmod(path, mode & 0o700 | 0o600, follow_symlinks=False)
                except OSError:
                    continue
                fixed.append((path, mode))
        try:
            home_mode = stat.S_IMODE(os.stat(self.root).st_mode)
        except OSError:
            return fixed, None
        return fixed, home_mode if home_mode & 0o077 else None

    def create(self) -> Path:
        """Check the directory, creating it 0700 if missing; an existing one keeps its mode."""
        self.check()
        if not self.exists():
            try:
                self.root.parent.mkdir(parents=True, exist_ok=True)
                self.root.mkdir(mode=0o700)
                os.chmod(self.root, 0o700)  # mkdir's mode passes through the umask
            except FileExistsError:
                self.check()  # created by someone else meanwhile: judge it like any other
            except OSError as exc:
                raise HomeError(
                    f"cannot create data directory {self.root}: {exc.strerror}"
                ) from None
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise HomeError(f"data directory {self.root} is not writable")
        return self.root

    def endpoint(self) -> str:
        """The control socket's ipc endpoint; HomeError when the path is too long for one."""
        path = self.control_socket
        if len(os.fsencode(path)) > MAX_IPC_PATH:
            raise HomeError(f"data directory path too long for an ipc socket: {path}")
        return f"ipc://{path}"
