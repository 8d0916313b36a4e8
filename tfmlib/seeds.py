"""Comparisons over several seeds: one result per seed, the median and the range, and whether a
conclusion holds for every seed.

Introduced in chapter 01; every chapter that concludes "A beats B" uses it.

One training run is one draw: another seed (another initialisation, another order of batches)
gives another number, and a gap between two models can be smaller than the spread of either.
The book therefore runs a comparison several times, prints each quantity as
``median [min, max]`` over the seeds, and asserts a conclusion only where it holds for *every*
seed (:meth:`SeedResults.holds_for_every_seed`); :func:`tfmlib.plot.plot_over_seeds` draws the
same results with their spread::

    def run_one(seed):                       # trains both models from this seed
        return {"GRU": gru_loss(seed), "RNN": rnn_loss(seed)}

    results = over_seeds(run_one, seeds=[0, 1, 2])
    print(results.table(fmt=".3f"))
    if results.holds_for_every_seed("GRU", "RNN", better="lower"):
        ...                                  # "the GRU's loss is lower for each of 3 seeds"

:func:`over_seeds` seeds Python, NumPy and PyTorch (:func:`tfmlib.config.seed_everything`) before
each call, so that ``run_one`` needs no seeding of its own, and a comparison repeats exactly on
one device.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from tfmlib.config import seed_everything

INTRODUCED_IN = 1

__all__ = ["SeedResults", "over_seeds"]

_BETTER = ("higher", "lower")


@dataclass
class SeedResults:
    """Per-seed results: ``values[name][i]`` is quantity ``name`` measured with ``seeds[i]``."""

    seeds: list[int]
    values: dict[str, list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.seeds:
            raise ValueError("SeedResults: no seeds")
        for name, vs in self.values.items():
            if len(vs) != len(self.seeds):
                raise ValueError(f"SeedResults: {name!r} has {len(vs)} values for {len(self.seeds)} seeds")

    @property
    def names(self) -> list[str]:
        """The quantities measured, in the order the first run returned them."""
        return list(self.values)

    def _get(self, name: str) -> list[float]:
        if name not in self.values:
            raise KeyError(f"SeedResults: no quantity {name!r}; measured: {self.names}")
        return self.values[name]

    def median(self, name: str) -> float:
        """The median of ``name`` over the seeds."""
        return statistics.median(self._get(name))

    def range(self, name: str) -> tuple[float, float]:
        """The smallest and the largest value of ``name`` over the seeds."""
        vs = self._get(name)
        return min(vs), max(vs)

    def summary(self, name: str, fmt: str = ".3g") -> str:
        """``"median [min, max]"`` of ``name``, each number formatted with ``fmt``."""
        lo, hi = self.range(name)
        return f"{self.median(name):{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"

    def differences(self, a: str, b: str) -> list[float]:
        """``a - b`` for each seed (the two measured on the same seed: a paired comparison)."""
        return [x - y for x, y in zip(self._get(a), self._get(b), strict=True)]

    def wins(self, a: str, b: str, better: str = "higher") -> list[bool]:
        """For each seed, whether ``a`` is strictly better than ``b`` (``better`` = ``"higher"``
        or ``"lower"``: which direction is better)."""
        if better not in _BETTER:
            raise ValueError(f"SeedResults.wins: better must be one of {_BETTER}, got {better!r}")
        sign = 1.0 if better == "higher" else -1.0
        return [sign * d > 0 for d in self.differences(a, b)]

    def holds_for_every_seed(self, a: str, b: str, better: str = "higher") -> bool:
        """True when ``a`` beats ``b`` (strictly, in the ``better`` direction) for every seed."""
        return all(self.wins(a, b, better))

    def verdict(self, a: str, b: str, better: str = "higher", fmt: str = ".3g") -> str:
        """One line a notebook can print: how often ``a`` beat ``b``, and the paired differences."""
        wins = self.wins(a, b, better)
        diffs = self.differences(a, b)
        lo, hi = min(diffs), max(diffs)
        word = "higher" if better == "higher" else "lower"
        return (f"{a} {word} than {b} for {sum(wins)} of {len(wins)} seeds; {a} - {b}: "
                f"{statistics.median(diffs):{fmt}} [{lo:{fmt}}, {hi:{fmt}}]")

    def table(self, fmt: str = ".3g") -> str:
        """Each quantity's median [min, max], then its value for every seed; ``fmt`` is a number
        format such as ``".3g"`` or ``"+.4f"`` (signed, for differences)."""
        try:
            format(0.0, fmt)
        except ValueError:
            raise ValueError(f"SeedResults.table: fmt={fmt!r} is not a number format "
                             f"(e.g. '.3g', '+.4f')") from None
        width = max(len(n) for n in self.names) if self.values else 4
        head = f"{'':<{width}}  {'median [min, max]':<26}" + "".join(f"  seed {s:<6}" for s in self.seeds)
        rows = [head]
        for name in self.names:
            row = f"{name:<{width}}  {self.summary(name, fmt):<26}"
            # format, then pad: a signed or zero-padded fmt ("+.4f", "08.3f") is a whole spec of its own
            row += "".join(f"  {format(v, fmt):<11}" for v in self.values[name])
            rows.append(row)
        return "\n".join(rows)

    def for_plot(self, names: Sequence[str] | None = None) -> dict[str, list[float]]:
        """``{name: values}``, the shape :func:`tfmlib.plot.plot_over_seeds` takes under each x."""
        return {n: list(self._get(n)) for n in (names or self.names)}


def over_seeds(run_one: Callable[[int], Mapping[str, float]], seeds: Sequence[int], *,
               verbose: bool = False) -> SeedResults:
    """Call ``run_one(seed)`` for each seed, after :func:`~tfmlib.config.seed_everything(seed)`,
    and collect what it returns: a mapping ``{quantity: number}`` with the same names every time
    (e.g. ``{"GRU": 0.31, "RNN": 0.44}``). ``verbose`` prints each seed's results as they come.

    Raises ``ValueError`` for no seeds or a repeated seed (a repeat is not another draw), for a
    run that returns other names than the first, and for a value that is not a finite number
    (a diverged run must be looked at, not averaged in).
    """
    seeds = list(seeds)
    if not seeds:
        raise ValueError("over_seeds: no seeds")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"over_seeds: seeds repeat ({seeds}); each seed must be a separate draw")
    values: dict[str, list[float]] = {}
    for seed in seeds:
        seed_everything(seed)
        got = run_one(seed)
        if not isinstance(got, Mapping) or not got:
            raise ValueError(f"over_seeds: run_one({seed}) must return a non-empty mapping "
                             f"{{name: number}}, got {type(got).__name__}")
        if values and list(got) != list(values):
            raise ValueError(f"over_seeds: run_one({seed}) returned {list(got)}, "
                             f"the first run {list(values)}")
        for name, value in got.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"over_seeds: run_one({seed}) gave {name}={value!r}; "
                                 "expected a finite number")
            values.setdefault(name, []).append(float(value))
        if verbose:
            print(f"seed {seed}: " + ", ".join(f"{n} {v:.4g}" for n, v in got.items()))
    return SeedResults(seeds, values)
