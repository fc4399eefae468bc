"""Benchmarks: each module runs as `python -m benchmarks.NAME`; they are entry points, so the package imports `zoo`
first, which registers the embedded models and worlds with the core (interp.embedded), as every entry point does."""

import zoo  # noqa: F401  (registration)
