"""The package's metadata agrees with the repository: what pyproject.toml installs, the pinned set, the front page.

`.ci/run` installs the package into a fresh venv and runs its scripts from outside the repository; these checks are
the fast part of the same contract, so that a drift shows up in the test suite too.
"""

from __future__ import annotations

import fnmatch
import importlib
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def pinned() -> dict[str, str]:
    """requirements.txt as {canonical name: pinned version}."""
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


def test_the_pinned_set_satisfies_every_range_the_package_declares():
    pins = pinned()
    project = PYPROJECT["project"]
    declared = list(project["dependencies"])
    for extra in ("ui", "dev"):  # docs (mkdocs-material) is pinned in .ci/run, not in requirements.txt
        declared += project["optional-dependencies"][extra]
    for spec in declared:
        requirement = Requirement(spec)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is a dependency of the package but not pinned in requirements.txt"
        assert requirement.specifier.contains(pins[name]), f"requirements.txt pins {name}=={pins[name]}, outside {spec}"
        if name == "torch":  # an unbounded torch lets pip pull a build nothing was tested with
            assert not requirement.specifier.contains("999"), "torch needs an upper bound"


def test_every_pinned_runtime_package_is_a_dependency_of_the_package():
    project = PYPROJECT["project"]
    declared = {canonicalize_name(Requirement(s).name) for s in project["dependencies"]}
    for extra in project["optional-dependencies"].values():
        declared |= {canonicalize_name(Requirement(s).name) for s in extra}
    assert set(pinned()) <= declared


def test_every_console_script_names_an_existing_main():
    scripts = PYPROJECT["project"]["scripts"]
    assert set(scripts) == {"interp", "saes", "riebench", "flowlens", "workbench"}
    for name, target in scripts.items():
        module_name, function = target.split(":")
        if module_name == "app":
            assert re.search(r"^def main\(", (ROOT / "app.py").read_text(), re.M), "app.main is the workbench script"
            continue
        assert callable(getattr(importlib.import_module(module_name), function)), target


def test_package_data_globs_cover_every_shipped_weight_and_sae_file():
    """Everything the resolvers read under zoo/weights and saes/pretrained is installed with the package."""
    data = PYPROJECT["tool"]["setuptools"]["package-data"]
    for package, folder in (("zoo", "weights"), ("saes", "pretrained")):
        files = [p for p in (ROOT / package / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        assert files
        for path in files:
            relative = path.relative_to(ROOT / package).as_posix()
            # setuptools' ** matches any number of folders; fnmatch's * already crosses "/"
            assert any(fnmatch.fnmatch(relative, glob.replace("**/", "")) for glob in data[package]), relative
    assert set(PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]) >= {
        "interp*", "zoo*", "saes*", "riebench*", "flowlens*", "ui*"}
    assert PYPROJECT["tool"]["setuptools"]["py-modules"] == ["app"]


def test_readme_is_a_front_page_with_the_set_up_and_test_commands():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 12 * 1024
    assert "pip install -r requirements.txt\npython app.py" in readme
    assert "```bash\npython -m pytest -q\n```" in readme
    assert "app_file: app.py" in readme  # the Space's front matter
    for target in re.findall(r"\]\(((?:docs/)?[^)#:]+)(?:#[^)]*)?\)", readme):  # every relative link resolves
        assert (ROOT / target).exists(), target
