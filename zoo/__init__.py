"""Embedded default models: their worlds (data generators), weights and training recipes.

Importing `zoo` registers them with the core (which never imports zoo): the weights directory
(`interp.embedded.register_weights_dir`: the embedded pipelines and chat models, a shipped root) and the shapes
world (`interp.ground_truth.register_world`, imported when first asked for). Every entry point imports zoo first.
"""

from pathlib import Path

from interp.embedded import register_weights_dir
from interp.ground_truth import register_world

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"


def _shapes():
    from .shapes import WORLD

    return WORLD


register_weights_dir(WEIGHTS_DIR)
register_world("shapes", _shapes)
