"""Planning a rank reads top to bottom (checkpoints/pipeline.py): config → layout rules → per-tensor
parts → rank plan. Each stage imports only the stages below it and the shared vocabulary, so no
stage can call back into the one that called it; filling (loader.py) comes after planning and no
stage needs it."""

import ast

from repo_root import ROOT

CHECKPOINTS = ROOT / "daemon_image" / "weightcache" / "checkpoints"

# Lowest first: the layout rules, the per-tensor parts (dense, then stacked experts), the rank plan,
# the dry run over a whole world.
STAGES = ["sharding", "read_tasks", "experts", "pipeline", "planner"]
# What every stage may use: the opened checkpoint, dtype names, the quantization allowlist, the
# manifest's entries and their columnar index.
VOCABULARY = {"checkpoint", "dtypes", "quantization", "manifest", "tensor_index"}


def sibling_imports(module: str) -> set[str]:
    """The modules of ``checkpoints`` that ``module`` imports, including inside functions."""
    found = set()
    for node in ast.walk(ast.parse((CHECKPOINTS / f"{module}.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
    return found - {module}


def test_each_planning_stage_imports_only_the_stages_below_it() -> None:
    wrong = {}
    for i, stage in enumerate(STAGES):
        above = sibling_imports(stage) - set(STAGES[:i]) - VOCABULARY
        if above:
            wrong[stage] = sorted(above)
    assert not wrong, f"planning stages reaching up or sideways (pass the answer down instead): {wrong}"


def test_the_shared_vocabulary_imports_no_stage() -> None:
    wrong = {m: sorted(sibling_imports(m) & set(STAGES)) for m in VOCABULARY if sibling_imports(m) & set(STAGES)}
    assert not wrong, wrong


def test_the_stage_check_sees_every_module() -> None:
    """A new module in checkpoints/ is placed here: a stage, the vocabulary, or the filling side."""
    filling = {"loader", "staging", "content", "progress", "page_cache"}
    assert {p.stem for p in CHECKPOINTS.glob("*.py")} - {"__init__"} == set(STAGES) | VOCABULARY | filling
    assert "pipeline" in sibling_imports("loader")  # the check itself: an import is seen
