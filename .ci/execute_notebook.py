#!/usr/bin/env python3
"""Runs a notebook's code cells in order in one namespace, as a kernel would, without Jupyter (the GPU
machine has none): stdout, the value of a cell's last expression, and every matplotlib figure a
cell makes become the cell's outputs. Writes the executed copy; exits 1 at the first failing cell.

    python .ci/execute_notebook.py notebooks/01_quickstart.ipynb executed/01_quickstart.ipynb
"""

from __future__ import annotations

import ast
import base64
import contextlib
import io
import json
import os
import sys
import time
import traceback


def run(src_path: str, dst_path: str) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(src_path) as f:
        nb = json.load(f)
    ns: dict = {"__name__": "__main__"}
    count = 0
    workdir = os.path.dirname(os.path.abspath(dst_path))
    os.makedirs(workdir, exist_ok=True)
    cwd = os.getcwd()
    os.chdir(workdir)  # results folders land beside the executed copy
    status = 0
    try:
        for cell in nb["cells"]:
            if cell["cell_type"] != "code":
                continue
            count += 1
            src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            outputs, out = [], io.StringIO()
            t0 = time.perf_counter()
            try:
                tree = ast.parse(src)
                last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                    exec(compile(tree, f"<cell {count}>", "exec"), ns)
                    value = eval(compile(ast.Expression(last.value), f"<cell {count}>", "eval"), ns) if last else None
                quiet = src.rstrip().endswith(";")
                if out.getvalue():
                    outputs.append({"output_type": "stream", "name": "stdout", "text": out.getvalue()})
                for num in plt.get_fignums():
                    buf = io.BytesIO()
                    plt.figure(num).savefig(buf, format="png", dpi=100, bbox_inches="tight")
                    outputs.append({"output_type": "display_data", "metadata": {},
                                    "data": {"image/png": base64.b64encode(buf.getvalue()).decode(),
                                             "text/plain": "<Figure>"}})
                plt.close("all")
                if value is not None and not quiet and type(value).__name__ != "Figure":
                    data = {"text/plain": repr(value)}
                    if hasattr(value, "_repr_html_"):
                        data["text/html"] = value._repr_html_()
                    outputs.append({"output_type": "execute_result", "execution_count": count, "metadata": {},
                                    "data": data})
            except Exception as exc:  # noqa: BLE001 - reported in the notebook and by the exit code
                if out.getvalue():
                    outputs.append({"output_type": "stream", "name": "stdout", "text": out.getvalue()})
                outputs.append({"output_type": "error", "ename": type(exc).__name__, "evalue": str(exc),
                                "traceback": traceback.format_exc().splitlines()})
                print(f"{src_path}: cell {count} failed:\n{traceback.format_exc()}", file=sys.stderr)
                status = 1
            cell["outputs"], cell["execution_count"] = outputs, count
            print(f"{src_path}: cell {count} done in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            if status:
                break
    finally:
        os.chdir(cwd)
        with open(dst_path, "w") as f:
            json.dump(nb, f, indent=1)
    return status


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: execute_notebook.py NOTEBOOK OUTPUT")
    sys.exit(run(sys.argv[1], sys.argv[2]))
