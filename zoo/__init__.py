"""Embedded default models: their worlds (data generators), weights and training recipes."""

from pathlib import Path

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
