"""Atomic file writes: a reader, or a run resumed after a crash, sees the old file or the new one,
never half of either. Files are made readable by others (0o644), as results are for sharing;
`tempfile.mkstemp` alone would leave them private."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable


TEMPORARY_GLOB = ".*.tmp"  # what an interrupted write leaves behind (see `remove_temporaries`)


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # not supported on this platform / filesystem: the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[str], object], mode: int = 0o644,
                 durable: bool = False) -> None:
    """Call write(temporary path) in the target's directory, then rename it over `path`; on any error
    the temporary file is removed and `path` is untouched. ``durable``: the bytes and the rename are
    fsynced to disk before returning (for stores whose manifest must never name a file a power cut lost)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        if durable:
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        _fsync_directory(path.parent)


def remove_temporaries(directory: str | os.PathLike) -> None:
    """Delete the temporary files interrupted atomic writes left in ``directory``."""
    directory = Path(directory)
    if directory.is_dir():
        for tmp in directory.glob(TEMPORARY_GLOB):
            tmp.unlink(missing_ok=True)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))
