"""Atomic writes: readers see the old file or the new one, and results are readable by others."""

import stat

import pytest

from interp.atomic import atomic_write, atomic_write_text


def test_a_written_file_replaces_the_old_one_and_is_readable_by_others(tmp_path):
    target = tmp_path / "report.md"
    target.write_text("old")
    atomic_write_text(target, "new")
    assert target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"]  # no temporary file left


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path):
    target = tmp_path / "checkpoint.pt"
    target.write_bytes(b"good")

    def half_then_crash(tmp):
        with open(tmp, "wb") as f:
            f.write(b"ha")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        atomic_write(target, half_then_crash)
    assert target.read_bytes() == b"good" and [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]
