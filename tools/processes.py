"""Processes seen from outside, read from /proc: what runs below a pid, whether one lives."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any


def reap(proc: subprocess.Popen[Any]) -> None:
    """Kill ``proc`` if it still runs, wait for it, and close its pipes."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(30)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid``, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purpose once reaped by init.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def signal_state(pid: int, signum: int) -> str:
    """What process ``pid`` does with ``signum``: ``caught``, ``ignored``, ``blocked`` or
    ``default`` (from ``/proc/PID/status``); ``gone`` when the process has ended.

    A child inherits an ignored disposition and a blocked mask across ``exec``: this says
    why a signal sent to it did nothing.
    """
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return "gone"
    fields = (ln.partition(":\t") for ln in lines)
    masks = {k: int(v, 16) for k, _, v in fields if k in ("SigBlk", "SigIgn", "SigCgt")}
    bit = 1 << (signum - 1)
    for state, key in (("blocked", "SigBlk"), ("ignored", "SigIgn"), ("caught", "SigCgt")):
        if masks.get(key, 0) & bit:
            return state
    return "default"
