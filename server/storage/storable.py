"""What the holding store needs of a message, and the codec that turns one into stored bytes.

The store is below the broker: it never imports the broker's message class. It reads a message through
:class:`Storable` and records where the message went on the message itself (``device``, ``chosen``,
``rule``: the three placement fields, written by the store only), so every layer above sees one answer
to "where is it". The bytes a device keeps come from a :class:`StoredCodec` the store is given when it
is made (the broker's is ``stored_form.STORED_CODEC``); nothing sets it afterwards.
"""
from __future__ import annotations

from typing import Any, Protocol


class StoredBlock(Protocol):
    """A queue's bulk block whose rows are settled in a catalog record (broker/blocks.py)."""

    holder: Any           # the Storable the block's rows are stored in
    queue: str
    stored: bool          # the holder is on a device with a reference for ``queue``
    recorded: bool        # a catalog record of settled rows exists

    def state(self) -> bytes: ...

    def delivered(self, message: Any, count: int) -> None: ...


class Storable(Protocol):
    """A message as the holding store reads it (the broker's ``BrokerMessage`` is one)."""

    key: int              # broker-wide unique, increasing at enqueue
    message_id: str
    destination: str
    seq: int
    persistent: bool
    size: int             # body bytes, what the store's figures count
    #: a row of a bulk block (its delivery count goes to the block's record), else None
    bulk: Any
    # -- the placement, written by the store only -----------------------------------------------------
    #: the device that holds it (the memory device: the heap; None: not placed, or forgotten)
    device: Any
    #: the device its rule chose (the admin figures count it there, even when the heap holds it)
    chosen: str | None
    #: the storage rule that chose it (None: no rule; the default choice or a fallback)
    rule: str | None


class StoredCodec(Protocol):
    """A message as the bytes a device keeps: whole, or as pieces whose concatenation they are (a large body
    stays the message's own bytes, never joined: the file device logs and pages it from them)."""

    def encode(self, message: Any) -> bytes: ...

    def encode_parts(self, message: Any) -> tuple[bytes, ...]: ...


class NoCodec:
    """The codec of a store that is never asked to encode a message (device-level tests, tools)."""

    def encode(self, message: Any) -> bytes:
        raise RuntimeError("this holding store was made without a codec (HoldingStore(codec=...))")

    def encode_parts(self, message: Any) -> tuple[bytes, ...]:
        return (self.encode(message),)
