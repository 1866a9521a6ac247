"""Issue 33's turn figures: PostgreSQL beside SQLite in one run, and two daemons on one store.

1. One daemon, 50 concurrent conversations (``bench_turns.py --only-concurrent``, figure 2:
   each turn one tool call and a final answer from an instant scripted model): SQLite and
   PostgreSQL in alternating rounds, each round a fresh daemon process; each round's
   turns/s beside the other's and the ratio; the median ratio beside the floor (PostgreSQL
   >= 70 % of SQLite's).
2. Two daemons on one PostgreSQL database at once (two bench_turns processes, each its own
   daemon and its 50 conversations, started together): the total turns/s; each daemon
   process's CPU a turn (``time.process_time``: the daemon and its client threads); the
   PostgreSQL server's CPU a turn (utime + stime of the postmaster and its backends, from
   /proc, over the figure).

   The projection to more cores: a turn costs C ms of CPU in all (the daemon processes'
   plus the server's, measured), so N cores at full use give N * 1000 / C turns/s, if the
   work spreads over the cores: across daemons it does (each is a process; the store's
   rows of different conversations do not collide), inside one daemon the GIL keeps its
   Python to about one core, so that needs about N daemons (one daemon alone is capped
   near 1000 / (its CPU a turn) turns/s, printed too). Linear: an upper bound (no server
   contention modelled). Not counted: the scripted model servers' CPU (one process a
   daemon here; a real model runs elsewhere), which on this machine takes cores from
   the daemons, so the measured total is below what the daemons and the server alone
   would reach.

The machine's load average is printed with each round (it is shared).

Run: ``python tools/bench/bench_pg_turns.py [--rounds N] [--seconds S] [--cores 4,8,16]``
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.pg_cluster import PgCluster

ROOT = Path(__file__).resolve().parents[2]
FLOOR = 0.70
RATE = re.compile(r"concurrent conversations: (\d+) turns in ([\d.]+) s = (\d+) turns/s, (\d+) err")
CPU = re.compile(r"process cpu ([\d.]+) ms a turn")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def start(seconds: float, url: str = "", wait: bool = False) -> subprocess.Popen[str]:
    argv = [
        sys.executable,
        str(ROOT / "tools" / "bench" / "bench_turns.py"),
        "--only-concurrent",
        "--seconds",
        str(seconds),
        "--idle",
        "0",
    ]
    if url:
        argv += ["--store-url", url]
    if wait:
        argv.append("--wait-go")
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


class Result:
    def __init__(self, turns: int, seconds: float, errors: int, cpu_ms: float) -> None:
        self.turns, self.seconds, self.errors, self.cpu_ms = turns, seconds, errors, cpu_ms

    @property
    def rate(self) -> float:
        return self.turns / self.seconds


def collect(proc: subprocess.Popen[str]) -> Result:
    assert proc.stdout is not None
    found: Result | None = None
    for line in proc.stdout:
        m = RATE.search(line)
        if m:
            found = Result(int(m[1]), float(m[2]), int(m[4]), 0.0)
        c = CPU.search(line)
        if c and found is not None:
            found.cpu_ms = float(c[1])
    proc.wait(120)
    if found is None:
        raise SystemExit(f"bench_turns printed no figure (exit {proc.returncode})")
    return found


def wait_ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip() == "ready":
            return
    raise SystemExit("a daemon of bench_turns never got ready")


def server_ticks(cluster: PgCluster) -> int:
    """CPU clock ticks of the cluster's postmaster, its live backends and its reaped ones."""
    head = int((cluster.data / "postmaster.pid").read_text().split()[0])
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(stat.parent.name), int(fields[1])
        if pid == head:
            total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
        elif ppid == head:
            total += int(fields[11]) + int(fields[12])
    return total


