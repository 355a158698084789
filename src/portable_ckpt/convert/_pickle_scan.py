"""A symbolic pickle reader that never imports or calls anything.

``torch.save`` stores a tensor as a zip whose ``data.pkl`` is a tiny pickle describing a call to
``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)``, and DCP's ``.metadata``
is a pickle of ``torch.distributed.checkpoint.metadata.Metadata``. To read both without importing
torch (which alone costs ~270 MiB of RSS and seconds of start-up) and without executing pickle
code, this module interprets the pickle opcodes on a stack machine that only builds inert values
(opcodes and argument formats as documented by :mod:`pickletools`; they are decoded by one flat
loop here because ``pickletools.genops`` alone is slower than ``pickle.loads`` on the 18 MB
``.metadata`` of a 128k-chunk checkpoint):

* ``GLOBAL``/``STACK_GLOBAL``/``INST`` name a :class:`Global` (never resolved);
* ``REDUCE``/``NEWOBJ``/``NEWOBJ_EX``/``OBJ``/``INST`` become a :class:`Call` record, and
  ``BUILD`` attaches its state to that record (``APPEND``/``SETITEMS`` on a record are kept too);
* ``PERSID``/``BINPERSID`` become a :class:`PersistentId`;
* on request (``unwrap_calls``, ``build_hooks``), chosen calls stand for their argument and
  chosen classes are turned into the caller's plain values as soon as ``BUILD`` gives them their
  state, so that a large pickle is never held as a graph of records (DCP ``.metadata``);
* lists, tuples, dicts, sets, frozensets, strings, bytes, numbers, ``None`` and bools are built
  as the plain Python values they denote, with the memo (``PUT``/``GET``/``MEMOIZE``) shared as in
  the real unpickler; protocol 0-2 module names of Python 2 (``__builtin__``, ``copy_reg``) are
  mapped to their Python 3 names as the real unpickler does.

The memo is a list of the dense prefix of keys that pickle writers produce (plus a dict of any
other keys, with the real unpickler's semantics), and the cyclic garbage collector is paused
while a large pickle is scanned.

No module is imported and no callable is ever invoked, so a hostile pickle can at worst be
rejected. An optional allow-list (``allowed_globals``) makes the scan fail with
:class:`PickleGlobalError` at the first global outside it. Extension codes (``EXT1/2/4``) and
out-of-band buffers (``NEXT_BUFFER``) are refused. Any malformed, truncated or over-deep input
raises :class:`PickleScanError` (a ``ValueError``), never another exception.
"""

from __future__ import annotations

import codecs
import contextlib
import struct
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from portable_ckpt._gc import paused_gc

