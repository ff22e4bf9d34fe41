"""How many passes run at once is the operator's own setting, not its host's CPU count."""

from __future__ import annotations

import pytest
from weightcache_operator.settings import pass_threads


def test_unset_runs_six_passes_at_once() -> None:
    assert pass_threads({}) == 6
    assert pass_threads({"WEIGHTCACHE_OPERATOR_PASS_THREADS": " "}) == 6


def test_a_given_count_is_taken_as_is() -> None:
    assert pass_threads({"WEIGHTCACHE_OPERATOR_PASS_THREADS": "3"}) == 3
    assert pass_threads({"WEIGHTCACHE_OPERATOR_PASS_THREADS": "256"}) == 256


@pytest.mark.parametrize("text", ["0", "-2", "four", "2.5", "257"])
def test_a_count_that_is_not_a_whole_number_from_1_to_256_is_refused_with_the_fix(text: str) -> None:
    with pytest.raises(ValueError, match="WEIGHTCACHE_OPERATOR_PASS_THREADS=.*whole number of threads from 1 to 256"):
        pass_threads({"WEIGHTCACHE_OPERATOR_PASS_THREADS": text})
