"""The recording double of the API (recording_kube.py) is read by a test while the operator's
event sink creates Events on its own thread (events.py): every read of the test is consistent,
never a "dictionary changed size during iteration" from a create landing mid-read."""

from __future__ import annotations

import threading

from recording_kube import RecordingKube


def test_names_steps_and_removals_stay_consistent_while_events_are_created_on_another_thread() -> None:
    api = RecordingKube()
    for k in range(50):
        api.put("Pod", {"metadata": {"name": f"pod-{k:02d}"}})
    done = threading.Event()

    def events() -> None:
        for _ in range(3_000):
            api.create("/api/v1/namespaces/ns/events", {"metadata": {"generateName": "tiny."}})
        done.set()

    sender = threading.Thread(target=events)
    sender.start()
    reads = 0
    while not done.is_set():
        assert len(api.names("Pod")) == 50
        if reads % 20 == 0:  # each reads every write so far: not every time, or the sender crawls
            assert all(kind != "Event" for _verb, kind, _name in api.steps())
        reads += 1
    sender.join()
    api.remove("Pod", "pod-00")
    assert api.names("Pod")[0] == "pod-01" and reads > 0
    assert len(api.names("Event")) == 3_000
