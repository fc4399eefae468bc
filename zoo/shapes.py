"""The shapes world: scenes whose every attribute is known, their captions, an exact
renderer and a probe that reads the attributes back from an image.

A scene is 1 to 3 objects on a plain background. Each object has a shape, a colour, a
size, a texture and one of nine grid positions (a 3 x 3 grid, one object per cell).
Captions are plain English with varied wording; `parse_caption` turns any caption of the
world back into its scene, so `render(parse_caption(text))` is the exact image of a
caption (used to score edits against truth).
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import asdict, dataclass, field, replace

import numpy as np
from PIL import Image, ImageDraw

IMAGE_SIZE = 64
SUPERSAMPLE = 4  # shapes are drawn at 4x and box-filtered: smooth, deterministic edges

SHAPES = ("circle", "square", "triangle", "star", "diamond", "cross")
COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (240, 210, 40),
    "purple": (140, 60, 180),
    "orange": (245, 140, 30),
    "pink": (245, 130, 190),
    "brown": (130, 80, 40),
}
BACKGROUNDS = {
    "white": (240, 240, 240),
    "black": (25, 25, 25),
    "gray": (128, 128, 128),
    "blue": COLOURS["blue"],
    "green": COLOURS["green"],
    "yellow": COLOURS["yellow"],
}
SIZES = ("small", "large")
TEXTURES = ("solid", "striped", "dotted")
POSITIONS = (
    "top left", "top", "top right",
    "left", "center", "right",
    "bottom left", "bottom", "bottom right",
)  # row-major over the 3 x 3 grid
ATTRIBUTES = ("shape", "colour", "size", "texture", "position")

RADIUS = {"small": 5.5, "large": 9.0}  # pixels at IMAGE_SIZE
TEXTURE_SHADE = 0.45  # stripes and dots are the object's colour darkened to this factor

# Where objects go when a caption gives no position.
DEFAULT_LAYOUT = {1: ("center",), 2: ("left", "right"), 3: ("left", "center", "right")}
DEFAULT_SIZE = "large"
DEFAULT_TEXTURE = "solid"


def world_fingerprint() -> str:
    """A digest of everything that decides how a scene is drawn (palette, shapes, sizes, textures, layout):
    a model trained on one world is not resumed, nor its latents reused, on another."""
    drawn = (COLOURS, BACKGROUNDS, SHAPES, SIZES, TEXTURES, POSITIONS, RADIUS, TEXTURE_SHADE, IMAGE_SIZE,
             SUPERSAMPLE)
    return hashlib.sha256(repr(drawn).encode()).hexdigest()[:16]


_SIZE_WORDS = {"small": "small", "little": "small", "tiny": "small",
               "large": "large", "big": "large"}
_TEXTURE_WORDS = {"solid": "solid", "plain": "solid", "striped": "striped", "dotted": "dotted",
                  "spotted": "dotted"}
_TEXTURE_SUFFIX = {"with stripes": "striped", "with dots": "dotted", "with spots": "dotted"}
_POSITION_PHRASES = {
    "top left": ["at the top left", "in the top left corner", "in the upper left"],
    "top": ["at the top", "at the top center", "in the upper middle"],
    "top right": ["at the top right", "in the top right corner", "in the upper right"],
    "left": ["on the left", "at the left", "in the middle left"],
    "center": ["in the center", "in the middle", "at the center"],
    "right": ["on the right", "at the right", "in the middle right"],
    "bottom left": ["at the bottom left", "in the bottom left corner", "in the lower left"],
    "bottom": ["at the bottom", "at the bottom center", "in the lower middle"],
    "bottom right": ["at the bottom right", "in the bottom right corner", "in the lower right"],
}
_PHRASE_TO_POSITION = sorted(
    ((p, pos) for pos, ps in _POSITION_PHRASES.items() for p in ps), key=lambda t: -len(t[0])
)
_BACKGROUND_FORMS = ("on a {} background", "against a {} background", "with a {} background")
_ARTICLES = ("a", "an", "one")


class WorldError(ValueError):
    """A caption or scene that the shapes world cannot express."""


@dataclass(frozen=True)
class ShapeObject:
    shape: str
    colour: str
    size: str = DEFAULT_SIZE
    texture: str = DEFAULT_TEXTURE
    position: str = "center"

    def __post_init__(self):
        for name, allowed in (("shape", SHAPES), ("colour", tuple(COLOURS)), ("size", SIZES),
                              ("texture", TEXTURES), ("position", POSITIONS)):
            if getattr(self, name) not in allowed:
                raise WorldError(f"unknown {name} {getattr(self, name)!r}; choose from {', '.join(allowed)}")


@dataclass(frozen=True)
class Scene:
    objects: tuple[ShapeObject, ...]
    background: str = "white"

    def __post_init__(self):
        if not 1 <= len(self.objects) <= 3:
            raise WorldError(f"a scene has 1 to 3 objects, not {len(self.objects)}")
        if self.background not in BACKGROUNDS:
            raise WorldError(f"unknown background {self.background!r}; choose from {', '.join(BACKGROUNDS)}")
        positions = [o.position for o in self.objects]
        if len(set(positions)) != len(positions):
            raise WorldError(f"two objects share a position: {positions}")
        for o in self.objects:
            if o.colour == self.background:
                raise WorldError(f"a {o.colour} object on a {o.colour} background would be invisible")

    def to_dict(self) -> dict:
        return {"objects": [asdict(o) for o in self.objects], "background": self.background}

    @classmethod
    def from_dict(cls, d: dict) -> "Scene":
        return cls(tuple(ShapeObject(**o) for o in d["objects"]), d["background"])

    def combination_key(self) -> str:
        """Canonical text of the attribute combination (order of objects does not matter)."""
        objs = sorted(f"{o.size} {o.colour} {o.texture} {o.shape} @ {o.position}" for o in self.objects)
        return " + ".join(objs) + f" / {self.background}"


def is_held_out(scene: Scene, fraction: float = 0.1) -> bool:
    """Whether the scene's attribute combination belongs to the held-out split.

    Decided by a hash of the combination, so the split is the same on every machine
    and the training recipe never sees a held-out combination.
    """
    digest = hashlib.sha256(scene.combination_key().encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


# ----------------------------------------------------------------------------- sampling

def sample_scene(rng: np.random.Generator, n_objects: int | None = None) -> Scene:
    """A uniformly random scene (1 to 3 objects unless `n_objects` is given)."""
    n = int(rng.integers(1, 4)) if n_objects is None else n_objects
    background = str(rng.choice(list(BACKGROUNDS)))
    colours = [c for c in COLOURS if c != background]
    cells = rng.choice(len(POSITIONS), size=n, replace=False)
    objects = tuple(
        ShapeObject(
            shape=str(rng.choice(SHAPES)),
            colour=str(rng.choice(colours)),
            size=str(rng.choice(SIZES)),
            texture=str(rng.choice(TEXTURES)),
            position=POSITIONS[int(c)],
        )
        for c in cells
    )
    return Scene(objects, background)


def sample_split(rng: np.random.Generator, split: str, n_objects: int | None = None,
                 held_out_fraction: float = 0.1) -> Scene:
    """A random scene from the `train` or `held_out` split."""
    if split not in ("train", "held_out"):
        raise ValueError(f"split must be 'train' or 'held_out', not {split!r}")
    while True:
        scene = sample_scene(rng, n_objects)
        if is_held_out(scene, held_out_fraction) == (split == "held_out"):
            return scene


# ----------------------------------------------------------------------------- captions

def caption(scene: Scene, rng: np.random.Generator | None = None) -> str:
    """An English caption of the scene; with `rng`, wording varies (synonyms, word order,
    implicit defaults), without it the canonical wording is used."""
    pick = (lambda options: options[int(rng.integers(len(options)))]) if rng is not None else (lambda o: o[0])
    n = len(scene.objects)
    default_layout = DEFAULT_LAYOUT[n]
    omit_positions = (rng is not None and tuple(o.position for o in scene.objects) == default_layout
                      and rng.random() < 0.5)
    phrases = []
    for obj in scene.objects:
        size = "" if (rng is not None and obj.size == DEFAULT_SIZE and rng.random() < 0.2) else \
            pick(["small", "little"] if obj.size == "small" else ["large", "big"])
        texture_prefix, texture_suffix = "", ""
        if obj.texture == "solid":
            texture_prefix = pick(["", "solid"]) if rng is not None else ""
        elif rng is not None and rng.random() < 0.3:
            texture_suffix = " with stripes" if obj.texture == "striped" else " with dots"
        else:
            texture_prefix = obj.texture
        words = [pick(["a", "one"]) if rng is not None and rng.random() < 0.2 else "a",
                 size, obj.colour, texture_prefix, obj.shape]
        text = " ".join(w for w in words if w) + texture_suffix
        if not omit_positions:
            text += " " + pick(_POSITION_PHRASES[obj.position])
        phrases.append(text)
    if n == 1:
        body = phrases[0]
    elif n == 2:
        body = f"{phrases[0]} and {phrases[1]}"
    else:
        body = f"{phrases[0]}, {phrases[1]} and {phrases[2]}"
    return f"{body} {pick(_BACKGROUND_FORMS).format(scene.background)}"


def vocabulary() -> list[str]:
    """Every word a caption of the world can use."""
    words = set(SHAPES) | set(COLOURS) | set(BACKGROUNDS) | set(_SIZE_WORDS) | set(_TEXTURE_WORDS)
    words |= set(_ARTICLES) | {"and", "background"}
    for phrase in list(_TEXTURE_SUFFIX) + [p for ps in _POSITION_PHRASES.values() for p in ps]:
        words |= set(phrase.split())
    for form in _BACKGROUND_FORMS:
        words |= set(form.format("").split())
    return sorted(words)


def _normalise(text: str) -> str:
    text = text.lower().replace("centre", "center").replace("grey", "gray").replace("colour", "color")
    text = re.sub(r"[^a-z,\s]", " ", text)
    return re.sub(r"\s+", " ", text).strip()


def parse_caption(text: str) -> Scene:
    """The scene a caption describes; raises WorldError naming what it cannot read."""
    norm = _normalise(text)
    if not norm:
        raise WorldError("empty caption")
    m = re.search(r"\b(?:on|against|with) (?:a|an) (\w+) background$", norm)
    if m:
        background, norm = m.group(1), norm[: m.start()].strip(" ,")
    else:
        background = "white"
    if background not in BACKGROUNDS:
        raise WorldError(f"unknown background {background!r}; choose from {', '.join(BACKGROUNDS)}")
    parts = [p.strip() for p in re.split(r",\s*(?:and\s+)?|\s+and\s+", norm) if p.strip()]
    if not 1 <= len(parts) <= 3:
        raise WorldError(f"a caption describes 1 to 3 objects, found {len(parts)}")
    specs = [_parse_object(p) for p in parts]
    taken = {s["position"] for s in specs if s.get("position")}
    free = [p for p in DEFAULT_LAYOUT[len(specs)] if p not in taken]
    free += [p for p in POSITIONS if p not in taken and p not in free]
    objects = []
    for spec in specs:
        if "position" not in spec:
            spec["position"] = free.pop(0)
        objects.append(ShapeObject(**spec))
    return Scene(tuple(objects), background)


def _parse_object(phrase: str) -> dict:
    spec: dict = {}
    for suffix, texture in _TEXTURE_SUFFIX.items():
        if phrase.endswith(suffix) or f" {suffix} " in f" {phrase} ":
            spec["texture"] = texture
            phrase = phrase.replace(suffix, " ")
    for text, position in _PHRASE_TO_POSITION:
        if re.search(rf"\b{text}\b", phrase):
            spec["position"] = position
            phrase = re.sub(rf"\b{text}\b", " ", phrase)
            break
    for word in phrase.split():
        if word in _ARTICLES:
            continue
        if word in SHAPES:
            key, value = "shape", word
        elif word in COLOURS:
            key, value = "colour", word
        elif word in _SIZE_WORDS:
            key, value = "size", _SIZE_WORDS[word]
        elif word in _TEXTURE_WORDS:
            key, value = "texture", _TEXTURE_WORDS[word]
        else:
            raise WorldError(f"cannot read {word!r} in {phrase.strip()!r}")
        if key in spec and spec[key] != value:
            raise WorldError(f"two {key}s given in {phrase.strip()!r}")
        spec[key] = value
    for required in ("shape", "colour"):
        if required not in spec:
            raise WorldError(f"no {required} given in {phrase.strip()!r}")
    return spec


# ----------------------------------------------------------------------------- rendering

def cell_box(position: str, size: int = IMAGE_SIZE) -> tuple[int, int, int, int]:
    """Pixel box (x0, y0, x1, y1) of a grid cell, end-exclusive."""
    row, col = divmod(POSITIONS.index(position), 3)
    edges = [round(i * size / 3) for i in range(4)]
    return edges[col], edges[row], edges[col + 1], edges[row + 1]


def cell_center(position: str, size: int = IMAGE_SIZE) -> tuple[float, float]:
    row, col = divmod(POSITIONS.index(position), 3)
    return (col + 0.5) * size / 3, (row + 0.5) * size / 3


def _shape_polygon(shape: str, cx: float, cy: float, r: float) -> list[tuple[float, float]] | None:
    if shape == "square":
        s = r * 0.82
        return [(cx - s, cy - s), (cx + s, cy - s), (cx + s, cy + s), (cx - s, cy + s)]
    if shape == "diamond":
        return [(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)]
    if shape == "triangle":
        return [(cx, cy - r), (cx + r * 0.95, cy + r * 0.8), (cx - r * 0.95, cy + r * 0.8)]
    if shape == "star":
        pts = []
        for i in range(10):
            rad = r if i % 2 == 0 else r * 0.45
            a = -np.pi / 2 + i * np.pi / 5
            pts.append((cx + rad * np.cos(a), cy + rad * np.sin(a)))
        return pts
    if shape == "cross":
        w = r * 0.36
        return [(cx - w, cy - r), (cx + w, cy - r), (cx + w, cy - w), (cx + r, cy - w), (cx + r, cy + w),
                (cx + w, cy + w), (cx + w, cy + r), (cx - w, cy + r), (cx - w, cy + w), (cx - r, cy + w),
                (cx - r, cy - w), (cx - w, cy - w)]
    return None  # circle


def object_mask(obj: ShapeObject, size: int = IMAGE_SIZE) -> np.ndarray:
    """Coverage of the object, (size, size) float in [0, 1] (anti-aliased)."""
    return _object_mask(obj.shape, obj.size, obj.position, size)


@functools.lru_cache(maxsize=512)
def _object_mask(shape: str, size_name: str, position: str, size: int) -> np.ndarray:
    s = SUPERSAMPLE
    hi = Image.new("L", (size * s, size * s), 0)
    draw = ImageDraw.Draw(hi)
    cx, cy = cell_center(position, size)
    r = RADIUS[size_name] * size / IMAGE_SIZE
    poly = _shape_polygon(shape, cx * s, cy * s, r * s)
    if poly is None:
        draw.ellipse([cx * s - r * s, cy * s - r * s, cx * s + r * s, cy * s + r * s], fill=255)
    else:
        draw.polygon(poly, fill=255)
    mask = np.asarray(hi, dtype=np.float32).reshape(size, s, size, s).mean(axis=(1, 3)) / 255.0
    mask.setflags(write=False)
    return mask


@functools.lru_cache(maxsize=8)
def _texture_pattern(texture: str, size: int) -> np.ndarray:
    """Where the darker shade shows, (size, size) float in [0, 1]."""
    period = max(2, round(4 * size / IMAGE_SIZE))
    y, x = np.mgrid[0:size, 0:size]
    if texture == "striped":
        pattern = ((y // (period // 2)) % 2 == 1).astype(np.float32)
    elif texture == "dotted":
        pattern = (((y % period) < period // 2) & ((x % period) < period // 2)).astype(np.float32)
    else:
        pattern = np.zeros((size, size), np.float32)
    pattern.setflags(write=False)
    return pattern


def object_colour_map(obj: ShapeObject, size: int = IMAGE_SIZE) -> np.ndarray:
    """The object's paint, (size, size, 3) float RGB in [0, 255], texture included."""
    base = np.asarray(COLOURS[obj.colour], np.float32)
    pattern = _texture_pattern(obj.texture, size)[..., None]
    return base * (1 - pattern) + base * TEXTURE_SHADE * pattern


