"""``gc_paused`` turns the cyclic collector off for a block and restores the caller's setting."""

import gc

import pytest
from weightcache.gcpause import gc_paused


def test_paused_inside_restored_after_even_on_error() -> None:
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with gc_paused():
            assert not gc.isenabled()
            with gc_paused():  # nested: the inner block must not re-enable it early
                assert not gc.isenabled()
            assert not gc.isenabled()
            raise RuntimeError("boom")
    assert gc.isenabled()


def test_a_caller_that_disabled_it_keeps_it_disabled() -> None:
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
