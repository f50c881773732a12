"""Read back an offline W&B run's ``run-<id>.wandb`` transaction log as wandb's own protobuf ``Record`` messages.

The file is W&B's LevelDB-style log (what ``wandb sync`` replays): a 7-byte file header (``:W&B``, magic 0xBEE1,
version 0), then 32 KiB blocks of chunks, each with a 7-byte header (crc32, length ``uint16``, type: 1 full,
2 first, 3 middle, 4 last) and a slice of one serialized ``wandb_internal_pb2.Record``; a block tail shorter than
a header is zero padding. wandb 0.31 reads it only in its Go core, so this walks the framing and leaves the
decoding to wandb's generated protobuf classes.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Dict, Iterator, List

BLOCK, HEADER = 32768, 7


def records(path: Path) -> Iterator:
    """Every ``Record`` of the log at ``path`` in write order.

    :raises ValueError: for a file that is not a W&B transaction log, or a chunk sequence that breaks off.
    """
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:HEADER])
    if ident != b":W&B" or magic != 0xBEE1:
        raise ValueError(f"{path}: not a W&B transaction log (header {data[:HEADER]!r})")
    pos, parts = HEADER, []
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the block's zero-padded tail
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0 and length == 0:  # preallocated space at the end
            break
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind in (1, 2):
            parts = [chunk]
        elif kind in (3, 4) and parts:
            parts.append(chunk)
        else:
            raise ValueError(f"{path}: chunk of type {kind} at byte {pos} out of sequence")
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(b"".join(parts))
            parts = []
            yield rec


def history(path: Path) -> List[Dict[str, object]]:
    """The run's ``wandb.log`` rows (``_step`` included), values JSON-decoded."""
    out = []
    for rec in records(path):
        if rec.WhichOneof("record_type") == "history":
            out.append({(it.key or "/".join(it.nested_key)): json.loads(it.value_json) for it in rec.history.item})
    return out


def of_type(path: Path, kind: str) -> list:
    """The records of one type (``run``, ``metric``, ``artifact``, ...): their payload messages."""
    return [getattr(r, kind) for r in records(path) if r.WhichOneof("record_type") == kind]