def render(scene: Scene, size: int = IMAGE_SIZE) -> np.ndarray:
    """The exact image of a scene, (size, size, 3) uint8 RGB."""
    canvas = np.empty((size, size, 3), np.float32)
    canvas[:] = BACKGROUNDS[scene.background]
    for obj in scene.objects:
        m = object_mask(obj, size)[..., None]
        canvas = canvas * (1 - m) + object_colour_map(obj, size) * m
    return np.clip(np.rint(canvas), 0, 255).astype(np.uint8)


def render_caption(text: str, size: int = IMAGE_SIZE) -> np.ndarray:
    return render(parse_caption(text), size)


def foreground_mask(scene: Scene, size: int = IMAGE_SIZE, positions: list[str] | None = None) -> np.ndarray:
    """Boolean (size, size): pixels covered by the scene's objects (optionally only some)."""
    mask = np.zeros((size, size), bool)
    for obj in scene.objects:
        if positions is None or obj.position in positions:
            mask |= object_mask(obj, size) > 0.0
    return mask


# ----------------------------------------------------------------------------- probe

@dataclass
class ProbeReading:
    background: str
    objects: list[ShapeObject] = field(default_factory=list)
    coverage: dict[str, float] = field(default_factory=dict)  # position -> foreground pixel share

    def at(self, position: str) -> ShapeObject | None:
        return next((o for o in self.objects if o.position == position), None)


