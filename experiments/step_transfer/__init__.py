"""Do SAEs trained on one-step block updates work at more steps, and on a multi-step base model? (issue 33)

The RIEBench paper claims that SAEs trained on SDXL Turbo's 1-step block updates generalise to 4-step Turbo and
to the multi-step SDXL base model without retraining. This measures the first half on the embedded `toy` (which
predicts the clean latent, so it runs at any number of steps of its Euler scheduler): the shipped 1-step SAEs
(`saes/pretrained/toy`) applied to the toy's block updates at 1, 2 and 4 steps, and at 4 steps with classifier-free
guidance (both halves), on held-out captions of the shapes world; and with `--base toy-base` the second half: the
same SAEs on the embedded multi-step base model's updates at its own 30 steps with guidance 5 (both halves).

    python -m experiments.step_transfer run      # resumable: each output under runs/step_transfer/ is skipped when
                                                 # it exists; progress in runs/step_transfer/log.txt
    python -m experiments.step_transfer report   # experiments/results/step_transfer.{json,md} from runs/;
                                                 # --docs also refills docs/experiments/step-transfer.md's tables
    python -m experiments.step_transfer causal   # RIEBench edits with the 1-step SAEs at 1, 2 and 4 steps
    python -m experiments.step_transfer paint    # painted labels (`saes causal`) with them at 1, 2 and 4 steps
    python -m experiments.step_transfer cost     # one toy-base recipe step, timed
    python -m experiments.step_transfer run --base toy-base   # the multi-step base model too (or a recipe's
                                                               # <run>/pipeline)
    # (causal, paint and report take --base too: the same edits on the base model's generations, at the steps
    # and guidance of its recipe.json, a column of their own)
    python -m experiments.step_transfer run --model toy-turbo --base toy-base   # the same-lineage pair: the 1-step
                                                 # SAEs of the one-step model trained from toy-base's weights
    # (every command takes --model: its figures go to measured-toy-turbo/, riebench-toy-turbo/, paint-toy-turbo/
    # and experiments/results/step_transfer_toy_turbo.{json,md}; the generations are shared)

Per block and setting: explained variance, L0 and dead fraction of the shipped SAE (per denoising step and over
all steps), beside a ceiling (a TopK SAE of the shipped size trained on that setting's updates, on other captions)
and a floor (a random-direction SAE of the same size and k); and feature agreement: each feature's activation on
the same caption, seed and position at a step of the setting against the 1-step run (Pearson correlation, top-k
overlap, and the overlap of the active sets). The first call of a multi-step generation has exactly the 1-step
call's input (the same noise at t = 999), so its agreement is 1 by construction; the steps after it are the test.
The random SAE's agreement is the floor there: how much agreement the updates' own similarity gives any dictionary.

The study is split by job: `study` (whose SAEs, which run directory and settings: a `Study` every command is given,
no module state), `measure` (`run`), `causal` (RIEBench edits and painted labels), `cost`, `report` (the tables and
the page) and `cli` (`main`). Their names are re-exported here.
"""

from .causal import *  # noqa: F401,F403
from .causal import __all__ as _causal
from .cli import main, run  # noqa: F401
from .cost import *  # noqa: F401,F403
from .cost import __all__ as _cost
from .measure import *  # noqa: F401,F403
from .measure import __all__ as _measure
from .report import *  # noqa: F401,F403
from .report import __all__ as _report
from .report import _on_base, _steps_name  # noqa: F401 - read by the tests
from .study import *  # noqa: F401,F403
from .study import __all__ as _study

__all__ = ["main", *_causal, *_cost, *[n for n in _measure if n != "run"], *_report, *_study]
