"""The step-transfer study's identity: whose shipped 1-step SAEs are tested and where its runs live (`Study`, passed
to every command: no module state), the settings a model generates in (`Setting`), the base model's sampling, and
the run configuration."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "experiments" / "results"
RUN_ROOT = REPO / "runs" / "step_transfer"
DEFAULT_MODEL = "toy"
REFERENCE = "1 step"


@dataclass(frozen=True)
class Setting:
    """How a model generates: steps of its scheduler, guidance (> 1: a CFG batch [uncond, cond]) and which half of
    the U-Net batch is measured."""

    steps: int
    guidance: float = 0.0
    half: str = "cond"
    model: str = DEFAULT_MODEL  # a model of the toy's architecture (`--model`; `toy-base` or a pipeline, `--base`)

    @property
    def slug(self) -> str:
        """The setting's files under runs/: they hold what the model generated, whichever SAEs are tested on it."""
        prefix = "" if self.model == DEFAULT_MODEL else _model_name(self.model) + "-"
        return f"{prefix}steps{self.steps}-g{self.guidance:g}-{self.half}"


def _model_directory(model: str) -> Path:
    """Where a model's pipeline lies: an embedded name's weights (`toy-base`), or the directory itself."""
    from interp.models.t2i import KNOWN_MODELS

    return Path(KNOWN_MODELS[model].source) if model in KNOWN_MODELS else Path(model)


def _model_name(model: str) -> str:
    """A short name for file names: the embedded name, or the run's name for a recipe's `<run>/pipeline`."""
    from interp.models.t2i import KNOWN_MODELS

    if model in KNOWN_MODELS:
        return model
    directory = Path(model).resolve()
    return directory.parent.name if directory.name == "pipeline" else directory.name


def base_sampling(model: str, one_step: str = DEFAULT_MODEL) -> tuple[int, float]:
    """The multi-step base model's own steps and guidance (its recipe.json); refused for a one-step model, and for
    one whose U-Net the SAEs of `one_step` cannot read."""
    recipe_path = _model_directory(model) / "recipe.json"
    if not recipe_path.exists():
        raise ValueError(f"{model} has no recipe.json: --base wants `toy-base` or a pipeline saved by "
                         "`python -m zoo train t2i --objective v_prediction`")
    recipe = json.loads(recipe_path.read_text())
    if recipe.get("objective", "sample") == "sample":
        raise ValueError(f"{model} was trained with the one-step objective; --base wants a multi-step model "
                         "(`python -m zoo train t2i --objective v_prediction`)")
    if _unet_layout(model) != _unet_layout(one_step):
        raise ValueError(f"{model}'s U-Net has other blocks or channels than {one_step}'s: {one_step}'s SAEs do not "
                         "fit it")
    return int(recipe.get("sampling_steps", 1)), float(recipe.get("guidance", 0.0))



def _unet_layout(model: str) -> list:
    """What decides whether one model's SAEs read another's blocks: the U-Net's block types and channels."""
    config = json.loads((_model_directory(model) / "unet" / "config.json").read_text())
    return [config.get(k) for k in ("block_out_channels", "down_block_types", "up_block_types")]


def base_column(model: str, one_step: str = DEFAULT_MODEL) -> str:
    """How the tables name the base model's generations: "base, 30 steps, CFG 5"."""
    steps, guidance = base_sampling(model, one_step)
    return f"base, {steps} steps" + (f", CFG {guidance:g}" if guidance > 1 else "")


def base_settings(model: str, one_step: str = DEFAULT_MODEL) -> dict[str, Setting]:
    """The multi-step base model's settings (both CFG halves at its own steps and guidance, from its recipe.json)."""
    steps, guidance = base_sampling(model, one_step)
    halves = ("cond", "uncond") if guidance > 1 else ("cond",)
    return {f"base, {steps} steps, CFG {guidance:g}, {half}": Setting(steps, guidance, half, str(model))
            for half in halves}


def one_step_settings(model: str) -> dict[str, Setting]:
    """The one-step model's settings: 1, 2 and 4 steps, and 4 steps with guidance 5 (both halves)."""
    return {"1 step": Setting(1, model=model),
            "2 steps": Setting(2, model=model),
            "4 steps": Setting(4, model=model),
            # the toy's default is no guidance (as SDXL Turbo's); SDXL base's default guidance is 5
            "4 steps, CFG 5, cond": Setting(4, 5.0, "cond", model),
            "4 steps, CFG 5, uncond": Setting(4, 5.0, "uncond", model)}




