"""Where the embedded models live, as their owner registers it: the core never imports the package that holds them.

The embedded toy pipelines (`interp.models.t2i.KNOWN_MODELS`' entries with ``embedded=True``) and chat models
(`interp.models.lm.embedded_lms`) are folders of one weights directory, which `zoo` (beside the core) registers when
it is imported (`zoo/__init__.py`), together with its worlds (`interp.ground_truth.register_world`). Every entry
point imports `zoo` before it runs: the command lines' ``__main__`` modules, the app, tests/conftest.py, and the
scripts of experiments/ and benchmarks/ that load an embedded model. A program that imports only `interp` and asks
for an embedded model gets one line saying so (`NotRegistered`, a ValueError: the CLIs' user errors).
"""

from __future__ import annotations

import os
from pathlib import Path

_WEIGHTS: list[Path] = []  # the registered weights directory (at most one)
EMBEDDED_PREFIX = "toy-chat"  # the embedded chat models' names: toy-chat (chat-base), toy-chat-<suffix> (chat-<suffix>)
EMBEDDED_LM_WORLD = "chat"  # the world they were trained in (zoo.chat.world): its held-out conversations and labels


class NotRegistered(ValueError):
    """An embedded model or world asked for before its package registered it."""


def register_weights_dir(path: str | os.PathLike) -> Path:
    """Make ``path`` the directory of the embedded models' weights (a later registration replaces an earlier one);
    it is also a shipped root (`interp.shipped`)."""
    directory = Path(path).resolve()
    _WEIGHTS[:] = [directory]
    return directory


def registered_weights_dir() -> Path | None:
    """The registered weights directory, or None when nothing registered one."""
    return _WEIGHTS[0] if _WEIGHTS else None


def weights_dir() -> Path:
    """The registered weights directory; `NotRegistered` (one line, what to do) when nothing registered one."""
    if not _WEIGHTS:
        raise NotRegistered("no embedded models are registered: import zoo first (`import zoo`; the command lines, "
                            "the app and the tests do)")
    return _WEIGHTS[0]


__all__ = ["EMBEDDED_LM_WORLD", "EMBEDDED_PREFIX", "NotRegistered", "register_weights_dir", "registered_weights_dir", "weights_dir"]
