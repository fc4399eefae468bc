"""MkDocs hook: the experiments' result files become part of the site where the scripts write them.

The experiment scripts write their tables, figures and JSON into experiments/results/ (the code's contract, read by
tests and by the next run); the docs pages link to them as `results/<file>` instead of keeping copies that would
drift. Each file there (not the per-cell folders) is added to the site under results/: .md files as pages (not in
the nav), the rest as they are.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

RESULTS = Path(__file__).resolve().parent / "experiments" / "results"


def on_files(files, config):
    for path in sorted(RESULTS.iterdir()):
        if path.is_file():
            files.append(File.generated(config, f"results/{path.name}", abs_src_path=str(path)))
    return files
