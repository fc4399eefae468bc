"""Ground truth: what an image generated from a prompt should show, where a world defines it.

The embedded toy model is made in the shapes world (`zoo.shapes`): every caption describes one scene
exactly (its objects' attributes and grid cells, its background), an exact renderer draws it, and a probe reads
a scene back from an image. Code that measures against that truth (feature labels and block probes in
`saes.probes`, the SAE report, splice fidelity's attribute accuracy, causal label scores, RIEBench's shapes
metrics) gets it through this interface, and a real model (SDXL Turbo), or prompts outside every world, gets
None and a message saying there is no ground truth, instead of running a world's code on what it cannot read.

    truth = ground_truth_for(model)      # the world the model was made in, or None (a T2IModel or a name)
    truth = ground_truth_of(prompts)     # the world these prompts are captions of, or None
    prompts = truth.prompts(100, seed=0) # captions of random scenes, reproducible by seed
    scenes = truth.scenes(prompts)       # one scene per prompt (None for a prompt outside the world)
    reading = truth.probe().read(image)  # what an image shows (`reading.at(cell)`, `reading.background`)

and its layout, where a scene's objects lie in an image (the feature labels and block probes score a block's
positions against it, the causal label scores paint into it):

    truth.cells                          # the named cells an object can occupy, in the world's order
    truth.cell_box(cell, size)           # a cell's pixel box (x0, y0, x1, y1) at size x size (an image, a block)
    truth.object_mask(obj, size)         # how much of each pixel an object covers; foreground_mask(scene, size)
    truth.held_out_scene(rng)            # a scene of the held-out split; truth.caption(scene): its caption

A scene has `.objects` and `.background` (its value of the attribute "background"); an object has its value of
each object attribute as an attribute of the same name (`obj.colour`), and its cell as `obj.position`.
The world's attributes come by role, so that generic code (the SAE report, splice fidelity, causal label scores,
the Paint tab) names none of them:

    truth.object_attributes              # every object attribute, in the world's order (the probe scores each)
    truth.key_attributes                 # those every value of which the SAE report wants a labelled feature for
    truth.hides_on_background            # the object attribute an object vanishes by sharing with the background
    example_label(truth)                 # "attribute=value" of the first key attribute (hints and messages)

A new world implements `GroundTruth` and its package registers it (`register_world`; `zoo` registers the shapes
world when imported); a model made in it names it (`KnownModel.world`, `T2IModel.world`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    import numpy as np


@runtime_checkable
class GroundTruth(Protocol):
    """A world whose prompts say exactly what an image shows."""

    name: str
    image_size: int  # the side of the world's images, in pixels

    def prompts(self, n: int, seed: int = 0, progress: bool = False) -> list[str]:
        """n captions of random scenes of the world, reproducible by seed."""

    def scene(self, prompt: str):
        """The scene a prompt describes, or None when the prompt is not a caption of the world."""

    def scenes(self, prompts: Sequence[str]) -> list | None:
        """One scene per prompt (None where a prompt is outside the world); None when no prompt is of it."""

    def attribute_values(self) -> list[tuple[str, str]]:
        """Every (attribute, value) a scene can have: object attributes, then the background."""

    def probe(self):
        """The reader of images: ``.read(image)`` -> the scene it shows, ``.score(image, scene)`` -> per attribute
        correctness."""

    # The layout: where a scene's objects lie in its images. A scene has `.objects` and `.background`; an object
    # has its value of every object attribute as an attribute (`obj.colour`), its cell as `obj.position`.

    cells: tuple[str, ...]  # the named cells an object can occupy (the values of "position"), in the world's order

    def cell_box(self, cell: str, size: int) -> tuple[int, int, int, int]:
        """The pixel box (x0, y0, x1, y1), end-exclusive, of a cell in a size x size grid (an image, a block)."""

    def object_mask(self, obj, size: int) -> np.ndarray:
        """(size, size) float in [0, 1]: how much of each pixel the object covers."""

    def foreground_mask(self, scene, size: int) -> np.ndarray:
        """(size, size) bool: the pixels any of the scene's objects covers."""

    def held_out_scene(self, rng: np.random.Generator):
        """A random scene of the held-out split (combinations the world's models never trained on), from rng."""

    def caption(self, scene) -> str:
        """The canonical caption of a scene (``scene(caption(s)) == s``)."""

    # The attributes by role: what the SAE report, splice fidelity, causal label scores and the Paint tab read
    # instead of naming a world's attributes.

    object_attributes: tuple[str, ...]  # every object attribute, in attribute_values' order ("position": the cell);
    # probe().score(image, scene) gives one accuracy per object attribute, "background" and "all"
    key_attributes: tuple[str, ...]  # the object attributes that tell objects apart at a glance: every value of them
    # is a label target of the SAE report and has its mixture distance measured; the first is what the Paint tab
    # starts with (a feature labelled with it visibly changes what it is painted on)
    hides_on_background: str | None  # the object attribute whose value, when it is the background's, hides the
    # object (a causal label score never paints that value on it); None when no attribute does


def example_label(truth: GroundTruth) -> str:
    """An "attribute=value" label of the world, for hints and messages: its first key attribute's first value."""
    attribute = truth.key_attributes[0]
    return next(f"{a}={v}" for a, v in truth.attribute_values() if a == attribute)


# name -> the world (made when first asked for), as its package registers it: `zoo` registers "shapes" on import
WORLDS: dict[str, Callable[[], GroundTruth]] = {}


def register_world(name: str, make: Callable[[], GroundTruth]) -> None:
    """Register a world by name: ``make()`` returns its `GroundTruth` (called when the world is first asked for)."""
    WORLDS[name] = make


class GroundTruthError(ValueError):
    """Work that needs a world's ground truth, asked of a model or prompts that have none."""


def world(name: str) -> GroundTruth:
    """A world by name (``"shapes"``)."""
    if name not in WORLDS:
        known = ", ".join(WORLDS) or "none registered (a world's package registers it: `import zoo`)"
        raise GroundTruthError(f"unknown world {name!r}; the worlds are: {known}")
    return WORLDS[name]()


def ground_truth_for(model) -> GroundTruth | None:
    """The world a text-to-image model was made in: a `T2IModel` (its ``world``), or a model name or directory
    (the toy and pipelines its recipe saved are the shapes world's); None for any other model."""
    if isinstance(model, (str, os.PathLike)):
        from .models.t2i_registry import known_model

        known = known_model(os.fspath(model))
        name = known.world if known is not None else None
    else:
        name = getattr(model, "world", None)
    return world(name) if name else None


def ground_truth_of(prompts: Sequence[str]) -> GroundTruth | None:
    """The world whose captions these prompts are (at least one of them), or None."""
    for name in WORLDS:
        truth = world(name)
        if any(truth.scene(p) is not None for p in prompts):
            return truth
    return None


def require_ground_truth(model, what: str, instead: str = "") -> GroundTruth:
    """`ground_truth_for(model)`, or a GroundTruthError saying that `what` needs one, the model has none, and
    what to do `instead`."""
    truth = ground_truth_for(model)
    if truth is None:
        name = getattr(model, "name", model)
        raise GroundTruthError(f"{what} needs a model made in a world whose scenes are known (the toy model: the "
                               f"shapes world); {name} has no ground truth" + (f": {instead}" if instead else ""))
    return truth


__all__ = ["GroundTruth", "GroundTruthError", "WORLDS", "example_label", "ground_truth_for", "ground_truth_of",
           "require_ground_truth", "world"]
