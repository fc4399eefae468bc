"""Run edit methods over a suite: one JSON per task and configuration, resumable.

Layout of an output directory:

    run.json                          the run's configuration (RunConfig)
    results/<config key>/<task>.json  one finished task: metrics, selected units, timings
    images/<config key>/<task>.png    the edited image (with save_images)

Each result file is written through a temporary file and a rename, so a finished task's
result survives any later failure; a rerun skips every (configuration, task) whose file
exists. A task that fails records `error` in its file and is retried by the next run.
"""

from __future__ import annotations

import json
import os
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from interp.atomic import atomic_write, atomic_write_text
from interp.ground_truth import require_ground_truth

from .methods import (METHODS, MethodConfig, MethodError, load_saes, make_method, method_names, prepare_task,
                      run_plan)
from .metrics import RealImageMetrics, shapes_metrics
from .tasks import ShapesSuiteConfig, Suite, TaskError, read_riebench_json, shapes_suite


@dataclass
class RunConfig:
    """Everything that determines a run's results (written to run.json)."""

    model: str = "toy"
    suite: str = "shapes"               # "shapes" (generated) or a task file (ours or the public RIEBench JSON)
    suite_seed: int = 0                 # shapes suite only
    categories: list[str] | None = None
    limit_per_category: int | None = None
    mask_dir: str | None = None         # PNG masks for the public RIEBench file
    saes: str | None = None             # directory with one SAE directory per block
    steps: int | None = None            # denoising steps; None: the model's default
    seed: int | None = None             # None: each task's own seed
    configs: list[MethodConfig] = field(default_factory=lambda: [MethodConfig()])
    save_images: bool = False
    dtype: str | None = None            # the pipeline's (--dtype); None: load_t2i's default for the device

    def to_dict(self) -> dict:
        d = asdict(self)
        d["configs"] = [c.to_dict() for c in self.configs]
        return d


class RunError(ValueError):
    """A results directory that cannot take this run, or cannot be reported on."""


RUN_FILE = "run.json"


def load_suite(cfg: RunConfig) -> Suite:
    if cfg.suite == "shapes":
        suite = shapes_suite(ShapesSuiteConfig(seed=cfg.suite_seed))
    elif cfg.mask_dir is not None:
        suite = read_riebench_json(cfg.suite, cfg.mask_dir)
    else:
        suite = Suite.load(cfg.suite)
    return suite.select(cfg.categories, cfg.limit_per_category)


def result_path(out: Path, config: MethodConfig, task_id: str) -> Path:
    return out / "results" / config.key() / f"{task_id}.json"


def is_done(path: Path) -> bool:
    """A result file that holds a finished task (a failed one is retried)."""
    try:
        return "error" not in json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return False


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(data, indent=1))


def _save_png(path: Path, image) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    image = image if hasattr(image, "save") else Image.fromarray(np.asarray(image, np.uint8))
    atomic_write(path, lambda tmp: image.save(tmp, format="PNG"))


