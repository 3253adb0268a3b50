"""CRC-32C (Castagnoli, the iSCSI polynomial 0x1EDC6F41, reflected 0x82F63B78) for the file device.

``crc32c(data, crc=0)`` continues a running checksum: ``crc32c(b, crc32c(a)) == crc32c(a + b)``; WAL
frames chain their checksums this way.  The ``google-crc32c`` package (hardware CRC32 instruction) is
used when installed; the table-driven fallback below gives the same answers, only slower, and is tested
against it and against the published check value ``crc32c(b"123456789") == 0xE3069283``.
"""
from __future__ import annotations


def _make_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _make_table()


def crc32c_fallback(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """Pure-Python CRC-32C; same contract as :func:`crc32c`."""
    table = _TABLE
    crc ^= 0xFFFFFFFF
    for byte in bytes(data):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


try:
    import google_crc32c as _google
except ImportError:  # pragma: no cover - exercised by running the suite without the package
    _google = None  # type: ignore[assignment]  # the module or None: mypy types the name as the module

if _google is not None and getattr(_google, "implementation", "c") == "c":
    _extend = _google.extend

    def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
        """CRC-32C of ``data``, continuing from ``crc`` (0 starts a new checksum)."""
        if type(data) is not bytes:      # the C binding takes read-only bytes only
            data = bytes(data)
        return _extend(crc, data)

    IMPLEMENTATION = "google-crc32c"
else:
    crc32c = crc32c_fallback
    IMPLEMENTATION = "python"
