"""A hot stage in its own process counts into its own StreamCounters and sends hot_update to
the worker, which merges it: the worker's counters then read as if the hot stage were a thread
of it (batch log entries sent once each, dead letters of both sides summed)."""

from __future__ import annotations

from peerwatch.streams.live.counters import BATCH_LOG_MAX, HOT_FIELDS, StreamCounters


def test_merged_hot_counters_read_as_the_hot_stages_own() -> None:
    hot, worker = StreamCounters(), StreamCounters()
    worker.windows, worker.findings = 7, 2  # stage 3's own
    worker.count_deadletter()
    sent = 0
    for i in range(5):
        hot.batch_done(100, 800, 1000.0 + i, 0.5 * i)
        if i == 2:
            hot.count_deadletter()
            hot.clock_offsets_ms["n1"] = 1200
        update = hot.hot_update(sent)
        sent = update["batches"]
        worker.merge_hot(update)
    snap = worker.snapshot()
    assert snap["batch_log"] == hot.snapshot()["batch_log"]  # each entry once, in order
    for name in HOT_FIELDS:
        assert snap[name] == getattr(hot, name), name
    assert (snap["samples"], snap["gpu_samples"], snap["batches"]) == (500, 4000, 5)
    assert (snap["windows"], snap["findings"]) == (7, 2)
    assert snap["deadletter"] == 2 == worker.scalars()["deadletter"]
    assert snap["clock_offsets_ms"] == {"n1": 1200}


def test_an_update_after_the_log_was_trimmed_sends_what_is_left() -> None:
    hot, worker = StreamCounters(), StreamCounters()
    for i in range(BATCH_LOG_MAX + 1500):
        hot.batch_done(1, 8, float(i), 0.0)
    update = hot.hot_update(0)
    assert len(update["batch_log_new"]) == len(hot.batch_log) <= BATCH_LOG_MAX
    worker.merge_hot(update)
    assert worker.batch_log[-1] == hot.batch_log[-1]
    assert len(worker.batch_log) <= BATCH_LOG_MAX
    assert hot.hot_update(update["batches"])["batch_log_new"] == []  # nothing new
