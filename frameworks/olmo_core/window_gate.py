"""OLMo-core's data loader on a streamed window (``data.prefetch=stream``, :mod:`pretrain_exp.data.stream`): every
instance it reads waits until the window stream has fetched it into the window cache, where OLMo-core's dataset
reads it.

OLMo-core's ``NumpyFSLDataLoader`` reads each instance through its (private) ``_get_dataset_item(idx)``, in the
training process or in its data-loader workers; :func:`gate_loader` puts the stream's
:meth:`StreamGate.wait_instance <pretrain_exp.data.stream.StreamGate.wait_instance>` in front of it for this loader
object (a picklable ``functools.partial``, so workers carry it). The tokens OLMo-core reads are the same bytes;
only when it reads them changes.
"""

from __future__ import annotations

import functools

from pretrain_exp.frameworks.olmo_core import upstream


def _gated_item(original, loader, order, idx):
    order.gate.wait_instance(int(idx), order)
    return original(loader, idx)


def gate_loader(loader, order) -> None:
    """Make ``loader`` (an OLMo-core ``NumpyFSLDataLoader``) wait for ``order.gate`` before each instance it reads;
    nothing when the run streams no window (``order.gate`` is ``None``)."""
    if getattr(order, "gate", None) is None:
        return
    upstream.wrap_dataset_item(loader, lambda original: functools.partial(_gated_item, original, loader, order))
