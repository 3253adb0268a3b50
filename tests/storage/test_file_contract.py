"""The HoldingDevice contract (tests/storage/contract.py) run against the file device."""
from __future__ import annotations

import pytest

from pymq_server.storage.file import FileDevice
from tests.storage import contract


@pytest.mark.parametrize("page_size", [4096, 65536], ids=["4k", "64k"])
@pytest.mark.parametrize("check", contract.CHECKS, ids=lambda f: f.__name__)
def test_file_contract(check, page_size, tmp_path):
    check(lambda: FileDevice("file", tmp_path / "store", page_size=page_size))


@pytest.mark.parametrize("check", contract.CHECKS, ids=lambda f: f.__name__)
def test_file_contract_with_a_cold_index(check, tmp_path):
    """Every message but the newest two in the index's cold arrays (index.py)."""
    check(lambda: FileDevice("file", tmp_path / "store", page_size=4096, index_hot=2))
