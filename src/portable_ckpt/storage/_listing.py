"""Listings from one scan: ``list`` and ``list_foreign`` shared by the bundled backends."""

from __future__ import annotations

import abc
import builtins
from collections.abc import Iterable, Iterator

from portable_ckpt.storage.base import ObjectInfo, Storage

__all__ = ["ListingEntry", "ScannedStorage"]

#: One scanned entry: ``(object, None)`` for a listed object, ``(None, name)`` for a foreign one.
ListingEntry = tuple[ObjectInfo | None, str | None]


class ScannedStorage(Storage):
    """A backend whose listings come from one scan that classifies every entry once.

    :meth:`list` and :meth:`list_foreign` are the two halves of :meth:`_scan`, so an entry is
    either listed or reported foreign (see :func:`~portable_ckpt.storage.base.well_formed`),
    never both and never neither.
    """

    @abc.abstractmethod
    def _scan(self, prefix: str, *, recursive: bool) -> Iterable[ListingEntry]:
        """Every entry under ``prefix``, each classified as an object or as foreign."""

    def list(self, prefix: str = "", *, recursive: bool = True) -> Iterator[ObjectInfo]:
        """List the objects under ``prefix``; foreign entries are skipped."""
        for info, _ in self._scan(prefix, recursive=recursive):
            if info is not None:
                yield info

    def list_foreign(self, prefix: str = "", *, recursive: bool = True) -> builtins.list[str]:
        """Entries under ``prefix`` that :meth:`list` skips as foreign."""
        return [name for _, name in self._scan(prefix, recursive=recursive) if name is not None]
