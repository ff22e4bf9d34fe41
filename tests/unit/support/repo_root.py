"""The repository's root, for tests that read its files (charts, examples, the CRD, other packages'
sources): one place that knows how deep tests/unit's folders sit."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
