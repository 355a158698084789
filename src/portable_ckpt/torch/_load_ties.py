"""Targets that share memory (tied weights, views inside another target) and how a load fills them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from portable_ckpt.errors import UsageError

__all__ = ["tied_targets"]

def tied_targets(targets: Sequence[tuple[str, torch.Tensor]]) -> dict[str, str]:
    """Targets that are the memory of an earlier one: key → the earlier key it is tied to.

    A tied model (``head.weight = emb.weight``) holds one tensor under two keys; the load wrote
    it twice and the last key won: an untied version loaded into a tied model gave the
    embedding the head's values, silently (odd-states review O2). A tie (the same memory, shape,
    strides and dtype), or a view inside another target, is filled by that target, and its own
    stored values are compared with what it then holds. Targets that overlap only in part are
    refused.
    """
    spans: dict[tuple[str, int], list[tuple[int, int, str, torch.Tensor]]] = {}
    for key, t in targets:
        if t.numel() == 0 or t.device.type == "meta":
            continue
        lo = t.data_ptr()
        extent = sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))
        hi = lo + (extent + 1) * t.element_size()
        spans.setdefault((str(t.device), t.untyped_storage().data_ptr()), []).append(
            (lo, hi, key, t))
    ties: dict[str, str] = {}
    for group in spans.values():
        group.sort(key=lambda g: (g[0], -g[1]))  # a base before the views that start with it
        for cluster in _clusters(group):
            _ties_in(cluster, ties)
    return ties


Span = tuple[int, int, str, torch.Tensor]


def _clusters(group: list[Span]) -> list[list[Span]]:
    """The runs of spans (sorted by start) that overlap one another, of two or more.

    Views of one flat buffer (a contiguous parameter buffer, FSDP1's ``use_orig_params``) are
    all one group; only spans that overlap are looked at together (last review L3: one tie
    among them made the whole buffer one case: a mask of its size, quadratic time).
    """
    out: list[list[Span]] = []
    run: list[Span] = []
    end = 0
    for g in group:
        if run and g[0] >= end:
            if len(run) > 1:
                out.append(run)
            run = []
        run.append(g)
        end = g[1] if len(run) == 1 else max(end, g[1])
    if len(run) > 1:
        out.append(run)
    return out


def _ties_in(cluster: list[Span], ties: dict[str, str]) -> None:
    """Ties and refusals among targets of one storage whose spans overlap.

    The same view under two keys is a tie at once. Otherwise one byte mask for the cluster's
    span, each view marked in turn: a view whose bytes are all marked already is filled by the
    views before it (a tie: compared after), one with some marked is refused.
    """
    first: dict[tuple[Any, ...], str] = {}
    views: list[Span] = []
    for g in cluster:
        t = g[3]
        same = (t.data_ptr(), t.dtype, tuple(t.shape), t.stride())
        if same in first:
            ties[g[2]] = ties.get(first[same], first[same])
        else:
            first[same] = g[2]
            views.append(g)
    if len(views) < 2:
        return
    base = views[0][0]
    mask = torch.zeros(max(hi for _, hi, _, _ in views) - base, dtype=torch.uint8)
    seen: list[Span] = []
    for lo, hi, key, t in views:
        size = t.element_size()
        view = mask.as_strided((*t.shape, size), (*(st * size for st in t.stride()), 1), lo - base)
        if bool(view.any()):
            other = next(k for a, b, k, _ in seen if a < hi and lo < b)
            if not bool(view.all()):
                raise UsageError(
                    f"tensors {other!r} and {key!r} of the target share part of their "
                    "memory: the load would write those elements twice and keep the last "
                    "key's values. Load one of them (leave the other out of the state), "
                    "or make them independent (.clone())"
                )
            ties[key] = ties.get(other, other)
            continue
        view.fill_(1)
        seen.append((lo, hi, key, t))
