"""Events leave the pass (events.py): posting never waits for the API server, and what is posted
is sent in order, failures and a full queue counted instead of raised."""

from __future__ import annotations

import threading
from typing import Any

from weightcache_operator.act.events import EventSink


def event(reason: str) -> dict[str, Any]:
    return {"reason": reason, "message": reason}


def test_posting_returns_while_the_api_server_has_not_answered_and_events_go_out_in_order() -> None:
    answer = threading.Event()
    sent: list[tuple[str, str]] = []

    def send(namespace: str, body: dict[str, Any]) -> None:
        answer.wait(10)
        sent.append((namespace, body["reason"]))

    sink = EventSink(send)
    for reason in ("PhaseLoading", "PhaseReady", "Failover"):
        sink.post("ns", event(reason))  # would block for 10 s each if sent on the caller's thread
    assert not sink.flush(timeout=0.2), "nothing is sent before the API server answers"
    answer.set()
    assert sink.flush(timeout=10)
    assert sent == [("ns", "PhaseLoading"), ("ns", "PhaseReady"), ("ns", "Failover")]
    sink.close(timeout=1)


def test_a_refused_event_is_counted_and_the_ones_after_it_are_still_sent() -> None:
    outcomes: list[str] = []
    sent: list[str] = []

    def send(_namespace: str, body: dict[str, Any]) -> None:
        if body["reason"] == "Refused":
            raise RuntimeError("403: events is forbidden")
        sent.append(body["reason"])

    sink = EventSink(send, counted=outcomes.append)
    for reason in ("A", "Refused", "B"):
        sink.post("ns", event(reason))
    assert sink.flush(timeout=10)
    assert sent == ["A", "B"] and outcomes == ["sent", "failed", "sent"]
    sink.close(timeout=1)


def test_beyond_the_limit_new_events_are_dropped_and_counted_not_queued() -> None:
    answer = threading.Event()
    outcomes: list[str] = []
    sent: list[str] = []

    def send(_namespace: str, body: dict[str, Any]) -> None:
        answer.wait(10)
        sent.append(body["reason"])

    sink = EventSink(send, limit=2, counted=outcomes.append)
    sink.post("ns", event("first"))
    # Wait until the sender has taken "first" off the queue (it then hangs in send).
    while sink.queued() > 0:
        threading.Event().wait(0.01)
    for reason in ("second", "third", "fourth"):
        sink.post("ns", event(reason))
    assert outcomes == ["dropped"], "two wait; the fourth is dropped while the API server hangs"
    answer.set()
    assert sink.flush(timeout=10)
    assert sent == ["first", "second", "third"]
    assert outcomes.count("sent") == 3


def test_after_close_what_waited_was_sent_and_later_posts_are_dropped() -> None:
    sent: list[str] = []
    outcomes: list[str] = []
    sink = EventSink(lambda _ns, body: sent.append(body["reason"]), counted=outcomes.append)
    sink.post("ns", event("last words"))
    sink.close(timeout=10)
    sink.post("ns", event("too late"))
    assert sent == ["last words"] and outcomes == ["sent", "dropped"]
