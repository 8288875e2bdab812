"""Which batch sizes of one config the optimizer measures, and why it leaves the others out.

A config's figures move with the batch size in known directions: p99 per call and memory grow with it,
items/s grows and saturates, joules per item fall and flatten. So the search does not measure every batch
size: a :class:`Ladder` hands out one batch size at a time and learns from each measurement.

- Finding the largest batch size that meets the budgets (p99, memory; out of memory always counts):
  - with a budget: from the smallest batch size upward. From one measurement the next batch size is the
    largest the budget allows if p99 (memory) grew in proportion to the batch -- a bound, since both grow
    more slowly than that. From two, the line through the last two (at most 8x the batch at once). Once a
    batch size is over the budget, binary search between it and the largest under it;
  - without one (throughput, energy): from the largest batch size, one step down after out of memory.
- Then downward from there (throughput, energy), while the smaller batch sizes could still win: the walk
  stops at one more than ``gain`` below the best, or at two in a row that do not beat it by ``gain``.
- For ``objective="latency"`` (p99 per call: smaller batches win) the walk goes upward from the smallest,
  with the same stopping rule.

Batch sizes the ladder never handed out get a reason from :meth:`Ladder.why_not`. Pure bookkeeping: the
search measures; tests drive it with synthetic curves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

JUMP = 8  # the line may take the batch at most this many times larger in one step


class Ladder:
    def __init__(self, batches: Sequence[int], *, objective: str, slo_p99_ms: float | None = None,
                 memory_gb: float | None = None, gain: float = 0.03, start: int | None = None,
                 descend: bool = True, below_start: bool = False):
        """``batches`` ascending; ``start``: the batch size to begin at (default: the smallest with a budget
        or for latency, the largest otherwise); ``descend``: walk below the largest feasible batch size
        (False for a config that only extends another's search upward); ``below_start``: when ``start`` is
        over the budgets, step down from it until a batch size meets them (a start that is a guess)."""
        self.batches = list(batches)
        self.objective, self.slo, self.mem, self.gain = objective, slo_p99_ms, memory_gb, gain
        self.constrained = slo_p99_ms is not None or memory_gb is not None
        self.upward = objective == "latency"
        n = len(self.batches)
        if start is None:
            start = 0 if (self.constrained or self.upward) else n - 1
        elif start not in self.batches:
            raise ValueError(f"start={start!r} is not one of the batch sizes {self.batches}")
        else:
            start = self.batches.index(start)
        self._start = start
        self.descend = descend
        self.below_start = below_start
        self.ok: dict[int, tuple[float, float | None, float | None]] = {}  # index -> (score, p99, gb)
        self.over: set[int] = set()
        self.predicted: set[int] = set()  # over without a measurement (predicted by the search)
        self.probes: dict[int, tuple[float, float | None]] = {}  # index -> (device ms, gb): see record_probe
        self.asked: set[int] = set()
        self.stopped: str | None = None  # why the ladder ended early (a failure)
        self._walk: list[int] = []  # indices the final walk visited, in order
        self._walk_done: str | None = None
        self._phase = "find"

    # -- what the search tells it ------------------------------------------------------------------------
    def record_ok(self, batch: int, score: float, p99_ms: float | None = None, gb: float | None = None) -> None:
        self.ok[self._index(batch)] = (score, p99_ms, gb)

    def record_over(self, batch: int, predicted: bool = False) -> None:
        """Over a budget or out of memory at ``batch`` (``predicted``: judged so without measuring it):
        larger batch sizes are too."""
        self.over.add(self._index(batch))
        if predicted:
            self.predicted.add(self._index(batch))

    def record_probe(self, batch: int, device_ms: float, gb: float | None = None) -> None:
        """Over the SLO at ``batch`` by the host's issuing alone: the device's time, ``device_ms``, is within
        it. Not feasible; but the climb goes on by the device time (where it breaks the SLO is what a
        compiled twin of the config starts from), and the feasible top is then searched for below the
        smallest such batch size."""
        self.probes[self._index(batch)] = (device_ms, gb)

    def stop(self, reason: str) -> None:
        """A failure that says nothing about other batch sizes of the config: no more of them."""
        self.stopped = reason

    def _index(self, batch: int) -> int:
        i = self.batches.index(batch)
        if i not in self.asked:
            raise ValueError(f"batch {batch} was not handed out by this ladder")
        return i

    # -- what it asks for --------------------------------------------------------------------------------
    @property
    def lowest_over(self) -> int:
        """Index of the smallest batch size over the budgets above the feasible top (below it, an over is
        noise -- a p99 blip on the walk -- and ends the walk instead)."""
        top = self.feasible_top
        above = [i for i in self.over if top is None or i > top]
        return min(above) if above else len(self.batches)

    @property
    def finished(self) -> bool:
        """True once the ladder has nothing more to hand out (not merely interrupted)."""
        return self.stopped is not None or self._walk_done is not None

    def next(self) -> int | None:
        """The next batch size to measure, or None when the ladder is done."""
        if self.stopped is not None:
            return None
        i = self._next_index()
        if i is None:
            return None
        if i in self.asked:  # cannot happen: each step moves to an index not measured yet
            raise RuntimeError(f"ladder asked twice for batch {self.batches[i]}")
        self.asked.add(i)
        return self.batches[i]

    def _next_index(self) -> int | None:
        if self._walk_done is not None:
            return None
        if self._phase == "find":
            i = self._find()
            if i is not None:
                return i
            self._phase = "walk"
            top = self.feasible_top
            if top is None or not self.descend:
                self._walk_done = "nothing meets the budgets" if top is None else "upward only"
                return None
            self._walk = [top]
        return self._step()

    @property
    def feasible_top(self) -> int | None:
        """Index of the largest batch size measured within the budgets (the smallest for latency)."""
        if not self.ok:
            return None
        return min(self.ok) if self.upward else max(self.ok)

    def _find(self) -> int | None:
        n, lo_over = len(self.batches), self.lowest_over
        if not self.asked:
            return self._start
        if self.upward:  # latency: the smallest batch size that fits starts the walk
            if self.ok:
                return None
            nxt = max(self.asked) + 1
            return nxt if nxt < lo_over and nxt < n else None
        top = max([*self.ok, *self.probes]) if (self.ok or self.probes) else None  # how far the climb got
        if top is not None and self.probes:
            lo_over = min((i for i in self.over if i > top), default=n)
        if top is None:
            if self.below_start:  # the start was a guess: one step further down at a time
                nxt = min(self.asked) - 1
                return nxt if nxt >= 0 else None
            if self.constrained or not self.descend:
                return None  # over the budget where it began: so is every larger batch size
            below = [i for i in range(min(self.asked), -1, -1) if i not in self.asked and i < lo_over]
            return below[0] if below else None  # out of memory at the top: one step down
        if top + 1 >= min(lo_over, n) or not self.constrained:  # without a budget the largest that ran is the top
            return self._bracket()
        if lo_over < n:  # bracketed: binary search between the top and the first over
            return (top + lo_over) // 2 if (top + lo_over) // 2 > top else top + 1
        target = self._estimate(top)
        j = max((i for i, b in enumerate(self.batches) if b <= target), default=top)
        return min(max(j, top + 1), n - 1)

    def _bracket(self) -> int | None:
        """After a climb past misses of the host (probes): the largest feasible batch size lies below the
        smallest miss above the feasible top; binary search there. None without probes (nothing to do)."""
        if not self.probes:
            return None
        ftop = max(self.ok) if self.ok else None
        if ftop is None:
            return None  # the climb began at the smallest batch size: nothing below its first probe
        miss = min([i for i in (*self.probes, *self.over) if i > ftop], default=None)
        if miss is None or miss - ftop < 2:
            return None
        return (ftop + miss) // 2

    def _estimate(self, top: int) -> float:
        """The largest batch size the budgets allow, judged from the measurements at or below ``top``."""
        b_top = self.batches[top]
        bounds = []
        nav = {i: (v[1], v[2]) for i, v in self.ok.items()}
        nav.update(self.probes)  # the device time of a host's miss
        for k, limit in ((0, self.slo), (1, self.mem)):
            if limit is None:
                continue
            pts = sorted((self.batches[i], v[k]) for i, v in nav.items() if v[k] is not None and i <= top)
            if not pts:
                continue
            (b2, q2) = pts[-1]
            if len(pts) == 1:
                bounds.append(b2 * limit / q2 if q2 > 0 else math.inf)  # grows at most in proportion
            else:
                b1, q1 = pts[-2]
                slope = (q2 - q1) / (b2 - b1)
                bounds.append(b2 + (limit - q2) / slope if slope > 0 else math.inf)
        return min([JUMP * b_top, *bounds])

    def _step(self) -> int | None:
        """One step of the walk away from the top; None when it stops (``_walk_done`` says why)."""
        while True:
            last = self._walk[-1]
            if last not in self.ok:  # over a budget (a blip) or out of memory below the top: the walk ends
                self._walk_done = f"batch {self.batches[last]} did not run within the budgets"
                return None
            best_i = max((i for i in self._walk if i in self.ok), key=lambda i: self.ok[i][0])
            best = self.ok[best_i][0]
            if len(self._walk) > 1 and last != best_i:
                s = self.ok[last][0]
                if s < best - self.gain * abs(best):
                    self._walk_done = (f"batch {self.batches[last]} was {(best - s) / abs(best):.1%} below batch "
                                       f"{self.batches[best_i]}")
                    return None
                since = self._walk[self._walk.index(best_i) + 1:]
                if len(since) >= 2:
                    self._walk_done = (f"batch sizes {' and '.join(str(self.batches[i]) for i in since)} did not "
                                       f"beat batch {self.batches[best_i]} by {self.gain:.0%}")
                    return None
            nxt = last + 1 if self.upward else last - 1
            if nxt < 0 or nxt >= min(len(self.batches), self.lowest_over):
                self._walk_done = "no more batch sizes"
                return None
            if nxt in self.ok:  # measured while finding the top: no cost
                self._walk.append(nxt)
                continue
            if nxt in self.asked:  # over or failed: the walk ends there
                self._walk_done = f"batch {self.batches[nxt]} did not run within the budgets"
                return None
            self._walk.append(nxt)
            return nxt

    # -- the batch sizes it left out --------------------------------------------------------------------
    def why_not(self, batch: int) -> str:
        """Why ``batch`` was never handed out (after :meth:`next` returned None)."""
        i = self.batches.index(batch)
        if self.stopped is not None:
            return f"not run: {self.stopped}"
        if i >= self.lowest_over:
            how = "predicted" if self.lowest_over in self.predicted else "already"
            return f"not run: batch {self.batches[self.lowest_over]} was {how} over the budgets"
        top = self.feasible_top
        what = {"throughput": "items/s", "energy": "joules per item", "latency": "p99"}[self.objective]
        lowest = min(self.asked, default=self._start)
        if not self.descend and i < lowest:
            if lowest == self._start:
                return f"not run: below batch {self.batches[self._start]}, where this config's search began"
            return (f"not run: below batch {self.batches[lowest]}, the first under the budgets on the way down "
                    f"from batch {self.batches[self._start]}, where this config's search began")
        lower = [k for k in self.asked if k < i]
        upper = [k for k in self.asked if k > i]
        if self.probes and lower and upper and (top is None or i > top):
            return (f"not run: the search jumped from batch {self.batches[max(lower)]} to "
                    f"{self.batches[min(upper)]} (climbing by the device time past the host's misses)")
        if top is None:
            return "not run: no batch size of this config met the budgets"
        if not self.descend:
            lower = max(k for k in self.asked if k < i)
            upper = min((k for k in self.asked if k > i), default=top)
            return (f"not run: the search jumped from batch {self.batches[lower]} to {self.batches[upper]}, as far "
                    f"as the budgets allowed judging by the smaller ones")
        side = "above" if self.upward else "below"
        return (f"not run: {side} the walk from batch {self.batches[top]}, which stopped where {what} stopped "
                f"improving ({self._walk_done})")
