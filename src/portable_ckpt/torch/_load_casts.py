"""The dtype conversions a load makes into targets of another dtype or device, checked to keep values.

A target of another dtype than the stored one is read in bounded batches into a temporary and
cast; a cast that changes a value (a sign, an integer out of range, more than the target's
rounding) is refused unless the caller allowed lossy casts (:class:`Casts`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from portable_ckpt.errors import UsageError
from portable_ckpt.io.reader import Checkpoint, ReadRequest
from portable_ckpt.logs import get_logger
from portable_ckpt.torch._inflight import say
from portable_ckpt.torch._tensors import (
    as_bits,
    format_dtype,
    target_dtype,
    torch_dtype,
    torch_from_numpy,
)

__all__ = ["CONVERT_BATCH_BYTES", "Casts", "exact_cast", "read_converted"]

_log = get_logger("torch")


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN payloads, -0.0), for any dtype the format has; views, no copies."""
    x, y = as_bits(a), as_bits(b)
    return bool(torch.equal(x, y)) if x is not None and y is not None else bool(torch.equal(a, b))


#: Temporary bytes one batch of converted targets may hold (a larger target goes alone).
CONVERT_BATCH_BYTES = 64 << 20


def read_converted(
    ck: Checkpoint,
    targets: list[tuple[ReadRequest, torch.Tensor]],
    casts: Casts | None = None,
    *,
    same_as: Mapping[str, str] | None = None,
) -> int:
    """Read targets that need a dtype or device conversion, batch by batch; return the peak.

    A dtype conversion is checked by ``casts`` (:meth:`Casts.convert`) before it is written.
    With ``same_as`` (tied keys → the key that filled their memory), nothing is written: the
    stored values must be the bits the target holds.
    """
    peak = 0
    batch: list[tuple[ReadRequest, torch.Tensor]] = []
    size = 0
    for i, (req, local) in enumerate(targets):
        n = ck.tensors[req.key].itemsize * (math.prod(req.lengths) if req.lengths else 1)
        batch.append((req, local))
        size += n
        if size >= CONVERT_BATCH_BYTES or i == len(targets) - 1:
            arrays = ck.read_many([r for r, _ in batch])
            with torch.no_grad():
                for (req, dst), arr in zip(batch, arrays, strict=True):
                    src = torch_from_numpy(arr)
                    out = src.to(dst.dtype)
                    if casts is not None and out.dtype != src.dtype:
                        casts.convert(req.key, src, out)
                    if same_as is None:
                        dst.copy_(out)
                    elif not _same_bits(out, dst.to(out.device)):
                        first = same_as[req.key]
                        raise UsageError(
                            f"tensors {first!r} and {req.key!r} of the target share memory "
                            f"(tied weights, or a view of the other), but {ck.path} holds "
                            "different values for them "
                            f"(box {list(req.offsets or ())}+{list(req.lengths or ())} of {req.key!r}): "
                            "the version was saved with them apart. Make them independent in the "
                            "target (a module's own parameter, .clone()) to load both, or leave "
                            "one key out of the state to give both the other's values"
                        )
            peak = max(peak, size)
            batch, size = [], 0
    return peak


#: Elements checked at once by a cast's value checks (bounds their masks' memory).
_CHECK_ELEMENTS = 1 << 22


def _digits(dtype: torch.dtype) -> tuple[int, float, float]:
    """A float type's precision (significand bits), largest value and smallest subnormal."""
    f = torch.finfo(dtype)
    bits = round(-math.log2(f.eps))
    return bits + 1, float(f.max), float(f.tiny) * float(f.eps)


def _rounds_to_max(dtype: torch.dtype) -> float:
    """The largest magnitude that a cast to ``dtype`` rounds to its largest finite value."""
    f = torch.finfo(dtype)
    top = float(f.max)
    exponent = math.frexp(top)[1] - 1  # of its leading bit (log2 would round up to 1024)
    return top + math.ldexp(float(f.eps) / 2, exponent)


def exact_cast(src: torch.dtype, out: torch.dtype) -> bool:
    """Whether every value of ``src`` is exactly a value of ``out`` (no scan needed).

    ``torch.promote_types`` is not this: it promotes every integer to any float type (int64 to
    float16) and raises for float8 (attack review 3 F1, F12). Complex and real types never
    cast into each other (:meth:`Casts.check` refuses such a target before any read).
    """
    if src == out:
        return True
    if src.is_complex or out.is_complex:
        return False
    if out == torch.bool:
        return False
    if src == torch.bool:  # 0 and 1: every type holds them but e8m0, which has no zero
        return not (out.is_floating_point and torch.finfo(out).min > 0)
    if out.is_floating_point:
        bits, top, low = _digits(out)
        if src.is_floating_point:
            sbits, stop, slow = _digits(src)
            return bits >= sbits and top >= stop and low <= slow
        i = torch.iinfo(src)
        return bool(max(abs(i.min), i.max) <= 2**bits)
    if src.is_floating_point:
        return False
    i, o = torch.iinfo(src), torch.iinfo(out)
    return bool(o.min <= i.min and o.max >= i.max)


