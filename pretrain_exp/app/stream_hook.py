"""The window stream in the segment loop (``data.prefetch=stream``, :mod:`pretrain_exp.data.stream`).

The run is prepared with a :class:`~pretrain_exp.data.stream.WindowStream` that is not started
(:func:`~pretrain_exp.app.prepare.prepare`); :class:`StreamHook` starts it in ``pre_train`` (one stream per node: on
local rank 0; every rank's reads of the window wait on its gate from there) and stops it in ``on_error`` and
``close``.
"""

from __future__ import annotations

from typing import Optional

from pretrain_exp.app.hooks import RunHook
from pretrain_exp.core.distributed import local_rank
from pretrain_exp.core.phases import PHASES
from pretrain_exp.data.stream import WindowStream

#: seconds ``close`` lets a stream finish writing its last progress record (it has fetched the whole window by the end
#: of a run) before it is stopped
FINISH_WAIT_S = 10.0


class StreamHook(RunHook):
    """The hook of the window stream (module docstring).

    :param stream: the prepared stream (``None``: no stream; every hook is a no-op).
    :param order: the run's :class:`~pretrain_exp.data.order.DataOrder` (its ``gate`` is set in ``pre_train``).
    """

    def __init__(self, stream: Optional[WindowStream], order):
        self.stream, self.order = stream, order

    def pre_train(self) -> None:
        """Start the stream (local rank 0) and make every reader of the window wait for it."""
        if self.stream is None:
            return
        with PHASES.phase("prefetch", mode="stream"):
            if local_rank() == 0:
                self.stream.start()
            self.order.gate = self.stream.gate()

    def on_error(self, exc: BaseException) -> None:
        """A failed run stops its stream at once."""
        if self.stream is not None:
            self.stream.close()

    def close(self) -> None:
        """Stop the stream (after at most :data:`FINISH_WAIT_S` seconds for it to finish)."""
        if self.stream is not None:
            self.stream.close(FINISH_WAIT_S)
