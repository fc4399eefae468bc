"""The registry of bench eval types: name -> how to run it on one SAE and its model.

An eval type is a module under `saes.bench.evals` that calls `register_eval(EvalType(...))` at import; `eval_types()`
imports every module there, so a new eval type is one new file (nothing else to edit). Its `run` takes

    run(sae, model, options: BenchOptions) -> EvalResult

`sae` is the inference SAE (saes.sae.SAE), `model` the loaded model of the kind the eval type reads (a
LanguageModel for "lm", a T2IModel for "t2i"), `options` the bounded sizes of the request and the eval's own
`--option key=value` pairs. It returns SAEBench's `eval_config`, `eval_result_metrics` (categories -> flat
numbers), `eval_result_details` and `eval_result_unstructured`; `saes.bench.schema` wraps them in the envelope.
`check` (optional) refuses bad input before any model work, so that a bad request writes nothing.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable

LIMITS = {  # every size a request carries, bounded before any work
    "n_tokens": (16, 5_000_000),
    "context_size": (4, 4096),
    "batch_size": (1, 1024),
    "seed": (0, 2**31 - 1),
    "max_examples": (2, 100_000),
}


@dataclass
class BenchOptions:
    """What a bench request carries: where the SAE sits in the model, bounded sizes, held-out text (`text`, for
    evals that score the model's loss) and labelled data (`dataset`, for the probing evals), and the eval types' own
    options (`extra`: --option key=value; each eval type reads its own through `get_int` / `get_float` / `get`)."""

    hook: str
    model_name: str
    n_tokens: int = 20_000
    context_size: int = 128
    batch_size: int = 8
    seed: int = 42
    dataset: str | None = None
    text: str | None = None
    max_examples: int = 2000
    dtype: str = "float32"
    device: str = "cpu"
    extra: dict[str, Any] = field(default_factory=dict)
    progress: bool = False

    def __post_init__(self):
        for name, (low, high) in LIMITS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name} must be a whole number from {low} to {high}, got {value!r}")

    def get(self, key: str, default=None):
        return self.extra.get(key, default)

    def get_int(self, key: str, default: int, low: int, high: int) -> int:
        value = self.extra.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"option {key} must be a whole number from {low} to {high}, got {value!r}")
        return value

    def get_float(self, key: str, default: float, low: float, high: float) -> float:
        value = self.extra.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= float(value) <= high:
            raise ValueError(f"option {key} must be a number from {low} to {high}, got {value!r}")
        return float(value)

    def get_ints(self, key: str, default: tuple[int, ...], low: int, high: int) -> tuple[int, ...]:
        """A list option given as JSON (`--option ks=[1,2,5]`) or one number."""
        value = self.extra.get(key, list(default))
        values = value if isinstance(value, list) else [value]
        if not values or any(isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high for v in values):
            raise ValueError(f"option {key} must be whole numbers from {low} to {high}, got {value!r}")
        return tuple(sorted(set(values)))


@dataclass
class EvalResult:
    """What an eval type returns: SAEBench's eval_config, eval_result_metrics, details and unstructured."""

    config: dict
    metrics: dict[str, dict]
    details: list = field(default_factory=list)
    unstructured: Any = None


@dataclass(frozen=True)
class EvalType:
    """One eval type. `name` is what --evals takes; `eval_type_id` is SAEBench's (it picks the schema); `kinds`
    the model kinds it reads ("lm", "t2i"); `options` the --option keys it reads (others are refused)."""

    name: str
    eval_type_id: str
    run: Callable[[Any, Any, BenchOptions], EvalResult]
    kinds: tuple[str, ...] = ("lm",)
    check: Callable[[Any, Any, BenchOptions], None] | None = None
    options: tuple[str, ...] = ()
    description: str = ""


EVAL_REGISTRY: dict[str, EvalType] = {}


def register_eval(eval_type: EvalType) -> EvalType:
    if eval_type.name in EVAL_REGISTRY and EVAL_REGISTRY[eval_type.name] is not eval_type:
        existing = EVAL_REGISTRY[eval_type.name]
        if existing.run is not eval_type.run:
            raise ValueError(f"eval type {eval_type.name!r} is registered twice")
    EVAL_REGISTRY[eval_type.name] = eval_type
    return eval_type


_loaded = False


def eval_types() -> dict[str, EvalType]:
    """Every registered eval type, after importing each module of saes.bench.evals (once)."""
    global _loaded
    if not _loaded:
        from . import evals

        for module in pkgutil.iter_modules(evals.__path__):
            importlib.import_module(f"{evals.__name__}.{module.name}")
        _loaded = True
    return EVAL_REGISTRY


def parse_evals(text: str) -> list[EvalType]:
    """`core,sparse_probing` -> their EvalTypes, in order; an unknown name lists the known ones."""
    known = eval_types()
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError(f"--evals names no eval type; choose from {', '.join(sorted(known))}")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown eval type(s) {', '.join(unknown)}; choose from {', '.join(sorted(known))}")
    return [known[n] for n in dict.fromkeys(names)]


def made_in_the_chat_world(model_name: str) -> bool:
    """Whether the model was trained in the chat world, as its spec says (`interp.models.spec.ModelSpec.world`: the
    embedded chat models): its held-out conversations and labelled texts are then the offline stand-in datasets."""
    from interp.embedded import EMBEDDED_LM_WORLD
    from interp.models.spec import model_spec

    return model_spec(model_name).world == EMBEDDED_LM_WORLD


def check_kinds(eval_type: EvalType, sae_kind_: str, model_kind: str, sae_label: str, model_name: str) -> None:
    """One clear line when an eval type cannot read this SAE or model."""
    what = {"lm": "a language-model SAE", "t2i": "an image-model SAE"}
    plural = {"lm": "language-model SAEs", "t2i": "image-model SAEs"}
    if sae_kind_ not in eval_type.kinds:
        raise ValueError(f"{sae_label} is {what.get(sae_kind_, sae_kind_)}, and eval {eval_type.name!r} is only for "
                         f"{' or '.join(plural.get(k, k) for k in eval_type.kinds)}")
    if model_kind not in eval_type.kinds:
        raise ValueError(f"eval {eval_type.name!r} needs a {' or '.join(eval_type.kinds)} model; {model_name} is a "
                         f"{model_kind} model")


__all__ = ["BenchOptions", "EVAL_REGISTRY", "EvalResult", "EvalType", "LIMITS", "check_kinds", "eval_types",
           "parse_evals", "register_eval"]
