"""What gpuopt adds when it compiles a decode step: a graph pass, and inductor's programmatic launch where
gpuopt's own kernels launch that way (:func:`compile_options`).

:func:`gpuopt.llm.fuse.fuse_projections` folds OPT's query scale into the fused weights and sets the
attention's ``scaling`` to 1.0, leaving ``q_proj(x) * 1.0`` in the model's forward. Inductor drops a
multiplication by a Python scalar one from torch 2.14 on; torch 2.11 keeps it as a copy kernel per layer
and step (1.1 us each for OPT-1.3B on an H100). :class:`DropMulByOne` removes it in every version,
with inductor's own conditions: the same shape, dtype and device, and no later in-place write to the
input (the multiplication would then be the copy that keeps its value).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

from .._ext import _C
from ..timing.inputs import device_index


def _one(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == 1


def _written(node: torch.fx.Node) -> bool:
    """Whether an operator writes ``node``'s value in place: an argument (positional or keyword) its
    schema marks as written, or a write into a view of it."""
    for user in node.users:
        schema = getattr(user.target, "_schema", None)
        if user.op != "call_function" or schema is None:
            continue
        for i, spec in enumerate(schema.arguments):
            arg = user.args[i] if i < len(user.args) else user.kwargs.get(spec.name)
            if arg is node and spec.alias_info is not None and spec.alias_info.is_write:
                return True
        if schema.returns and schema.returns[0].alias_info is not None and _written(user):  # a view of node
            return True
    return False


class DropMulByOne(CustomGraphPass):
    """Removes ``aten.mul.Tensor(x, 1)`` (either order, a Python int or float one) where the product is
    ``x`` itself: same shape, dtype and device, ``x`` not written in place afterwards."""

    removed = 0  # multiplications removed by the last call (for tests)

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.removed = 0
        for node in list(graph.find_nodes(op="call_function", target=torch.ops.aten.mul.Tensor)):
            if len(node.args) != 2 or node.kwargs:
                continue
            x, y = node.args
            if _one(x):
                x, y = y, x
            if not (isinstance(x, torch.fx.Node) and _one(y)):
                continue
            before, after = x.meta.get("val"), node.meta.get("val")
            if not (isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor)
                    and before.shape == after.shape and before.dtype == after.dtype
                    and before.device == after.device) or _written(x):
                continue
            if any(user.op == "output" for user in node.users):  # the graph would return x itself (an input, say)
                continue
            node.replace_all_uses_with(x)
            graph.erase_node(node)
            self.removed += 1

    def uuid(self) -> str:
        # inductor's FX graph cache keys on it: a changed pass must not reuse graphs the old one made
        try:
            from torch._inductor.custom_graph_pass import get_hash_for_files

            return get_hash_for_files((__file__,)).hex()
        except ImportError:
            return "gpuopt.llm.passes.DropMulByOne/2"


def compile_options(device: torch.device | str | None = None) -> dict[str, Any]:
    """The inductor options of gpuopt's compiled decode steps on ``device``: :class:`DropMulByOne`, and
    inductor's programmatic dependent launch (``triton.enable_pdl``: its Triton kernels start while the
    kernel before them finishes) where gpuopt's own decode kernels launch that way on ``device``
    (``gpuopt._C.programmatic_launch_runs``: compute capability 9.0+ with this build's code for it, and
    ``gpuopt._C.programmatic_launch()`` on). Inductor's alone,
    between plainly launched kernels of gpuopt's, made OPT-1.3B's step slower on the H100; with them,
    1.031x faster (``benchmarks/llm_decode_pdl.py``)."""
    options: dict[str, Any] = {"joint_custom_post_pass": DropMulByOne()}
    if device is not None and _programmatic(torch.device(device)):
        options["triton.enable_pdl"] = True
    return options


def _programmatic(device: torch.device) -> bool:
    from torch._inductor import config

    if device.type != "cuda" or not torch.cuda.is_available() or not hasattr(config.triton, "enable_pdl"):
        return False
    return bool(_C.programmatic_launch_runs(device_index(device)))


__all__ = ["DropMulByOne", "compile_options"]