__all__ = [
    "CONSUMED",
    "Call",
    "ExpansionError",
    "Global",
    "OpaqueKey",
    "PersistentId",
    "PickleGlobalError",
    "PickleScanError",
    "Resolved",
    "WalkBudget",
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


class ExpansionError(PickleScanError):
    """A walk over a scanned pickle would visit more values than its bytes justify."""


class WalkBudget:
    """How many values walks over one scanned pickle may visit in all.

    The memo lets a pickle refer to one value many times, so a 317-byte pickle (``x = [x, x]``
    forty times) describes a value of 2^40 leaves: every walk that expands references (to JSON,
    to dotted keys) charges each value it visits here. Legitimate pickles hold each value about
    once and their walks visit a few values per byte; the budget is ``per_byte`` visits per byte
    of the pickle, plus ``base``.
    """

    __slots__ = ("left", "limit", "what")

    def __init__(
        self, pickle_bytes: int, *, what: str, per_byte: int = 16, base: int = 1 << 16
    ) -> None:
        self.limit = base + per_byte * max(0, pickle_bytes)
        self.left = self.limit
        self.what = what

    def spend(self, n: int = 1) -> None:
        """Charge ``n`` visits; raise :class:`ExpansionError` past the budget."""
        self.left -= n
        if self.left < 0:
            raise ExpansionError(
                f"{self.what}: its shared references expand to more than {self.limit} values "
                "(each reference to a memoized value is walked again); refusing to expand it"
            )


@dataclass(frozen=True)
class Global:
    """A reference to ``module.name`` (never resolved)."""

    module: str
    name: str

    @property
    def qualname(self) -> str:
        """Return ``"module.name"``."""
        return f"{self.module}.{self.name}"


class Call:
    """A deferred ``func(*args, **kwargs)`` with the state a ``BUILD`` opcode attached.

    ``items`` and ``setitems`` hold what ``APPEND(S)``/``SETITEM(S)`` added to the object (list
    and dict subclasses, ``OrderedDict``). Compared and hashed by identity (like the objects it
    stands for by default), so records can be dict keys: DCP's ``storage_data`` is keyed by
    ``MetadataIndex`` objects. Slotted, with the rarely used containers created on demand: a
    large ``.metadata`` holds millions of these.
    """

    __slots__ = ("_items", "_kwargs", "_setitems", "_slot", "args", "func", "state")

    def __init__(
        self,
        func: Any,
        args: tuple[Any, ...],
        state: Any = None,
        *,
        kwargs: dict[Any, Any] | None = None,
    ) -> None:
        self.func = func
        self.args = args
        self.state = state
        self._items: list[Any] | None = None
        self._setitems: list[tuple[Any, Any]] | None = None
        self._kwargs = kwargs
        self._slot = -1  # memo slot, recorded when scan_pickle has build hooks

    @property
    def items(self) -> list[Any]:
        """Values appended to the object (``APPEND``/``APPENDS``)."""
        return self._items if self._items is not None else []

    @property
    def setitems(self) -> list[tuple[Any, Any]]:
        """Key/value pairs set on the object (``SETITEM``/``SETITEMS``), in order."""
        return self._setitems if self._setitems is not None else []

    @property
    def kwargs(self) -> dict[Any, Any]:
        """Keyword arguments (``NEWOBJ_EX``)."""
        return self._kwargs if self._kwargs is not None else {}

    def __repr__(self) -> str:
        func = self.func.qualname if isinstance(self.func, Global) else type(self.func).__name__
        return f"Call({func}, {len(self.args)} args)"


@dataclass(frozen=True)
class PersistentId:
    """The argument of a ``BINPERSID`` opcode (torch: ``('storage', type, key, loc, numel)``)."""

    value: Any


class Resolved:
    """Base of values a ``build_hooks`` callable may return that can be dict keys.

    :func:`scan_pickle` treats instances as opaque, hashable leaves (like :class:`Call`).
    """

    __slots__ = ()


class _Consumed:
    """Stands in the memo for a state dict that a build hook consumed (see :func:`scan_pickle`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<consumed object state>"


CONSUMED = _Consumed()


class _Mark:
    pass


_MARK = _Mark()
_MAX_OPS = 1_000_000
#: Deepest tuple/frozenset nesting accepted inside a dict key or set element (hashing recurses).
_MAX_KEY_DEPTH = 64
#: Inputs above this size are scanned with the cyclic garbage collector paused.
_GC_PAUSE_BYTES = 1 << 20

GlobalFilter = Callable[[str], bool] | Collection[str]
BuildHook = Callable[[tuple[Any, ...], dict[Any, Any]], Any]


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


#: Most nodes (counted with multiplicity: a value referenced twice counts twice) of one dict key
#: or set element. ``hash()`` of a tuple is not cached and walks every element again, so a key
#: built as ``x = (x, x)`` sixty times (129 bytes) would take 2^60 steps to hash; such a key is
#: refused even though the scan stores it unhashed (see :class:`OpaqueKey`): a later walk (a
#: consumer's own ``hash()``, ``repr()``) would expand it.
_MAX_KEY_NODES = 4096
_INT_HASH_MOD = (1 << 61) - 1
_KEY_LEAVES = (str, bytes, int, float, complex, type(None), Global, Call, Resolved)


class OpaqueKey:
    """A dict key or set element whose hash the pickle could choose, stored unhashed.

    Strings and bytes hash with a random seed, ints below 2^61 - 1 to themselves, and records by
    identity; any other key (a float, a larger int, a tuple, a frozenset, a persistent id) could
    be chosen by a file to collide with many others, which makes building the dict quadratic in
    their number (conversion review rev22 D1). The scan stores such a key wrapped in this
    record, which is hashed and compared by identity: insertion order is kept, and two equal
    keys are *not* merged (a writer never pickles one dict with two equal keys; a consumer that
    turns keys into strings sees both and refuses or skips the value, as for ``1`` and ``"1"``).

    Attributes:
        value: the key as the pickle built it.

    """

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        v = self.value
        if type(v) is int:
            return f"<int key of {v.bit_length()} bits>" if v.bit_length() > 256 else repr(v)
        if type(v) is float:
            return repr(v)
        return f"<{type(v).__name__} key>"


def _int_nodes(n: int) -> int:
    """What hashing or printing int ``n`` costs, in nodes: one per 64 bits.

    ``hash()`` of an int is not cached and reads every digit: a 1 MB int key hashed 32 000
    times took 20 s (conversion review atkconv2 N4).

    Raises:
        PickleScanError: more than :data:`_MAX_KEY_NODES` of them.

    """
    nodes = 1 + n.bit_length() // 64
    if nodes > _MAX_KEY_NODES:
        raise PickleScanError(
            f"an integer dict key or set element of {n.bit_length():,} bits (more than "
            f"{_MAX_KEY_NODES * 64:,}); refusing to hash it"
        )
    return nodes


class _KeyCheck:
    """Checks every dict key and set element of one scan, and says how to store it.

    Refuses unhashable keys, keys nested deeper than :data:`_MAX_KEY_DEPTH` (C hashing
    recurses) and keys of more than :data:`_MAX_KEY_NODES` nodes counted with multiplicity (the
    count is memoised per node, so shared references cost one visit each; an int of 2^61 or more
    counts one node per 64 bits). A key whose hash the pickle can choose is returned wrapped in
    an :class:`OpaqueKey` and never hashed, so collisions cost nothing; every cost is thus
    bounded by the pickle's bytes, whatever the number of keys.
    """

    __slots__ = ("keep", "sizes")

    def __init__(self) -> None:
        self.sizes: dict[int, int] = {}  # id(tuple/frozenset/PersistentId) -> nodes
        self.keep: list[Any] = []  # keeps those ids valid for the whole scan

    def __call__(self, key: Any) -> Any:
        t = type(key)
        if (
            t is str
            or t is Call
            or t is bool
            or t is bytes
            or key is None
            or (t is int and -_INT_HASH_MOD < key < _INT_HASH_MOD)
            or isinstance(key, Resolved | Global)
        ):
            return key
        if id(key) not in self.sizes:
            if t is int:
                _int_nodes(key)
            else:
                self._size(key)
        return OpaqueKey(key)

    def _size(self, key: Any) -> int:
        """Nodes of ``key`` with multiplicity (memoised per node), checking each node's type."""
        sizes = self.sizes
        todo: list[tuple[Any, int, bool]] = [(key, 0, False)]
        while todo:
            node, depth, done = todo.pop()
            if type(node) is tuple:
                kids: tuple[Any, ...] = node
            elif isinstance(node, PersistentId):
                kids = (node.value,)
            elif isinstance(node, frozenset):
                # built by FROZENSET, which checked its elements; its hash is cached after the
                # first, from its elements' stored hashes
                kids = ()
            elif type(node) is int:
                if not -_INT_HASH_MOD < node < _INT_HASH_MOD and id(node) not in sizes:
                    sizes[id(node)] = _int_nodes(node)
                    self.keep.append(node)
                continue
            elif isinstance(node, _KEY_LEAVES):
                continue
            else:
                raise PickleScanError(
                    f"unhashable dict key or set element of type {type(node).__name__}"
                )
            if done:
                total = 1 + len(node) if type(node) is frozenset else 1
                for k in kids:
                    total += sizes.get(id(k), 1)
                if total > _MAX_KEY_NODES:
                    raise PickleScanError(
                        f"a dict key or set element of more than {_MAX_KEY_NODES} values "
                        "(counting each shared reference again, as hashing it would)"
                    )
                sizes[id(node)] = total
                self.keep.append(node)
                continue
            if id(node) in sizes:
                continue
            if depth > _MAX_KEY_DEPTH:
                raise PickleScanError("dict key or set element nested too deeply")
            if len(kids) > _MAX_KEY_NODES:
                raise PickleScanError(
                    f"a dict key or set element of more than {_MAX_KEY_NODES} values"
                )
            todo.append((node, depth, True))
            todo.extend((k, depth + 1, False) for k in kids if id(k) not in sizes)
        return sizes[id(key)] if id(key) in sizes else 1


#: Python 2 module names that protocol 0-2 pickles use (pickle's ``fix_imports``), as the real
#: unpickler maps them (``_compat_pickle``), for the modules whose names matter here.
_PY2_MODULES = {"__builtin__": "builtins", "copy_reg": "copyreg", "exceptions": "builtins"}


def _make_global(
    module: Any, name: Any, allowed: Callable[[str], bool] | None, proto: int = 4
) -> Global:
    if not isinstance(module, str) or not isinstance(name, str):
        raise PickleScanError("global with non-string names")
    if proto < 3:
        module = _PY2_MODULES.get(module, module)
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
    unwrap_calls: Collection[str] = (),
    build_hooks: Mapping[str, BuildHook] | None = None,
) -> Any:
    """Interpret ``data`` symbolically and return the top-level value.

    Args:
        data: the pickle (protocol 0-5, in-band buffers only).
        allowed_globals: ``"module.name"`` strings (or a predicate on them) that may appear;
            ``None`` accepts every global (they are never resolved either way).
        max_ops: most opcodes to interpret; ``None`` for no limit beyond the input size (every
            opcode consumes at least one byte).
        unwrap_calls: ``"module.name"`` of callables whose ``REDUCE`` with one argument stands
            for that argument itself (``torch.Size((2, 3))`` → ``(2, 3)``): no :class:`Call`
            record is built (a large DCP ``.metadata`` holds hundreds of thousands of sizes).
        build_hooks: ``"module.name"`` → ``hook(args, state)``, called when ``BUILD`` gives a
            dict ``state`` to a fresh object record of that class (``NEWOBJ``/``REDUCE``).
            If the hook returns something other than ``None``, that value replaces the record
            on the stack and in the memo, and the memo entry of ``state`` becomes
            :data:`CONSUMED` (pickle writers never refer to an object's ``__dict__`` again; a
            pickle that does finds an inert placeholder). Hooks must not raise. A large DCP
            ``.metadata`` is thus never held as a graph of records and state dicts.

    Returns:
        The symbolic value: plain containers and scalars, :class:`Global`, :class:`Call` and
        :class:`PersistentId` records.

    Raises:
        PickleGlobalError: a global outside ``allowed_globals``.
        PickleScanError: unknown or refused opcode, malformed or truncated stream, or too many
            operations.

    """
    allowed = _as_filter(allowed_globals)
    # The scan allocates one container per few opcodes and frees nothing until it ends: the cyclic
    # collector would traverse the growing graph again and again (~15 % of the time on a
    # 128k-chunk .metadata) and finds nothing to free, so it is paused for large inputs.
    with paused_gc() if len(data) > _GC_PAUSE_BYTES else contextlib.nullcontext():
        try:
            return _scan(
                bytes(data) if not isinstance(data, bytes) else data,
                allowed,
                max_ops,
                frozenset(unwrap_calls),
                build_hooks or {},
            )
        except PickleScanError:
            raise
        except KeyError as exc:  # only memo lookups index a dict
            raise PickleScanError(f"malformed pickle: memo key {exc} missing") from None
        except RecursionError:
            raise PickleScanError("malformed pickle: nested too deeply") from None
        except Exception as exc:  # e.g. UnicodeDecodeError, ValueError from int()/float() args
            raise PickleScanError(f"malformed pickle: {type(exc).__name__}: {exc}"[:300]) from None


