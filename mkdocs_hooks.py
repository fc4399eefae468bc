"""MkDocs hooks: files the site shows from where the code keeps them, so that the docs hold no copies that drift.

- experiments/results/: the experiment scripts write their tables, figures and JSON there (the code's contract, read
  by tests and by the next run). Each file there (not the per-cell folders) is added to the site under results/
  (.md files as pages outside the nav, the rest as they are); pages link to them as `results/<file>`.
- ARCHITECTURE.md, the repository's account of its layers, arrows, data flow and formats, is the page
  architecture.md; its links into docs/ are rewritten to the site's pages.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parent
RESULTS = REPO / "experiments" / "results"
ARCHITECTURE = REPO / "ARCHITECTURE.md"


def on_files(files, config):
    for path in sorted(RESULTS.iterdir()):
        if path.is_file():
            files.append(File.generated(config, f"results/{path.name}", abs_src_path=str(path)))
    files.append(File.generated(config, "architecture.md", abs_src_path=str(ARCHITECTURE)))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == "architecture.md":
        return markdown.replace("](docs/", "](")
    return markdown