class AttributeProbe:
    """Reads a scene back from an image of the world (rendered or generated).

    Background: nearest background colour to the image's per-channel median. Objects:
    a grid cell is occupied when enough of its pixels differ from the background; its
    object is the nearest template (every shape, colour, size and texture rendered into
    that cell on that background), which tolerates blur and noise.
    """

    def __init__(self, size: int = IMAGE_SIZE, occupancy_threshold: float = 0.05,
                 distance_threshold: float = 60.0):
        self.size = size
        self.occupancy_threshold = occupancy_threshold
        self.distance_threshold = distance_threshold

    def read(self, image: np.ndarray | Image.Image) -> ProbeReading:
        img = np.asarray(image.convert("RGB") if isinstance(image, Image.Image) else image, np.float32)
        if img.shape != (self.size, self.size, 3):
            img = np.asarray(Image.fromarray(img.clip(0, 255).astype(np.uint8)).resize(
                (self.size, self.size), Image.BILINEAR), np.float32)
        median = np.median(img.reshape(-1, 3), axis=0)
        background = min(BACKGROUNDS, key=lambda b: np.sum((median - BACKGROUNDS[b]) ** 2))
        far = np.linalg.norm(img - np.asarray(BACKGROUNDS[background], np.float32), axis=-1) > self.distance_threshold
        reading = ProbeReading(background)
        for position in POSITIONS:
            x0, y0, x1, y1 = cell_box(position, self.size)
            share = float(far[y0:y1, x0:x1].mean())
            reading.coverage[position] = share
            if share < self.occupancy_threshold:
                continue
            names, templates = _templates(background, position, self.size)
            crop = img[y0:y1, x0:x1].reshape(1, -1)
            best = int(np.argmin(((templates - crop) ** 2).sum(axis=1)))
            reading.objects.append(names[best])
        return reading

    def score(self, image: np.ndarray | Image.Image, scene: Scene) -> dict[str, float]:
        """Per-attribute correctness (0/1 averaged over the scene's objects) of the reading
        against the true scene: background, position (an object found in the right cell),
        and shape, colour, size, texture of the object found there."""
        reading = self.read(image)
        result = {"background": float(reading.background == scene.background)}
        per_attr = {a: [] for a in ATTRIBUTES}
        for obj in scene.objects:
            if len(scene.objects) == 1:
                # One object asked for: judge the most visible object drawn, wherever it is.
                found = max(reading.objects, key=lambda o: reading.coverage[o.position], default=None)
                per_attr["position"].append(float(found is not None and found.position == obj.position))
            else:
                found = reading.at(obj.position)
                per_attr["position"].append(float(found is not None))
            for a in ("shape", "colour", "size", "texture"):
                per_attr[a].append(float(found is not None and getattr(found, a) == getattr(obj, a)))
        result.update({a: float(np.mean(v)) for a, v in per_attr.items()})
        extra = {o.position for o in reading.objects} - {o.position for o in scene.objects}
        result["no_extra_objects"] = float(not extra)
        result["all"] = float(all(result[a] == 1.0 for a in ("background",) + ATTRIBUTES) and not extra)
        return result