class Runner:
    """Holds the model, SAEs, suite and methods of a run; `run()` fills the results directory."""

    def __init__(self, cfg: RunConfig, out: str | os.PathLike, model=None, saes: dict | None = None,
                 suite: Suite | None = None, progress: bool = True):
        self.cfg = cfg
        self.out = Path(out)
        check_same_run(self.out, cfg)  # before anything is loaded: results of two runs never mix
        self.suite = suite if suite is not None else load_suite(cfg)
        if not self.suite.tasks:
            raise TaskError("no task selected")
        if saes is None and not cfg.saes and any(METHODS[c.method].needs_saes for c in cfg.configs):
            raise MethodError("the sae method needs SAEs: pass --saes DIR (one SAE directory per block)")
        if model is None:
            from interp.cli import parse_dtype
            from interp.models import load_t2i

            model = load_t2i(cfg.model, device="cpu" if not torch.cuda.is_available() else None,
                             dtype=parse_dtype(cfg.dtype))
        self.model = model
        if any(task.original_scene is not None for task in self.suite.tasks):
            # Shapes-world tasks are scored against the scene an image should show: a model made elsewhere cannot
            # be judged so (it would score success 0 and perfect preservation, meaning nothing).
            truth = require_ground_truth(model, "scoring the shapes-world suite",
                                         "give a task file of real-image tasks (--suite FILE, scored by CLIP and "
                                         "LPIPS) or a shapes-world model (--model toy)")
            if truth.name != "shapes":
                raise TaskError(f"the suite is the shapes world's but {getattr(model, 'name', model)} was made in "
                                f"the {truth.name} world")
        # The run's steps and seed, like every configuration below, are checked before anything is generated.
        model.check_request(model.default_steps if cfg.steps is None else cfg.steps,
                            seeds=() if cfg.seed is None else (cfg.seed,))
        blocks = sorted({b for c in cfg.configs for b in c.blocks})
        if saes is None and cfg.saes:
            from saes.sae import SAEFormatError, check_sae_model

            saes = load_saes(cfg.saes, blocks)
            try:  # SAEs of another model (toy-v2's on toy) would edit with meaningless features
                check_sae_model(saes, model.name, cfg.saes)
            except SAEFormatError as err:
                raise MethodError(str(err)) from None
        self.saes = saes or {}
        self.methods = {}
        for config in cfg.configs:  # every configuration is checked before anything is generated
            method = self.methods.setdefault(config.method, make_method(config.method, model, self.saes))
            method.check(config)
        self.blocks = blocks
        self.needs_neurons = any(METHODS[c.method].needs_neurons for c in cfg.configs)
        self.progress = progress
        self._real_metrics = None

    def real_metrics(self) -> RealImageMetrics:
        if self._real_metrics is None:
            self._real_metrics = RealImageMetrics()
        return self._real_metrics

    def pending(self) -> list[tuple]:
        """(task, [configs still to run]) for every task with work left."""
        work = []
        for task in self.suite.tasks:
            todo = [c for c in self.cfg.configs if not is_done(result_path(self.out, c, task.id))]
            if todo:
                work.append((task, todo))
        return work

    def score(self, task, edited_image, ctx) -> tuple[dict, dict]:
        if task.original_scene is not None:
            return shapes_metrics(task, edited_image, ctx.original_image), {}
        metrics = self.real_metrics()
        return metrics(edited_image, ctx.original_image, task.edited), dict(metrics.skipped)

    def run(self, on_result: Callable[[dict], None] | None = None,
            cancel: threading.Event | Callable[[], bool] | None = None) -> dict:
        """Run every pending (task, configuration); returns counts of done, skipped and failed.

        on_result (for an interactive caller such as the UI) is called after each (task,
        configuration) with {"task", "config", "result", "original_image", "edited_image",
        "done", "total"} (images None when the task failed). cancel (an Event or a callable)
        is checked before each edit: when set, the run stops there, `counts` gets
        "cancelled": True, and every finished result stays on disk for a resumed run.
        """
        from tqdm import tqdm

        self.out.mkdir(parents=True, exist_ok=True)
        write_json(self.out / RUN_FILE, {"run": self.cfg.to_dict(), "suite": {
            "name": self.suite.name, "version": self.suite.version, "seed": self.suite.seed,
            "tasks": len(self.suite.tasks)}})
        work = self.pending()
        counts = {"done": 0, "already_done": len(self.suite.tasks) * len(self.cfg.configs)
                  - sum(len(t) for _, t in work), "failed": 0}
        total = sum(len(t) for _, t in work)
        bar = tqdm(total=total, desc="riebench", unit="edit", disable=not self.progress)
        reported = 0

        def report(task, config, result, ctx=None, edited=None):
            nonlocal reported
            reported += 1
            if on_result is not None:
                on_result({"task": task, "config": config, "result": result,
                           "original_image": ctx.original_image if ctx is not None else None,
                           "edited_image": edited, "done": reported, "total": total})

        for task, todo in work:
            if _is_cancelled(cancel):
                counts["cancelled"] = True
                break
            try:
                started = time.perf_counter()
                ctx = prepare_task(self.model, task, self.blocks, seed=self.cfg.seed, steps=self.cfg.steps,
                                   neurons=self.needs_neurons, mask_threshold=todo[0].mask_threshold)
                prepare_seconds = time.perf_counter() - started
            except (TaskError, MethodError) as err:
                for config in todo:
                    failure = self._fail(task, config, err)
                    bar.update(1)
                    report(task, config, failure)
                counts["failed"] += len(todo)
                continue
            for config in todo:
                if _is_cancelled(cancel):
                    counts["cancelled"] = True
                    break
                edited, ctx_of_result = None, ctx
                try:
                    started = time.perf_counter()
                    plan = self.methods[config.method].plan(ctx, config)
                    edited = run_plan(self.model, ctx, plan)
                    edit_seconds = time.perf_counter() - started
                    metrics, skipped = self.score(task, edited, ctx)
                    result = {"task": task.id, "category": task.category, "label": config.label,
                              "config": config.to_dict(), "seed": ctx.seed, "steps": ctx.steps,
                              "metrics": metrics, "skipped_metrics": skipped, "selected": plan.selected,
                              "n_edits": len(plan.edits), "notes": ctx.notes,
                              "seconds": {"prepare": prepare_seconds, "edit": edit_seconds}}
                    if self.cfg.save_images:
                        _save_png(self.out / "images" / config.key() / f"{task.id}.png", edited)
                    write_json(result_path(self.out, config, task.id), result)
                    counts["done"] += 1
                except KeyboardInterrupt:
                    raise
                except Exception as err:  # noqa: BLE001 - recorded per task; finished results stay
                    result = self._fail(task, config, err)
                    counts["failed"] += 1
                    edited, ctx_of_result = None, None
                bar.update(1)
                report(task, config, result, ctx_of_result, edited)
            if counts.get("cancelled"):
                break
        bar.close()
        return counts

    def _fail(self, task, config, err) -> dict:
        failure = {"task": task.id, "category": task.category, "label": config.label, "config": config.to_dict(),
                   "error": f"{type(err).__name__}: {err}",
                   "traceback": "".join(traceback.format_exception(err))[-4000:]}
        write_json(result_path(self.out, config, task.id), failure)
        return failure