def _line(data: bytes, i: int) -> tuple[bytes, int]:
    """Return the bytes up to the next newline at or after ``i`` and the index after it."""
    j = data.find(b"\n", i)
    if j < 0:
        raise PickleScanError("truncated: no newline after a text argument")
    return data[i:j], j + 1


def _take(data: bytes, i: int, n: int) -> tuple[bytes, int]:
    j = i + n
    if n < 0 or j > len(data):
        raise PickleScanError(f"truncated: {n} bytes announced, {max(0, len(data) - i)} left")
    return data[i:j], j


def _uint(data: bytes, i: int, width: int) -> tuple[int, int]:
    j = i + width
    if j > len(data):
        raise PickleScanError("truncated argument")
    return int.from_bytes(data[i:j], "little"), j


def _unquote(raw: bytes) -> str:
    for q in (b'"', b"'"):
        if len(raw) >= 2 and raw.startswith(q) and raw.endswith(q):
            return str(codecs.escape_decode(raw[1:-1])[0], "latin-1")
    raise PickleScanError("STRING argument without quotes")


#: Memo keys are below 2^32 (the binary opcodes' 4-byte argument; the text ``PUT`` of a real
#: writer counts up from 0). A text key of the file's choosing above that could make the
#: sparse memo's hashes collide (ints hash modulo 2^61 - 1: quadratic; rev22 re-attack R1).
_MEMO_KEYS = 1 << 32


