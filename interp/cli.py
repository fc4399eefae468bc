"""How the four command lines (`python -m interp|saes|riebench|flowlens`) end a command that fails.

A failure the user can act on (a bad argument, a missing or unreadable file, a model that cannot serve
the request, a weights file that is truncated, corrupt or an unsafe pickle) is one line, `error: message`,
on stderr and exit status 2, as argparse's own refusals are; Ctrl-C is exit status 130. Anything else is
a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

# What a failure may raise for a user to act on, whichever front end started the work: the command lines here
# and the UI (ui.common.USER_ERRORS is this tuple plus two of the UI's own). Its message is shown, with no traceback.
USER_ERRORS = (ValueError, OSError, ImportError, FloatingPointError)
# Names of the files that weights and checkpoints are read from (safetensors, torch pickles).
WEIGHTS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".pkl")


def at_least(minimum: int, maximum: int | None = None):
    """An argparse type: an integer of at least `minimum` (and at most `maximum`)."""
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum or maximum is not None and value > maximum:
            bounds = f"at least {minimum}" if maximum is None else f"from {minimum} to {maximum}"
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {value}")
        return value

    parse.__name__ = "int"  # argparse's message for a non-integer: "invalid int value"
    return parse


def probability(text: str) -> float:
    """An argparse type: a number from 0 to 1 (a fraction, a rate, an AUROC)."""
    value = float(text)
    if not 0 <= value <= 1:  # NaN fails both comparisons
        raise argparse.ArgumentTypeError(f"must be from 0 to 1, got {text}")
    return value


probability.__name__ = "float"  # argparse's message for a non-number: "invalid float value"


def _frames(err: BaseException) -> list:
    """The frames the error passed through, outermost first."""
    frames, tb = [], err.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


def _file_being_read(frames: list) -> str | None:
    """The weights file a failed reader had open: the innermost frame's local variable naming an existing file
    with a weights suffix.

    The readers that fail here (transformers, diffusers, torch.load) hold the path in a local
    variable but do not put it into their messages."""
    for frame in reversed(frames):
        for value in frame.f_locals.values():
            if isinstance(value, (str, os.PathLike)) and os.fspath(value).endswith(WEIGHTS_SUFFIXES) \
                    and os.path.isfile(value):
                return os.fspath(value)
    return None


def _refusal_reason(message: str) -> str:
    """What torch.load(weights_only=True) refused, from its message, without its advice to load the file
    unsafely (which a file of unknown origin must not get) and its pointer to the docs."""
    marker = "WeightsUnpickler error:"
    if marker in message:
        return _first_sentence(message.split(marker, 1)[1])
    paragraphs = [p.strip() for p in message.split("\n\n") if p.strip()]
    reasons = [p for p in paragraphs[1:] if not p.startswith("Check the documentation")]
    if paragraphs and paragraphs[0].startswith("Weights only load failed") and reasons:
        return _first_sentence(reasons[0])
    return _first_sentence(message)


def _first_sentence(message: str) -> str:
    line = (message.strip().splitlines() or ["no reason given"])[0]
    return line.split(". ")[0].rstrip(".")


def unreadable_weights(err: BaseException) -> str | None:
    """The `error:` text for a weights or checkpoint file that could not be read, naming the file; None
    for any other error.

    What the readers raise (each tried on a damaged file): safetensors' SafetensorError for a
    truncated or corrupt .safetensors file, pickle.UnpicklingError when torch.load(weights_only=True)
    refuses a pickle (damaged, or one that would run code when loaded), and RuntimeError from
    torch.serialization for a damaged zip checkpoint.
    """
    import pickle

    from safetensors import SafetensorError

    frames = _frames(err)
    if isinstance(err, SafetensorError):
        problem = f"it is not a readable safetensors file ({_first_sentence(str(err))}): it is truncated or corrupt"
    elif isinstance(err, pickle.UnpicklingError):
        problem = (f"torch.load refused it ({_refusal_reason(str(err))}): it is damaged, or it is a pickle that "
                   f"would run code; do not load it unsafely")
    elif isinstance(err, RuntimeError) and frames and \
            frames[-1].f_code.co_filename.endswith(os.path.join("torch", "serialization.py")):
        problem = f"it is not a readable torch checkpoint ({_first_sentence(str(err))}): it is truncated or corrupt"
    else:
        return None
    path = _file_being_read(frames)
    return (f"cannot read {path or 'a weights file'}: {problem}; replace it with a good copy (a run's checkpoint: "
            f"delete it, and the run starts over)")


def user_error_message(err: BaseException) -> str | None:
    """What to tell the user about a failure they can act on: one of USER_ERRORS, or a weights file that cannot
    be read (`unreadable_weights`). None for anything else, which is a bug and keeps its traceback. The one error
    map: `run_command` prints it, `ui.common.user_errors` shows it in the browser."""
    if isinstance(err, USER_ERRORS):
        return str(err)
    from .distributed import lost_peer

    return unreadable_weights(err) or lost_peer(err)


def run_command(args, interrupted: str = "interrupted") -> int:
    """`args.run(args)` with the failures a user can act on as `error: message` (exit 2) and Ctrl-C as exit 130.
    Before the command runs, its output options must not point into files shipped with the repository
    (`interp.shipped`: refused unless --overwrite)."""
    from .shipped import refuse_shipped_outputs

    try:
        refuse_shipped_outputs(args)
        return args.run(args)
    except KeyboardInterrupt:
        print(interrupted, file=sys.stderr)
        return 130
    except Exception as err:
        message = user_error_message(err)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 2


# The dtypes a model may be loaded in, by the name users type (`--dtype`, the UI's choice, results files).
DTYPES = ("float32", "bfloat16", "float16")


# The dtype a language model loads in when --dtype is not given: what its results were made in.
LM_DTYPE = "float32"


def parse_dtype(name, default: str | None = None):
    """The one conversion of a ``--dtype`` value (or the UI's choice, or a results file's name) to a torch dtype:
    ``"bfloat16"`` -> ``torch.bfloat16`` (a torch.dtype passes through); None -> `default` converted (None: None,
    the loader's own default: a text-to-image pipeline's float16 on CUDA, float32 on a CPU; a language model passes
    ``default=LM_DTYPE``); a ValueError naming the choices for anything else. float16 is allowed on a CPU: torch
    runs it there (measured: slower than float32 on this machine's CPU; bfloat16 is the fast one, docs/dtype.md)."""
    import torch

    if name is None:
        if default is None:
            return None
        name = default
    if isinstance(name, torch.dtype):
        name = dtype_name(name)
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return getattr(torch, name)


def dtype_name(dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``, the name `parse_dtype` reads and results files record."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype}; choose one of {', '.join(DTYPES)}")
    return name


MIXED_DEFAULT = "language models float32; text-to-image models float16 on CUDA, float32 on a CPU"


def add_dtype_argument(parser, default: str | None = "float32", what: str = "the model",
                       said: str | None = None) -> None:
    """``--dtype float32|bfloat16|float16``, the same option on every command that loads a model: the dtype
    `what` runs in. ``default=None``: the loader's own (text-to-image: float16 on CUDA, float32 on a CPU;
    `parse_dtype(None, default=LM_DTYPE)` reads None as float32 for a language model)."""
    said = said or default or "float16 on CUDA, float32 on a CPU"
    parser.add_argument("--dtype", choices=DTYPES, default=default,
                        help=f"dtype {what} runs in (default {said}); bfloat16 is faster on CPUs with AMX/AVX512-BF16 "
                             f"and on GPUs, with the numeric change docs/dtype.md measures")


BACKENDS = ("hf", "transformer_lens", "nnsight")


def add_backend_argument(parser, what: str = "") -> None:
    """``--backend hf|transformer_lens|nnsight``, the same option on every command that loads a language model: the
    Hugging Face model as it is, TransformerLens' (a HookedTransformer where it converts one locally, a
    TransformerBridge otherwise), or the Hugging Face model wrapped in nnsight's LanguageModel (its sites read and
    written inside nnsight's trace); all read and write the same residual stream (tests/test_lm_families.py,
    tests/test_lm_nnsight.py)."""
    parser.add_argument("--backend", choices=BACKENDS, default="hf",
                        help=f"{what}the language model's backend: hf (default), transformer_lens or nnsight; all "
                             f"read the same residual stream (docs/lm-architectures.md)")


def add_device_argument(parser, default: str | None = "cpu", help: str | None = None) -> None:
    """``--device cpu|cuda|cuda:N``, the same option on every command that places a model: where it runs."""
    parser.add_argument("--device", default=default, help=help)


def add_out_argument(parser, required: bool = False, default=None, help: str | None = None) -> None:
    """``--out PATH``, the same option on every command that writes: the shipped-files guard reads it
    (`interp.shipped.OUTPUT_OPTIONS`, checked by `run_command`) and `add_overwrite_options` gives the command
    ``--overwrite``."""
    parser.add_argument("--out", required=required, default=default, help=help)


def parse_options(pairs: list[str]) -> dict:
    """``--option key=value`` pairs as a dict, each value read as JSON where it is JSON (a number, a list), else kept as
    a string."""
    options = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"--option expects key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options
