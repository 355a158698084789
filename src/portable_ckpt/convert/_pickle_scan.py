"""A symbolic pickle reader that never imports or calls anything.

``torch.save`` stores a tensor as a zip whose ``data.pkl`` is a tiny pickle describing a call to
``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)``. To read the chunk bytes
of a DCP checkpoint without importing torch (which alone costs ~270 MiB of RSS) and without
executing pickle code, this module interprets the pickle opcodes on a stack machine that only
builds inert values: ``GLOBAL`` becomes a :class:`Global` name, ``REDUCE``/``NEWOBJ`` become a
:class:`Call` record, ``BINPERSID`` becomes a :class:`PersistentId`. No module is imported and no
callable is ever invoked, so a hostile pickle can at worst be rejected.
"""

from __future__ import annotations

import pickletools
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Call", "Global", "PersistentId", "PickleScanError", "scan_pickle"]


class PickleScanError(ValueError):
    """The pickle uses an opcode or structure this reader does not interpret."""


@dataclass(frozen=True)
class Global:
    """A reference to ``module.name`` (never resolved)."""

    module: str
    name: str

    @property
    def qualname(self) -> str:
        """Return ``"module.name"``."""
        return f"{self.module}.{self.name}"


@dataclass
class Call:
    """A deferred ``func(*args)`` with the state a ``BUILD`` opcode attached."""

    func: Any
    args: tuple[Any, ...]
    state: Any = None
    items: list[Any] = field(default_factory=list)
    setitems: list[tuple[Any, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class PersistentId:
    """The argument of a ``BINPERSID`` opcode (torch: ``('storage', type, key, loc, numel)``)."""

    value: Any


class _Mark:
    pass


_MARK = _Mark()
_MAX_OPS = 1_000_000


def _pop_mark(stack: list[Any]) -> list[Any]:
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is _MARK:
            items = stack[i + 1 :]
            del stack[i:]
            return items
    raise PickleScanError("MARK missing")


def scan_pickle(data: bytes) -> Any:
    """Interpret ``data`` symbolically and return the top-level value.

    Raises:
        PickleScanError: unknown opcode, malformed stream or too many operations.

    """
    stack: list[Any] = []
    memo: dict[int, Any] = {}
    count = 0
    try:
        ops = pickletools.genops(data)
        for op, arg, _pos in ops:
            count += 1
            if count > _MAX_OPS:
                raise PickleScanError("pickle too long")
            name = op.name
            if name in ("PROTO", "FRAME"):
                continue
            if name == "STOP":
                if len(stack) != 1:
                    raise PickleScanError("stack not balanced at STOP")
                return stack[0]
            if name == "GLOBAL":
                module, _, attr = str(arg).partition(" ")
                stack.append(Global(module, attr))
            elif name == "STACK_GLOBAL":
                attr = stack.pop()
                module = stack.pop()
                if not isinstance(module, str) or not isinstance(attr, str):
                    raise PickleScanError("STACK_GLOBAL with non-string names")
                stack.append(Global(module, attr))
            elif name in (
                "SHORT_BINUNICODE",
                "BINUNICODE",
                "BINUNICODE8",
                "UNICODE",
                "SHORT_BINSTRING",
                "BINSTRING",
                "STRING",
                "BININT",
                "BININT1",
                "BININT2",
                "LONG1",
                "LONG4",
                "BINFLOAT",
                "FLOAT",
                "SHORT_BINBYTES",
                "BINBYTES",
                "BINBYTES8",
            ):
                stack.append(arg)
            elif name == "INT":
                stack.append(arg)
            elif name == "NONE":
                stack.append(None)
            elif name == "NEWTRUE":
                stack.append(True)
            elif name == "NEWFALSE":
                stack.append(False)
            elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
                memo[int(arg)] = stack[-1]  # type: ignore[arg-type]
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif name in ("BINGET", "LONG_BINGET", "GET"):
                try:
                    stack.append(memo[int(arg)])  # type: ignore[arg-type]
                except KeyError:
                    raise PickleScanError(f"memo key {arg} missing") from None
            elif name == "MARK":
                stack.append(_MARK)
            elif name == "TUPLE":
                stack.append(tuple(_pop_mark(stack)))
            elif name == "EMPTY_TUPLE":
                stack.append(())
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                n = int(name[-1])
                items = stack[-n:]
                del stack[-n:]
                stack.append(tuple(items))
            elif name == "EMPTY_LIST":
                stack.append([])
            elif name == "EMPTY_DICT":
                stack.append({})
            elif name == "LIST":
                stack.append(_pop_mark(stack))
            elif name == "DICT":
                items = _pop_mark(stack)
                stack.append(_pairs_to_dict(items))
            elif name == "APPEND":
                value = stack.pop()
                _append(stack[-1], [value])
            elif name == "APPENDS":
                items = _pop_mark(stack)
                _append(stack[-1], items)
            elif name == "SETITEM":
                value = stack.pop()
                key = stack.pop()
                _setitems(stack[-1], [key, value])
            elif name == "SETITEMS":
                items = _pop_mark(stack)
                _setitems(stack[-1], items)
            elif name == "BINPERSID":
                stack.append(PersistentId(stack.pop()))
            elif name == "REDUCE":
                args = stack.pop()
                func = stack.pop()
                if not isinstance(args, tuple):
                    raise PickleScanError("REDUCE arguments are not a tuple")
                stack.append(Call(func, args))
            elif name == "NEWOBJ":
                args = stack.pop()
                cls = stack.pop()
                stack.append(Call(cls, tuple(args)))
            elif name == "BUILD":
                state = stack.pop()
                target = stack[-1]
                if not isinstance(target, Call):
                    raise PickleScanError("BUILD on a non-object")
                target.state = state
            else:
                raise PickleScanError(f"opcode {name} is not supported")
    except PickleScanError:
        raise
    except (ValueError, IndexError, TypeError, KeyError) as exc:
        raise PickleScanError(f"malformed pickle: {exc}") from None
    raise PickleScanError("pickle has no STOP opcode")


def _pairs_to_dict(items: list[Any]) -> dict[Any, Any]:
    if len(items) % 2:
        raise PickleScanError("odd number of dict items")
    out: dict[Any, Any] = {}
    for k, v in zip(items[::2], items[1::2], strict=True):
        try:
            out[k] = v
        except TypeError:
            raise PickleScanError("unhashable dict key") from None
    return out


def _append(target: Any, items: list[Any]) -> None:
    if isinstance(target, list):
        target.extend(items)
    elif isinstance(target, Call):
        target.items.extend(items)
    else:
        raise PickleScanError("APPEND on a non-list")


def _setitems(target: Any, items: list[Any]) -> None:
    if len(items) % 2:
        raise PickleScanError("odd number of dict items")
    if isinstance(target, dict):
        target.update(_pairs_to_dict(items))
    elif isinstance(target, Call):
        target.setitems.extend(zip(items[::2], items[1::2], strict=True))
    else:
        raise PickleScanError("SETITEM on a non-dict")
