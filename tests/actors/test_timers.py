"""The actor inbox watching a poller (actors/timers.py): what a hosted worker pool relies on."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
import zmq

from actors.timers import Ready, TimerInbox
from tools.waiting import wait_until

FOREVER_MS = 60_000


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def watching(sock: socket.socket, wait_ms: int = FOREVER_MS) -> TimerInbox:
    poller = zmq.Poller()
    poller.register(sock.fileno(), zmq.POLLIN)
    inbox = TimerInbox()
    inbox.watch(poller, lambda: wait_ms)
    return inbox


def test_a_readable_socket_comes_out_as_ready(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    inbox = watching(a)
    b.send(b"x")
    got = inbox.get()
    assert isinstance(got.message, Ready) and got.reply_to is None
    assert [fd for fd, _ in got.message.events] == [a.fileno()]


def test_a_put_from_another_thread_wakes_an_owner_asleep_in_the_poller(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, _ = pair
    inbox = watching(a)  # the poller alone would wait a minute
    got: list[object] = []
    owner = threading.Thread(target=lambda: got.append(inbox.get()))
    owner.start()
    wait_until(lambda: inbox._sleeping, 5, what="the owner asleep in the poller")
    inbox.put("mail")
    owner.join(5)
    assert got == ["mail"]
    assert not inbox._sleeping


def test_messages_cannot_starve_the_poller_nor_the_poller_messages(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    inbox = watching(a)
    for n in range(100):
        inbox.put(n)
    b.send(b"x")
    got = [inbox.get() for _ in range(TimerInbox.MESSAGES_PER_LOOK + 1)]
    assert got[: TimerInbox.MESSAGES_PER_LOOK] == list(range(TimerInbox.MESSAGES_PER_LOOK))
    assert isinstance(got[-1].message, Ready)  # looked at before the 17th message
    # the socket stays readable (nobody read it): messages still come between its turns
    after = [inbox.get() for _ in range(TimerInbox.MESSAGES_PER_LOOK + 1)]
    assert sum(isinstance(x, int) for x in after) == TimerInbox.MESSAGES_PER_LOOK


def test_timers_fire_while_watching_and_the_pollers_own_time_is_an_empty_ready(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, _ = pair
    inbox = watching(a, wait_ms=FOREVER_MS)
    inbox.add(0.0, "due")
    assert inbox.get().message == "due"
    ticking = watching(a, wait_ms=0)
    got = ticking.get()
    assert isinstance(got.message, Ready) and got.message.events == []


def test_after_unwatch_the_inbox_waits_on_its_mailbox_alone(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    inbox = watching(a)
    assert inbox.watching
    inbox.unwatch()
    inbox.unwatch()  # twice: nothing
    assert not inbox.watching
    b.send(b"x")  # readable, but no longer watched
    sender = threading.Thread(target=inbox.put, args=("after",))
    sender.start()
    assert inbox.get() == "after"
    sender.join()
    with pytest.raises(RuntimeError):
        poller = zmq.Poller()
        inbox.watch(poller, lambda: 1)
        inbox.watch(poller, lambda: 1)  # one poller at a time
