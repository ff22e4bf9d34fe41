"""The SGLang versions the plug-in and the daemon run with: read from SGLang's own version string,
refused outside the range with one line naming the range and the fix."""

import pytest
from weightcache.sglang import versions
from weightcache_contract.errors import WeightCacheError


@pytest.mark.parametrize("version", ["0.5.17", "0.5.17+cpu", "0.5.19", "0.5.21", "0.5.21.post1"])
def test_every_release_from_the_oldest_to_the_newest_supported_is_accepted(version: str) -> None:
    versions.check(version)


@pytest.mark.parametrize("version", ["0.5.16", "0.5.22", "0.4.9", "0.6.0", "1.0.0"])
def test_a_release_outside_the_range_is_refused_naming_the_range_and_the_fix(version: str) -> None:
    with pytest.raises(WeightCacheError) as refused:
        versions.check(version)
    message = str(refused.value)
    assert f"this is SGLang {version}" in message
    assert "supports SGLang 0.5.17 to 0.5.21" in message
    assert "--load-format auto" in message


def test_a_version_string_without_a_release_number_is_refused_rather_than_guessed() -> None:
    with pytest.raises(WeightCacheError, match="cannot read SGLang's version 'dev'"):
        versions.check("dev")
