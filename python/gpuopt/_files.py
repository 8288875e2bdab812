"""File writing shared by every layer: one atomic writer (results, reports, sweep headers, baselines,
the ceilings cache), its form for writers that want a path (plots), and the check that an output folder can be written before any work starts."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def write_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` through a temporary file in the same folder, fsync it and rename it over
    ``path``: readers see the old or the new file, never half of one, even after a crash."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, _open_mode(path))
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def _open_mode(path: Path) -> int:
    """mkstemp creates files 0600; the mode open() would give: the old file's, or the umask's."""
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        return 0o666 & ~_umask()


def _umask() -> int:
    """The process umask, read without changing it where Linux allows (os.umask can only set it,
    and setting it briefly would race with other threads creating files)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside ``path`` for a writer that wants a file name (matplotlib's savefig):
    renamed over ``path`` when the block ends, removed when it raises (Ctrl-C too), so ``path`` is
    never half-written. Give the writer the format explicitly: the temporary name ends in .tmp."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, _open_mode(path))
    finally:
        os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


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
