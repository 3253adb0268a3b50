"""The file device: a paged store with a write-ahead log (seed 002).  See ``format.py`` for the bytes."""
from .device import DEFAULT_CHECKPOINT_BYTES, DEFAULT_PAGE_SIZE, FileDevice

__all__ = ["FileDevice", "DEFAULT_PAGE_SIZE", "DEFAULT_CHECKPOINT_BYTES"]
