"""How long each ``chalie`` command takes, wall clock, against a running daemon.

Starts a real ``chalie run`` on a temporary data directory, then runs each command as
its own process, as an operator or a script does, ``RUNS`` times, and prints the median
beside its floor (control commands <= 150 ms; ``tools call`` <= 250 ms plus the tool)
and beside ``python3 -c pass`` measured in the same run. Bytecode is cached, as in an
installed copy (``PYTHONDONTWRITEBYTECODE`` is dropped for the commands). Each figure's CPU time
(user + system, of the command's process) is printed too: it moves much less than the
wall clock on a loaded machine. ``stop`` of a running daemon includes the daemon's own
shutdown and exit (``stop`` returns once the process is gone): it is measured on
``STOP_RUNS`` daemons started one after another on the same data directory, each once
its discovery index is ready (a stop during the first index build waits for it), and
again with no daemon running. ``tools list`` with no daemon (it imports every ability
itself) is held to ``NO_DAEMON_RATIO`` times ``python3 -c pass``.

Run: python tools/bench/bench_cli.py [--runs N] [--stop-runs N]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from chalie.process import control  # noqa: E402

CONTROL_FLOOR = 0.150
CALL_FLOOR = 0.250
# A command that runs without the daemon: at most this many times ``python3 -c pass``.
NO_DAEMON_RATIO = 8

COMMANDS: list[tuple[str, list[str], float]] = [
    ("--version", ["--version"], CONTROL_FLOOR),
    ("--help", ["--help"], CONTROL_FLOOR),
    ("status", ["status"], CONTROL_FLOOR),
    ("policy list", ["policy", "list"], CONTROL_FLOOR),
    ("trail", ["trail"], CONTROL_FLOOR),
    ("token list", ["token", "list"], CONTROL_FLOOR),
    ("conversations list", ["conversations", "list"], CONTROL_FLOOR),
    ("mcp list", ["mcp", "list"], CONTROL_FLOOR),
    ("tools call clock", ["tools", "call", "clock", "action=now"], CALL_FLOOR),
]


CPU: dict[str, list[float]] = {}


def timed(argv: list[str], env: dict[str, str]) -> float:
    """Wall seconds of one run; its CPU seconds (user + system) are noted in CPU."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    took = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    CPU.setdefault(" ".join(argv), []).append(cpu)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return took


def median_of(argv: list[str], env: dict[str, str], runs: int) -> float:
    timed(argv, env)  # warm the page cache and the bytecode
    CPU.pop(" ".join(argv), None)
    return statistics.median(timed(argv, env) for _ in range(runs))


def cpu_of(argv: list[str]) -> float:
    return statistics.median(CPU.get(" ".join(argv), [0.0]))


def ready(reply: control.ControlReply) -> bool:
    """Every actor up and the discovery index built."""
    data = reply.data
    if not reply.ok or not all(c["alive"] for c in data["actors"]):
        return False
    state = data.get("discovery")
    return isinstance(state, dict) and state.get("state") == "ready"


def start(home: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    (home / "config.toml").write_text("[mcp_server]\nport = 0\n[chat]\nport = 0\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "chalie", "--home", str(home), "run"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    client = control.ControlClient(home, timeout=2)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            try:
                reply = client.call("status")
            except control.DaemonNotRunning:
                time.sleep(0.05)
                continue
            if ready(reply):
                return proc
            time.sleep(0.05)
    finally:
        client.close()
    proc.kill()
    raise SystemExit("the daemon did not become ready")


def row(name: str, took: float, floor: float, floor_name: str, base: float, cpu: float) -> str:
    verdict = "ok" if took <= floor else "OVER"
    return (
        f"{name:<22} {took * 1000:7.1f} ms   {floor_name} {floor * 1000:5.0f} ms  "
        f"ratio {took / floor:4.2f}  {verdict:<4}   {took / base:5.1f}x python3 -c pass   "
        f"cpu {cpu * 1000:5.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--stop-runs", type=int, default=5)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="chc-", dir="/tmp"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CHALIE_HOME": str(home)}
    # As installed: bytecode is cached (pip compiles it; the first run here writes it).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    chalie = [sys.executable, "-m", "chalie", "--home", str(home)]
    proc = start(home, env)
    try:
        bare = [sys.executable, "-c", "pass"]
        base = median_of(bare, env, args.runs)
        subprocess.run([*chalie, "policy", "set", "chat", "clock", "allow"], env=env, check=True)
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; runs: {args.runs}")
        print(
            f"{'python3 -c pass':<22} {base * 1000:7.1f} ms   (the floor of any Python command)"
            f"   cpu {cpu_of(bare) * 1000:5.1f} ms"
        )
        for name, argv, floor in COMMANDS:
            took = median_of([*chalie, *argv], env, args.runs)
            floor_name = "floor" if floor == CONTROL_FLOOR else "floor+tool"
            print(row(name, took, floor, floor_name, base, cpu_of([*chalie, *argv])))
        stops = []
        for n in range(args.stop_runs):
            if n:
                proc = start(home, env)
            stops.append(timed([*chalie, "stop"], env))
            proc.wait(60)
        stop_cpu = cpu_of([*chalie, "stop"])
        print(
            row(
                "stop (daemon exits)",
                statistics.median(stops),
                CONTROL_FLOOR,
                "floor",
                base,
                stop_cpu,
            )
            + f" (median of {len(stops)} daemons: "
            + " ".join(f"{t * 1000:.0f}" for t in stops)
            + ")"
        )
        CPU.pop(" ".join([*chalie, "stop"]), None)
        idle = median_of([*chalie, "stop"], env, args.runs)
        print(
            row(
                "stop (none running)", idle, CONTROL_FLOOR, "floor", base, cpu_of([*chalie, "stop"])
            )
        )
        listing = [*chalie, "tools", "list"]
        took = median_of(listing, env, args.runs)
        print(
            row(
                "tools list (no daemon)",
                took,
                NO_DAEMON_RATIO * base,
                f"{NO_DAEMON_RATIO}x pass",
                base,
                cpu_of(listing),
            )
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
