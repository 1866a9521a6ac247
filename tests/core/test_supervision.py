"""Pure supervision rules: restart types, intensity window, exponential backoff."""

from __future__ import annotations

import pytest

from chalie.process.supervision import (
    ChildSpec,
    OnDemand,
    RestartIntensity,
    RestartPolicy,
    backoff_delay,
    check_specs,
    should_restart,
)


def _start() -> object:
    raise AssertionError("never started in these tests")


def spec(id: str = "c", restart: str = "permanent") -> ChildSpec:
    return ChildSpec(id, _start, restart)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("restart", "abnormal", "expected"),
    [
        ("permanent", True, True),
        ("permanent", False, True),
        ("transient", True, True),
        ("transient", False, False),
        ("temporary", True, False),
        ("temporary", False, False),
    ],
)
def test_restart_type_decides_whether_an_exit_restarts(
    restart: str, abnormal: bool, expected: bool
) -> None:
    assert should_restart(restart, abnormal=abnormal) is expected  # type: ignore[arg-type]


def test_restart_delays_grow_exponentially_up_to_the_cap() -> None:
    policy = RestartPolicy(intensity=10, period=100.0, backoff_base=0.05, backoff_cap=0.3)
    delays = [policy.on_exit(spec(), abnormal=True, now=t).delay for t in (0.0, 0.1, 0.2, 0.3, 0.4)]
    assert delays == [0.05, 0.1, 0.2, 0.3, 0.3]


def test_backoff_starts_over_once_a_child_stayed_up_for_a_full_period() -> None:
    policy = RestartPolicy(intensity=10, period=1.0, backoff_base=0.05, backoff_cap=2.0)
    assert policy.on_exit(spec(), abnormal=True, now=0.0).delay == 0.05
    assert policy.on_exit(spec(), abnormal=True, now=0.1).delay == 0.1
    assert policy.on_exit(spec(), abnormal=True, now=5.0).delay == 0.05


def test_backoff_is_counted_per_child() -> None:
    policy = RestartPolicy(intensity=10, period=10.0, backoff_base=0.05)
    policy.on_exit(spec("a"), abnormal=True, now=0.0)
    policy.on_exit(spec("a"), abnormal=True, now=0.1)
    assert policy.on_exit(spec("b"), abnormal=True, now=0.2).delay == 0.05


def test_exceeding_the_intensity_within_the_period_escalates() -> None:
    policy = RestartPolicy(intensity=5, period=10.0)
    actions = [policy.on_exit(spec(), abnormal=True, now=float(t)).action for t in range(6)]
    assert actions == ["restart"] * 5 + ["escalate"]


def test_restarts_spread_over_more_than_the_period_never_escalate() -> None:
    policy = RestartPolicy(intensity=2, period=1.0)
    actions = [policy.on_exit(spec(), abnormal=True, now=t * 0.6).action for t in range(20)]
    assert "escalate" not in actions


def test_intensity_is_shared_by_all_children_of_a_supervisor() -> None:
    policy = RestartPolicy(intensity=2, period=10.0)
    assert policy.on_exit(spec("a"), abnormal=True, now=0.0).action == "restart"
    assert policy.on_exit(spec("b"), abnormal=True, now=0.1).action == "restart"
    assert policy.on_exit(spec("c"), abnormal=True, now=0.2).action == "escalate"


def test_exits_that_do_not_restart_do_not_count_towards_the_intensity() -> None:
    policy = RestartPolicy(intensity=1, period=10.0)
    for t in range(5):
        assert (
            policy.on_exit(spec(restart="temporary"), abnormal=True, now=float(t)).action
            == "ignore"
        )
    assert policy.on_exit(spec(), abnormal=True, now=6.0).action == "restart"


def test_intensity_window_counts_recent_restarts() -> None:
    window = RestartIntensity(3, 2.0)
    for t in (0.0, 0.5, 1.0):
        assert window.record(t, "x")
    assert window.recent(1.5) == 3
    assert window.recent(2.2) == 2
    assert window.recent(10.0) == 0


def test_backoff_of_a_huge_attempt_is_capped_not_an_overflow() -> None:
    assert backoff_delay(10_000, base=0.05, cap=2.0) == 2.0
    with pytest.raises(ValueError):
        backoff_delay(-1, base=0.05, cap=2.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"id": "", "start": _start}, "non-empty"),
        ({"id": "x", "start": "nope"}, "callable"),
        ({"id": "x", "start": _start, "restart": "sometimes"}, "restart must be one of"),
        ({"id": "x", "start": _start, "shutdown": 0}, "shutdown"),
    ],
)
def test_a_malformed_child_spec_is_rejected_with_the_reason(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        ChildSpec(**kwargs)  # type: ignore[arg-type]


def test_duplicate_child_ids_are_rejected() -> None:
    with pytest.raises(ValueError, match="'a'"):
        check_specs([spec("a"), spec("a")])
    with pytest.raises(TypeError):
        check_specs([spec("a"), "b"])  # type: ignore[list-item]


def test_bad_intensity_settings_are_rejected() -> None:
    with pytest.raises(ValueError):
        RestartIntensity(-1, 1.0)
    with pytest.raises(ValueError):
        RestartIntensity(1, 0)


def test_an_on_demand_template_makes_each_child_spec_with_its_rule() -> None:
    turns = OnDemand("turn", restart="transient", shutdown=2.0, intensity=3, period=30.0)
    made = turns.spec("c_1", lambda: None)  # type: ignore[arg-type,return-value]
    assert (made.id, made.restart, made.shutdown) == ("c_1", "transient", 2.0)
    policy = RestartPolicy(intensity=turns.intensity, period=turns.period)
    assert policy.on_exit(made, abnormal=False, now=0.0).action == "ignore"
    assert [policy.on_exit(made, abnormal=True, now=t).action for t in (1, 2, 3, 4)] == [
        "restart",
        "restart",
        "restart",
        "escalate",
    ]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"kind": ""}, "non-empty kind"),
        ({"kind": "turn", "restart": "sometimes"}, "restart must be one of"),
        ({"kind": "turn", "shutdown": 0}, "shutdown must be a positive"),
        ({"kind": "turn", "intensity": -1}, "intensity"),
        ({"kind": "turn", "period": 0}, "period"),
    ],
)
def test_a_malformed_on_demand_template_is_rejected(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        OnDemand(**kwargs)  # type: ignore[arg-type]
