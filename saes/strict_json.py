"""Strict JSON for every file the saes package writes.

`json.dumps` writes NaN and infinities as the bare words NaN / Infinity by default, which are not
JSON: strict readers (a browser's JSON.parse, jq, most other languages) reject the whole file. Here
such a number is an error that says where it is, and nothing is written.
"""

from __future__ import annotations

import json
import math
import os

from interp.atomic import atomic_write_text


class NonFiniteError(ValueError):
    """A NaN or infinite number on its way into a JSON file."""


def _first_non_finite(obj, where: str = "") -> tuple[str, float] | None:
    if isinstance(obj, float):
        return None if math.isfinite(obj) else (where or "the value", obj)
    if isinstance(obj, dict):
        items = ((f"{where}.{key}" if where else str(key), value) for key, value in obj.items())
    elif isinstance(obj, (list, tuple)):
        items = ((f"{where}[{i}]", value) for i, value in enumerate(obj))
    else:
        return None
    for path, value in items:
        found = _first_non_finite(value, path)
        if found is not None:
            return found
    return None


def dumps(obj, **kwargs) -> str:
    """json.dumps(obj, allow_nan=False, **kwargs), with an error naming the first NaN or infinity."""
    try:
        return json.dumps(obj, allow_nan=False, **kwargs)
    except ValueError:
        found = _first_non_finite(obj)
        if found is None:
            raise
        raise NonFiniteError(f"{found[0]} is {found[1]}, which JSON cannot hold") from None


def write_json(path: str | os.PathLike, obj, **kwargs) -> None:
    """`dumps(obj, **kwargs)` written atomically to path; on a non-finite number the old file is kept."""
    try:
        text = dumps(obj, **kwargs)
    except NonFiniteError as err:
        raise NonFiniteError(f"not writing {path}: {err}") from None
    atomic_write_text(path, text)
