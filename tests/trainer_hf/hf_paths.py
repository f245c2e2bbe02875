"""Paths shared by the trainer_hf tests (a uniquely named module: `conftest` is ambiguous across test dirs)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROMPTS = REPO / "trainer" / "prompts"
