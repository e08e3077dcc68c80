"""Which of a few callables is faster, on a machine that may be busy: interleaved rounds.

``compare`` times each function once per round, in an order that rotates every round, so a
burst of load from elsewhere hits all of them alike; ``Comparison.faster`` names a winner
only when its slowest decile beats every other's fastest, and ``verdict`` says so in words,
or says the machine was too noisy to tell. The chapters assert timing lessons through it,
so a busy machine makes a page say "too noisy", never a wrong order.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Optional

import torch

from kernels.bench.timing import time_calls


@dataclass
class Comparison:
    """Interleaved timings of a few callables: medians and 10th/90th percentiles, in ms."""

    median_ms: dict
    p10_ms: dict
    p90_ms: dict
    rounds: int

    def faster(self) -> Optional[str]:
        """The name whose slowest decile beats every other's fastest decile, or None.

        That is the course's test for "this machine can tell them apart": with the two
        p10-p90 ranges apart, the order held in at least 80% of the interleaved rounds.
        """
        for name in self.median_ms:
            if all(self.p90_ms[name] < self.p10_ms[o] for o in self.median_ms if o != name):
                return name
        return None

    def medians(self) -> str:
        """Each name's median, in call order, as a page reads them: "naive 1.2 ms, inplace 1.1 ms"."""
        return ", ".join(f"{n} {ms:.3g} ms" for n, ms in self.median_ms.items())

    def verdict(self) -> str:
        ranges = ", ".join(f"{n} {self.median_ms[n]:.3g} ms (p10-p90 {self.p10_ms[n]:.3g}-{self.p90_ms[n]:.3g})"
                           for n in self.median_ms)
        winner = self.faster()
        if winner is None:
            return (f"{ranges}: the ranges overlap, so this machine was too noisy (or the difference too "
                    f"small) to say which is faster from {self.rounds} interleaved rounds")
        return f"{ranges}: {winner} is faster, its slowest decile below the others' fastest"


def in_turns(fns: dict, device="cpu", rounds: int = 15, warmup: int = 2) -> dict[str, list[float]]:
    """Each of ``fns``' (name -> no-argument callable) times in ms, one call of each per round in an
    order that rotates every round, no profiler: round r's times sit at index r of every list, so
    two callables can be compared round by round (``ratio_spread``), a burst of load from elsewhere
    hitting both alike."""
    device = torch.device(device)
    names = list(fns)
    if not names or rounds < 1:
        raise ValueError(f"in_turns needs at least one callable and one round, got {len(names)} and {rounds}")
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].extend(time_calls(fns[name], device, 1))
    return times


def ratio_spread(times: dict[str, list[float]], over: str, under: str) -> tuple[float, float, float]:
    """(median, 10th, 90th percentile) of ``over``'s time divided by ``under``'s, round by round
    (``in_turns``' times)."""
    ratios = [a / b for a, b in zip(times[over], times[under])]
    if len(ratios) < 2:
        return ratios[0], ratios[0], ratios[0]
    deciles = statistics.quantiles(ratios, n=10, method="inclusive")
    return statistics.median(ratios), deciles[0], deciles[8]


def compare(fns: dict, device="cpu", rounds: int = 15, warmup: int = 2) -> Comparison:
    """Time each of ``fns`` (name -> no-argument callable) in interleaved rounds (``in_turns``),
    no profiler: a burst of load from elsewhere hits all of them alike instead of whichever
    happened to run then."""
    times = in_turns(fns, device, rounds, warmup)

    def pct(values, q):
        return statistics.quantiles(values, n=10, method="inclusive")[q] if len(values) > 1 else values[0]

    return Comparison(median_ms={n: statistics.median(t) for n, t in times.items()},
                      p10_ms={n: pct(t, 0) for n, t in times.items()},
                      p90_ms={n: pct(t, 8) for n, t in times.items()}, rounds=rounds)