def _memo_put(memo: list[Any], memo_x: dict[int, Any], key: int, value: Any) -> None:
    """Store ``memo[key] = value`` with the semantics of a dict memo (see :func:`_scan`)."""
    if not 0 <= key < _MEMO_KEYS:
        raise PickleScanError(f"memo key of {key.bit_length()} bits outside 0..2^32-1")
    n = len(memo)
    if 0 <= key < n:
        memo[key] = value
    elif key == n:
        memo.append(value)
        n += 1
        while n in memo_x:  # entries put ahead of the dense prefix now join it
            memo.append(memo_x.pop(n))
            n += 1
    else:
        memo_x[key] = value


def _memo_get(memo: list[Any], memo_x: dict[int, Any], key: int) -> Any:
    if 0 <= key < len(memo):
        return memo[key]
    if not 0 <= key < _MEMO_KEYS:
        raise PickleScanError(f"memo key of {key.bit_length()} bits outside 0..2^32-1")
    if key not in memo_x:
        raise PickleScanError(f"memo key {key} missing")
    return memo_x[key]


def _note_global(
    g: Global,
    unwrap: frozenset[str],
    hooks: Mapping[str, BuildHook] | None,
    unwrap_ids: set[int],
    hook_ids: dict[int, BuildHook],
) -> bool:
    qual = g.qualname
    hook = hooks.get(qual) if hooks else None
    if hook is not None:
        hook_ids[id(g)] = hook
    if qual in unwrap:
        unwrap_ids.add(id(g))
    return hook is not None or qual in unwrap


