"""The built package: import order, build facts, version checks and typed errors across the C++
boundary. The crash-prone paths run in a subprocess so a segfault is a clean failure."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest
import torch

import gpuopt
from gpuopt._ext import check_torch_version

REPO = Path(__file__).resolve().parents[1]


def _run_python(code: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300, **kw
    )


def test_numeric_error_messages_cross_the_boundary_as_value_error():
    # Exactly where a module linked with a private static libstdc++ segfaults (BUILD.md pitfall 1):
    # formatting a number into a C++ error message, once in the core and once in the torch adapter.
    proc = _run_python(
        """
        import json, gpuopt
        from gpuopt import _C
        out = []
        for call in (lambda: _C.quantile([1.0, 2.0], 1.5), lambda: _C.time_device_copy(-5)):
            try:
                call()
            except Exception as exc:
                out.append([type(exc).__name__, str(exc)])
        print(json.dumps(out))
        """
    )
    assert proc.returncode == 0, proc.stderr
    (core_type, core_msg), (adapter_type, adapter_msg) = json.loads(proc.stdout)
    assert core_type == "ValueError" and "1.5" in core_msg and "q must be in [0, 1]" in core_msg
    assert adapter_type == "ValueError" and "-5" in adapter_msg and "nbytes" in adapter_msg


def test_type_errors_arrive_as_type_error():
    with pytest.raises(TypeError, match="out must be int32"):
        torch.ops.gpuopt.fill_pattern_(torch.zeros(4), 0)


def test_build_info_describes_the_build():
    info = gpuopt.build_info()
    assert info["torch_version"] == torch.__version__
    assert info["gpuopt_version"] == gpuopt.__version__
    assert isinstance(info["cuda"], bool)
    assert info["build_type"]
    assert info["compiler"]
    if info["cuda"]:
        assert info["cuda_archs"] and info["nvcc_version"]
        assert info["no_cuda_reason"] == ""
        assert info["torch_cuda"] == torch.version.cuda
    else:
        assert info["no_cuda_reason"]


def test_version_mismatch_names_both_versions_and_the_fix():
    check_torch_version("2.5.0", "2.5.0")
    with pytest.raises(ImportError) as exc:
        check_torch_version("2.5.0+cu124", "2.6.0+cu126")
    msg = str(exc.value)
    assert "2.5.0+cu124" in msg and "2.6.0+cu126" in msg and "--no-build-isolation" in msg


def test_stale_build_is_an_import_error_in_a_fresh_interpreter():
    proc = _run_python(
        """
        import torch
        torch.__version__ = "0.0.1+stale"
        try:
            import gpuopt
        except ImportError as exc:
            print("ImportError:", exc)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "ImportError:" in proc.stdout and "0.0.1+stale" in proc.stdout
    assert "pip install --no-build-isolation" in proc.stdout


def test_configure_without_torch_stops_with_one_clear_sentence(tmp_path):
    cmake = Path(sys.executable).with_name("cmake")
    if not cmake.exists():
        pytest.skip("the cmake package is not installed beside this Python")
    bare = tmp_path / "bare-venv"
    venv.EnvBuilder(with_pip=False).create(bare)  # same Python, no torch
    proc = subprocess.run(
        [str(cmake), "-S", str(REPO), "-B", str(tmp_path / "build"), f"-DPython_EXECUTABLE={bare}/bin/python"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode != 0
    text = " ".join((proc.stdout + proc.stderr).split())
    assert "cannot import torch" in text and "Install torch first" in text
    assert "pip install --no-build-isolation ." in text


def test_a_broken_gpuopt_does_not_break_unrelated_pytest_sessions(tmp_path):
    # pytest loads installed plugins in every session; if gpuopt cannot be imported (e.g. a stale build
    # after a torch upgrade), other projects' tests (their own `gpu` marker included) run untouched, and
    # only tests that need gpuopt error in setup, with the reason.
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: this project's own marker\n")
    (tmp_path / "test_other.py").write_text("import pytest\n\n@pytest.mark.gpu\ndef test_x():\n    pass\n")
    (tmp_path / "test_perf.py").write_text("def test_bench(gpuopt_bench):\n    pass\n")
    run = f"""
        import sys
        import torch
        torch.__version__ = "0.0.1+stale"  # gpuopt's import now fails: built for another torch
        import pytest
        sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "--strict-markers", {str(tmp_path)!r}, *sys.argv[1:]]))
        """
    proc = _run_python(run, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 passed, 1 error" in proc.stdout  # the perf test errors in setup, as with a missing fixture
    assert "gpuopt's pytest plugin is off: gpuopt cannot be imported (ImportError: gpuopt was built against" in proc.stdout
    (tmp_path / "test_perf.py").unlink()
    unrelated = _run_python(run, cwd=tmp_path)
    assert unrelated.returncode == 0 and "1 passed" in unrelated.stdout, unrelated.stdout + unrelated.stderr
    assert "gpuopt" not in unrelated.stdout + unrelated.stderr  # not a word, not a warning
    option = subprocess.run([sys.executable, "-c", textwrap.dedent(run), "--gpuopt-save=main"], capture_output=True,
                            text=True, timeout=300, cwd=tmp_path)
    assert option.returncode == pytest.ExitCode.USAGE_ERROR
    assert "ERROR: --gpuopt-save needs gpuopt, which cannot be imported (ImportError: " in option.stderr


@pytest.mark.parametrize("umask, expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_files_written_by_gpuopt_get_the_umask_mode_not_mkstemps_0600(tmp_path, umask, expected):
    from gpuopt._files import write_atomic

    old = os.umask(umask)
    try:
        new = write_atomic(tmp_path / "sub" / "new.json", "{}")
        kept = tmp_path / "kept.json"
        kept.write_text("old")
        kept.chmod(0o640)
        write_atomic(kept, "new")
    finally:
        os.umask(old)
    assert new.read_text() == "{}" and stat.S_IMODE(new.stat().st_mode) == expected
    assert kept.read_text() == "new" and stat.S_IMODE(kept.stat().st_mode) == 0o640  # replacing keeps the mode
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["kept.json", "new.json", "sub"]  # no temp file left
