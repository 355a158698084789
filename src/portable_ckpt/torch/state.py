"""Continuation state beyond tensors: RNG, LR scheduler, gradient scaler and data position.

Each helper is a :class:`~portable_ckpt.torch.flatten.StateEntry`: put it anywhere in the state
dict passed to :func:`portable_ckpt.torch.save` / :func:`~portable_ckpt.torch.load` and it is
stored as one non-tensor entry with its built-in schema. LR schedulers
(``torch.optim.lr_scheduler.LRScheduler`` and ``ReduceLROnPlateau``) and gradient scalers
(``torch.amp.GradScaler`` and subclasses) found in the state dict are wrapped automatically.

* :class:`RNGState` — ``pck:rng/1``, per rank: Python ``random``, NumPy's legacy global generator,
  torch CPU and (when present) every CUDA device. Captured before any other ``state_dict()`` call
  and restored after everything else. World-size policy (default ``modulo``): on a different
  world size new rank ``r`` continues stored rank ``r mod W`` (``drop`` keeps fresh RNG,
  ``rank0`` gives everyone rank 0's, ``require_same`` refuses).
* :class:`DataPosition` — ``pck:data-position/1``, per rank: ``epoch``, ``global_sample_index``
  (samples of the epoch consumed by the whole job) and free-form further members (``extra``). Default policy ``rank0``: the cursor is global (the
  same on every rank) and each rank's share is derived from it and the current world size.
* :class:`LRSchedulerState` — ``pck:lr-scheduler/1``, global: the scheduler's
  ``state_dict()`` as JSON.
* :class:`GradScalerState` — ``pck:grad-scaler/1``, global. On CPU use
  ``torch.amp.GradScaler("cpu")`` (supported since torch 2.3).

The step itself is not an entry: it is the manifest's ``step`` (``LoadInfo.step``).
"""

from __future__ import annotations

import base64
import random
from typing import Any, cast

import numpy as np
import torch

from portable_ckpt.errors import EntrySchemaError, EntryTargetError, UsageError
from portable_ckpt.format.usage import strict_int
from portable_ckpt.format.vocab import POLICIES
from portable_ckpt.torch.flatten import StateEntry, decode_json, encode_json

__all__ = [
    "DataPosition",
    "GeneratorState",
    "GradScalerState",
    "LRSchedulerState",
    "RNGState",
    "capture_rng",
    "is_grad_scaler",
    "is_lr_scheduler",
    "restore_rng",
]

def _check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise UsageError(f"world_size_policy must be one of {POLICIES}, got {policy!r}")
    return policy


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.contiguous().numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(
        bytearray(base64.b64decode(s.encode("ascii"), validate=True)), dtype=torch.uint8
    )


def _cuda_initialized() -> bool:
    return bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]


