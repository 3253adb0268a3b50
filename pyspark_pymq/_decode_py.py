"""MESSAGE frames of a range read -> one Arrow record batch of the read schema, without making a Message.

The reference semantics (spec/spark.md §4) of the per-message read path; ``_ext/arrow_decode.pyx``
(``pyspark_pymq._decode_c``) computes the same batch from the same frames by writing Arrow buffers
directly, and tests/spark/test_decode.py runs both on the same good and hostile input.  A frame is the
``(headers, body)`` pair the SDK keeps with ``read_range(frames=True)``: headers already unescaped,
body the bytes between the blank line and the NUL.

Rules, column by column (the Spark types are those of ``pyspark_pymq._arrow.READ_FIELDS``):

* every header name and value is text UTF-8 can carry, checked first in each row (a value that is not a
  ``str``: TypeError; a lone surrogate: MessageFormatError naming the header);
* ``offset`` is ``pymq-seq``, required; integers follow ``pymq.protocol.numbers`` (digits only, at most
  19, bounded), so a bad one is the same ``InvalidHeader`` whichever twin decodes it;
* ``value`` is the body as sent, whatever its kind and charset (a map body keeps its JSON wire form), so
  the per-message path and the Arrow path (spec/spark.md §5) give the same bytes;
* ``bodyType`` follows ``content-type`` as ``pymq.message.from_frame`` does (map, text, bytes; without a
  content-type, text when the body is valid UTF-8);
* ``timestamp`` / ``expiration`` are ms on the wire, µs in Arrow; ``expires`` 0 is null;
* ``properties`` are the other headers (not the reserved JMS and protocol ones, not JMSXGroupID, which is
  ``key``), their text as sent.
"""
from __future__ import annotations

import struct
from collections.abc import Sequence

import pyarrow as pa

from pymq.errors import MessageFormatError
from pymq.message import RESERVED_HEADERS, content_body_type
from pymq.protocol.numbers import INT32_MAX, INT64_MAX, header_int, parse_wire_int
from pyspark_pymq._arrow import CREATE_TIME, arrow_schema

#: the largest ms value whose µs still fit an int64
MAX_MS = INT64_MAX // 1000
#: headers that are never properties: the JMS header fields and protocol machinery, and the group (``key``)
NOT_PROPERTIES = frozenset(RESERVED_HEADERS | {"JMSXGroupID"})
#: content kinds; the strings are the ``bodyType`` column's values
TEXT, BYTES, MAP = "text", "bytes", "map"
#: a variable-width Arrow column (int32 offsets) holds less than 2 GiB
MAX_COLUMN_BYTES = (1 << 31) - 1
_DESTINATION_PREFIXES = ("/queue/", "/topic/", "/temp-queue/")
_SCHEMAS = {False: arrow_schema(False), True: arrow_schema(True)}
_END = struct.Struct("<i")            # a binary or string column's last int32 offset: its data size


def content_kind(content_type: str | None, transformation: str | None) -> str | None:
    """The ``bodyType`` a ``content-type`` header gives; None means "decide by the body" (no content-type:
    text when the body is valid UTF-8).  The rule of ``pymq.message.from_frame``."""
    return content_body_type(content_type, transformation)


