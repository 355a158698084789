"""A symbolic pickle reader that never imports or calls anything.

``torch.save`` stores a tensor as a zip whose ``data.pkl`` is a tiny pickle describing a call to
``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)``, and DCP's ``.metadata``
is a pickle of ``torch.distributed.checkpoint.metadata.Metadata``. To read both without importing
torch (which alone costs ~270 MiB of RSS and seconds of start-up) and without executing pickle
code, this module interprets the pickle opcodes (from :func:`pickletools.genops`) on a stack
machine that only builds inert values:

* ``GLOBAL``/``STACK_GLOBAL``/``INST`` name a :class:`Global` (never resolved);
* ``REDUCE``/``NEWOBJ``/``NEWOBJ_EX``/``OBJ``/``INST`` become a :class:`Call` record, and
  ``BUILD`` attaches its state to that record (``APPEND``/``SETITEMS`` on a record are kept too);
* ``PERSID``/``BINPERSID`` become a :class:`PersistentId`;
* lists, tuples, dicts, sets, frozensets, strings, bytes, numbers, ``None`` and bools are built
  as the plain Python values they denote, with the memo (``PUT``/``GET``/``MEMOIZE``) shared as in
  the real unpickler.

No module is imported and no callable is ever invoked, so a hostile pickle can at worst be
rejected. An optional allow-list (``allowed_globals``) makes the scan fail with
:class:`PickleGlobalError` at the first global outside it. Extension codes (``EXT1/2/4``) and
out-of-band buffers (``NEXT_BUFFER``) are refused. Any malformed, truncated or over-deep input
raises :class:`PickleScanError` (a ``ValueError``), never another exception.
"""

from __future__ import annotations

import pickletools
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Call",
    "Global",
    "PersistentId",
    "PickleGlobalError",
    "PickleScanError",
    "scan_pickle",
]


class PickleScanError(ValueError):
    """The pickle uses an opcode or structure this reader does not interpret, or is malformed."""


class PickleGlobalError(PickleScanError):
    """The pickle references a global that the caller's allow-list does not contain.

    Attributes:
        qualname: the refused ``"module.name"``.

    """

    def __init__(self, qualname: str) -> None:
        super().__init__(f"global {qualname} is not allowed")
        self.qualname = qualname


@dataclass(frozen=True)
class Global:
    """A reference to ``module.name`` (never resolved)."""

    module: str
    name: str

    @property
    def qualname(self) -> str:
        """Return ``"module.name"``."""
        return f"{self.module}.{self.name}"


@dataclass(eq=False)
class Call:
    """A deferred ``func(*args, **kwargs)`` with the state a ``BUILD`` opcode attached.

    Compared and hashed by identity (like the objects it stands for by default), so records can
    be dict keys: DCP's ``storage_data`` is keyed by ``MetadataIndex`` objects.
    """

    func: Any
    args: tuple[Any, ...]
    state: Any = None
    items: list[Any] = field(default_factory=list)
    setitems: list[tuple[Any, Any]] = field(default_factory=list)
    kwargs: dict[Any, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PersistentId:
    """The argument of a ``BINPERSID`` opcode (torch: ``('storage', type, key, loc, numel)``)."""

    value: Any


class _Mark:
    pass


_MARK = _Mark()
_MAX_OPS = 1_000_000
#: Deepest tuple/frozenset nesting accepted inside a dict key or set element (hashing recurses).
_MAX_KEY_DEPTH = 64

_PUSH_ARG = frozenset(
    {
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
        "INT",
        "LONG",
        "LONG1",
        "LONG4",
        "BINFLOAT",
        "FLOAT",
        "SHORT_BINBYTES",
        "BINBYTES",
        "BINBYTES8",
    }
)
_MEMO_PUT = frozenset({"BINPUT", "LONG_BINPUT", "PUT"})
_MEMO_GET = frozenset({"BINGET", "LONG_BINGET", "GET"})
_TUPLE_N = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3}

GlobalFilter = Callable[[str], bool] | Collection[str]


def _pop_mark(stack: list[Any]) -> list[Any]:
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is _MARK:
            items = stack[i + 1 :]
            del stack[i:]
            return items
    raise PickleScanError("MARK missing")


def _pop(stack: list[Any]) -> Any:
    if not stack:
        raise PickleScanError("stack underflow")
    value = stack.pop()
    if value is _MARK:
        raise PickleScanError("unexpected MARK on the stack")
    return value


