"""The shapes-world edit categories, one registry entry each: how a task of the category is drawn, its
instruction, which region it edits, what counts as success and what must stay as it was.

Everything that differs between categories is here; the suite generator (``tasks.shapes_suite``) and the
metrics (``metrics.edit_success``, ``metrics.attribute_preservation``) read it from the category instead of
switching on its name. A new category is one ``@register_category`` function pair plus its entry; the
random draws of the existing categories are unchanged by adding one (each category has its own stream).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np

from zoo import shapes

ATTRIBUTES = ("shape", "colour", "size", "texture")


def pick(rng: np.random.Generator, options) -> str:
    """One of ``options`` drawn by ``rng``; sorted first, since a set's order changes with Python's string
    hash seed from one process to the next (the suite was different in every process)."""
    options = sorted(options)
    return options[int(rng.integers(len(options)))]


@dataclass(frozen=True)
class Draw:
    """What a category's edit is drawn from: the original scene and the object picked in it."""

    rng: np.random.Generator
    original: shapes.Scene
    obj: shapes.ShapeObject          # the object picked for the edit (every category draws one)
    free: list[str]                  # grid cells with no object
    colours: list[str]               # object colours other than the background's

    @property
    def others(self) -> tuple[shapes.ShapeObject, ...]:
        return tuple(o for o in self.original.objects if o is not self.obj)


# (target scene, source position, target position, edited attributes)
Edit = tuple[shapes.Scene, "str | None", "str | None", list[str]]


@dataclass(frozen=True)
class ShapesCategory:
    name: str
    riebench: str                                         # the public RIEBench category it mirrors
    edit: Callable[[Draw], Edit]
    instruction: Callable[[shapes.Scene, shapes.Scene, "str | None", "str | None"], str]
    success: Callable[[shapes.Scene, "shapes.ProbeReading", "str | None", "str | None", list[str]], bool]
    region: str = "object"        # "object": the edited object's pixels (its cell when absent); "background"
    object_count: Callable[[np.random.Generator, int], int] | None = None  # objects in the original (max given)
    keeps_background: bool = True  # preservation checks that the background did not change
    keeps_object: bool = True      # preservation checks the edited object's other attributes


SHAPES_CATEGORY_REGISTRY: dict[str, ShapesCategory] = {}


def register_category(category: ShapesCategory) -> ShapesCategory:
    if category.name in SHAPES_CATEGORY_REGISTRY:
        raise ValueError(f"category {category.name!r} is registered twice")
    SHAPES_CATEGORY_REGISTRY[category.name] = category
    return category


# ----------------------------------------------------------------------------- shared pieces

def _replace(attribute: str, allowed: Callable[[Draw], object]) -> Callable[[Draw], Edit]:
    def edit(d: Draw) -> Edit:
        value = pick(d.rng, set(allowed(d)) - {getattr(d.obj, attribute)})
        p = d.obj.position
        return shapes.replace_object(d.original, p, **{attribute: value}), p, p, [attribute]
    return edit


def _describe_change(original, target, p, q) -> str:
    old = next(o for o in original.objects if o.position == p)
    new = next(o for o in target.objects if o.position == q)
    return f"change the {old.size} {old.colour} {old.texture} {old.shape} at {p} into a " \
           f"{new.size} {new.colour} {new.texture} {new.shape}"


def _attributes_read(target, reading, p, q, attributes) -> bool:
    wanted = next(o for o in target.objects if o.position == q)
    found = reading.at(q)
    return found is not None and all(getattr(found, a) == getattr(wanted, a) for a in attributes)


def _drawn_at_target(target, reading, q) -> bool:
    wanted = next(o for o in target.objects if o.position == q)
    found = reading.at(q)
    return found is not None and found.shape == wanted.shape and found.colour == wanted.colour


# ----------------------------------------------------------------------------- the categories
# In registration order, which is the suite's order: each category draws from the stream [seed, its index],
# so a new category goes at the end and leaves the others' tasks as they were.