def body_kind(body: bytes) -> str:
    """The ``bodyType`` of a body that came without a content-type."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return BYTES
    return TEXT


def check_text(headers: dict) -> None:
    """Every header name and value of a frame is text that UTF-8 can carry, checked before anything else
    of the row: a value that is not a ``str`` is a TypeError, one holding a lone surrogate (the SDK's
    scanner never makes one, but a caller may pass any dict) a MessageFormatError naming the header.
    Both twins raise the same error for the same row whatever else is wrong in it (the compiled one used
    to meet it wherever it first encoded the value, the twin at the end)."""
    for name, value in headers.items():
        if type(name) is not str or type(value) is not str:
            raise TypeError(f"a frame's header names and values must be str, not {type(name).__name__}: "
                            f"{type(value).__name__}")
        if not (name.isascii() and value.isascii()):
            try:
                name.encode("utf-8")
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise MessageFormatError(f"header {name!r} of a MESSAGE is not valid Unicode text (it holds a "
                                         f"lone surrogate)") from None


def _flag(value: str | None, word: str) -> bool:
    return value is not None and value.lower() == word


def _seq(headers: dict) -> int:
    raw = headers.get("pymq-seq")
    if raw is None or raw == "":
        raise MessageFormatError("a MESSAGE of a range read has no 'pymq-seq' header")
    return parse_wire_int("pymq-seq", raw)


def too_large(column: str) -> str:
    return (f"column '{column}' of one Arrow batch would hold more than the 2 GiB an Arrow binary or string "
            f"column can; decode fewer messages at once")


def _array(values: list, arrow_type: pa.DataType, column: str) -> pa.Array:
    array = pa.array(values, arrow_type)
    # pyarrow splits what one array cannot hold into chunks; below that, the offsets say the size
    if isinstance(array, pa.ChunkedArray) or (len(array) and _END.unpack_from(
            array.buffers()[1], 4 * (array.offset + len(array)))[0] > MAX_COLUMN_BYTES):
        raise MessageFormatError(too_large(column))
    return array


def frames_to_batch(frames: Sequence[tuple[dict, bytes]], destination: str, kind: str,
                    include_properties: bool) -> pa.RecordBatch:
    """One record batch, a row per frame in order."""
    n = len(frames)
    seqs, ids, corrs, keys, values, body_types = [], [], [], [], [], []
    stamps, expires, prios, modes, redelivered, counts, reply_tos, types = [], [], [], [], [], [], [], []
    props = []
    kinds: dict[tuple, str | None] = {}
    total_value = 0
    for headers, body in frames:
        if type(headers) is not dict:
            raise TypeError(f"a frame's headers must be a dict, not {type(headers).__name__}")
        check_text(headers)
        seqs.append(_seq(headers))
        ids.append(headers.get("message-id"))
        corrs.append(headers.get("correlation-id"))
        group = headers.get("JMSXGroupID")
        keys.append(None if group is None else group.encode("utf-8"))
        ctype, transformation = headers.get("content-type"), headers.get("transformation")
        body_type = kinds.get((ctype, transformation), False)
        if body_type is False:
            body_type = kinds[(ctype, transformation)] = content_kind(ctype, transformation)
        value = bytes(body)
        total_value += len(value)
        values.append(value)
        body_types.append(body_kind(value) if body_type is None else body_type)
        stamps.append(header_int(headers, "timestamp", 0, maximum=MAX_MS) * 1000)
        expiry = header_int(headers, "expires", 0, maximum=MAX_MS)
        expires.append(expiry * 1000 if expiry else None)
        prios.append(header_int(headers, "priority", 4, maximum=9))
        modes.append(1 if _flag(headers.get("persistent"), "false") else 2)
        redelivered.append(_flag(headers.get("redelivered"), "true"))
        counts.append(header_int(headers, "JMSXDeliveryCount", 1, maximum=INT32_MAX))
        reply = headers.get("reply-to")
        reply_tos.append(reply if reply is not None and reply.startswith(_DESTINATION_PREFIXES) else None)
        types.append(headers.get("type"))
        if include_properties:
            props.append([(k, v) for k, v in headers.items() if k not in NOT_PROPERTIES])
    if total_value > MAX_COLUMN_BYTES:
        raise MessageFormatError(too_large("value"))
    ts = pa.timestamp("us", tz="UTC")
    value_column = _array(values, pa.binary(), "value")
    columns = [
        pa.repeat(pa.scalar(destination, pa.string()), n),
        pa.repeat(pa.scalar(kind, pa.string()), n),
        pa.repeat(pa.scalar(0, pa.int32()), n),
        pa.array(seqs, pa.int64()),
        _array(ids, pa.string(), "messageId"),
        _array(corrs, pa.string(), "correlationId"),
        _array(keys, pa.binary(), "key"),
        value_column,
        _array(body_types, pa.string(), "bodyType"),
        pa.array(stamps, ts),
        pa.repeat(pa.scalar(CREATE_TIME, pa.int32()), n),
        pa.array(expires, ts),
        pa.array(prios, pa.int32()),
        pa.array(modes, pa.int32()),
        pa.array(redelivered, pa.bool_()),
        pa.array(counts, pa.int32()),
        _array(reply_tos, pa.string(), "replyTo"),
        _array(types, pa.string(), "type"),
    ]
    if include_properties:
        columns.append(pa.array(props, pa.map_(pa.string(), pa.string())))
    return pa.RecordBatch.from_arrays(columns, schema=_SCHEMAS[include_properties])
