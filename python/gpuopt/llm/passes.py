"""What gpuopt adds when it compiles a decode step: two graph passes, and inductor's programmatic launch
where gpuopt's own kernels launch that way (:func:`compile_options`).

:class:`FuseResidual` moves a residual add into the epilogue of the gpuopt linear layer whose output it
adds (``residual + o_proj(...)``, ``residual + fc2(...)``): with the norms folded into the next linear
layers (:func:`gpuopt.llm.fuse.fold_norms`) no kernel is left between a layer's matmuls but the attention.

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
        return _file_hash("gpuopt.llm.passes.DropMulByOne/2")


def _linear_ops() -> tuple[Any, ...]:
    return (torch.ops.gpuopt.decode_linear.default, torch.ops.gpuopt.int8_weight_only_linear.default)


def _residual_index(node: torch.fx.Node) -> int:
    """The position of ``residual`` among the arguments of the gpuopt linear operator ``node`` calls."""
    return [a.name for a in node.target._schema.arguments].index("residual")


def _residual_free(node: torch.fx.Node) -> bool:
    """Whether a call of one of gpuopt's linear operators passes no residual (None, positionally or by name)."""
    i = _residual_index(node)
    return (len(node.args) <= i or node.args[i] is None) and node.kwargs.get("residual") is None


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape (statically: no guard added on a symbolic size), dtype and device."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return (a.dim() == b.dim() and all(statically_known_true(x == y) for x, y in zip(a.shape, b.shape))
            and a.dtype == b.dtype and a.device == b.device)


class FuseResidual(CustomGraphPass):
    """Replaces ``aten.add.Tensor(linear(...), r)`` (either order, no alpha), where ``linear`` is
    ``gpuopt::decode_linear`` or ``gpuopt::int8_weight_only_linear`` without a residual and its output is
    read by the add only, by the linear operator with ``residual=r`` at the add's place: when ``r`` is
    another value with the output's shape, dtype and device (no broadcast, no type promotion) and neither
    it nor the linear's inputs are written in place (the linear then reads them later, unchanged)."""

    fused = 0  # adds fused by the last call (for tests)

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.fused = 0
        ops = _linear_ops()
        for node in list(graph.find_nodes(op="call_function", target=torch.ops.aten.add.Tensor)):
            if len(node.args) != 2 or node.kwargs:
                continue
            out = node.meta.get("val")
            for linear, r in (node.args, node.args[::-1]):
                if not (isinstance(linear, torch.fx.Node) and isinstance(r, torch.fx.Node) and r is not linear
                        and linear.op == "call_function" and linear.target in ops and len(linear.users) == 1
                        and _residual_free(linear)):
                    continue
                y, rv = linear.meta.get("val"), r.meta.get("val")
                if not all(isinstance(t, torch.Tensor) for t in (out, y, rv)) or not (_same(y, rv) and _same(y, out)):
                    continue
                inputs = [a for a in (*linear.args, *linear.kwargs.values()) if isinstance(a, torch.fx.Node)]
                if any(_written(a) for a in (*inputs, r)):
                    continue
                i = _residual_index(linear)
                args, kwargs = linear.args, dict(linear.kwargs)
                if len(args) > i:  # passed positionally (as None)
                    args = (*args[:i], r, *args[i + 1:])
                else:
                    kwargs["residual"] = r
                with graph.inserting_before(node):
                    fused = graph.call_function(linear.target, args, kwargs)
                fused.meta.update(linear.meta)
                node.replace_all_uses_with(fused)
                graph.erase_node(node)
                graph.erase_node(linear)
                self.fused += 1
                break

    def uuid(self) -> str:
        return _file_hash("gpuopt.llm.passes.FuseResidual/1")


def _file_hash(fallback: str) -> str:
    # inductor's FX graph cache keys on it: a changed pass must not reuse graphs the old one made
    try:
        from torch._inductor.custom_graph_pass import get_hash_for_files

        return get_hash_for_files((__file__,)).hex()
    except ImportError:
        return fallback


def compile_options(device: torch.device | str | None = None) -> dict[str, Any]:
    """The inductor options of gpuopt's compiled decode steps on ``device``: :class:`DropMulByOne`,
    :class:`FuseResidual`, and
    inductor's programmatic dependent launch (``triton.enable_pdl``: its Triton kernels start while the
    kernel before them finishes) where gpuopt's own decode kernels launch that way on ``device``
    (``gpuopt._C.programmatic_launch_runs``: compute capability 9.0+ with this build's code for it, and
    ``gpuopt._C.programmatic_launch()`` on). Inductor's alone,
    between plainly launched kernels of gpuopt's, made OPT-1.3B's step slower on the H100; with them,
    1.031x faster (``benchmarks/llm_decode_pdl.py``)."""
    options: dict[str, Any] = {"joint_custom_post_pass": DropMulByOne(), "post_grad_custom_post_pass": FuseResidual()}
    if device is not None and _programmatic(torch.device(device)):
        options["triton.enable_pdl"] = True
    return options


def _programmatic(device: torch.device) -> bool:
    from torch._inductor import config

    if device.type != "cuda" or not torch.cuda.is_available() or not hasattr(config.triton, "enable_pdl"):
        return False
    return bool(_C.programmatic_launch_runs(device_index(device)))


__all__ = ["DropMulByOne", "FuseResidual", "compile_options"]