def _add(d: Draw) -> Edit:
    q = pick(d.rng, d.free)
    new = shapes.ShapeObject(pick(d.rng, shapes.SHAPES), pick(d.rng, d.colours), pick(d.rng, shapes.SIZES),
                             pick(d.rng, shapes.TEXTURES), q)
    # Objects are listed in grid order, so a caption reads top to bottom whatever was added.
    objects = tuple(sorted(d.original.objects + (new,), key=lambda o: shapes.POSITIONS.index(o.position)))
    return shapes.Scene(objects, d.original.background), q, q, ["presence"]


def _add_instruction(original, target, p, q) -> str:
    new = next(o for o in target.objects if o.position == q)
    return f"add a {new.colour} {new.shape} at {q}"


def _delete_instruction(original, target, p, q) -> str:
    old = next(o for o in original.objects if o.position == p)
    return f"remove the {old.colour} {old.shape} at {p}"


def _move(d: Draw) -> Edit:
    q = pick(d.rng, d.free)
    moved = tuple(dataclasses.replace(o, position=q) if o is d.obj else o for o in d.original.objects)
    return shapes.Scene(moved, d.original.background), d.obj.position, q, ["position"]


def _background(d: Draw) -> Edit:
    used = {o.colour for o in d.original.objects}
    allowed = [b for b in shapes.BACKGROUNDS if b != d.original.background and b not in used]
    return shapes.Scene(d.original.objects, pick(d.rng, allowed)), None, None, ["background"]


def _two_attributes(d: Draw) -> Edit:
    a, b = d.rng.choice(list(ATTRIBUTES), size=2, replace=False)
    changes = {}
    for attribute in (str(a), str(b)):
        allowed = {"shape": shapes.SHAPES, "colour": d.colours, "size": shapes.SIZES,
                   "texture": shapes.TEXTURES}[attribute]
        changes[attribute] = pick(d.rng, set(allowed) - {getattr(d.obj, attribute)})
    p = d.obj.position
    return shapes.replace_object(d.original, p, **changes), p, p, sorted(changes)


for category in (
        ShapesCategory("change shape", "change object", _replace("shape", lambda d: shapes.SHAPES), _describe_change,
                       _attributes_read),
        ShapesCategory("add object", "add object", _add, _add_instruction,
                       lambda target, reading, p, q, attributes: _drawn_at_target(target, reading, q),
                       object_count=lambda rng, most: int(rng.integers(1, most)), keeps_object=False),
        ShapesCategory("delete object", "delete object",
                       lambda d: (shapes.Scene(d.others, d.original.background), d.obj.position, d.obj.position,
                                  ["presence"]),
                       _delete_instruction, lambda target, reading, p, q, attributes: reading.at(p) is None,
                       object_count=lambda rng, most: int(rng.integers(2, most + 1)), keeps_object=False),
        ShapesCategory("change colour", "change color", _replace("colour", lambda d: d.colours), _describe_change,
                       _attributes_read),
        ShapesCategory("change size", "change content", _replace("size", lambda d: shapes.SIZES), _describe_change,
                       _attributes_read),
        ShapesCategory("move object", "change pose", _move, lambda original, target, p, q: f"move the object at {p} to {q}",
                       lambda target, reading, p, q, attributes: _drawn_at_target(target, reading, q)
                       and reading.at(p) is None),
        ShapesCategory("change texture", "change material", _replace("texture", lambda d: shapes.TEXTURES),
                       _describe_change, _attributes_read),
        ShapesCategory("change background", "change background", _background,
                       lambda original, target, p, q: f"change the background from {original.background} to "
                                                      f"{target.background}",
                       lambda target, reading, p, q, attributes: reading.background == target.background,
                       region="background", keeps_background=False, keeps_object=False),
        # the broadest edit of the world: two attributes at once
        ShapesCategory("change two attributes", "change style", _two_attributes, _describe_change, _attributes_read)):
    register_category(category)


__all__ = ["ATTRIBUTES", "Draw", "SHAPES_CATEGORY_REGISTRY", "ShapesCategory", "pick", "register_category"]
