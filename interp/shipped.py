"""The one guard for files that ship with the repository: they are written only on purpose (`--overwrite`).

Shipped files are found two ways. By location: the embedded models (`zoo/weights/`, as `zoo` registers it:
`interp.embedded`) and the pretrained SAEs (`saes/pretrained/`). By a marker: each shipped root holds a file named
`SHIPPED`, so a copy of a whole root made elsewhere (``cp -r saes/pretrained runs/pretrained``) is protected too; a copy of one model or one SAE set
(``cp -r saes/pretrained/toy runs/toy-saes``) carries no marker and is the user's own.

Every command line reaches the guard: `interp.cli.run_command` checks the options named in `OUTPUT_OPTIONS`
before the command runs (`refuse_shipped_outputs`), and `add_overwrite_options` gives each command that has one
of them an `--overwrite`. A command whose files land somewhere no option names (cards beside the SAEs read, an
eval.json beside its SAE) calls `refuse_shipped` with those paths itself.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .embedded import registered_weights_dir

MARKER = "SHIPPED"
# The pretrained SAEs beside the `interp` package: a shipped root by location (a path, not an import).
PRETRAINED_ROOT = Path(__file__).resolve().parent.parent / "saes" / "pretrained"
# argparse destinations that name where a command writes: checked by run_command before any command runs.
OUTPUT_OPTIONS = ("out", "save_to", "pool_dir")
WRITE_ELSEWHERE = "write to a directory of your own instead (e.g. --out runs/NAME)"


def shipped_roots() -> tuple[Path, ...]:
    """The shipped roots by location: the embedded models' weights (as `zoo` registers them:
    `interp.embedded`) and the pretrained SAEs. Each also holds the marker, so it is protected without registration."""
    weights = registered_weights_dir()
    return (PRETRAINED_ROOT,) if weights is None else (weights, PRETRAINED_ROOT)


class ShippedFilesError(ValueError):
    """A command would write files that ship with the repository, and was not told to (--overwrite)."""


def shipped_root(path: str | os.PathLike) -> Path | None:
    """The shipped root that `path` is or lies inside (by location, or by the nearest directory above it holding
    the marker file); None for a path of the user's own. The path need not exist."""
    path = Path(path).expanduser().resolve()
    for root in shipped_roots():
        if path == root or root in path.parents:
            return root
    for directory in (path, *path.parents):
        if (directory / MARKER).is_file():
            return directory
    return None


def is_shipped(path: str | os.PathLike) -> bool:
    """Whether the path is, or lies inside, a directory that ships with the repository."""
    return shipped_root(path) is not None


def refuse_shipped(paths, command: str, instead: str = WRITE_ELSEWHERE) -> None:
    """A ShippedFilesError if any of the paths that `command` would write ships with the repository; `instead`
    says where to write. Callers skip the call when the user passed --overwrite."""
    hit = [os.fspath(p) for p in paths if p is not None and is_shipped(p)]
    if hit:
        roots = sorted({_describe(shipped_root(p)) for p in hit})
        raise ShippedFilesError(
            f"{command} would rewrite files shipped with the repository ({', '.join(hit)}, under "
            f"{', '.join(roots)}); {instead}, or pass --overwrite to regenerate the shipped files on purpose")


def _describe(root: Path) -> str:
    return str(root) if root in shipped_roots() else f"{root}, marked shipped by its {MARKER} file"


def _leaf_parsers(parser: argparse.ArgumentParser):
    """Every parser that runs a command: the parser itself, or each subcommand's, however deeply nested."""
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers:
        yield parser
    for action in subparsers:
        for sub in dict.fromkeys(action.choices.values()):  # aliases share a parser
            yield from _leaf_parsers(sub)


def output_options(parser: argparse.ArgumentParser) -> list[str]:
    """The destinations of the parser's options that name where its command writes."""
    return [a.dest for a in parser._actions if a.dest in OUTPUT_OPTIONS]


def add_overwrite_options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Give every command of `parser` that writes (has an option of OUTPUT_OPTIONS) an `--overwrite` flag, if it
    has none of its own, and record its name for the guard's message."""
    for leaf in _leaf_parsers(parser):
        if not output_options(leaf):
            continue
        if not any(a.dest == "overwrite" for a in leaf._actions):
            leaf.add_argument("--overwrite", action="store_true",
                              help="write into files shipped with the repository (saes/pretrained/, "
                                   "zoo/weights/) on purpose")
        leaf.set_defaults(writer=leaf.prog.removeprefix("python -m "))
    return parser


def refuse_shipped_outputs(args: argparse.Namespace) -> None:
    """The guard every command line runs before its command: refuse output options that point into shipped
    files, unless --overwrite."""
    if getattr(args, "overwrite", False):
        return
    paths = [getattr(args, dest) for dest in OUTPUT_OPTIONS if getattr(args, dest, None) not in (None, "")]
    if paths:
        refuse_shipped([os.fspath(p) for p in paths], getattr(args, "writer", "this command"))
