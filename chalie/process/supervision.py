"""Supervision as data and pure decisions: child specs, restart rules, intensity, backoff.

The OTP rules the supervisor actor (``actors.process.supervisor``) applies, with no
actors and no threads here, so each rule is tested with an injected clock:

1. A child exits, normally or abnormally (``should_restart`` decides from its
   restart type: permanent always, transient only after a failure, temporary
   never).
2. Every restart is recorded in the supervisor-wide ``RestartIntensity``
   window; more than ``intensity`` restarts within ``period`` seconds means
   the supervisor gives up and escalates to its parent.
3. Otherwise the restart waits ``backoff_delay(k)``, where ``k`` is how many
   times this child was already restarted within the window, so a crash loop
   slows down exponentially and a child that stayed up a full period starts
   again from the base delay.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

if TYPE_CHECKING:
    import pykka

Restart = Literal["permanent", "transient", "temporary"]
RESTART_TYPES: Final[tuple[str, ...]] = ("permanent", "transient", "temporary")

DEFAULT_INTENSITY: Final = 5
DEFAULT_PERIOD: Final = 10.0
DEFAULT_BACKOFF_BASE: Final = 0.05
DEFAULT_BACKOFF_CAP: Final = 2.0


@dataclass(frozen=True)
class ChildSpec:
    """One supervised child, declared as data.

    ``start`` starts the child actor and returns its ref; the supervisor calls
    it again, from its own thread, for every restart. ``shutdown`` is how long
    the supervisor waits for a clean stop before giving up on the child.
    """

    id: str
    start: Callable[[], pykka.ActorRef[Any]]
    restart: Restart = "permanent"
    shutdown: float = 5.0

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError("a child spec needs a non-empty string id")
        if not callable(self.start):
            raise TypeError(f"child {self.id!r}: start must be callable")
        if self.restart not in RESTART_TYPES:
            raise ValueError(
                f"child {self.id!r}: restart must be one of {', '.join(RESTART_TYPES)}, "
                f"not {self.restart!r}"
            )
        if not isinstance(self.shutdown, int | float) or self.shutdown <= 0:
            raise ValueError(f"child {self.id!r}: shutdown must be a positive number of seconds")


@dataclass(frozen=True)
class OnDemand:
    """Children a supervisor starts on demand, one a key, from one template (OTP's
    ``simple_one_for_one``): every such child is ``restart`` (``transient``: a normal
    exit is final, a failure restarts it), stopped within ``shutdown`` seconds, and
    more than ``intensity`` restarts within ``period`` seconds make the supervisor give
    up and escalate to its parent. A child not restarted is forgotten.
    """

    kind: str
    restart: Restart = "transient"
    shutdown: float = 5.0
    intensity: int = DEFAULT_INTENSITY
    period: float = DEFAULT_PERIOD

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or not self.kind:
            raise ValueError("on-demand children need a non-empty kind")
        if self.restart not in RESTART_TYPES:
            raise ValueError(f"{self.kind}: restart must be one of {', '.join(RESTART_TYPES)}")
        if not isinstance(self.shutdown, int | float) or self.shutdown <= 0:
            raise ValueError(f"{self.kind}: shutdown must be a positive number of seconds")
        RestartIntensity(self.intensity, self.period)  # its own checks

    def spec(self, key: str, start: Callable[[], pykka.ActorRef[Any]]) -> ChildSpec:
        """The child spec of the child for ``key``."""
        return ChildSpec(key, start, self.restart, self.shutdown)


def check_specs(specs: list[ChildSpec] | tuple[ChildSpec, ...]) -> None:
    """Reject a child list with duplicate ids, naming the id."""
    seen: set[str] = set()
    for spec in specs:
        if not isinstance(spec, ChildSpec):
            raise TypeError(f"expected ChildSpec, got {type(spec).__name__}")
        if spec.id in seen:
            raise ValueError(f"two children with id {spec.id!r}")
        seen.add(spec.id)


def should_restart(restart: Restart, *, abnormal: bool) -> bool:
    """Whether an exited child is started again, by its restart type."""
    if restart == "permanent":
        return True
    if restart == "transient":
        return abnormal
    return False


def backoff_delay(attempt: int, *, base: float, cap: float) -> float:
    """Seconds to wait before restart number ``attempt`` (0-based) within the window."""
    if attempt < 0:
        raise ValueError("attempt must be >= 0")
    # The exponent is clamped so a long crash loop never overflows a float.
    return float(min(cap, base * 2 ** min(attempt, 62)))


class RestartIntensity:
    """Restart times within a sliding window of ``period`` seconds.

    ``record(now)`` notes one restart and answers whether it is still within
    the allowed intensity; the first restart past it returns False.
    """

    def __init__(self, intensity: int = DEFAULT_INTENSITY, period: float = DEFAULT_PERIOD) -> None:
        if not isinstance(intensity, int) or intensity < 0:
            raise ValueError("intensity must be a non-negative integer")
        if not isinstance(period, int | float) or period <= 0:
            raise ValueError("period must be a positive number of seconds")
        self.intensity = intensity
        self.period = float(period)
        self._times: deque[tuple[float, str]] = deque()

    def _expire(self, now: float) -> None:
        while self._times and now - self._times[0][0] >= self.period:
            self._times.popleft()

    def record(self, now: float, child_id: str = "") -> bool:
        """Note a restart at ``now``; False when it exceeds the intensity."""
        self._expire(now)
        self._times.append((now, child_id))
        return len(self._times) <= self.intensity

    def recent(self, now: float, child_id: str | None = None) -> int:
        """Restarts within the window, of one child or of all."""
        self._expire(now)
        return sum(1 for _, cid in self._times if child_id is None or cid == child_id)


@dataclass(frozen=True)
class Decision:
    """What to do about one exited child."""

    action: Literal["ignore", "restart", "escalate"]
    delay: float = 0.0


class RestartPolicy:
    """The supervisor's decision for each child exit: restart after a delay, ignore, or escalate."""

    def __init__(
        self,
        *,
        intensity: int = DEFAULT_INTENSITY,
        period: float = DEFAULT_PERIOD,
        backoff_base: float = DEFAULT_BACKOFF_BASE,
        backoff_cap: float = DEFAULT_BACKOFF_CAP,
    ) -> None:
        if backoff_base < 0 or backoff_cap < 0:
            raise ValueError("backoff must be non-negative")
        self.window = RestartIntensity(intensity, period)
        self.backoff_base = float(backoff_base)
        self.backoff_cap = float(backoff_cap)

    def on_exit(self, spec: ChildSpec, *, abnormal: bool, now: float) -> Decision:
        if not should_restart(spec.restart, abnormal=abnormal):
            return Decision("ignore")
        attempt = self.window.recent(now, spec.id)
        if not self.window.record(now, spec.id):
            return Decision("escalate")
        return Decision(
            "restart", backoff_delay(attempt, base=self.backoff_base, cap=self.backoff_cap)
        )