def _checkable(t: torch.Tensor) -> torch.Tensor:
    """``t``, or as float32 when it is a float8.

    torch lacks isfinite and more for float8; its e4m3fn has no infinity (an overflow
    saturates or is NaN), which float32 keeps as it is.
    """
    return t.float() if t.is_floating_point() and t.element_size() == 1 else t


def _int_changes(src: torch.Tensor, out: torch.Tensor) -> int:
    """How many values of ``src`` the cast to ``out`` changed (integers compared exactly).

    A round trip through ``src``'s own type hides a wrap (uint8 200 -> int8 -56 -> uint8 200),
    so both sides are compared as int64 where they are integers, and a float side only where it
    is an integer within int64's range.
    """
    def as_int64(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if t.is_floating_point():
            w = t.to(torch.float64)
            ok = torch.isfinite(w) & (w == w.trunc()) & (w.abs() < 2.0**63)
            return torch.where(ok, w, 0.0).to(torch.int64), ok
        if t.dtype == torch.uint64:  # values of 2**63 and above would wrap: never "the same"
            ok = t.double() < 2.0**63
            return torch.where(ok, t, 0).to(torch.int64), ok
        return t.to(torch.int64), torch.ones(t.shape, dtype=torch.bool)

    a, a_ok = as_int64(src)
    b, b_ok = as_int64(out)
    return int((~a_ok | ~b_ok | (a != b)).sum())


class Casts:
    """dtype conversions of one load: refused (``strict_dtype``) or logged once per family.

    A family is the key with its numbered components dropped (``model/layers/3/w`` and
    ``model/layers/7/w`` are one family), per pair of dtypes.
    """

    def __init__(self, strict: bool, *, tell: bool = False) -> None:
        self.strict = strict
        #: Say on stderr each pair of dtypes a cast loses precision between (rank 0 of a load)
        self.tell = tell
        self.told: set[tuple[str, str]] = set()
        self.seen: set[tuple[str, str, str]] = set()
        #: key → what its conversion did on this rank (``LoadInfo.casts``)
        self.done: dict[str, dict[str, Any]] = {}

    def convert(self, key: str, src: torch.Tensor, out: torch.Tensor) -> None:
        """Account for one cast box; refuse one that changes what the values are.

        A narrower float type turns large values into ``inf`` and small ones into 0: an AdamW
        ``exp_avg_sq`` loaded into float16 became all zeros, a 1e5 buffer ``inf``, and the
        job went on (multi-job review F5). Refused: a finite value made infinite, a box where
        more than half of the finite non-zero values became 0, and an integer that changes (a
        wrap between signed and unsigned, a truncation, an int64 rounded by a float target,
        attack review 3 F1, F4). Other zeros are counted (``flushed``); rounding of floats to
        a narrower float is what such a cast means and passes.
        """
        rec = self.done.setdefault(key, {
            "key": key, "stored": format_dtype(src.dtype, key=key),
            "target": format_dtype(out.dtype, key=key), "flushed": 0, "elements": 0,
        })
        rec["elements"] += src.numel()
        if src.dtype.is_complex != out.dtype.is_complex:
            raise UsageError(
                f"tensor {key!r}: casting the stored {rec['stored']} to the target's "
                f"{rec['target']}: complex and real dtypes do not cast into each other; build "
                f"the target with dtype {rec['stored']}"
            )
        if exact_cast(src.dtype, out.dtype):
            return  # every stored value is a target value (bf16 -> fp32 weights: no scan)
        try:
            why = self._changes(rec, src, out)
        except RuntimeError as e:  # an operation torch lacks for the pair (float8, uint64)
            why = f"the cast cannot be checked ({e})"
        if why:
            raise UsageError(
                f"tensor {key!r}: casting the stored {rec['stored']} to the target's "
                f"{rec['target']}: {why}; build the target with dtype {rec['stored']} (and "
                "cast it after the load, if that is what you want). Targets of other tensors "
                "may already hold this version's values"
            )

    @staticmethod
    def _changes(rec: dict[str, Any], src: torch.Tensor, out: torch.Tensor) -> str:
        """Why the cast of ``src`` into ``out`` is refused ("" when it is not).

        Checked in slices of :data:`_CHECK_ELEMENTS`, so the masks stay small beside the box.
        """
        a, b = src.reshape(-1), out.reshape(-1)
        to_float = out.is_floating_point()
        ints = src.dtype != torch.bool and not src.is_floating_point()
        overflow = changed = flushed = nonzero = flipped = raised = 0
        # A type without a zero (e8m0) takes what is far below its smallest value up to it
        # (1e-45 became 2^-127): that is its flush to zero, counted as one.
        floor = (float(torch.finfo(out.dtype).tiny) / 2
                 if to_float and float(torch.finfo(out.dtype).min) > 0 else 0.0)
        # Beyond the largest value by more than half a step there (what rounds to it): float8
        # e4m3fn saturates instead of giving inf (448 for 500, and for inf: review of the change
        # D1).
        top = _rounds_to_max(out.dtype) if to_float else 0.0
        for i in range(0, a.numel(), _CHECK_ELEMENTS):
            x, y = _checkable(a[i : i + _CHECK_ELEMENTS]), _checkable(b[i : i + _CHECK_ELEMENTS])
            if not to_float:
                changed += _int_changes(x, y)
                continue
            xf = x if x.is_floating_point() else x.double()  # (torch has no abs of uints)
            overflow += int((torch.isfinite(xf) & (~torch.isfinite(y) | (xf.abs() > top))).sum())
            # inf saturated, or made NaN: the fnuz float8 types and e8m0 have no inf, and
            # torch gives NaN there (an inf loss-scale buffer loaded as NaN, silently)
            overflow += int((torch.isinf(xf) & ~torch.isinf(y)).sum())
            if ints:
                changed += _int_changes(x, y)
            # A sign lost, or a 0 that is no longer 0: a float type without a sign or a zero
            # (e8m0) turned [-2, 0] into [2, 5.9e-39] and passed (maintainer review M1).
            yf = y if y.is_floating_point() else y.double()
            flipped += int(((xf < 0) & (yf > 0) | (xf > 0) & (yf < 0) | (xf == 0) & (yf != 0)).sum())
            nz = (x != 0) & torch.isfinite(x)
            nonzero += int(nz.sum())
            flushed += int((nz & (y == 0)).sum())
            if floor:
                raised += int((nz & (xf.abs() < floor)).sum())
        rec["flushed"] += flushed + raised
        if overflow:
            return (
                f"{overflow} value(s) out of the target type's range would become infinite, "
                "its largest value, or NaN"
            )
        if flipped:
            return (f"{flipped} value(s) would change sign or stop being 0 (the target type "
                    "has no sign or no zero)")
        if changed and ints:
            return f"{changed} integer value(s) cannot be represented and would change"
        if changed:
            return f"{changed} value(s) are not integers the target type holds"
        if flushed and 2 * flushed > nonzero:
            return (
                f"{flushed} of its {nonzero} non-zero values would become 0 (below the "
                "target type's smallest value)"
            )
        if raised and 2 * raised > nonzero:
            return (
                f"{raised} of its {nonzero} non-zero values would become the target type's "
                "smallest value, more than twice theirs (the type has no zero)"
            )
        return ""

    def report(self) -> list[dict[str, Any]]:
        """The casts of this rank's load, one per key (``LoadInfo.casts``)."""
        return list(self.done.values())

    def check(self, ck: Checkpoint, key: str, local: torch.Tensor) -> None:
        stored = ck.tensors[key].dtype
        target = target_dtype(local.dtype, key=key, stored=stored)
        if stored == target:
            return
        if torch_dtype(stored).is_complex != local.dtype.is_complex:
            # A complex value has no real one (torch drops the imaginary part with a warning)
            # and a real target of a complex tensor, or the reverse, is a different state.
            raise UsageError(
                f"tensor {key!r}: {ck.path} stores {stored}, the target is {target}: complex "
                "and real dtypes do not cast into each other; build the target with dtype "
                f"{stored} (torch.view_as_real/view_as_complex convert after the load)"
            )
        if self.strict:
            raise UsageError(
                f"tensor {key!r}: {ck.path} stores {stored}, the target is {target}; "
                f"strict_dtype=True refuses to cast (build the target with dtype {stored})"
            )
        if (self.tell and (stored, target) not in self.told
                and not exact_cast(torch_dtype(stored), local.dtype)):
            # The logger is silent until a job configures logging: a bf16 model loaded from
            # fp32 master weights lost precision without a word (odd-states review O5).
            self.told.add((stored, target))
            say(f"load: tensors stored as {stored} (first {key!r}) are cast to the target's "
                f"{target}, which rounds them; LoadInfo.casts lists each, strict_dtype=True "
                "refuses")
        family = "/".join("#" if p.isdigit() else p for p in key.split("/"))
        if (family, stored, target) not in self.seen:
            self.seen.add((family, stored, target))
            _log.warning(
                "load: casting %s (stored %s) to the target's %s%s; pass strict_dtype=True "
                "to refuse", key, stored, target,
                " and every tensor like it" if family != key else "",
            )
