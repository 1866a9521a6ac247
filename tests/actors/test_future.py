"""Reply: the cheap concurrent.futures.Future behaves as the standard one does."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest

from actors.future import Reply


def test_result_set_from_another_thread_wakes_every_waiter() -> None:
    fut: Reply[int] = Reply()
    got: list[int] = []
    waiters = [threading.Thread(target=lambda: got.append(fut.result(10))) for _ in range(3)]
    for t in waiters:
        t.start()
    assert not fut.done()
    fut.set_result(7)
    for t in waiters:
        t.join(10)
    assert got == [7, 7, 7]
    assert fut.done() and not fut.cancelled() and fut.exception() is None
    assert "returned int" in repr(fut)


def test_timeout_then_answer() -> None:
    fut: Reply[str] = Reply()
    with pytest.raises(TimeoutError):
        fut.result(timeout=0.01)
    with pytest.raises(TimeoutError):
        fut.result(timeout=0)
    fut.set_result("late")
    assert fut.result(timeout=0) == "late"


def test_exception_is_raised_to_the_waiter() -> None:
    fut: Reply[int] = Reply()
    fut.set_exception(ValueError("bad"))
    with pytest.raises(ValueError, match="bad"):
        fut.result(1)
    assert isinstance(fut.exception(0), ValueError)
    assert "raised ValueError" in repr(fut)


def test_answered_once_only() -> None:
    fut: Reply[int] = Reply()
    fut.set_result(1)
    with pytest.raises(concurrent.futures.InvalidStateError):
        fut.set_result(2)
    with pytest.raises(concurrent.futures.InvalidStateError):
        fut.set_exception(RuntimeError())
    assert not fut.cancel()
    assert fut.result() == 1


def test_cancel_before_the_answer() -> None:
    fut: Reply[int] = Reply()
    seen: list[bool] = []
    fut.add_done_callback(lambda f: seen.append(f.cancelled()))
    assert fut.cancel() and fut.cancel()
    assert seen == [True]
    with pytest.raises(concurrent.futures.CancelledError):
        fut.result(0)
    with pytest.raises(concurrent.futures.InvalidStateError):
        fut.set_result(1)
    assert not fut.set_running_or_notify_cancel()


def test_running_cannot_be_cancelled() -> None:
    fut: Reply[int] = Reply()
    assert fut.set_running_or_notify_cancel() and fut.running()
    assert not fut.cancel()
    fut.set_result(3)
    assert fut.result() == 3


def test_callbacks_before_and_after_the_answer_and_a_failing_one() -> None:
    fut: Reply[int] = Reply()
    seen: list[object] = []
    fut.add_done_callback(lambda f: seen.append(("early", f.result())))
    fut.add_done_callback(lambda f: 1 / 0)  # logged, never breaks the answer
    fut.set_result(5)
    fut.add_done_callback(lambda f: seen.append(("late", f.result())))
    assert seen == [("early", 5), ("late", 5)]


def test_asyncio_wraps_it() -> None:
    fut: Reply[str] = Reply()

    async def main() -> str:
        waiting = asyncio.wrap_future(fut)
        threading.Timer(0.01, fut.set_result, args=("from a thread",)).start()
        return await asyncio.wait_for(waiting, 10)

    assert asyncio.run(main()) == "from a thread"


def test_asyncio_cancel_cancels_it() -> None:
    fut: Reply[str] = Reply()

    async def main() -> None:
        waiting = asyncio.wrap_future(fut)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(main())
    assert fut.cancelled()