def _is_cancelled(cancel) -> bool:
    if cancel is None:
        return False
    if isinstance(cancel, threading.Event):
        return cancel.is_set()
    return bool(cancel())


def load_results(out: str | os.PathLike) -> tuple[list[dict], list[dict]]:
    """(finished results, failed results) of a run directory."""
    done, failed = [], []
    for path in sorted(Path(out).glob("results/*/*.json")):
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError:
            continue
        (failed if "error" in data else done).append(data)
    return done, failed


def check_run_dir(out: str | os.PathLike) -> None:
    """A RunError unless `out` holds a RIEBench run whose results can all be read (what `riebench report` reads):
    an empty directory, one without a run, or a damaged result file would give empty or partial tables."""
    out = Path(out)
    if not out.is_dir():
        raise RunError(f"{out} is not a directory: give the --out of a `python -m riebench run` or `sweep`")
    files = sorted(out.glob("results/*/*.json"))
    if not (out / RUN_FILE).is_file() and not files:
        raise RunError(f"{out} holds no RIEBench run (no {RUN_FILE}, no results/): give the --out of a "
                       f"`python -m riebench run` or `sweep`")
    if not files:
        raise RunError(f"{out} holds no results yet: run the command that made it again to compute them")
    damaged = []
    for path in files:
        try:
            json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            damaged.append(str(path))
    if damaged:
        raise RunError(f"{len(damaged)} result file(s) cannot be read ({', '.join(damaged[:3])}"
                       f"{', ...' if len(damaged) > 3 else ''}): delete them and run the command that made {out} "
                       f"again to redo those tasks")


def check_same_run(out: str | os.PathLike, cfg: RunConfig) -> None:
    """A RunError if `out` already holds another run's results: a results directory holds one run's configuration
    (the same command again resumes it; save_images may change). Results without a run.json are refused too."""
    out = Path(out)
    path = out / RUN_FILE
    if not path.is_file():
        if any(out.glob("results/*/*.json")):
            raise RunError(f"{out} holds results but no {RUN_FILE} saying what made them: choose an empty --out")
        return
    try:
        before = json.loads(path.read_text())["run"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
        raise RunError(f"{path} cannot be read, so the results in {out} cannot be resumed: choose an empty --out") \
            from None
    now = json.loads(json.dumps(cfg.to_dict()))
    keys = list(now) + [k for k in before if k not in now]  # RunConfig's order: the model first
    differ = [k for k in keys if k != "save_images" and before.get(k) != now.get(k)]
    if differ:
        shown = "; ".join(f"{k}: {json.dumps(before.get(k))[:60]} there, {json.dumps(now.get(k))[:60]} here"
                          for k in differ[:3])
        raise RunError(f"{out} holds the results of another run ({shown}): a results directory holds one run, so "
                       f"choose another --out (or run the same command again to resume that one)")


def sweep_configs(k_values: list[int], multipliers: list[float], blocks: list[str],
                  methods: tuple[str, ...] | None = None,
                  per_block: bool = False) -> list[MethodConfig]:
    """The grid of k_trans x m for each method (``method_names``; default: every method that edits blocks),
    the prompt swap, and (per_block) each block alone."""
    configs = [MethodConfig("prompt-swap", blocks=list(blocks))]
    for name in methods or method_names(edits_blocks=True):
        for k in k_values:
            for m in multipliers:
                configs.append(MethodConfig.named(name, k_trans=k, multiplier=m, blocks=list(blocks)))
                if per_block and len(blocks) > 1:
                    configs += [MethodConfig.named(name, k_trans=k, multiplier=m, blocks=[b]) for b in blocks]
    return configs
