"""`CacheUpkeep`: closed sessions' outputs added to their `ResponseCache` on a thread of their own.

Contract: `submit(cache, tokens)` copies the tokens, queues them and returns at once
(`submit_many(cache, documents)`: several documents, added in one `ResponseCache.add_many`); one
worker thread (a single-worker `concurrent.futures` executor, started on first use) adds them in
submission order and then calls `after()` (the proposer builds its snapshot of the sources there,
so the next proposal finds it ready). A proposal meanwhile reads the snapshot it already had.
`wait(timeout=None) -> bool` is True once everything submitted before the call is added. An add
that fails is logged and its documents counted (`failures`); the cache stays as before it (`ResponseCache.add`
swaps its state in only at its end), and later adds go on. At interpreter exit the executor
finishes the queued adds.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Callable

from ..tokenids import as_tokens

__all__ = ["CacheUpkeep"]

log = logging.getLogger(__name__)


class CacheUpkeep:
    def __init__(self, after: Callable[[], object] | None = None):
        self._after = after
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._last: Future | None = None
        self.failures = 0

    def submit(self, cache, tokens) -> None:
        self.submit_many(cache, [tokens])

    def submit_many(self, cache, documents) -> None:
        docs = [as_tokens(d).copy() for d in documents]  # the caller may reuse its buffers
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="suffixspec-cache-upkeep")
            self._last = self._executor.submit(self._add, cache, docs)

    def _add(self, cache, docs) -> None:
        try:
            cache.add_many(docs)
            if self._after is not None:
                self._after()
        except Exception:  # noqa: BLE001 - one output's failure must not stop the upkeep
            log.exception("adding closed sessions' outputs to the response cache failed")
            with self._lock:
                self.failures += len(docs)

    def wait(self, timeout: float | None = None) -> bool:
        with self._lock:
            last = self._last
        if last is None:
            return True
        wait_futures([last], timeout)
        return last.done()
