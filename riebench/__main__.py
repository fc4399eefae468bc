"""python -m riebench {tasks,run,sweep,report} ...

    python -m riebench tasks --suite shapes --seed 0 --out runs/riebench/shapes-suite.json
    python -m riebench tasks --suite ../shared/data/riebench.json --masks MASK_DIR --out tasks.json
    python -m riebench run --model toy --method sae --saes runs/saes --k-trans 5 --m 1 --out runs/riebench/sae
    python -m riebench run --model toy --method prompt-swap --limit-per-category 5 --out runs/riebench/swap
    python -m riebench sweep --model toy --saes runs/saes --k-trans 1 5 20 --m 0.5 1 2 --out runs/riebench/sweep
    python -m riebench report runs/riebench/sweep

A run is resumable: rerun the same command and finished tasks are skipped.
"""

from __future__ import annotations

import argparse
import sys

import zoo  # noqa: F401 - registers the embedded models and worlds with the core (interp.embedded)

from interp.cli import run_command
from interp.shipped import add_overwrite_options


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m riebench",
                                     description="Representation-based image editing benchmark.")
    commands = parser.add_subparsers(dest="command", required=True)

    from .report import add_report_arguments, report_command
    from .run import add_run_method_arguments, add_sweep_arguments, run_method_command, sweep_command
    from .tasks import add_tasks_arguments, tasks_command

    for name, help_text, add_arguments, command in (
        ("tasks", "write a task suite (the shapes world's, or a converted RIEBench file)", add_tasks_arguments,
         tasks_command),
        ("run", "run one method (a grid of k_trans x m) over a suite (resumable)", add_run_method_arguments,
         run_method_command),
        ("sweep", "the k_trans x m grid of every method, the baselines and the prompt swap", add_sweep_arguments,
         sweep_command),
        ("report", "(re)write the tables and plots of a run directory", add_report_arguments, report_command),
    ):
        sub = commands.add_parser(name, help=help_text)
        add_arguments(sub)
        sub.set_defaults(run=command)

    return run_command(add_overwrite_options(parser).parse_args(argv),
                       interrupted="interrupted: rerun the same command to resume")


if __name__ == "__main__":
    sys.exit(main())
