"""The compile-artifact directory's pure decisions: what a key covers, which entries are evicted."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from weightcache.artifacts.key import ArtifactKey, Claim
from weightcache.artifacts.store import Entry, eviction_order

KEY = ArtifactKey(
    engine="vllm",
    engine_version="0.32.0",
    torch_version="2.11.0",
    image="ghcr.io/example/vllm:1",
    device="cpu:avx512f",
    weights="w" * 64,
    compile_config="c" * 10,
)


def test_every_field_of_the_key_changes_its_digest() -> None:
    digests = {KEY.digest}
    for field, value in KEY.model_dump().items():
        digests.add(KEY.model_copy(update={field: value + "x"}).digest)
    assert len(digests) == 1 + len(KEY.model_dump())


def test_a_key_is_stable_across_processes_and_field_order() -> None:
    again = ArtifactKey.model_validate(dict(reversed(list(KEY.model_dump().items()))))
    assert again.digest == KEY.digest and len(KEY.digest) == 32


def test_a_claim_with_unknown_fields_or_a_malformed_hit_is_refused() -> None:
    with pytest.raises(ValidationError):
        Claim.model_validate({"key": KEY.model_dump(), "hit": "../../etc"})
    with pytest.raises(ValidationError):
        Claim.model_validate({"key": {**KEY.model_dump(), "extra": "x"}})


def test_least_recently_used_entries_go_first_until_the_rest_fit() -> None:
    entries = [Entry("a", 40, last_used=3.0), Entry("b", 40, last_used=1.0), Entry("c", 40, last_used=2.0)]
    assert eviction_order(entries, max_bytes=80) == ["b"]
    assert eviction_order(entries, max_bytes=40) == ["b", "c"]
    assert eviction_order(entries, max_bytes=120) == []


def test_an_entry_in_use_is_never_evicted_even_when_oldest() -> None:
    entries = [Entry("old", 50, last_used=1.0), Entry("new", 50, last_used=2.0)]
    assert eviction_order(entries, max_bytes=50, in_use=frozenset({"old"})) == ["new"]
    assert eviction_order(entries, max_bytes=0, in_use=frozenset({"old", "new"})) == []


def test_the_engine_compiles_into_its_staging_and_its_own_aot_setting_wins() -> None:
    from pathlib import Path

    from weightcache.artifacts.engine import engine_env

    env = engine_env(Path("/a/staging/0123456789abcdef"), "/a", "vllm", {})
    assert env["VLLM_CACHE_ROOT"] == "/a/staging/0123456789abcdef/data"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/a/staging/0123456789abcdef/data/inductor"
    assert env["VLLM_USE_AOT_COMPILE"] == "0"
    assert "VLLM_USE_AOT_COMPILE" not in engine_env(Path("/a/staging/x"), "/a", "vllm", {"VLLM_USE_AOT_COMPILE": "1"})


def test_an_engine_profile_without_caches_of_its_own_gets_torchs_only() -> None:
    from pathlib import Path

    from weightcache.artifacts.engine import engine_env

    env = engine_env(Path("/a/staging/x"), "/a", "reference", {})
    assert set(env) == {
        "WEIGHTCACHE_ARTIFACT_DIR",
        "WEIGHTCACHE_ARTIFACT_STAGING",
        "TORCHINDUCTOR_CACHE_DIR",
        "TRITON_CACHE_DIR",
    }
