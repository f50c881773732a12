"""A run component for tests that need a run to outlast a time limit on any machine: it sleeps after each segment
but the last (``hooks=[tests.slow_segments:SlowSegments]``). ``hooks`` may change between invocations of one run,
so the re-run that resumes it leaves the component out."""

from __future__ import annotations

import time

from pretrain_exp.app.hooks import RunHook

SLEEP_S = 60.0  #: seconds slept after each segment but the last


class SlowSegments(RunHook):
    """Sleeps :data:`SLEEP_S` seconds after each segment's checkpoint but the last (a signal ends the sleep as it
    would end training)."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx

    def post_segment(self, ckpt, final: bool) -> None:
        if not final:
            time.sleep(SLEEP_S)
