"""The notebooks run top to bottom (small parameters on the CPU), outputs stripped in the repo."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_there_are_five_notebooks_and_they_are_stripped():
    assert [p.name for p in NOTEBOOKS] == ["01_quickstart.ipynb", "02_batch_sweep_and_report.ipynb",
                                           "03_training.ipynb", "04_serving.ipynb", "05_llm_decode.ipynb"]
    for p in NOTEBOOKS:
        for cell in json.loads(p.read_text())["cells"]:
            assert not cell.get("outputs") and not cell.get("execution_count"), p.name
            src = "".join(cell["source"])
            assert "measure(" not in src.replace("gpuopt.", "") or cell["cell_type"] == "markdown", (
                f"{p.name}: notebooks use gpuopt, they define no timing code")


@pytest.mark.slow
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(notebook, tmp_path):
    env = dict(os.environ, GPUOPT_NOTEBOOK_QUICK="1")
    out = tmp_path / notebook.name
    proc = subprocess.run([sys.executable, str(REPO / ".ci" / "execute_notebook.py"), str(notebook), str(out)],
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    executed = json.loads(out.read_text())
    code = [c for c in executed["cells"] if c["cell_type"] == "code"]
    assert all(c["execution_count"] for c in code)
    assert any(o.get("output_type") == "display_data" for c in code for o in c["outputs"]), "no figure was drawn"


def test_the_repository_url_is_one_string_a_fork_changes_with_one_command():
    # README's clone command and Colab cell and each notebook's install cell: the same URL, so the
    # README's `sed` over README.md and notebooks/*.ipynb changes all of them.
    url = re.compile(r"https://github\.com/[^/\s\"']+/gpuopt")
    readme = (REPO / "README.md").read_text()
    seen = {"README.md": url.findall(readme)}
    for p in NOTEBOOKS:
        seen[p.name] = [u for cell in json.loads(p.read_text())["cells"] for u in url.findall("".join(cell["source"]))]
    assert len(seen["README.md"]) >= 2 and all(len(seen[p.name]) == 1 for p in NOTEBOOKS), seen
    assert len({u for urls in seen.values() for u in urls}) == 1, seen
    (first,) = set(seen["README.md"])
    assert f"sed -i 's#{first.removeprefix('https://')}#github.com/YOU/gpuopt#' README.md notebooks/*.ipynb" in readme
