"""Atomic file writes: a reader, or a run resumed after a crash, sees the old file or the new one,
never half of either. Files are made readable by others (0o644), as results are for sharing;
`tempfile.mkstemp` alone would leave them private."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable


def atomic_write(path: str | os.PathLike, write: Callable[[str], object], mode: int = 0o644) -> None:
    """Call write(temporary path) in the target's directory, then rename it over `path`; on any error
    the temporary file is removed and `path` is untouched."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))
