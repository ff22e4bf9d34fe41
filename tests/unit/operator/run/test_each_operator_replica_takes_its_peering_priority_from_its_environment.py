"""An operator replica's kopf peering priority (handlers._priority): distinct per replica, from the
environment as given or hashed from the pod's uid."""

from __future__ import annotations


def test_operator_priority_from_environment() -> None:
    from weightcache_operator.run.handlers import _priority

    assert _priority("42") == 42
    uid = "0b6f0e7e-8a3c-4f59-9d7d-5c3f3c1d2e10"
    assert _priority(uid) == _priority(uid) and _priority(uid) != _priority(uid[::-1])
    assert 1 <= _priority("") <= 1_000_000
