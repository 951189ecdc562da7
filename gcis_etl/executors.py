"""Executors run ItemTasks and hand back ItemResults; `executor:` in config.yaml picks one.

- `local` (default, no broker): worker threads in this process sharing `concurrency` conversion child processes
  (isolation.py), each leased only while an item converts. Decoding and encoding happen only in those children,
  so this is a process pool where it matters; `transfer_slots` more threads fetch and deposit other items
  meanwhile, so that no child waits for a download or an upload.
- `celery`: tasks go to a broker and run on any number of machines (gcis_etl.worker).

The caller plans in its own thread (listing, ledger decisions) and submits one task at a time; submit waits
only while every slot is busy, so a backlog of millions of items streams through a bounded window. Once a slot
is free it asks `stopping()` again: the time limit may have passed, or a stop come, while it waited, and then
it sends nothing (the caller finds the task unanswered once drained: the next run does it).
"""
from __future__ import annotations

import queue
import threading
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator, Protocol

from gcis_etl.isolation import ChildPool
from gcis_etl.pipelines import Pipeline
from gcis_etl.work import ItemResult, ItemTask, Worker


class Executor(Protocol):
    def check(self) -> None:
        """Raise GcisError when no task could run (e.g. the broker is unreachable): called before any item."""

    def submit(self, task: ItemTask) -> list[ItemResult]:
        """Start `task` as soon as a slot is free, unless `stopping()` by then; return the results that finished
        meanwhile."""

    def drain(self) -> Iterator[ItemResult]:
        """The results of every task still running, as they finish."""

    def left_queued(self, pipeline: str) -> int:
        """The pipeline's tasks left to the workers, not started, once drain() ended a stopped run (its note)."""

    def close(self) -> None:
        """Release workers (after drain)."""


class LocalExecutor:
    def __init__(self, pipelines: dict[str, Pipeline], concurrency: int, scratch: Path, transfer_slots: int = 0,
                 stopping: Callable[[], bool] | None = None):
        self.pipelines = pipelines
        self.scratch = scratch
        self.stopping = stopping or (lambda: False)
        self._children = ChildPool(concurrency)
        self._todo: queue.Queue = queue.Queue()
        self._done: queue.Queue = queue.Queue()
        self._slots = threading.Semaphore(concurrency + transfer_slots)
        self._running = 0
        self._stopped: str | None = None  # set by a result that stops the run (see _work)
        self._threads = [threading.Thread(target=self._work, name=f"gcis-worker-{n}", daemon=True)
                         for n in range(concurrency + transfer_slots)]
        for thread in self._threads:
            thread.start()

    def check(self) -> None:
        """Its processes are its own: nothing to reach."""

    def submit(self, task: ItemTask) -> list[ItemResult]:
        self._slots.acquire()
        if self.stopping():  # came while it waited for the slot: the task is not sent
            self._slots.release()
        else:
            self._running += 1
            self._todo.put(task)
        return self._finished(block=False)

    def left_queued(self, pipeline: str) -> int:
        return 0  # a stop waits for every task it handed over, each with a thread of its own: all started

    def drain(self) -> Iterator[ItemResult]:
        while self._running:
            yield from self._finished(block=True)
        self._stopped = None  # every task is answered: the next ones start afresh

    def close(self) -> None:
        self._todo.join()  # no child is leased now; each lives until closed: close them first
        self._children.close()
        for _ in self._threads:
            self._todo.put(None)
        for thread in self._threads:
            thread.join()

    def _finished(self, block: bool) -> list[ItemResult]:
        results = []
        try:
            results.append(self._done.get(block=block))
            while True:
                results.append(self._done.get_nowait())
        except queue.Empty:
            pass
        self._running -= len(results)
        return results

    def _work(self) -> None:
        """Once a result stops the run (its source or store down, scratch full), the tasks handed over but not
        begun are answered with its reason, untried: they would only meet the same cause."""
        worker = Worker(self.pipelines, self.scratch, self._children)
        while (task := self._todo.get()) is not None:
            try:
                if self._stopped is not None:
                    self._done.put(replace(ItemResult.failed(task, self._stopped), stops_run=True))
                    continue
                result = worker.process(task)
                if result.stops_run:
                    self._stopped = result.reason
                self._done.put(result)
            finally:
                self._slots.release()
                self._todo.task_done()


def open_executor(kind: str, pipelines: dict[str, Pipeline], concurrency: int, scratch: Path,
                  transfer_slots: int, stopping: Callable[[], bool] | None = None) -> Executor:
    """`stopping()` true (a stop asked for, the run's time up: Harvest.stopping), no task is sent, not even one
    that waited in submit for a slot while it became true, and the run waits only for what has started: Celery
    leaves a task still in its queue there. The local executor has nothing to leave: each task it holds has a
    thread of its own, free when the task was handed over, so all have started."""
    if kind == "celery":
        from gcis_etl.worker import CeleryExecutor
        return CeleryExecutor(pipelines, concurrency, scratch, stopping=stopping)
    return LocalExecutor(pipelines, concurrency, scratch, transfer_slots, stopping)