@functools.lru_cache(maxsize=64)
def _templates(background: str, position: str, size: int) -> tuple[list[ShapeObject], np.ndarray]:
    """Every object that can stand in a cell, rendered there: names and (n, cell pixels * 3)."""
    x0, y0, x1, y1 = cell_box(position, size)
    names, rows = [], []
    for shape in SHAPES:
        for colour in COLOURS:
            if colour == background:
                continue
            for size_name in SIZES:
                for texture in TEXTURES:
                    obj = ShapeObject(shape, colour, size_name, texture, position)
                    img = render(Scene((obj,), background), size)
                    names.append(obj)
                    rows.append(img[y0:y1, x0:x1].reshape(-1).astype(np.float32))
    return names, np.stack(rows)


def replace_object(scene: Scene, position: str, **changes) -> Scene:
    """The scene with the object at `position` changed (shape=..., colour=..., position=...)."""
    objects = tuple(replace(o, **changes) if o.position == position else o for o in scene.objects)
    return Scene(objects, scene.background)


# ----------------------------------------------------------------------------- the world's ground truth

def world_prompts(n: int, seed: int = 0, progress: bool = False) -> list[str]:
    """n captions of random scenes of the world (varied wording), reproducible by seed; with `progress`, a
    progress bar (about 14,000 captions a second)."""
    from tqdm import tqdm

    rng = np.random.default_rng(seed)
    return [caption(sample_scene(rng), rng)
            for _ in tqdm(range(n), desc="captions", unit="caption", disable=not progress, mininterval=1.0)]


