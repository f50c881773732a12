"""The one retry policy of the project: exponential backoff with random jitter.

Every remote read (checkpoint downloads in ``frameworks/download.py``, token-file sizes and byte ranges in
``pretrain_exp/data/remote.py``) retries transient failures (connection errors, timeouts, HTTP 5xx/408/429,
short reads) with the same rule: before retry ``k`` (1-based) sleep ``min(max_delay, base * 2**(k-1))`` plus up
to half of that again as jitter, so many clients that failed together do not retry in lockstep.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, TypeVar

log = logging.getLogger(__name__)

MAX_DELAY_S = 60.0  #: cap of one backoff sleep before jitter, seconds

T = TypeVar("T")


class TransientError(Exception):
    """A failure worth retrying (connection error, timeout, 5xx/408/429, short read); the message says which."""


def backoff_delay(failures: int, base_delay_s: float, max_delay_s: float = MAX_DELAY_S) -> float:
    """Sleep before retry number ``failures`` (1-based), seconds: ``min(max_delay_s, base * 2**(failures-1))``
    plus up to half of that again as random jitter, so consecutive sleeps strictly grow until the cap."""
    delay = min(max_delay_s, base_delay_s * 2 ** (failures - 1))
    return delay + random.uniform(0.0, delay / 2)


@dataclass
class RetryPolicy:
    """How often and how long to retry :class:`TransientError` failures.

    :param max_retries: retries allowed after consecutive failed attempts (0 = try once).
    :param base_delay_s: first backoff sleep, seconds; doubles per consecutive failure, plus <= 50 % jitter.
    :param max_delay_s: cap of one sleep before jitter, seconds.
    :param sleep: called with each delay in seconds (inject a recorder in tests).
    """

    max_retries: int = 5
    base_delay_s: float = 1.0
    max_delay_s: float = MAX_DELAY_S
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)

    def delay(self, failures: int) -> float:
        """The sleep before retry ``failures`` (1-based), seconds (:func:`backoff_delay`)."""
        return backoff_delay(failures, self.base_delay_s, self.max_delay_s)

    def call(self, attempt: Callable[[], T], *, what: str, give_up: Callable[[int, Exception], Exception],
             progress: Optional[Callable[[], int]] = None) -> T:
        """Run ``attempt()`` until it returns, retrying on :class:`TransientError` with backoff.

        :param attempt: one try; raises :class:`TransientError` for a failure worth retrying, anything else
            propagates at once (a 404 is not retried).
        :param what: names the operation in the warning logged before each retry (no credentials in it).
        :param give_up: ``(failures, last error) -> exception`` raised once ``max_retries`` retries failed.
        :param progress: optional counter (e.g. bytes on disk); an attempt that raised it resets the count of
            consecutive failures, so a long transfer survives many drops as long as each one makes progress.
        :returns: what ``attempt`` returned.
        """
        failures = 0
        while True:
            before = progress() if progress is not None else 0
            try:
                return attempt()
            except TransientError as e:
                if progress is not None and progress() > before:
                    failures = 0
                failures += 1
                if failures > self.max_retries:
                    raise give_up(failures, e) from None
                delay = self.delay(failures)
                log.warning("%s: %s; retry %d/%d in %.1f s", what, e, failures, self.max_retries, delay)
                self.sleep(delay)
