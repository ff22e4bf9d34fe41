"""The vLLM versions the plug-in runs with: read from vLLM's own version string, refused outside the range."""

import pytest
from weightcache.vllm import versions
from weightcache_contract.errors import WeightCacheError


@pytest.mark.parametrize("version", ["0.26.0", "0.26.0+cpu", "0.29.1", "0.32.0", "0.32.0+cpu", "0.32.3.dev12+g1234"])
def test_every_release_from_the_oldest_to_the_newest_supported_is_accepted(version: str) -> None:
    versions.check(version)


@pytest.mark.parametrize("version", ["0.25.1", "0.33.0", "1.0.0", "0.9.2"])
def test_a_release_outside_the_range_is_refused_naming_the_range_and_the_fix(version: str) -> None:
    with pytest.raises(WeightCacheError) as refused:
        versions.check(version)
    message = str(refused.value)
    assert f"this is vLLM {version}" in message
    assert "supports vLLM 0.26 to 0.32" in message
    assert "--load-format auto" in message


def test_a_version_string_without_a_release_number_is_refused_rather_than_guessed() -> None:
    with pytest.raises(WeightCacheError, match="cannot read vLLM's version 'dev'"):
        versions.check("dev")
