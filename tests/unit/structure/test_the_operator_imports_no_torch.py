"""The operator's process, whatever it runs, imports neither torch nor numpy: its image has neither."""

from __future__ import annotations

import subprocess
import sys


def test_the_operator_imports_no_torch() -> None:
    """The operator image has no torch: what it imports from weightcache must not need it."""
    code = "import sys, weightcache_operator.run.handlers; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