def _top(stack: list[Any]) -> Any:
    if not stack or stack[-1] is _MARK:
        raise PickleScanError("stack underflow")
    return stack[-1]


def _check_key(key: Any) -> None:
    """Refuse unhashable or deeply nested keys before hashing them (C hashing recurses)."""
    todo = [(key, 0)]
    while todo:
        k, depth = todo.pop()
        if depth > _MAX_KEY_DEPTH:
            raise PickleScanError("dict key or set element nested too deeply")
        if isinstance(k, tuple | frozenset):
            todo.extend((v, depth + 1) for v in k)
        elif isinstance(k, PersistentId):
            todo.append((k.value, depth + 1))
        elif not isinstance(k, str | bytes | int | float | complex | type(None) | Global | Call):
            raise PickleScanError(f"unhashable dict key or set element of type {type(k).__name__}")


def _make_global(module: Any, name: Any, allowed: Callable[[str], bool] | None) -> Global:
    if not isinstance(module, str) or not isinstance(name, str):
        raise PickleScanError("global with non-string names")
    g = Global(module, name)
    if allowed is not None and not allowed(g.qualname):
        raise PickleGlobalError(g.qualname)
    return g


def _as_filter(allowed_globals: GlobalFilter | None) -> Callable[[str], bool] | None:
    if allowed_globals is None or callable(allowed_globals):
        return allowed_globals
    names = frozenset(allowed_globals)
    return names.__contains__


def scan_pickle(
    data: bytes | bytearray | memoryview,
    *,
    allowed_globals: GlobalFilter | None = None,
    max_ops: int | None = _MAX_OPS,
) -> Any:
    """Interpret ``data`` symbolically and return the top-level value.

    Args:
        data: the pickle (protocol 0-5, in-band buffers only).
        allowed_globals: ``"module.name"`` strings (or a predicate on them) that may appear;
            ``None`` accepts every global (they are never resolved either way).
        max_ops: most opcodes to interpret; ``None`` for no limit beyond the input size (every
            opcode consumes at least one byte).

    Returns:
        The symbolic value: plain containers and scalars, :class:`Global`, :class:`Call` and
        :class:`PersistentId` records.

    Raises:
        PickleGlobalError: a global outside ``allowed_globals``.
        PickleScanError: unknown or refused opcode, malformed or truncated stream, or too many
            operations.

    """
    allowed = _as_filter(allowed_globals)
    try:
        return _scan(data, allowed, max_ops)
    except PickleScanError:
        raise
    except RecursionError:
        raise PickleScanError("malformed pickle: nested too deeply") from None
    except Exception as exc:  # pickletools raises ValueError, struct.error, UnicodeError, ...
        raise PickleScanError(f"malformed pickle: {type(exc).__name__}: {exc}"[:300]) from None


