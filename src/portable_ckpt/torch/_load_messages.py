"""What a load says when the target's keys and the version's do not match: the nearest keys, the fix."""

from __future__ import annotations

from typing import Any

from portable_ckpt.errors import CheckpointError, TensorMissingError
from portable_ckpt.format.keys import similar_keys
from portable_ckpt.io.reader import Checkpoint
from portable_ckpt.torch.flatten import VALUES_ENTRY

__all__ = ["instead", "none_found"]

def none_found(ck: Checkpoint, keys: list[str]) -> TensorMissingError:
    """The error of a load of which no rank found one of its target tensors in the version.

    Such a load loaded nothing and reported success, also with ``strict=False``: the
    fine-tune the docs showed restored ``{"model": model}`` from a version that holds
    ``train/model/...`` and trained from random weights (docs review 21, F1). Keys absent one
    by one are what ``strict=False`` is for; all of them absent is a target that does not fit.
    """
    where = f"checkpoint {ck.path}, which holds {len(ck.tensors)} tensors"
    if not keys:  # this rank holds no tensor: its peers' did not fit
        return TensorMissingError(f"no rank found one of its target tensors in {where}")
    return TensorMissingError(
        f"none of the target's {len(keys)} tensors (e.g. {keys[0]!r}) is in {where}: the "
        f"target does not fit the version, and strict=False does not load it either; "
        f"{_prefix_hint(ck, keys)}. To load an optional part only where a version holds it, "
        "look first: portable_ckpt.open(root).tensors"
    )


def _stored_below(key: str, stored: list[str], wanted: str) -> str:
    """A container stored where the target holds one ``wanted`` at ``key``, said ("" if not).

    A module's extra state that is None in a fresh object, a parameter that became a
    submodule: not a renamed prefix, as the keys that look alike suggested (zoo review, low).
    """
    below = sorted(k for k in stored if k.startswith(f"{key}/"))
    if not below:
        return ""
    return (
        f"the checkpoint holds a dict or list there ({below[:4]}"
        f"{', ...' if len(below) > 4 else ''}), the target a single "
        f"{'plain value' if wanted == 'value' else 'tensor'}: make the target's value a "
        "container of that shape (an empty dict takes whatever is stored below it)"
    )


def _prefix_hint(ck: Checkpoint, keys: list[str]) -> str:
    """How the target's keys differ from the stored ones by a prefix, or how to see both."""
    stored = list(ck.tensors)  # in the record's order: the same hint on every rank and run
    below = _stored_below(keys[0], stored, "tensor")
    if below:
        return below
    ends: dict[str, str] = {}  # "a/b/c" -> "x/a/b/c": the stored keys by their shorter tails
    for s in stored[:200_000]:
        parts = s.split("/")
        for i in range(1, min(len(parts), 8)):
            ends.setdefault("/".join(parts[i:]), s)
    known = set(stored)
    for key in keys[:256]:
        if key in ends:
            long = ends[key]
            under = long[: -len(key)]
            return (f"the version holds {key!r} as {long!r}: nest the target under {under!r} "
                    "as the saving job did")
        parts = key.split("/")
        for i in range(1, len(parts)):
            tail = "/".join(parts[i:])
            if tail in known:
                return (f"the version holds {key!r} as {tail!r}: the target nests it under "
                        f"{'/'.join(parts[:i]) + '/'!r}, the saving job did not")
    close = similar_keys(keys[0], stored)
    if close:
        return f"stored keys that look alike: {close} (a renamed prefix? map the target's keys)"
    return "build the target with the saved keys (portable-ckpt inspect lists them)"


def instead(ck: Checkpoint, key: str, *, wanted: str) -> str:
    """What ``ck`` holds in place of a missing ``key``, for the error ("" when nothing is near).

    The same key stored as the other kind (a tensor saved where the target now holds an int),
    or keys that look alike (a renamed prefix): ``strict=False`` is then the wrong advice, as it
    would load nothing for them and report success.
    """
    values: Any = {}
    if VALUES_ENTRY in ck.entries:
        try:
            values = ck.entry(VALUES_ENTRY)
        except CheckpointError:
            values = {}
    values = values if isinstance(values, dict) else {}
    if wanted == "value" and key in ck.tensors:
        return (
            f"; the checkpoint holds {key!r} as a tensor, the target a plain value: make the "
            "target a tensor of the saved shape and dtype"
        )
    if wanted == "tensor" and key in values:
        return (
            f"; the checkpoint holds {key!r} as a plain value, the target a tensor: make the "
            "target that value's type"
        )
    head, _, member = key.rpartition("/")
    if f"/{head}/".find("/state/") >= 0:
        # An optimizer's per-parameter state of other members: another optimizer class, not a
        # renamed prefix (manager review 25, L2: an AdamW's state loaded into an SGD said "map
        # the target's keys")
        sibling = {k.rpartition("/")[2] for k in [*ck.tensors, *values]
                   if k.rpartition("/")[0] == head}
        if sibling and member not in sibling:
            return (f"; the checkpoint holds {sorted(sibling)[:6]} for that parameter: the "
                    "state of another optimizer class (an AdamW's where an SGD's is wanted?): "
                    "build the optimizer the version saved, or leave it out of the loaded "
                    "state (a fine-tune builds it fresh)")
    below = _stored_below(key, [*ck.tensors, *values], wanted)
    if below:
        return f"; {below}"
    close = similar_keys(key, [*ck.tensors, *values])
    if not close:
        return ""
    return (
        f"; stored keys that look alike: {close} (a renamed prefix? map the target's keys; "
        "strict=False would leave them unloaded and report success)"
    )
