"""What an export sees of a portable version: ``--select``, ``--strip-prefix``, ``--dtype``.

:class:`ExportView` presents the selected tensors and entries under their exported names (a
prefix stripped) and reads tensors cast to the export dtype, so every writer (HF, DCP, torch.save)
gets the same selection without knowing about it. Nothing is read until a writer reads a box.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any

import numpy as np

from portable_ckpt.convert._model import ConvertOptions
from portable_ckpt.errors import UsageError
from portable_ckpt.format.dtypes import DTYPES
from portable_ckpt.format.keys import (
    DCP_ITEMS_ENTRY,
    VALUES_ENTRY,
    DcpPath,
    JsonTree,
    dcp_fqn,
    dcp_items_value,
    recorded_items,
    split_key,
)

__all__ = ["FLOAT_DTYPES", "ExportView", "parse_dtype"]

#: Dtypes ``--dtype`` casts; integer, bool and 8-bit float (quantised) tensors keep theirs.
FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})
_ALIASES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
    "fp64": "float64",
    "double": "float64",
}


def parse_dtype(text: str) -> str:
    """Return the format dtype name of ``--dtype`` (``bf16``, ``float16``, ``fp32``, ...).

    Raises:
        UsageError: not a floating-point dtype ``--dtype`` can cast to.

    """
    name = _ALIASES.get(text.lower(), text.lower())
    if name not in FLOAT_DTYPES:
        raise UsageError(
            f"--dtype {text!r}: use one of bf16, fp16, fp32, fp64 (or bfloat16, float16, "
            "float32, float64); integer and bool tensors keep their dtype"
        )
    return name


@dataclass(frozen=True)
class _Tensor:
    """A tensor as exported: its name, dtype, shape and the stored range records."""

    key: str
    source_key: str
    dtype: str
    shape: tuple[int, ...]
    ranges: Any

    @property
    def numpy_dtype(self) -> np.dtype[Any]:
        """The numpy dtype of the exported elements."""
        return DTYPES[self.dtype].numpy

    @property
    def nbytes(self) -> int:
        """Bytes of the exported elements."""
        n = DTYPES[self.dtype].itemsize
        for d in self.shape:
            n *= d
        return n


class ExportView:
    """A portable version filtered, renamed and cast for export (see the module docstring).

    ``--select`` globs and ``--strip-prefix`` apply to the stored keys (as ``portable-ckpt
    inspect`` lists them). With ``dotted`` the exported names are DCP's FQNs of the keys (their
    components joined with ``.``: ``model/layers.0.weight`` → ``model.layers.0.weight``, as a
    nested module's ``state_dict()`` names them) — what safetensors consumers expect.

    Raises:
        UsageError: two selected names collide once renamed, or nothing matches.

    """

    def __init__(self, ck: Any, options: ConvertOptions, *, dotted: bool = False) -> None:
        self._ck = ck
        self._dotted = dotted
        self._patterns = options.select
        self._strip = options.strip_prefix or ""
        self._dtype = options.dtype
        self.tensors: dict[str, _Tensor] = {}
        self.entries: dict[str, Any] = {}
        self._entry_source: dict[str, str] = {}
        taken: dict[str, str] = {}
        for key in sorted(ck.tensors):
            name = self._name(key)
            if name is not None:
                info = ck.tensors[key]
                dtype = self._dtype if self._dtype and info.dtype in FLOAT_DTYPES else info.dtype
                self._claim(taken, name, key)
                self.tensors[name] = _Tensor(name, key, dtype, tuple(info.shape), info.ranges)
        self._values: dict[str, Any] = {}  # entry name -> value as exported (JSON leaves)
        for ename in sorted(ck.entries):
            if ename == DCP_ITEMS_ENTRY:
                continue  # follows what is exported (below)
            if ename == VALUES_ENTRY and (self._patterns or self._strip) and self._leaves(ck, taken):
                if ename in self.entries:
                    self._claim(taken, ename, ename)
                continue
            name = self._name(ename, tensor=False)
            if name is not None:
                self._claim(taken, name, ename)
                self.entries[name] = ck.entries[ename]
                self._entry_source[name] = ename
        self._record(ck)
        if self._patterns and not taken:
            raise UsageError(
                f"--select {' '.join(self._patterns)} matches no tensor or entry of {ck.path}; "
                "see `portable-ckpt inspect` for the keys"
            )

    def _leaves(self, ck: Any, taken: dict[str, str]) -> bool:
        """Export ``torch.values`` leaf by leaf (``False``: not a leaf table, taken whole).

        Each leaf's key is a stored key that ``--select`` and ``--strip-prefix`` apply to, as to
        a tensor's; ``--select torch.values`` takes every leaf. Two leaves, or a leaf and a
        tensor, exported under one name are refused as two tensors are.
        """
        e = ck.entries[VALUES_ENTRY]
        stored = ck.entry(VALUES_ENTRY) if e.scope == "global" else None
        if not isinstance(stored, dict):
            return False
        whole = any(fnmatch.fnmatchcase(VALUES_ENTRY, p) for p in self._patterns)
        kept: dict[str, Any] = {}
        for k, v in stored.items():
            name = self._strip_key(k) if whole else self._name(k, tensor=False)
            if name is not None:
                self._claim(taken, name, k)
                kept[name] = v
        if kept:
            self.entries[VALUES_ENTRY] = e
            self._entry_source[VALUES_ENTRY] = VALUES_ENTRY
            self._values[VALUES_ENTRY] = kept
        return True

    def _record(self, ck: Any) -> None:
        """``torch.dcp_items`` for what is exported: its paths renamed, those of nothing gone."""
        e = ck.entries.get(DCP_ITEMS_ENTRY)
        if e is None or e.scope != "global":
            return
        if not (self._patterns or self._strip):
            self.entries[DCP_ITEMS_ENTRY] = e
            self._entry_source[DCP_ITEMS_ENTRY] = DCP_ITEMS_ENTRY
            return
        record = recorded_items(ck)
        if record is None:
            return
        leaves = JsonTree(self._values.get(VALUES_ENTRY, {}))  # what is exported, by container
        names = {t.source_key: n for n, t in self.tensors.items()}
        paths: list[DcpPath] = []
        for key, path in record.items():
            new = names.get(key) if key in ck.tensors else self._strip_key(key)
            if new is None or (key not in ck.tensors and new not in leaves):
                continue
            comps = split_key(new) if key not in ck.tensors or not self._dotted else [new]
            tail = path[len(path) - len(comps) :] if len(comps) <= len(path) else ()
            paths.append(tuple(
                old if type(old) is int and str(old) == c else c
                for c, old in zip(comps, tail or comps, strict=True)
            ))
        if paths or VALUES_ENTRY in self.entries:
            self.entries[DCP_ITEMS_ENTRY] = e
            self._entry_source[DCP_ITEMS_ENTRY] = DCP_ITEMS_ENTRY
            self._values[DCP_ITEMS_ENTRY] = dcp_items_value(paths)

    def _strip_key(self, key: str) -> str:
        if self._strip and key.startswith(self._strip) and len(key) > len(self._strip):
            return key[len(self._strip) :]
        return key

    def _name(self, key: str, *, tensor: bool = True) -> str | None:
        if self._patterns and not any(fnmatch.fnmatchcase(key, p) for p in self._patterns):
            return None
        key = self._strip_key(key)
        return dcp_fqn(key) if self._dotted and tensor else key

    @staticmethod
    def _claim(taken: dict[str, str], name: str, key: str) -> None:
        prev = taken.setdefault(name, key)
        if prev != key:
            raise UsageError(
                f"{prev!r} and {key!r} are both exported as {name!r}; --select one of them"
            )

    @property
    def path(self) -> str:
        """The version's location."""
        return str(self._ck.path)

    @property
    def step(self) -> int:
        """The version's step."""
        return int(self._ck.step)

    @property
    def continuation(self) -> Any:
        """The version's continuation record."""
        return self._ck.continuation

    def read(
        self, key: str, offsets: Any = None, lengths: Any = None
    ) -> np.ndarray[Any, Any]:
        """Read a box of exported tensor ``key``, in its exported dtype."""
        t = self.tensors[key]
        arr: np.ndarray[Any, Any] = self._ck.read(t.source_key, offsets, lengths)
        if DTYPES[t.dtype].numpy != arr.dtype:
            arr = arr.astype(DTYPES[t.dtype].numpy)
        return arr

    def entry(self, name: str, rank: int | None = None, world_size: int | None = None) -> Any:
        """The value of exported entry ``name`` (as :meth:`Checkpoint.entry`)."""
        if name in self._values:
            return self._values[name]
        return self._ck.entry(self._entry_source[name], rank=rank, world_size=world_size)

    def source_key(self, name: str) -> str:
        """The stored key of an exported tensor or entry name."""
        t = self.tensors.get(name)
        return t.source_key if t is not None else self._entry_source[name]
