"""The storage contract (portable_ckpt.testing.storage.StorageTests) on the local backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from portable_ckpt.errors import StorageError
from portable_ckpt.storage.base import Storage
from portable_ckpt.storage.faults import Fault, FaultyStorage
from portable_ckpt.storage.local import LocalStorage
from portable_ckpt.testing.storage import StorageTests, payload


class TestLocalStorage(StorageTests):
    writes_in_place = True  # an attempt's directory is private to its writer

    @pytest.fixture
    def store(self, tmp_path: Path) -> Storage:
        return LocalStorage(tmp_path / "root", create=True)


class TestFaultyStorage(StorageTests):
    """The fault-injecting wrapper passes the contract through (a fault that fires, fails nothing)."""

    writes_in_place = True

    @pytest.fixture
    def store(self, tmp_path: Path) -> FaultyStorage:
        return FaultyStorage(LocalStorage(tmp_path / "root", create=True), [Fault(error=None)])

    def test_injected_failures_are_storage_errors(self, store: FaultyStorage) -> None:
        """Contract: "any other I/O failure" is a StorageError, whatever the operation."""
        store.put("v/obj", payload(100))
        store.faults[:] = [
            Fault(op="read", error="EIO", times=1),
            Fault(op="write", error="ENOSPC"),
        ]
        with pytest.raises(StorageError, match="injected"):
            store.read_range("v/obj", 0, 10)
        assert store.read_range("v/obj", 0, 10) == payload(100)[:10]  # once only
        with pytest.raises(StorageError, match="No space left"):
            store.put("v/full", payload(10))
        assert not store.exists("v/full")
