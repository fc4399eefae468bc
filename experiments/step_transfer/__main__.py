"""`python -m experiments.step_transfer ...` (see the package's docstring)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
