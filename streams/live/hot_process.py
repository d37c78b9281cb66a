"""The hot stage in a process of its own (``stream.hot_process``, on by default).

In one process the hot stage and the faust agents (stage 3's detection, scored windows and
changelogs; stage 4) share one GIL: py-spy ``--gil`` of a benchmark worker had the event loop
holding it about three times as long as the hot stage, which waited. Here the hot stage runs in
a child process (multiprocessing, *spawn*: no fork of a running event loop and its sockets),
so each side has a core. They share nothing but Kafka, as before: the hot stage sends window
batches and findings to their topics exactly as it did from a thread of the worker.

- Counters: the child counts into its own :class:`StreamCounters` and sends
  :meth:`~StreamCounters.hot_update` over a pipe every :data:`REPORT_EVERY_S`; the worker merges
  it (:meth:`~StreamCounters.merge_hot`), so its counters file and peerwatch's own metrics look
  the same either way. Batch CPU times in the batch log are the hot process's own.
- Lifetimes: the child ends its batch and commits when asked (:meth:`HotProcess.stop`), on
  SIGTERM (a service manager stopping the whole group), or when its parent is gone (checked
  every :data:`REPORT_EVERY_S`: a worker killed hard leaves no orphan reading samples). It
  ignores SIGINT (the worker handles Ctrl-C and asks it to stop). A child that ends unasked, or
  fails, stops the worker (SIGTERM to itself): a worker whose samples are no longer read must
  not look healthy.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
from typing import Any

from peerwatch import gc_tuning
from peerwatch.streams.live.counters import StreamCounters
from peerwatch.streams.live.hot_spec import HotSpec

log = logging.getLogger(__name__)

#: How often the child sends its counters and checks for its parent and a stop request (s).
REPORT_EVERY_S = 0.25
#: Exit status of a child whose hot stage raised.
EXIT_FAILED = 3


class HotProcess:
    """A worker's hot stage in a child process; :meth:`start` and :meth:`stop` as
    :class:`~peerwatch.streams.live.hot_stage.HotStage`'s (thread) ones."""

    def __init__(self, spec: HotSpec, counters: StreamCounters, loglevel: int) -> None:
        self.spec = spec
        self.counters = counters
        self.loglevel = loglevel
        self._proc: Any = None
        self._conn: Any = None
        self._stopping = threading.Event()
        self._pump: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else int(self._proc.pid)

    def start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child_conn = ctx.Pipe(duplex=True)
        self._proc = ctx.Process(
            target=child_main, args=(self.spec, child_conn, os.getpid(), self.loglevel),
            name="peerwatch-hot", daemon=True,
        )  # fmt: skip
        self._proc.start()
        child_conn.close()
        log.info("hot stage started in process %d", self._proc.pid)
        self._pump = threading.Thread(target=self._receive, name="peerwatch-hot-pump", daemon=True)
        self._pump.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask the child to finish (final commit) and wait for it; then end it by force."""
        self._stopping.set()
        if self._proc is None:
            return
        with contextlib.suppress(OSError, ValueError):  # already gone
            self._conn.send("stop")
        self._proc.join(timeout_s)
        if self._proc.is_alive():
            log.error("hot process %d did not stop in %.0f s; killing it", self._proc.pid,
                      timeout_s)  # fmt: skip
            self._proc.kill()
            self._proc.join(5.0)
        if self._pump is not None:
            self._pump.join(5.0)

    def _receive(self) -> None:
        """The worker's side of the pipe: merge counters; stop the worker if the child ends
        without being asked to."""
        while True:
            try:
                if self._conn.poll(1.0):
                    self.counters.merge_hot(self._conn.recv())
                    continue
            except (EOFError, OSError):
                pass  # the child's end closed: it is ending
            else:
                if self._proc.is_alive():
                    continue
            self._proc.join(5.0)
            if not self._stopping.is_set():
                # Status 0: stopped by a signal of its own (often the same SIGTERM that is
                # stopping this worker); anything else: it failed.
                code = self._proc.exitcode
                log.log(logging.WARNING if code == 0 else logging.CRITICAL,
                        "hot stage process %d ended (exit status %s); stopping the worker",
                        self._proc.pid, code)  # fmt: skip
                os.kill(os.getpid(), signal.SIGTERM)
            return


def child_main(spec: HotSpec, conn: Any, parent_pid: int, loglevel: int) -> None:
    """The hot process: run the hot stage until asked to stop, reporting its counters."""
    gc_tuning.tune()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(
        level=loglevel, stream=sys.stderr,
        format="[%(asctime)s] [hot %(process)d] [%(levelname)s] %(name)s: %(message)s",
    )  # fmt: skip
    counters = StreamCounters()
    hot = spec.build(counters)
    signal.signal(signal.SIGTERM, lambda _sig, _frame: hot.request_stop())
    sent = [0]

    def report() -> None:
        update = counters.hot_update(sent[0])
        sent[0] = int(update["batches"])
        conn.send(update)

    def watch() -> None:
        while not hot.stopped():
            try:
                if conn.poll(REPORT_EVERY_S) and conn.recv() == "stop":
                    hot.request_stop()
                if os.getppid() != parent_pid:
                    log.warning("worker %d is gone; the hot stage stops", parent_pid)
                    hot.request_stop()
                report()
            except (EOFError, OSError):
                hot.request_stop()  # the worker's end closed

    watcher = threading.Thread(target=watch, name="peerwatch-hot-report", daemon=True)
    watcher.start()
    try:
        hot.run()
    except Exception:
        log.critical("hot stage failed; stopping the worker", exc_info=True)
        hot.request_stop()
        watcher.join(2 * REPORT_EVERY_S + 1.0)
        sys.exit(EXIT_FAILED)
    hot.request_stop()
    watcher.join(2 * REPORT_EVERY_S + 1.0)
    with contextlib.suppress(OSError, ValueError):
        report()  # the final counters
