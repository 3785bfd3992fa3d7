"""Where the project's shipped assets live inside the installed package."""

from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"
EMBEDDED_TARGET = ASSETS / "target"  # the small SDAR-architecture target this project trains and ships
