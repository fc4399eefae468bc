"""How well an edit worked.

Shapes world (scored against truth, `shapes_metrics`):
- success: the probe reads the target attribute(s) in the target region of the edited
  image (the new shape at the object's cell, the added object, an empty cell after a
  deletion, the moved object at its new cell and none at the old, the new background);
- preservation: every other attribute unchanged, as read by the probe, between the
  original generation and the edited one (other objects, the edited object's other
  attributes, the background, no object appearing elsewhere), as the share of those
  readings that agree; and the mean pixel distance outside the edit regions;
- target distance: mean pixel distance to the exact rendering of the target scene.

Real models (`RealImageMetrics`): LPIPS between original and edited images and CLIP
image-image and text-image similarity, when their weights are on this machine; otherwise
the result names each skipped metric and why (nothing is downloaded).
"""

from __future__ import annotations

import os

import numpy as np

from interp.ground_truth import world
from zoo import shapes

from .categories import ATTRIBUTES, SHAPES_CATEGORY_REGISTRY
from .tasks import Task


def default_probe() -> shapes.AttributeProbe:
    """The shapes world's probe (its ground truth, `interp.ground_truth`): a shapes suite's tasks are its scenes."""
    return world("shapes").probe()


def as_array(image) -> np.ndarray:
    """(height, width, 3) float32 in [0, 255] from a PIL image or a uint8/float array."""
    if hasattr(image, "convert"):
        array = np.asarray(image.convert("RGB"), np.float32)
    else:
        raw = np.asarray(image)
        array = raw.astype(np.float32)
        if raw.dtype != np.uint8 and array.max(initial=0.0) <= 1.0:  # a float image in [0, 1]
            array = array * 255.0
    if array.ndim != 3 or array.shape[-1] != 3:
        raise ValueError(f"an image is (height, width, 3), not shape {array.shape}")
    return array


def edit_success(task: Task, reading: shapes.ProbeReading) -> float:
    """1.0 when the probe reads the edit's target in the target region of the edited image (the category's
    own test, ``riebench.categories``)."""
    _, target = task.scenes()
    category = SHAPES_CATEGORY_REGISTRY[task.category]
    return float(category.success(target, reading, task.source_position, task.target_position,
                                  task.edited_attributes))


def attribute_preservation(task: Task, original_reading: shapes.ProbeReading,
                           edited_reading: shapes.ProbeReading) -> tuple[float, int]:
    """Share of the attributes the edit should not touch that read the same before and after.

    Returns (share, number of readings compared). The reference is what the probe read in
    the original generation (what the model drew), not the caption: preservation asks
    whether the edit changed anything else, not whether the model drew the caption.
    """
    category = SHAPES_CATEGORY_REGISTRY[task.category]
    edited_cells = {c for c in (task.source_position, task.target_position) if c is not None}
    checks: list[bool] = []
    if category.keeps_background:
        checks.append(edited_reading.background == original_reading.background)
    for obj in original_reading.objects:
        if obj.position in edited_cells:
            continue
        after = edited_reading.at(obj.position)
        checks += [after is not None and getattr(after, a) == getattr(obj, a)
                   for a in ("shape", "colour", "size", "texture")]
    if category.keeps_object:
        before = original_reading.at(task.source_position)
        # A move that failed leaves the object where it was: its attributes still count as kept.
        after = edited_reading.at(task.target_position) or edited_reading.at(task.source_position)
        kept = [a for a in ATTRIBUTES if a not in task.edited_attributes]
        if before is not None:
            checks += [after is not None and getattr(after, a) == getattr(before, a) for a in kept]
    appeared = {o.position for o in edited_reading.objects} - {o.position for o in original_reading.objects}
    checks.append(not (appeared - edited_cells))
    return float(np.mean(checks)), len(checks)


def shapes_metrics(task: Task, edited_image, original_image, probe: shapes.AttributeProbe | None = None) -> dict:
    """Every shapes-world metric of one edited image against its original generation and the truth."""
    probe = probe or default_probe()
    original_scene, target_scene = task.scenes()
    edited = as_array(edited_image)
    original = as_array(original_image)
    if edited.shape != original.shape:
        raise ValueError(f"task {task.id}: the edited image is {edited.shape} but the original is {original.shape}")
    size = edited.shape[:2]
    edited_reading, original_reading = probe.read(edited), probe.read(original)
    region = task.region("source", size) | task.region("target", size)
    outside = ~region
    diff = np.abs(edited - original).mean(axis=-1) / 255.0
    truth = shapes.render(target_scene, size[0]).astype(np.float32)
    preservation, n_checks = attribute_preservation(task, original_reading, edited_reading)
    return {
        "success": edit_success(task, edited_reading),
        "preservation": preservation,
        "preservation_checks": n_checks,
        "outside_pixel_distance": float(diff[outside].mean()) if outside.any() else 0.0,
        "inside_pixel_change": float(diff[region].mean()) if region.any() else 0.0,
        "target_distance": float(np.abs(edited - truth).mean() / 255.0),
        "target_all_correct": probe.score(edited, target_scene)["all"],
        "original_drawn_correctly": probe.score(original, original_scene)["all"],
    }


# ----------------------------------------------------------------------------- real models

CLIP_DEFAULT = "openai/clip-vit-large-patch14"


class RealImageMetrics:
    """LPIPS and CLIP similarities for real-model edits, from weights already on this machine.

    clip: a local directory or a hub id found in the local cache (never downloaded).
    `skipped` maps each unavailable metric to the reason.
    """

    def __init__(self, clip: str | None = None, device: str = "cpu"):
        self.device = device
        self.skipped: dict[str, str] = {}
        self._clip = self._lpips = None
        clip = clip or os.environ.get("RIEBENCH_CLIP", CLIP_DEFAULT)
        try:
            from transformers import CLIPModel, CLIPProcessor

            self._clip = CLIPModel.from_pretrained(clip, local_files_only=True).to(device).eval()
            self._processor = CLIPProcessor.from_pretrained(clip, local_files_only=True)
        except Exception as err:  # noqa: BLE001 - any failure means: not available here
            reason = f"CLIP weights {clip!r} are not on this machine ({str(err).splitlines()[0][:160]})"
            self.skipped["clip_image_image"] = self.skipped["clip_text_image"] = reason
        try:
            import lpips  # noqa: F401 - optional package

            self._lpips = lpips.LPIPS(net="alex", verbose=False).to(device).eval()
        except Exception as err:  # noqa: BLE001
            self.skipped["lpips"] = f"LPIPS is not available ({str(err).splitlines()[0][:160]}); " \
                                    "install the `lpips` package with its AlexNet weights cached"

    def __call__(self, edited_image, original_image, edited_prompt: str) -> dict:
        import torch

        result: dict = {}
        with torch.no_grad():
            if self._clip is not None:
                inputs = self._processor(text=[edited_prompt], images=[edited_image, original_image],
                                         return_tensors="pt", padding=True).to(self.device)
                out = self._clip(**inputs)
                img = torch.nn.functional.normalize(out.image_embeds, dim=-1)
                txt = torch.nn.functional.normalize(out.text_embeds, dim=-1)
                result["clip_image_image"] = float(img[0] @ img[1])
                result["clip_text_image"] = float(img[0] @ txt[0])
            if self._lpips is not None:
                def tensor(image):
                    return torch.from_numpy(as_array(image) / 127.5 - 1.0).permute(2, 0, 1)[None].to(self.device)
                result["lpips"] = float(self._lpips(tensor(edited_image), tensor(original_image)))
        return result