def one_step_models() -> list[str]:
    """The embedded one-step models of the toy's architecture, whose shipped SAEs a study may test."""
    from interp.models.t2i_registry import KNOWN_MODELS, TOY_BLOCKS

    return [name for name, known in KNOWN_MODELS.items()
            if known.embedded and known.blocks == TOY_BLOCKS and known.default_steps == 1]


@dataclass
class Study:
    """Whose shipped 1-step SAEs are tested (``model``: the toy, or another embedded one-step model of its
    architecture such as `toy-turbo`, trained from `toy-base`'s weights), where the runs live (``run_root``) and the
    settings measured (``settings``: the one-step model's, plus the base model's with `with_base`). Every command
    is given one; `Study.of` checks the model in one line."""

    model: str = DEFAULT_MODEL
    run_root: Path = RUN_ROOT
    settings: dict[str, Setting] = field(default=None)

    def __post_init__(self):
        self.run_root = Path(self.run_root)
        if self.settings is None:
            self.settings = one_step_settings(self.model)

    @classmethod
    def of(cls, model: str = DEFAULT_MODEL, run_root: Path = RUN_ROOT) -> "Study":
        """The study of `model`'s shipped SAEs (saes/pretrained/<model>, as `saes/pretrained/toy/ship.sh` makes
        them); refused in one line for a model that is not an embedded one-step model of the toy's architecture, or
        has no shipped SAEs."""
        one_step = one_step_models()
        if model not in one_step:
            raise ValueError(f"{model!r} is not an embedded one-step model of the toy's architecture (one of "
                             f"{', '.join(one_step)})")
        study = cls(model, run_root)
        if not study.sae_root.is_dir():
            raise ValueError(f"{model} has no shipped SAEs ({_shown(study.sae_root)}): make them with "
                             f"`MODEL={model} bash saes/pretrained/toy/ship.sh`")
        return study

    @property
    def sae_root(self) -> Path:
        return REPO / "saes" / "pretrained" / self.model

    def with_base(self, base: str | None) -> "Study":
        """The same study with the multi-step base model's settings too (none without a base)."""
        if not base:
            return self
        return replace(self, settings={**self.settings, **base_settings(base, self.model)})

    def sae_dir(self, name: str) -> Path:
        """A run directory of figures that depend on the SAEs tested (measured/, riebench/, paint/): the toy's as
        they were, another model's with its name, so that both sets of results live side by side under one root."""
        return self.run_root / (name if self.model == DEFAULT_MODEL else f"{name}-{self.model}")

    def model_flag(self) -> str:
        """The `--model` a command line needs to name the SAEs under test ("" for the toy's)."""
        return "" if self.model == DEFAULT_MODEL else f" --model {self.model}"

    def results_stem(self) -> str:
        """The results' file name: step_transfer for the toy's SAEs, step_transfer_<model> for another model's."""
        return "step_transfer" if self.model == DEFAULT_MODEL else f"step_transfer_{self.model.replace('-', '_')}"

    def docs_markers(self) -> tuple[str, str]:
        """The docs page's markers around the tables of the SAEs under test (one pair per one-step model)."""
        name = "step-transfer" if self.model == DEFAULT_MODEL else f"step-transfer {self.model}"
        return f"<!-- {name} -->", f"<!-- /{name} -->"

    def log(self, message: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {message}"
        print(line, flush=True)
        self.run_root.mkdir(parents=True, exist_ok=True)
        with open(self.run_root / "log.txt", "a") as log:
            log.write(line + "\n")


@dataclass(frozen=True)
class RunConfig:
    n_eval: int = 200            # held-out captions (the world's held-out split), one seed each
    eval_seed: int = 33
    n_train: int = 200           # captions of the ceiling SAEs' stores (world captions of another seed)
    train_seed: int = 3333
    ceiling_steps: int = 1000    # TopK training steps of each ceiling SAE (4M vectors; the shipped saw 10M)
    ceiling_batch: int = 4096
    ceiling_lr: float = 1e-3     # the shipped SAEs' (saes/pretrained/toy/ship.sh)
    top_k: int = 20              # positions in each feature's top-k overlap
    min_firing: int = 20         # a feature is compared when it fires at least this often in the 1-step run
    random_seed: int = 0
    threads: int = 1             # the cores are shared: two threads on an oversubscribed machine run far slower


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)



def _scheduler_note(model: str) -> dict:
    config = json.loads((_model_directory(model) / "scheduler" / "scheduler_config.json").read_text())
    return {k: config[k] for k in ("_class_name", "prediction_type", "timestep_spacing", "rescale_betas_zero_snr")}



__all__ = ["DEFAULT_MODEL", "REFERENCE", "REPO", "RESULTS", "RUN_ROOT", "RunConfig", "Setting", "Study",
           "base_column", "base_sampling", "base_settings", "one_step_models", "one_step_settings"]
