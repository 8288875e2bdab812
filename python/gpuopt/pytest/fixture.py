"""What the ``gpuopt_bench`` fixture gives a test (the fixture itself is defined in the entry point,
:mod:`gpuopt_pytest`): measure with gpuopt inside a test and record the result for the session's
report and baselines."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from .. import testing
from ..prepare.config import Config
from ..timing.calibration import round_medians
from ..timing.measurement import Measurement, measure
from .session import REGRESSIONS, _Session


class Bench:
    """What the ``gpuopt_bench`` fixture gives a test: call it to measure, ``record`` to add a
    Measurement taken otherwise (e.g. by :func:`gpuopt.testing.assert_faster`) to the report."""

    def __init__(self, item: pytest.Item, state: _Session):
        self._item = item
        self._state = state
        self._index = 0
        self._keys: set[str] = set()

    @property
    def options(self) -> dict[str, Any]:
        """The test's ``gpuopt(...)`` marker options, nearest marker winning."""
        merged: dict[str, Any] = {}
        for mark in reversed(list(self._item.iter_markers("gpuopt"))):
            if mark.args:
                raise TypeError(f"@pytest.mark.gpuopt takes measure options as keywords only, got positional "
                                f"{mark.args!r}")
            merged.update(mark.kwargs)
        return merged

    def __call__(self, target: Any, config: Config | str | None = None, inputs: Any = None, *,
                 name: str | None = None, **measure_options: Any) -> Measurement:
        """``bench(fn, **measure_options)`` times a callable; ``bench(model, config, inputs,
        **measure_options)`` prepares ``model`` under ``config`` (a :class:`~gpuopt.Config` or a
        string for :meth:`~gpuopt.Config.parse`) and times it on ``inputs``. ``name`` keys the
        measurement in the report and baselines (default: the test id, then ``#1``, ``#2``...)."""
        __tracebackhide__ = True
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a string, got {type(name).__name__}")
        if name == "":
            raise ValueError("name must be a non-empty string")
        options = {**self.options, **measure_options}
        label = options.pop("label", None) or name
        if config is not None:
            if not isinstance(target, torch.nn.Module):
                raise TypeError(f"gpuopt_bench(model, config, inputs): model must be a torch.nn.Module, "
                                f"got {type(target).__name__}")
            if inputs is None:
                raise TypeError("gpuopt_bench(model, config, inputs): inputs are required with a config")
            if "inputs" in options:
                raise TypeError("gpuopt_bench(model, config, inputs): inputs are given positionally; drop "
                                "the inputs= measure option")
            if not isinstance(config, (Config, str)):
                raise TypeError(f"config must be a gpuopt.Config or a string like 'fp16-amp+channels_last', "
                                f"got {type(config).__name__}")
            cfg = Config.parse(config)
            prepared = cfg.apply(target, inputs, device=options.get("device"))
            if not prepared.ok:
                pytest.fail(f"gpuopt_bench: config {cfg.label} could not be prepared: {prepared.error}",
                            pytrace=False)
            fn, label = prepared.runner(inputs), label or cfg.label
        else:
            if inputs is not None:
                raise TypeError("gpuopt_bench(fn, ...): positional inputs go with a model and a config; "
                                "for a callable pass inputs=[...] as a measure option")
            if not callable(target):
                raise TypeError(f"gpuopt_bench(fn): fn must be callable, got {type(target).__name__}")
            fn = target
        if self._state.disabled:
            self._state.untimed_calls += 1
            return testing._run_once(fn, options.get("inputs"), label)
        m = measure(fn, label=label, **options)
        rounds = self._state.calibrate_rounds
        # --gpuopt-calibrate: the same workload in further separate runs, for the A/A calibration.
        more = round_medians(fn, rounds=rounds - 1, **options)[0] if rounds else []
        return self._record(m, name, [m.p50, *more] if rounds else None)

    def record(self, m: Measurement, *, name: str | None = None) -> Measurement:
        """Add ``m`` to the session's report (and baseline comparison); returns ``m``.

        >>> c = assert_faster(fp32_fn, fp16_fn, min_speedup=1.8)      # doctest: +SKIP
        >>> gpuopt_bench.record(c.candidate_measurement, name="fp16")  # doctest: +SKIP
        """
        __tracebackhide__ = True
        return self._record(m, name, None)

    def _record(self, m: Measurement, name: str | None, medians: list[float] | None) -> Measurement:
        __tracebackhide__ = True
        if not isinstance(m, Measurement):
            raise TypeError(f"record needs a gpuopt.Measurement, got {type(m).__name__}")
        if testing.untimed(m):
            return m
        test = self._item.nodeid
        if name is None:
            key = test if self._index == 0 else f"{test}#{self._index}"
            self._index += 1
        else:
            key = f"{test}#{name}"
        if key in self._keys:
            raise ValueError(f"measurement key {key!r} is already used in this test; pass another name=")
        self._keys.add(key)
        rec = self._state.record(test, key, name, m)
        if medians is not None:
            self._state.round_medians[key] = medians
        failed = [c for c in rec.checks if c.failed]
        if failed:
            self._item.stash.setdefault(REGRESSIONS, []).append("\n".join([
                f"gpuopt: {rec.key} regressed against baseline {self._state.compare!r} (beyond the "
                "threshold and significant):",
                *(f"  {c.describe()}" for c in failed),
                f"  {testing.environment_line(m.device_name)}",
            ]))
        return m