def _build_hook(
    target: Call,
    state: dict[Any, Any],
    hook_ids: dict[int, BuildHook],
    stack: list[Any],
    memo: list[Any],
) -> None:
    """Let the hook of ``target``'s class replace it (see ``build_hooks`` of :func:`scan_pickle`)."""
    hook = hook_ids.get(id(target.func))
    if hook is None or target._kwargs is not None or target._items or target._setitems:
        return
    value = hook(target.args, state)
    if value is None:
        return
    stack[-1] = value
    k = target._slot  # checked with ``is``: a memo slot can have been overwritten since
    if 0 <= k < len(memo) and memo[k] is target:
        memo[k] = value
        if k + 1 < len(memo) and memo[k + 1] is state:
            memo[k + 1] = CONSUMED


def _pop_mark(stack: list[Any], marks: list[int]) -> list[Any]:
    if not marks:
        raise PickleScanError("MARK missing")
    p = marks.pop()
    items = stack[p + 1 :]
    del stack[p:]
    return items


def _scan(
    data: bytes,
    allowed: Callable[[str], bool] | None,
    max_ops: int | None,
    unwrap: frozenset[str] = frozenset(),
    hooks: Mapping[str, BuildHook] | None = None,
) -> Any:
    # One flat dispatch on the opcode byte, most frequent opcodes first. The opcodes are decoded
    # here rather than with pickletools.genops (whose argument formats this follows): genops
    # alone took 4.6 s for the 18 MB .metadata of a 128k-chunk checkpoint, more than
    # pickle.loads with torch imported (2.9 s).
    #
    # The memo has the semantics of the real unpickler's (a dict: MEMOIZE stores at the number of
    # distinct keys) but is held as a list of the dense prefix 0..len-1, which pickle writers
    # produce, plus a dict of any other keys: a 128k-chunk .metadata memoizes 2M objects, and a
    # dict with int keys costs ~70 bytes per entry against 8 for a list slot.
    #
    # ``marks`` holds the stack positions of the MARK sentinels (which stay on the stack so that
    # consuming one by mistake is detected): only POP can remove a MARK without raising.
    stack: list[Any] = []
    marks: list[int] = []
    push = stack.append
    pop = stack.pop
    mark = _MARK
    call = Call
    memo: list[Any] = []
    memo_x: dict[int, Any] = {}
    memo_append = memo.append
    check_key = _KeyCheck()
    unwrap_ids: set[int] = set()
    hook_ids: dict[int, BuildHook] = {}
    globals_seen: list[Global] = []  # keeps the ids in unwrap_ids and hook_ids valid
    # With build hooks, MEMOIZE records each record's memo slot in it, so that BUILD can replace
    # the record there (and its state dict, memoized right after it by pickle writers).
    track = bool(hooks)
    from_bytes = int.from_bytes
    n = len(data)
    # Every opcode consumes at least one byte: without a smaller max_ops nothing needs counting.
    counting = max_ops is not None and max_ops < n
    limit = max_ops or 0
    i = 0
    count = 0
    proto = 0  # until a PROTO opcode says otherwise (protocols 0 and 1 have none)
    # Hot opcodes index the stack and data directly: an empty stack or a short argument raises
    # IndexError, which scan_pickle reports as a malformed pickle.
    while i < n:
        op = data[i]
        i += 1
        if counting:
            count += 1
            if count > limit:
                raise PickleScanError("pickle too long")
        if op == 0x94:  # MEMOIZE
            top = stack[-1]
            if top is mark:
                raise PickleScanError("MEMOIZE of a MARK")
            if memo_x:
                _memo_put(memo, memo_x, len(memo) + len(memo_x), top)
            else:
                if track and type(top) is call:
                    top._slot = len(memo)
                memo_append(top)
        elif op == 0x6A:  # LONG_BINGET
            if i + 4 > n:
                raise PickleScanError("truncated argument")
            key = from_bytes(data[i : i + 4], "little")
            push(memo[key] if key < len(memo) else _memo_get(memo, memo_x, key))
            i += 4
        elif op == 0x4B:  # BININT1
            push(data[i])
            i += 1
        elif op == 0x68:  # BINGET
            key = data[i]
            push(memo[key] if key < len(memo) else _memo_get(memo, memo_x, key))
            i += 1
        elif op == 0x28:  # MARK
            marks.append(len(stack))
            push(mark)
        elif op == 0x29:  # EMPTY_TUPLE
            push(())
        elif op == 0x81 or op == 0x52:  # NEWOBJ, REDUCE
            args = pop()
            func = pop()
            if type(args) is not tuple or func is mark:
                raise PickleScanError("REDUCE/NEWOBJ arguments are not a tuple")
            if unwrap_ids and id(func) in unwrap_ids and len(args) == 1 and op == 0x52:
                push(args[0])
            else:
                push(call(func, args))
        elif op == 0x62:  # BUILD
            state = pop()
            target = stack[-1]
            if state is mark:
                raise PickleScanError("unexpected MARK on the stack")
            if type(target) is not call:
                raise PickleScanError("BUILD on a non-object")
            old = target.state
            if old is not None and isinstance(old, dict) and isinstance(state, dict):
                old.update(state)
            else:
                target.state = state
                if track and old is None and type(state) is dict:
                    _build_hook(target, state, hook_ids, stack, memo)
        elif op == 0x75:  # SETITEMS
            if not marks:
                raise PickleScanError("MARK missing")
            p = marks.pop()
            target = stack[p - 1] if p else None
            if type(target) is dict and not (len(stack) - p - 1) % 2:
                for j in range(p + 1, len(stack), 2):
                    key = stack[j]
                    if type(key) is not str:
                        key = check_key(key)
                    target[key] = stack[j + 1]
                del stack[p:]
            else:
                items = stack[p + 1 :]
                del stack[p:]
                _setitems(_top(stack), items, check_key)
        elif op == 0x7D:  # EMPTY_DICT
            push({})
        elif op == 0x85:  # TUPLE1
            top = pop()
            if top is mark:
                raise PickleScanError("TUPLE1 of a MARK")
            push((top,))
        elif op == 0x86:  # TUPLE2
            b = pop()
            a = pop()
            if a is mark or b is mark:
                raise PickleScanError("unexpected MARK on the stack")
            push((a, b))
        elif op == 0x4D:  # BININT2
            push(data[i] | data[i + 1] << 8)
            i += 2
        elif op == 0x8C:  # SHORT_BINUNICODE
            j = i + 1 + data[i]
            if j > n:
                raise PickleScanError("truncated string")
            push(str(data[i + 1 : j], "utf-8", "surrogatepass"))
            i = j
        elif op == 0x4A:  # BININT
            if i + 4 > n:
                raise PickleScanError("truncated argument")
            push(from_bytes(data[i : i + 4], "little", signed=True))
            i += 4
        elif op == 0x87:  # TUPLE3
            c = pop()
            b = pop()
            a = pop()
            if a is mark or b is mark or c is mark:
                raise PickleScanError("unexpected MARK on the stack")
            push((a, b, c))
        elif op == 0x71:  # BINPUT
            key = data[i]
            top = _top(stack)
            if key < len(memo):
                memo[key] = top
            elif key == len(memo) and not memo_x:
                memo_append(top)
            else:
                _memo_put(memo, memo_x, key, top)
            i += 1
        elif op == 0x72:  # LONG_BINPUT
            key, i = _uint(data, i, 4)
            _memo_put(memo, memo_x, key, _top(stack))
        elif op == 0x61:  # APPEND
            value = _pop(stack)
            _append(_top(stack), [value])
        elif op == 0x65:  # APPENDS
            items = _pop_mark(stack, marks)
            _append(_top(stack), items)
        elif op == 0x5D:  # EMPTY_LIST
            push([])
        elif op == 0x4E:  # NONE
            push(None)
        elif op == 0x89:  # NEWFALSE
            push(False)
        elif op == 0x88:  # NEWTRUE
            push(True)
        elif op == 0x74:  # TUPLE
            push(tuple(_pop_mark(stack, marks)))
        elif op == 0x93:  # STACK_GLOBAL
            attr = _pop(stack)
            module = _pop(stack)
            g = _make_global(module, attr, allowed, proto)
            if (unwrap or hooks) and _note_global(g, unwrap, hooks, unwrap_ids, hook_ids):
                globals_seen.append(g)
            push(g)
        elif op == 0x73:  # SETITEM
            value = _pop(stack)
            key = _pop(stack)
            _setitems(_top(stack), [key, value], check_key)
        elif op == 0x95:  # FRAME (the next frame's length: informational)
            _, i = _uint(data, i, 8)
        elif op == 0x58:  # BINUNICODE
            ln, i = _uint(data, i, 4)
            raw, i = _take(data, i, ln)
            push(str(raw, "utf-8", "surrogatepass"))
        elif op == 0x8D:  # BINUNICODE8
            ln, i = _uint(data, i, 8)
            raw, i = _take(data, i, ln)
            push(str(raw, "utf-8", "surrogatepass"))
        elif op == 0x47:  # BINFLOAT
            raw, i = _take(data, i, 8)
            push(struct.unpack(">d", raw)[0])
        elif op == 0x8A:  # LONG1
            raw, i = _take(data, i + 1, data[i])
            push(int.from_bytes(raw, "little", signed=True))
        elif op == 0x8B:  # LONG4
            raw, i = _take(data, i, 4)
            raw, i = _take(data, i, int.from_bytes(raw, "little", signed=True))
            push(int.from_bytes(raw, "little", signed=True))
        elif op == 0x43:  # SHORT_BINBYTES
            raw, i = _take(data, i + 1, data[i])
            push(raw)
        elif op == 0x42:  # BINBYTES
            ln, i = _uint(data, i, 4)
            raw, i = _take(data, i, ln)
            push(raw)
        elif op == 0x8E:  # BINBYTES8
            ln, i = _uint(data, i, 8)
            raw, i = _take(data, i, ln)
            push(raw)
        elif op == 0x96:  # BYTEARRAY8
            ln, i = _uint(data, i, 8)
            raw, i = _take(data, i, ln)
            push(bytearray(raw))
        elif op == 0x55:  # SHORT_BINSTRING
            raw, i = _take(data, i + 1, data[i])
            push(str(raw, "latin-1"))
        elif op == 0x54:  # BINSTRING
            raw, i = _take(data, i, 4)
            raw, i = _take(data, i, int.from_bytes(raw, "little", signed=True))
            push(str(raw, "latin-1"))
        elif op == 0x51:  # BINPERSID
            push(PersistentId(_pop(stack)))
        elif op == 0x8F:  # EMPTY_SET
            push(set())
        elif op == 0x90:  # ADDITEMS
            items = _pop_mark(stack, marks)
            target = _top(stack)
            if not isinstance(target, set):
                raise PickleScanError("ADDITEMS on a non-set")
            target.update([check_key(item) for item in items])
        elif op == 0x91:  # FROZENSET
            items = _pop_mark(stack, marks)
            push(frozenset([check_key(item) for item in items]))
        elif op == 0x92:  # NEWOBJ_EX
            kwargs = _pop(stack)
            args = _pop(stack)
            cls = _pop(stack)
            if not isinstance(args, tuple) or not isinstance(kwargs, dict):
                raise PickleScanError("NEWOBJ_EX arguments are not a tuple and a dict")
            push(Call(cls, args, kwargs=kwargs))
        elif op == 0x80:  # PROTO
            proto = data[i]
            if proto > 5:
                raise PickleScanError(f"unsupported pickle protocol {proto}")
            i += 1
        elif op == 0x2E:  # STOP
            if len(stack) != 1 or stack[0] is mark:
                raise PickleScanError("stack not balanced at STOP")
            return stack[0]
        # -- protocol 0/1 text opcodes and the rarely used rest ------------------------------------
        elif op == 0x63:  # GLOBAL
            module_b, i = _line(data, i)
            name_b, i = _line(data, i)
            g = _make_global(str(module_b, "utf-8"), str(name_b, "utf-8"), allowed, proto)
            if (unwrap or hooks) and _note_global(g, unwrap, hooks, unwrap_ids, hook_ids):
                globals_seen.append(g)
            push(g)
        elif op == 0x69:  # INST
            module_b, i = _line(data, i)
            name_b, i = _line(data, i)
            cls = _make_global(str(module_b, "utf-8"), str(name_b, "utf-8"), allowed, proto)
            push(Call(cls, tuple(_pop_mark(stack, marks))))
        elif op == 0x6F:  # OBJ
            items = _pop_mark(stack, marks)
            if not items or items[0] is mark:
                raise PickleScanError("OBJ without a class")
            push(Call(items[0], tuple(items[1:])))
        elif op == 0x6C:  # LIST
            push(_pop_mark(stack, marks))
        elif op == 0x64:  # DICT
            push(_pairs_to_dict(_pop_mark(stack, marks), check_key))
        elif op == 0x49:  # INT (I00/I01 are False/True)
            raw, i = _line(data, i)
            push(False if raw == b"00" else True if raw == b"01" else int(raw))
        elif op == 0x4C:  # LONG
            raw, i = _line(data, i)
            push(int(raw[:-1] if raw.endswith(b"L") else raw))
        elif op == 0x46:  # FLOAT
            raw, i = _line(data, i)
            push(float(raw))
        elif op == 0x53:  # STRING
            raw, i = _line(data, i)
            push(_unquote(raw))
        elif op == 0x56:  # UNICODE
            raw, i = _line(data, i)
            push(str(raw, "raw-unicode-escape"))
        elif op == 0x70:  # PUT
            raw, i = _line(data, i)
            _memo_put(memo, memo_x, int(raw), _top(stack))
        elif op == 0x67:  # GET
            raw, i = _line(data, i)
            push(_memo_get(memo, memo_x, int(raw)))
        elif op == 0x50:  # PERSID
            raw, i = _line(data, i)
            push(PersistentId(str(raw, "ascii")))
        elif op == 0x30:  # POP
            if not stack:
                raise PickleScanError("stack underflow")
            if stack.pop() is mark:
                marks.pop()
        elif op == 0x31:  # POP_MARK
            _pop_mark(stack, marks)
        elif op == 0x32:  # DUP
            push(_top(stack))
        elif op in (0x82, 0x83, 0x84):  # EXT1/2/4: resolved through the copyreg registry
            raise PickleScanError("extension-registry opcodes (EXT1/2/4) are not supported")
        elif op in (0x97, 0x98):  # NEXT_BUFFER, READONLY_BUFFER
            raise PickleScanError("out-of-band buffers are not supported")
        else:
            raise PickleScanError(f"unknown opcode 0x{op:02x} at byte {i - 1}")
    raise PickleScanError("pickle has no STOP opcode (truncated)")


def _pairs_to_dict(
    items: list[Any], check_key: _KeyCheck, out: dict[Any, Any] | None = None
) -> dict[Any, Any]:
    if len(items) % 2:
        raise PickleScanError("odd number of dict items")
    if out is None:
        out = {}
    it = iter(items)
    for k, v in zip(it, it, strict=True):
        if type(k) is not str:
            k = check_key(k)
        out[k] = v
    return out


def _append(target: Any, items: list[Any]) -> None:
    if isinstance(target, list):
        target.extend(items)
    elif isinstance(target, Call):
        if target._items is None:
            target._items = []
        target._items.extend(items)
    else:
        raise PickleScanError("APPEND on a non-list")


def _setitems(target: Any, items: list[Any], check_key: _KeyCheck) -> None:
    if len(items) % 2:
        raise PickleScanError("odd number of dict items")
    if isinstance(target, dict):
        _pairs_to_dict(items, check_key, target)
    elif isinstance(target, Call):
        if target._setitems is None:
            target._setitems = []
        target._setitems.extend(zip(items[::2], items[1::2], strict=True))
    else:
        raise PickleScanError("SETITEM on a non-dict")
