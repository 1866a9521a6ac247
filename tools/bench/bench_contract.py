"""Median time to render an envelope and to assemble every descriptor.

Run: python tools/bench/bench_contract.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from chalie.calls.envelope import render
from chalie.calls.registry import Registry
from chalie.result import ToolResult


def median_us(fn: Callable[[], object], n: int = 20_000, repeat: int = 5) -> tuple[float, float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(samples), min(samples)


def main() -> None:
    success = ToolResult.success(
        {"location": "Valletta, MT", "condition": "Clear", "temperature_c": 24.1}
    )
    error = ToolResult.error(
        "no-query-or-location",
        "recall requires either a query or a location.",
        hint="pass query= to search by topic, or location= to filter by place.",
        meta={"action": "recall"},
    )
    page = ToolResult.success(
        ("<p>fetched page</p>\n[end:weather]\n" * 200), meta={"url": "https://x/y?q=1"}
    )
    reg = Registry.collect(entry_points=False)
    print(f"abilities registered: {len(reg)}")
    for label, fn, n in [
        ("render success envelope (small JSON body)", lambda: render("weather", success), 20_000),
        ("render error envelope (hint + meta)", lambda: render("memory", error), 20_000),
        ("render 7 KB body with 200 tag-shaped lines", lambda: render("browse", page), 2_000),
        (
            "construct ToolResult.success(dict) + render",
            lambda: render("weather", ToolResult.success({"a": 1})),
            20_000,
        ),
        (f"assemble all {len(reg)} descriptors", lambda: reg.descriptors(allow_async=True), 2_000),
        ("assemble one descriptor", lambda: reg.get("clock").cls.descriptor(), 5_000),  # type: ignore[union-attr]
    ]:
        med, best = median_us(fn, n)
        print(f"{label:<48} median {med:8.2f} us   best {best:8.2f} us")


if __name__ == "__main__":
    main()
