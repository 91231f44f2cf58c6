"""The `StreamMessage` fields and reason codes the batch kernels check and stamp (spec/protocol.md,
"Batched data path"; spec/record-validity.md), as plain constants: `jit_batches.py` compiles them
into the kernels and `batches.py` tells clients about them, and neither side needs the other
(the broker's side imports no numba)."""

from __future__ import annotations

from danube.machines.wal import records

MSG_ID_FIELD = 2
PAYLOAD_FIELD = 3
ATTRIBUTES_FIELD = 7

STAMP_ROOM = 1 + 10 + 1 + 10
"""Most bytes stamping adds to a record besides the msg_id fields: the msg_id tag and length,
the offset's tag and varint."""

BAD_NONE = records.OK
BAD_MSG_ID = records.HAS_MSG_ID
"""A record carries a `msg_id`: the broker is the one that names a stored message."""
BATCH_FIELDS = records.MAX_FIELDS - records.MSG_ID_FIELDS
"""Most fields of a batch's record: stamped, it must still be one `records.decode` reads."""
# The other reason codes (`danube.machines.wal.records`), as the kernels' compile-time constants.
_TRUNCATED = records.TRUNCATED
_BAD_VARINT = records.BAD_VARINT
_BAD_TAG = records.BAD_TAG
_BAD_WIRE_TYPE = records.BAD_WIRE_TYPE
_WRONG_WIRE_TYPE = records.WRONG_WIRE_TYPE
_BAD_UTF8 = records.BAD_UTF8
_BAD_ENTRY = records.BAD_ENTRY
_TOO_MANY_FIELDS = records.TOO_MANY_FIELDS
_TOO_MANY_ATTRIBUTES = records.TOO_MANY_ATTRIBUTES
_MAX_ATTRIBUTES = records.MAX_ATTRIBUTES
