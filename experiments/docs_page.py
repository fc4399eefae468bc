"""Refilling the generated block of an experiment's docs page: the tables between two markers, the prose around
them written by hand (docs/experiments/*.md)."""

from __future__ import annotations

from pathlib import Path

from interp.atomic import atomic_write_text


def refill(page: Path, markers: tuple[str, str], markdown: str) -> None:
    """Replace what lies between ``markers`` in ``page`` by ``markdown`` without its first two lines (the report's
    heading and the blank line after it). A page without both markers is an error, not a silent no-op."""
    text = page.read_text()
    start, end = markers
    if start not in text or end not in text:
        raise ValueError(f"{page} has no {start} ... {end} block to fill")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    body = "\n".join(markdown.splitlines()[2:])
    atomic_write_text(page, f"{head}{start}\n{body.strip()}\n{end}{tail}")
