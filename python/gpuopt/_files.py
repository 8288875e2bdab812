"""File writing shared by every layer: one atomic writer (results, reports, sweep headers, baselines,
the ceilings cache) and the check that an output folder can be written before any work starts."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` through a temporary file in the same folder, fsync it and rename it over
    ``path``: readers see the old or the new file, never half of one, even after a crash."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def check_writable(output_dir: str | os.PathLike) -> Path:
    """The output folder, created if needed; ValueError naming it when it cannot be written."""
    path = Path(output_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".gpuopt-write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"output directory {str(path)!r} is not writable: {exc.strerror or exc}") from exc
    return path
