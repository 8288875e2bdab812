"""Sweeps of decode cells: models x paths x precisions x batch sizes x prompt lengths x new tokens, each
cell a row of :class:`gpuopt.Results`; a cell that fails (out of memory, a compile error, a capture
that cannot be made) is recorded with its reason and the sweep goes on."""

from __future__ import annotations

import dataclasses
import gc
import itertools
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from .._checks import check_int
from .._ext import build_info
from ..report.results import Results, Row, llm_mode
from ..timing.environment import env
from ..timing.inputs import device_index
from ..timing.measurement import validate_measure_options
from .measure import PRECISIONS, Models, check_precision, measure_decode
from .models import check_causal_lm, check_lengths, model_config, model_name
from .paths import PATHS, check_path


def _values(name: str, value: Any, check: Callable[[Any], Any]) -> list:
    values = [value] if isinstance(value, (str, int, torch.nn.Module)) else list(value)
    if not values:
        raise ValueError(f"{name} must name at least one value, got {value!r}")
    if len({str(v) if not isinstance(v, torch.nn.Module) else id(v) for v in values}) != len(values):
        raise ValueError(f"{name} must not repeat a value, got {value!r}")
    for v in values:
        check(v)
    return values


def decode_sweep(models: str | torch.nn.Module | Sequence[str | torch.nn.Module], *,
                 paths: str | Sequence[str] = ("hf-generate", "static-graph"),
                 precisions: str | Sequence[str] = ("fp16",), batch_sizes: int | Sequence[int] = (1,),
                 prompt_lens: int | Sequence[int] = (128,), new_tokens: int | Sequence[int] = (128,),
                 device: torch.device | str | int | None = None, seed: int = 0, parity: bool = True,
                 parity_tokens: int = 32, ceilings: dict | None = None, out: str | Path | None = None,
                 progress: Callable[[str], None] | None = print, **measure_options: Any) -> Results:
    """Measures every combination; returns the rows as :class:`gpuopt.Results` (and writes them to
    ``out``/results.json after each cell when ``out`` is given, so nothing measured is lost).

    Everything is checked before anything runs: names (:data:`gpuopt.llm.LLM_MODELS`), paths,
    precisions, positive lengths that fit each model's positions, measure options.

    >>> r = decode_sweep("tiny-gpt2", paths="static", precisions="fp32", batch_sizes=[1, 2],
    ...                  prompt_lens=8, new_tokens=4, device="cpu", max_time_s=0.2)   # doctest: +SKIP
    """
    index = device_index(device)
    on_gpu = index is not None
    model_list = _values("models", models, lambda m: model_config(m) if isinstance(m, str)
                         else check_causal_lm(m, "models"))
    path_list = _values("paths", paths, lambda p: check_path(p, on_gpu))
    precision_list = _values("precisions", precisions, check_precision)
    batch_list = _values("batch_sizes", batch_sizes, lambda v: check_int("batch_sizes", v))
    prompt_list = _values("prompt_lens", prompt_lens, lambda v: check_int("prompt_lens", v))
    new_list = _values("new_tokens", new_tokens, lambda v: check_int("new_tokens", v))
    check_int("parity_tokens", parity_tokens)
    for m in model_list:
        cfg = model_config(m) if isinstance(m, str) else m.config
        for p, n in itertools.product(prompt_list, new_list):
            check_lengths(cfg, p, n, model_name(m))
    validate_measure_options({k: v for k, v in measure_options.items() if k not in ("mode", "device")})
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
    if ceilings is None and on_gpu:
        from ..analysis.device_ceilings import ceilings as measured_ceilings

        ceilings = measured_ceilings(index, cached_only=True)

    spec = {"kind": "llm", "models": [model_name(m) for m in model_list], "paths": path_list,
            "precisions": precision_list, "batch_sizes": batch_list, "prompt_lens": prompt_list,
            "new_tokens": new_list, "seed": seed, "parity_tokens": parity_tokens if parity else None}
    results = Results(env=env(), build=build_info(), spec=spec, ceilings=ceilings)
    say = progress or (lambda _msg: None)
    for model in model_list:
        name = model_name(model)
        try:
            shared = Models(model, torch.device("cuda", index) if on_gpu else "cpu", seed)
        except Exception as exc:  # noqa: BLE001 - every cell of this model is recorded failed
            reason = f"building {name} failed: {type(exc).__name__}: {exc}"
            for cell in itertools.product(precision_list, path_list, batch_list, prompt_list, new_list):
                results.add(_failed(reason, name, *cell))
            _checkpoint(results, out)
            continue
        for precision in precision_list:
            for path, b, p, n in itertools.product(path_list, batch_list, prompt_list, new_list):
                t0 = time.perf_counter()
                try:
                    r = measure_decode(shared, path=path, precision=precision, batch_size=b, prompt_len=p,
                                       new_tokens=n, seed=seed, parity=parity, parity_tokens=parity_tokens,
                                       ceilings=ceilings, **measure_options)
                    row = r.to_row()
                    say(r.summary())
                except torch.OutOfMemoryError as exc:
                    row = _failed(_oom_reason(exc), name, precision, path, b, p, n)
                    say(f"{name} {precision}+{path} bs{b} p{p}+n{n}: {row.error}")
                except Exception as exc:  # noqa: BLE001 - recorded with its reason; the sweep goes on
                    row = _failed(f"{type(exc).__name__}: {exc}", name, precision, path, b, p, n)
                    say(f"{name} {precision}+{path} bs{b} p{p}+n{n}: failed: {row.error}")
                results.add(dataclasses.replace(row, runner_overhead_s=time.perf_counter() - t0))
                _checkpoint(results, out)
                _release(on_gpu)
            shared.free(precision)
        del shared
        _release(on_gpu)
    return results


def _failed(reason: str, model: str, precision: str, path: str, b: int, p: int, n: int) -> Row:
    return Row.failed(reason, model=model, config=f"{precision}+{path}", batch_size=b, mode=llm_mode(p, n),
                      precision=precision, item_unit="tokens",
                      llm={"path": path, "precision": precision, "prompt_len": p, "new_tokens": n})


def _oom_reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else "CUDA out of memory"
    return text if text.startswith("out of memory") else f"out of memory: {text}"


def _checkpoint(results: Results, out: Path | None) -> None:
    if out is not None:
        results.to_json(out / "results.json")


def _release(on_gpu: bool) -> None:
    gc.collect()
    if on_gpu:
        torch.cuda.empty_cache()


__all__ = ["PATHS", "PRECISIONS", "decode_sweep"]