def _scan(
    data: bytes | bytearray | memoryview, allowed: Callable[[str], bool] | None, max_ops: int | None
) -> Any:
    stack: list[Any] = []
    memo: dict[int, Any] = {}
    count = 0
    limit = max_ops if max_ops is not None else len(data) + 1
    for op, arg, _pos in pickletools.genops(bytes(data) if not isinstance(data, bytes) else data):
        count += 1
        if count > limit:
            raise PickleScanError("pickle too long")
        name = op.name
        if name in _PUSH_ARG:
            stack.append(arg)
        elif name == "MEMOIZE":
            memo[len(memo)] = _top(stack)
        elif name in _MEMO_PUT:
            memo[int(arg)] = _top(stack)  # type: ignore[arg-type]
        elif name in _MEMO_GET:
            try:
                stack.append(memo[int(arg)])  # type: ignore[arg-type]
            except KeyError:
                raise PickleScanError(f"memo key {arg} missing") from None
        elif name == "MARK":
            stack.append(_MARK)
        elif name == "EMPTY_TUPLE":
            stack.append(())
        elif name in _TUPLE_N:
            n = _TUPLE_N[name]
            items = [_pop(stack) for _ in range(n)]
            items.reverse()
            stack.append(tuple(items))
        elif name == "TUPLE":
            stack.append(tuple(_pop_mark(stack)))
        elif name == "EMPTY_DICT":
            stack.append({})
        elif name == "EMPTY_LIST":
            stack.append([])
        elif name == "NONE":
            stack.append(None)
        elif name == "NEWTRUE":
            stack.append(True)
        elif name == "NEWFALSE":
            stack.append(False)
        elif name == "SETITEMS":
            items = _pop_mark(stack)
            _setitems(_top(stack), items)
        elif name == "SETITEM":
            value = _pop(stack)
            key = _pop(stack)
            _setitems(_top(stack), [key, value])
        elif name == "APPENDS":
            items = _pop_mark(stack)
            _append(_top(stack), items)
        elif name == "APPEND":
            value = _pop(stack)
            _append(_top(stack), [value])
        elif name == "STACK_GLOBAL":
            attr = _pop(stack)
            module = _pop(stack)
            stack.append(_make_global(module, attr, allowed))
        elif name == "GLOBAL":
            module, _, attr = str(arg).partition(" ")
            stack.append(_make_global(module, attr, allowed))
        elif name == "NEWOBJ":
            args = _pop(stack)
            cls = _pop(stack)
            if not isinstance(args, tuple):
                raise PickleScanError("NEWOBJ arguments are not a tuple")
            stack.append(Call(cls, args))
        elif name == "NEWOBJ_EX":
            kwargs = _pop(stack)
            args = _pop(stack)
            cls = _pop(stack)
            if not isinstance(args, tuple) or not isinstance(kwargs, dict):
                raise PickleScanError("NEWOBJ_EX arguments are not a tuple and a dict")
            stack.append(Call(cls, args, kwargs=kwargs))
        elif name == "REDUCE":
            args = _pop(stack)
            func = _pop(stack)
            if not isinstance(args, tuple):
                raise PickleScanError("REDUCE arguments are not a tuple")
            stack.append(Call(func, args))
        elif name == "BUILD":
            state = _pop(stack)
            target = _top(stack)
            if not isinstance(target, Call):
                raise PickleScanError("BUILD on a non-object")
            if isinstance(target.state, dict) and isinstance(state, dict):
                target.state.update(state)
            else:
                target.state = state
        elif name == "INST":
            module, _, attr = str(arg).partition(" ")
            cls = _make_global(module, attr, allowed)
            stack.append(Call(cls, tuple(_pop_mark(stack))))
        elif name == "OBJ":
            items = _pop_mark(stack)
            if not items:
                raise PickleScanError("OBJ without a class")
            stack.append(Call(items[0], tuple(items[1:])))
        elif name == "LIST":
            stack.append(_pop_mark(stack))
        elif name == "DICT":
            stack.append(_pairs_to_dict(_pop_mark(stack)))
        elif name == "EMPTY_SET":
            stack.append(set())
        elif name == "ADDITEMS":
            items = _pop_mark(stack)
            target = _top(stack)
            if not isinstance(target, set):
                raise PickleScanError("ADDITEMS on a non-set")
            for item in items:
                _check_key(item)
            target.update(items)
        elif name == "FROZENSET":
            items = _pop_mark(stack)
            for item in items:
                _check_key(item)
            stack.append(frozenset(items))
        elif name == "BYTEARRAY8":
            stack.append(bytearray(arg))  # type: ignore[arg-type]
        elif name == "BINPERSID":
            stack.append(PersistentId(_pop(stack)))
        elif name == "PERSID":
            stack.append(PersistentId(arg))
        elif name == "POP":
            if not stack:
                raise PickleScanError("stack underflow")
            stack.pop()
        elif name == "POP_MARK":
            _pop_mark(stack)
        elif name == "DUP":
            stack.append(_top(stack))
        elif name == "PROTO":
            if not isinstance(arg, int) or not 0 <= arg <= 5:
                raise PickleScanError(f"unsupported pickle protocol {arg}")
        elif name == "FRAME":
            continue
        elif name == "STOP":
            if len(stack) != 1 or stack[0] is _MARK:
                raise PickleScanError("stack not balanced at STOP")
            return stack[0]
        else:  # EXT1/2/4 (copyreg extension registry), NEXT_BUFFER/READONLY_BUFFER (out of band)
            raise PickleScanError(f"opcode {name} is not supported")
    raise PickleScanError("pickle has no STOP opcode (truncated)")


def _pairs_to_dict(items: list[Any]) -> dict[Any, Any]:
    if len(items) % 2:
        raise PickleScanError("odd number of dict items")
    out: dict[Any, Any] = {}
    for k, v in zip(items[::2], items[1::2], strict=True):
        _check_key(k)
        out[k] = v
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
