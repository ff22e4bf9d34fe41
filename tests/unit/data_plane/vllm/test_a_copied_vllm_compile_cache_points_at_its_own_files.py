"""A warm engine finds its compiled graphs in the entry copied into its own staging directory:
vLLM 0.26's index names each graph by the absolute path it was saved under, in the publishing
engine's staging, which is gone; the claim rewrites those paths to the copy's files (the index in
the format vLLM writes, ``pprint`` of a dict literal, read back with ``ast.literal_eval``).
Anything that is not a plain handle of a file beside the index is left as it was."""

import ast
import os
import pprint
from pathlib import Path

from weightcache.vllm.artifacts import COMPILE_CACHE_INDEX, relocate_compile_cache

GRAPH = "artifact_compile_range_1_8192_subgraph_0"
OLD = "/var/lib/weightcache/artifacts/staging/fb79acb4354a6043/data/torch_compile_cache/0d1b7d64d2/rank_0_0/backbone"


def index_in(data: Path, graphs: dict) -> Path:
    here = data / "torch_compile_cache" / "0d1b7d64d2" / "rank_0_0" / "backbone"
    here.mkdir(parents=True)
    (here / GRAPH).write_bytes(b"compiled")
    index = here / COMPILE_CACHE_INDEX
    index.write_text(pprint.PrettyPrinter(indent=4).pformat(graphs))
    return index


def handle(key: str, path: str) -> dict:
    return {"graph_handle": (key, path), "cache_key": "fx-abc"}


def test_every_graph_of_a_copied_entry_is_loaded_from_the_copy(tmp_path: Path) -> None:
    graphs = {((1, 8192), 0, "inductor_standalone"): handle(GRAPH, f"{OLD}/{GRAPH}")}
    graphs[((1, 8192), 1, "inductor_standalone")] = handle(GRAPH, f"{OLD}/{GRAPH}")
    index = index_in(tmp_path / "data", graphs)

    assert relocate_compile_cache(tmp_path / "data") == 2

    read = ast.literal_eval(index.read_text())
    assert set(read) == set(graphs)
    for graph in read.values():
        key, path = graph["graph_handle"]
        assert key == GRAPH and path == str(index.parent / GRAPH) and os.path.isfile(path)
        assert graph["cache_key"] == "fx-abc"
    assert relocate_compile_cache(tmp_path / "data") == 0  # already in place: nothing rewritten


def test_a_handle_that_is_not_a_plain_file_name_beside_the_index_is_left_alone(tmp_path: Path) -> None:
    graphs = {
        ((1, 8192), 0, "inductor_standalone"): handle("../../../../etc/passwd", "/etc/passwd"),
        ((1, 8192), 1, "inductor_standalone"): handle("", "/x"),
        ((1, 8192), 2, "inductor_standalone"): {"graph_handle": ("a", "b", "c")},
        ((1, 8192), 3, "eager"): None,
    }
    index = index_in(tmp_path / "data", graphs)
    before = index.read_bytes()
    assert relocate_compile_cache(tmp_path / "data") == 0
    assert index.read_bytes() == before


def test_an_index_that_is_not_a_python_literal_is_left_for_vllm_to_refuse(tmp_path: Path) -> None:
    index = index_in(tmp_path / "data", {})
    index.write_text("__import__('os').system('touch /tmp/pwned')")
    assert relocate_compile_cache(tmp_path / "data") == 0
    assert index.read_text() == "__import__('os').system('touch /tmp/pwned')"


def test_a_symlinked_index_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside.py"
    outside.write_text(pprint.pformat({((1, 2), 0, "inductor_standalone"): handle(GRAPH, f"{OLD}/{GRAPH}")}))
    index = index_in(tmp_path / "data", {})
    index.unlink()
    index.symlink_to(outside)
    before = outside.read_bytes()
    assert relocate_compile_cache(tmp_path / "data") == 0
    assert outside.read_bytes() == before


def test_data_without_vllms_compile_cache_is_nothing_to_do(tmp_path: Path) -> None:
    (tmp_path / "data" / "inductor").mkdir(parents=True)
    assert relocate_compile_cache(tmp_path / "data") == 0