class ShapesWorld:
    """The shapes world as an `interp.ground_truth.GroundTruth`: its captions, the scene each one describes,
    its attribute values, its probe and its layout (the 3 x 3 grid of `POSITIONS`)."""

    name = "shapes"
    image_size = IMAGE_SIZE
    cells = POSITIONS
    object_attributes = ATTRIBUTES
    key_attributes = ("colour", "shape")
    hides_on_background = "colour"  # an object of the background's colour cannot be seen

    def prompts(self, n: int, seed: int = 0, progress: bool = False) -> list[str]:
        return world_prompts(n, seed, progress)

    def scene(self, prompt: str) -> Scene | None:
        try:
            return parse_caption(prompt)
        except WorldError:
            return None

    def scenes(self, prompts) -> list[Scene | None] | None:
        scenes = [self.scene(p) for p in prompts]
        return scenes if any(s is not None for s in scenes) else None

    def attribute_values(self) -> list[tuple[str, str]]:
        values = {"shape": SHAPES, "colour": tuple(COLOURS), "size": SIZES, "texture": TEXTURES,
                  "position": POSITIONS, "background": tuple(BACKGROUNDS)}
        return [(attribute, value) for attribute, options in values.items() for value in options]

    @functools.cached_property
    def _probe(self) -> AttributeProbe:
        return AttributeProbe()

    def probe(self) -> AttributeProbe:
        return self._probe

    def cell_box(self, cell: str, size: int) -> tuple[int, int, int, int]:
        return cell_box(cell, size)

    def object_mask(self, obj: ShapeObject, size: int) -> np.ndarray:
        return object_mask(obj, size)

    def foreground_mask(self, scene: Scene, size: int) -> np.ndarray:
        return foreground_mask(scene, size)

    def held_out_scene(self, rng: np.random.Generator) -> Scene:
        return sample_split(rng, "held_out")

    def caption(self, scene: Scene) -> str:
        return caption(scene)


WORLD = ShapesWorld()