def single(cluster: PgCluster, rounds: int, seconds: float) -> None:
    print(f"1. one daemon, 50 concurrent conversations, {seconds:g} s a run, alternating:")
    pg_rates, sq_rates, ratios = [], [], []
    for i in range(rounds):
        sq = collect(start(seconds))
        sq_load = load()
        pg = collect(start(seconds, cluster.new_database()))
        ratio = pg.rate / sq.rate
        pg_rates.append(pg.rate)
        sq_rates.append(sq.rate)
        ratios.append(ratio)
        print(
            f"  round {i + 1}: sqlite {sq.rate:6.1f} turns/s ({sq.errors} errors, cpu "
            f"{sq.cpu_ms:.2f} ms a turn, load {sq_load})   postgresql {pg.rate:6.1f} turns/s "
            f"({pg.errors} errors, cpu {pg.cpu_ms:.2f} ms a turn, load {load()})   "
            f"ratio {ratio:.2f}"
        )
    median = statistics.median(ratios)
    print(
        f"  => postgresql median {statistics.median(pg_rates):.1f} turns/s, sqlite median "
        f"{statistics.median(sq_rates):.1f} turns/s; PostgreSQL / SQLite median of round "
        f"ratios {median:.2f} (floor >= {FLOOR:.2f}): {'OK' if median >= FLOOR else 'UNDER'}"
    )


def pair(cluster: PgCluster, rounds: int, seconds: float, cores: list[int]) -> None:
    print(
        f"2. two daemons on one PostgreSQL database, each 50 concurrent conversations, "
        f"{seconds:g} s, {os.cpu_count()} cores:"
    )
    totals, cpu_turn, daemon_turn = [], [], []
    tick = os.sysconf("SC_CLK_TCK")
    for i in range(rounds):
        url = cluster.new_database()
        procs = [start(seconds, url, wait=True) for _ in range(2)]
        for p in procs:
            wait_ready(p)
        ticks0 = server_ticks(cluster)
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [collect(p) for p in procs]
        server_s = (server_ticks(cluster) - ticks0) / tick
        turns = sum(r.turns for r in results)
        total = sum(r.rate for r in results)
        daemons_ms = sum(r.cpu_ms * r.turns for r in results) / turns
        server_ms = server_s * 1000 / turns
        totals.append(total)
        cpu_turn.append(daemons_ms + server_ms)
        daemon_turn.append(daemons_ms)
        print(
            f"  round {i + 1}: daemon A {results[0].rate:6.1f} + daemon B {results[1].rate:6.1f}"
            f" = {total:6.1f} turns/s ({sum(r.errors for r in results)} errors); CPU a turn: "
            f"daemons {daemons_ms:.2f} ms + PostgreSQL {server_ms:.2f} ms = "
            f"{daemons_ms + server_ms:.2f} ms   load {load()}"
        )
    total, c, d = (statistics.median(x) for x in (totals, cpu_turn, daemon_turn))
    print(
        f"  => total median {total:.1f} turns/s on {os.cpu_count()} cores; CPU a turn median "
        f"{c:.2f} ms (daemons {d:.2f}, PostgreSQL {c - d:.2f})"
    )
    one = 1000 / d  # each turn is one daemon's: d is a daemon's CPU a turn
    print(f"  one daemon's cap (its Python on one core): about {one:.0f} turns/s")
    for n in cores:
        print(
            f"  projected on {n} cores, {n} daemons: {n * 1000 / c:.0f} turns/s "
            f"(= {n} x 1000 / {c:.2f} ms; linear, an upper bound)"
        )


def main() -> None:
    args = _arguments()
    cores = [int(x) for x in args.cores.split(",") if x]
    started = time.monotonic()
    with PgCluster() as cluster:
        print(f"PostgreSQL {cluster.bin.parent.name} on loopback; load average {load()}")
        if not args.skip_single:
            single(cluster, args.rounds, args.seconds)
        pair(cluster, args.rounds, args.seconds, cores)
    print(f"(took {time.monotonic() - started:.0f} s; load average at the end {load()})")


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each figure")
    parser.add_argument("--seconds", type=float, default=10.0, help="one run's length")
    parser.add_argument("--cores", default="4,8,16", help="core counts to project to")
    parser.add_argument("--skip-single", action="store_true", help="figure 2 alone")
    return parser.parse_args()


if __name__ == "__main__":
    main()
