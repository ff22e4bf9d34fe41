"""Where unit tests find the modules they import.

The tests sit in folders by the room of the code they test (operator/<room>, data_plane/<package>,
contract, chart, harness, structure) and import the shared builders of their room's support/ folder
(operator/support, data_plane/support; support/ for what every room uses) by bare module name
(``from builders import make``), never another test module (a structure test checks that). pytest's
default ``prepend`` import mode puts only a test file's own folder on ``sys.path``, and only when it collects
that file, so a name defined in another folder would import or not depending on which files a run
collects, and in which order. Every folder below this one that holds a module is put on ``sys.path``
here instead, before any test module is imported: a module's bare name is all a test needs, however
pytest was started.

Bare names are one namespace, so no two modules here may share a name (pytest stops at a second test
file of the same name, but a second builder module would silently shadow the first), and a folder
that holds modules holds no folders (one named ``vllm`` on ``sys.path`` would import as vLLM where
vLLM is not installed). structure/test_every_unit_test_module_has_a_name_of_its_own.py checks both.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

for folder in sorted({path.parent for path in HERE.rglob("*.py")} - {HERE}):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