def capture_rng(*, cuda: bool | None = None) -> dict[str, Any]:
    """Return this process's RNG state as a ``pck:rng/1`` value.

    Args:
        cuda: Include every CUDA device's generator (default: when CUDA is initialised).

    """
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state(legacy=True)
    if not isinstance(np_state, tuple):  # pragma: no cover - legacy=True always gives a tuple
        raise UsageError("numpy legacy RNG state unavailable")
    name, key, pos, has_gauss, cached = np_state
    use_cuda = torch.cuda.is_available() and _cuda_initialized() if cuda is None else cuda
    value: dict[str, Any] = {
        "python": {
            "version": int(version),
            "state": list(internal),  # ints already (a tuple of 625)
            "gauss_next": gauss,
        },
        "numpy": {
            "bit_generator": str(name),
            # tolist(): Python ints, 20× faster than int() per element (async_save blocks on it)
            "state": {"key": np.asarray(key).tolist(), "pos": int(pos)},
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch_cpu": _b64(torch.get_rng_state()),
    }
    if use_cuda:
        value["torch_cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return value


def restore_rng(value: dict[str, Any]) -> None:
    """Apply a ``pck:rng/1`` value to this process's generators.

    Raises:
        EntrySchemaError: ``value`` is no ``pck:rng/1`` object, or a member cannot be applied.

    """
    if not isinstance(value, dict):  # (None was an AttributeError on .get: api review 31)
        raise EntrySchemaError(
            f"pck:rng/1 value cannot be applied: expected an object (capture_rng()'s dict), got "
            f"{type(value).__name__}"
        )
    try:
        py = value.get("python")
        if py is not None:
            random.setstate(
                (int(py["version"]), tuple(int(x) for x in py["state"]), py["gauss_next"])
            )
        nps = value.get("numpy")
        if nps is not None:
            np.random.set_state(
                (
                    nps["bit_generator"],
                    np.asarray(nps["state"]["key"], dtype=np.uint32),
                    int(nps["state"]["pos"]),
                    int(nps["has_gauss"]),
                    float(nps["cached_gaussian"]),
                )
            )
        cpu = value.get("torch_cpu")
        if cpu is not None:
            torch.set_rng_state(_unb64(cpu))
        cuda = value.get("torch_cuda")
        if cuda and torch.cuda.is_available():
            states = [_unb64(s) for s in cuda]
            if len(states) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all(states)
            else:
                for i in range(min(len(states), torch.cuda.device_count())):
                    torch.cuda.set_rng_state(states[i], i)
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise EntrySchemaError(f"pck:rng/1 value cannot be applied: {e}") from e


class RNGState(StateEntry):
    """Per-rank RNG state (``pck:rng/1``); captured first at save, restored last at load.

    Args:
        world_size_policy: What a different world size gets (default ``modulo``).
        cuda: Include CUDA generators (default: when CUDA is initialised).

    """

    schema = "pck:rng/1"
    scope = "per_rank"
    restore_last = True
    capture_first = True

    def __init__(self, world_size_policy: str = "modulo", *, cuda: bool | None = None) -> None:
        self.world_size_policy = _check_policy(world_size_policy)
        self.cuda = cuda
        #: True after a load applied a stored value (False when the policy dropped it).
        self.restored = False

    def capture(self) -> Any:
        """Return this rank's RNG state now."""
        return capture_rng(cuda=self.cuda)

    def restore(self, value: Any) -> None:
        """Apply the stored value (``None``: keep the current generators)."""
        self.restored = value is not None
        if value is not None:
            restore_rng(value)


class GeneratorState(StateEntry):
    """Per-rank state of a generator of your own: a ``torch.Generator`` or ``numpy.random.Generator``.

    :class:`RNGState` holds the global generators only; one the job made itself (input noise,
    a sampler's, a NumPy ``default_rng``) cannot be stored as it is (never pickle), and wrapped
    as a plain value it is rank 0's for every rank. Stored as ``pck:json/1``, per rank, restored
    into the same generator object (after everything else, like the RNG). Registering it keeps
    an ``exact`` contract true (continuation review F3).

    A NumPy generator's ``spawn()`` continues the saved run's children when the generator is
    rebuilt from the saved run's seed before the load (its SeedSequence cannot be replaced, only
    advanced); otherwise its draws continue and a load of a run that spawned says that its
    children will not (a ``UserWarning``).

    Args:
        generator: The generator (its state is read at each save, set at each load).
        world_size_policy: What a different world size gets (default ``modulo``, as the RNG).

    """

    scope = "per_rank"
    restore_last = True

    def __init__(self, generator: Any, world_size_policy: str = "modulo") -> None:
        if isinstance(generator, torch.Generator):
            self.kind = "torch"
        elif isinstance(generator, np.random.Generator):
            self.kind = "numpy"
        else:
            raise UsageError(
                "GeneratorState takes a torch.Generator or a numpy.random.Generator, got "
                f"{type(generator).__name__}; the global generators are RNGState()'s"
            )
        self.generator = generator
        self.world_size_policy = _check_policy(world_size_policy)
        #: True after a load applied a stored value.
        self.restored = False

    def capture(self) -> Any:
        """Return the generator's state as JSON (a NumPy one's with its SeedSequence)."""
        if self.kind == "torch":
            return {"kind": "torch", "state": _b64(self.generator.get_state())}
        bitgen = self.generator.bit_generator
        value = {"kind": "numpy", "state": encode_json(_np_plain(bitgen.state), key="state")}
        seq = _seed_seq(bitgen)
        if seq is not None:
            value["seed_seq"] = encode_json(seq, key="seed_seq")
        return value

    def restore(self, value: Any) -> None:
        """Set the generator to a stored state (``None``: keep its current one).

        A NumPy state is checked against the generator's own layout before it is applied: NumPy
        does not range-check positions, and a hostile ``pos`` made draws read memory outside the
        generator, or crash the process (attack review 2 F1). Its SeedSequence cannot be
        replaced, so it is advanced past the children the saved run spawned: ``spawn()`` after
        a resume continues the saved run's children instead of repeating them (F8).

        Raises:
            EntryTargetError: the stored value is the other kind's (torch or NumPy).
            EntrySchemaError: the stored value is not a state of this generator.

        """
        self.restored = False
        if value is None:
            return
        if isinstance(value, dict) and value.get("kind") in ("torch", "numpy") and (
            value["kind"] != self.kind
        ):
            raise EntryTargetError(
                f"generator state cannot be applied: the stored state is a {value['kind']} "
                f"generator's, this is {self.kind}; give the entry a {value['kind']} generator"
            )
        try:
            if not isinstance(value, dict) or value.get("kind") != self.kind:
                got = value.get("kind") if isinstance(value, dict) else type(value).__name__
                raise ValueError(f"the stored state is a {got} generator's, this is {self.kind}")
            if self.kind == "torch":
                if not isinstance(value.get("state"), str):
                    raise ValueError("a torch generator's state is a base64 string")
                self.generator.set_state(_unb64(value["state"]))
            else:
                bitgen = self.generator.bit_generator
                state = _np_state(bitgen, decode_json(value.get("state")))
                _spawned(value.get("seed_seq"))  # all checked before the generator changes
                bitgen.state = state
                _advance_seed_seq(bitgen, value.get("seed_seq"))
        except (KeyError, TypeError, ValueError, RuntimeError, OverflowError) as e:
            raise EntrySchemaError(f"generator state cannot be applied: {e}") from e
        self.restored = True


#: Largest values of the integers of NumPy bit generator states, by name (others: < 2**128).
_NP_INT_MAX = {"pos": 624, "buffer_pos": 4, "has_uint32": 1, "uinteger": 2**32 - 1}


def _np_state(bitgen: Any, stored: Any) -> dict[str, Any]:
    """``stored`` checked member by member against ``bitgen``'s own state, with NumPy arrays.

    Same members, the same array lengths and element widths, integers (never booleans or
    floats) within their ranges; a position at most its buffer's length. NumPy's setters check
    little of this, and index their buffers with what they are given.
    """
    template = bitgen.state

    def check(want: Any, got: Any, where: str) -> Any:
        if isinstance(want, dict):
            if not isinstance(got, dict) or set(got) != set(want):
                raise ValueError(f"{where}: members {sorted(want)} expected")
            return {k: check(want[k], got[k], f"{where}.{k}") for k in want}
        if isinstance(want, np.ndarray):
            if not isinstance(got, list) or len(got) != want.size:
                raise ValueError(f"{where}: a list of {want.size} integers expected")
            top = 2 ** (8 * want.dtype.itemsize) - 1
            for x in got:
                if type(x) is not int or not 0 <= x <= top:
                    raise ValueError(f"{where}: integers of 0 … {top} expected")
            return np.array(got, dtype=want.dtype).reshape(want.shape)
        if isinstance(want, str):
            if got != want:
                raise ValueError(f"{where}: {want!r} expected, the stored state is {got!r}'s")
            return got
        top = _NP_INT_MAX.get(where.rsplit(".", 1)[-1], 2**128 - 1)
        if type(got) is not int or not 0 <= got <= top:
            raise ValueError(f"{where}: an integer of 0 … {top} expected")
        return got

    return cast(dict[str, Any], check(template, stored, "state"))


def _seed_seq(bitgen: Any) -> dict[str, Any] | None:
    """A bit generator's SeedSequence as JSON (``None`` for one that is not a SeedSequence)."""
    seq = getattr(bitgen, "seed_seq", None)
    if not isinstance(seq, np.random.SeedSequence):
        return None
    entropy: Any = seq.entropy
    return {
        "entropy": [int(x) for x in entropy] if isinstance(entropy, (list, tuple, np.ndarray))
        else (None if entropy is None else int(entropy)),
        "spawn_key": [int(x) for x in seq.spawn_key],
        "pool_size": int(seq.pool_size),
        "n_children_spawned": int(seq.n_children_spawned),
    }


#: Children a stored SeedSequence may claim to have spawned (spawning them again costs time).
_MAX_CHILDREN = 1 << 16


def _spawned(stored: Any) -> int | None:
    """The stored SeedSequence's number of children (None: no sequence was stored)."""
    if stored is None:
        return None
    if not isinstance(stored, dict) or type(stored.get("n_children_spawned")) is not int:
        raise ValueError("seed_seq: n_children_spawned expected")
    want: int = stored["n_children_spawned"]
    if not 0 <= want <= _MAX_CHILDREN:
        raise ValueError(f"seed_seq.n_children_spawned: 0 … {_MAX_CHILDREN} expected")
    return want


def _advance_seed_seq(bitgen: Any, stored: Any) -> None:
    """Spawn (and drop) the children the saved run had spawned beyond this generator's.

    Only for the same sequence (entropy, spawn key, pool size): another seed's children differ
    whatever is done, and a generator that spawned more than the saved run cannot go back; both
    are said (a ``UserWarning``), as the contract cannot cover them.
    """
    mine = _seed_seq(bitgen)
    want = _spawned(stored)
    if want is None or mine is None:
        return
    same = all(stored.get(k) == mine[k] for k in ("entropy", "spawn_key", "pool_size"))
    have = mine["n_children_spawned"]
    if same and want >= have:
        if want > have:
            bitgen.seed_seq.spawn(want - have)
        return
    if not same and want == have == 0:
        return  # a run that never spawned: said in the class docstring, not at every load
    import warnings

    why = ("it was seeded otherwise than the saved run's" if not same else
           f"it spawned {have} children, the saved run {want}")
    warnings.warn(
        f"GeneratorState: draws continue the saved run's, but spawn() will not: {why}; build "
        "the generator with the saved run's seed before restoring, and spawn after it",
        UserWarning, stacklevel=3,
    )


def _np_plain(value: Any) -> Any:
    """A NumPy bit generator's state with arrays and NumPy integers as JSON lists and ints."""
    if isinstance(value, dict):
        return {k: _np_plain(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return [int(x) for x in value.reshape(-1)]
    if isinstance(value, np.integer):
        return int(value)
    return value


class DataPosition(StateEntry):
    """Where the data stream stands (``pck:data-position/1``), a mutable holder.

    Args:
        epoch: Current epoch (an integer >= 0, as ``global_sample_index``; ``PCK-USAGE``
            otherwise).
        global_sample_index: Samples of the epoch consumed by the whole job (the same on every
            rank).
        extra: Further JSON members stored beside them (e.g. ``sampler_seed``).
        world_size_policy: What a different world size gets (default ``rank0``).

    """

    schema = "pck:data-position/1"
    scope = "per_rank"

    def __init__(
        self,
        epoch: int = 0,
        global_sample_index: int = 0,
        extra: dict[str, Any] | None = None,
        *,
        world_size_policy: str = "rank0",
    ) -> None:
        # Counts: int("1") and int(1.5) took a string and a float, and -1 was taken, each
        # stored as a position the loader then resumed from (api review 31)
        self.epoch = strict_int(epoch, "DataPosition: epoch", minimum=0)
        self.global_sample_index = strict_int(
            global_sample_index, "DataPosition: global_sample_index", minimum=0)
        self.extra: dict[str, Any] = dict(extra or {})
        self.world_size_policy = _check_policy(world_size_policy)
        #: True after a load applied a stored value.
        self.restored = False

    def capture(self) -> Any:
        """Return the position as JSON."""
        value: dict[str, Any] = {k: encode_json(v, key=k) for k, v in self.extra.items()}
        value.update(epoch=self.epoch, global_sample_index=self.global_sample_index)
        return value

    def restore(self, value: Any) -> None:
        """Apply a stored position (``None``: keep the current one)."""
        self.restored = value is not None
        if value is None:
            return
        try:
            self.epoch = int(value["epoch"])
            self.global_sample_index = int(value["global_sample_index"])
            self.extra = {
                k: decode_json(v)
                for k, v in value.items()
                if k not in ("epoch", "global_sample_index")
            }
        except (KeyError, TypeError, ValueError) as e:
            raise EntrySchemaError(f"pck:data-position/1 value cannot be applied: {e}") from e

    def __repr__(self) -> str:
        return (
            f"DataPosition(epoch={self.epoch}, global_sample_index={self.global_sample_index}, "
            f"extra={self.extra})"
        )


def is_lr_scheduler(obj: Any) -> bool:
    """Whether ``obj`` is a torch LR scheduler (including ``ReduceLROnPlateau``)."""
    sched = torch.optim.lr_scheduler
    bases = tuple(
        c
        for c in (getattr(sched, "LRScheduler", None), getattr(sched, "ReduceLROnPlateau", None))
        if c
    )
    return isinstance(obj, bases)


def is_grad_scaler(obj: Any) -> bool:
    """Whether ``obj`` is a ``torch.amp.GradScaler`` (or the CUDA alias / a subclass)."""
    return isinstance(obj, torch.amp.GradScaler)


class LRSchedulerState(StateEntry):
    """A scheduler's state (``pck:lr-scheduler/1``, global).

    The value is ``scheduler.state_dict()`` as JSON (non-finite floats tagged as
    ``{"__float__": "inf"}``).
    """

    schema = "pck:lr-scheduler/1"

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def capture(self) -> Any:
        """Return the scheduler's state as JSON, with the class of each scheduler (``class``)."""
        value = encode_json(self.scheduler.state_dict(), key="lr-scheduler")
        _name_classes(value, self.scheduler)
        return value

    def restore(self, value: Any) -> None:
        """Load a stored scheduler state into a scheduler of the class that saved it.

        Raises:
            EntryTargetError: the value names another scheduler class (R-ENTRY-17): applied to
                it, a ``CosineAnnealingLR``'s state set a ``LinearLR``'s epoch and left a
                stray ``T_max`` (fine-tuning review F5).

        """
        if value is None:
            return
        _check_classes(value, self.scheduler, "the value")  # before the scheduler changes
        state = decode_json(without_scheduler_class(value))
        current = self.scheduler.state_dict()
        for k, v in list(state.items()):  # keep tuple-typed fields tuples
            if isinstance(current.get(k), tuple) and isinstance(v, list):
                state[k] = tuple(v)
        self.scheduler.load_state_dict(state)


def _class_name(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _name_classes(value: Any, scheduler: Any) -> None:
    """Add ``class`` to a scheduler's JSON state, and to each nested scheduler's (SequentialLR)."""
    if not isinstance(value, dict):
        return
    value["class"] = _class_name(scheduler)
    nested, inner = value.get("_schedulers"), getattr(scheduler, "_schedulers", None)
    if isinstance(nested, list) and isinstance(inner, (list, tuple)) and len(nested) == len(inner):
        for v, s in zip(nested, inner, strict=True):
            _name_classes(v, s)


def without_scheduler_class(value: Any) -> Any:
    """A ``pck:lr-scheduler/1`` value without the ``class`` members the format adds.

    For a ``load_state_dict`` that is not :class:`LRSchedulerState`'s (DCP's, a torch.save
    file's), which would keep them as attributes (R-ENTRY-17: not handed to the scheduler).
    """
    if not isinstance(value, dict):
        return value
    out = {k: v for k, v in value.items() if k != "class"}
    if isinstance(out.get("_schedulers"), list):
        out["_schedulers"] = [without_scheduler_class(v) for v in out["_schedulers"]]
    return out


def _check_classes(value: Any, scheduler: Any, where: str) -> None:
    """Refuse ``value`` unless each ``class`` it holds names ``scheduler``'s class, or is absent.

    Classes are compared by their last dotted part, against the target's class and its bases:
    a job whose scheduler moved to another module, or a subclass of the stored class, restores
    as before; a value of another scheduler class is refused, naming both. Nested schedulers
    (SequentialLR, ChainedScheduler) are compared one by one, and a different number of them
    is refused whatever the value names (torch applies the first ones, or fails on an index).
    """
    if not isinstance(value, dict):
        return
    stored, live = value.get("class"), _class_name(scheduler)
    names = {c.__name__ for c in type(scheduler).__mro__}  # "a.<locals>.Warmup": "Warmup"
    if isinstance(stored, str) and stored.rsplit(".", 1)[-1] not in names:
        raise EntryTargetError(
            f"pck:lr-scheduler/1 value cannot be applied: {where} holds the state of a "
            f"{stored[-200:]}, the target is a {live}; build the scheduler of the stored class, "
            "or leave the scheduler out of the loaded state (a fine-tune builds it fresh; a "
            "version an older release saved after loading another class's state names that "
            "class: docs/upgrading.md, 'Loads')"
        )
    nested, inner = value.get("_schedulers"), getattr(scheduler, "_schedulers", None)
    if isinstance(nested, list) and isinstance(inner, (list, tuple)):
        if len(nested) != len(inner):
            raise EntryTargetError(
                f"pck:lr-scheduler/1 value cannot be applied: {where} holds {len(nested)} "
                f"nested schedulers, the target {live} holds {len(inner)}; build it with the "
                "stored schedule, or leave the scheduler out of the loaded state"
            )
        for i, (v, s) in enumerate(zip(nested, inner, strict=True)):
            _check_classes(v, s, f"{where}._schedulers[{i}]")


class GradScalerState(StateEntry):
    """A gradient scaler's state (``pck:grad-scaler/1``, global)."""

    schema = "pck:grad-scaler/1"

    def __init__(self, scaler: Any) -> None:
        self.scaler = scaler

    def capture(self) -> Any:
        """Return the scaler's state as JSON."""
        sd = self.scaler.state_dict()
        if not sd:
            return {}
        return {
            "scale": float(sd["scale"]),
            "growth_factor": float(sd["growth_factor"]),
            "backoff_factor": float(sd["backoff_factor"]),
            "growth_interval": int(sd["growth_interval"]),
            "_growth_tracker": int(sd["_growth_tracker"]),
        }

    def restore(self, value: Any) -> None:
        """Load a stored scaler state."""
        if not value:
            return
        self.scaler.load_state_dict(
            {
                "scale": float(value["scale"]),
                "growth_factor": float(value["growth_factor"]),
                "backoff_factor": float(value["backoff_factor"]),
                "growth_interval": int(value["growth_interval"]),
                "_growth_tracker": int(value["_growth_tracker"]),
            }
        )
