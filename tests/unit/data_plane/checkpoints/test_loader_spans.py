"""``coalesce``: which direct reads share one pread and one host-to-device synchronisation."""

from weightcache.checkpoints.loader import FileSpan, ReadTask, coalesce


def task(name: str, nbytes: int) -> ReadTask:
    return ReadTask(source=name, dim=None, start=0, stop=0, transform="raw", outputs=(name,), read_bytes=nbytes)


def names(span: FileSpan) -> list[str]:
    return [t.source for _, t in span.reads]


def test_neighbours_in_one_file_share_a_span_in_file_order() -> None:
    reads = [("a", 300, 100, task("c", 100)), ("a", 0, 100, task("a", 100)), ("a", 100, 200, task("b", 200))]
    [span] = coalesce(reads, limit=1000, max_gap=0)
    assert (span.file, span.start, span.stop) == ("a", 0, 400)
    assert names(span) == ["a", "b", "c"]
    assert [offset for offset, _ in span.reads] == [0, 100, 300]
    assert span.read_bytes == 400


def test_a_gap_a_new_file_or_the_limit_starts_a_new_span() -> None:
    reads = [
        ("a", 0, 100, task("a0", 100)),
        ("a", 150, 100, task("a1", 100)),  # gap 50 > max_gap 10
        ("a", 250, 100, task("a2", 100)),
        ("a", 350, 100, task("a3", 100)),  # would make the span 300 > limit 250
        ("b", 450, 100, task("b0", 100)),  # another file, even though the offset follows
    ]
    spans = coalesce(reads, limit=250, max_gap=10)
    assert [names(s) for s in spans] == [["a0"], ["a1", "a2"], ["a3"], ["b0"]]
    assert [(s.start, s.stop) for s in spans] == [(0, 100), (150, 350), (350, 450), (450, 550)]


def test_a_small_gap_is_read_through_and_a_large_read_stands_alone() -> None:
    reads = [("a", 0, 10, task("x", 10)), ("a", 15, 10, task("y", 10)), ("a", 30, 5000, task("big", 5000))]
    spans = coalesce(reads, limit=1000, max_gap=8)
    assert [names(s) for s in spans] == [["x", "y"], ["big"]]
    assert (spans[0].start, spans[0].stop) == (0, 25)  # the 5 bytes between x and y are read, not used
    assert spans[0].read_bytes == 20 and spans[1].stop - spans[1].start == 5000


def test_overlapping_reads_never_share_a_span() -> None:
    reads = [("a", 0, 100, task("x", 100)), ("a", 50, 100, task("y", 100))]
    assert [names(s) for s in coalesce(reads, limit=1000, max_gap=100)] == [["x"], ["y"]]


def test_nothing_to_read_gives_no_spans() -> None:
    assert coalesce([]) == []
