"""Policy code of the checkpoint manager (no torch): save decisions, retention, telemetry.

The training-loop object is :class:`portable_ckpt.torch.CheckpointManager` (the thin torch
binding in :mod:`portable_ckpt.torch.manager`); everything here is plain Python, importable and
testable without torch:

* :mod:`~portable_ckpt.manager.decisions` — when to save (every N steps, every S seconds, listed
  steps, preemption), decided once and shared by every rank;
* :mod:`~portable_ckpt.manager.retention` — which versions to keep (last N, every M-th, best N by
  a metric), with the protections of the spec's gc rules;
* :mod:`~portable_ckpt.manager.telemetry` — structured events (logger, JSON lines, Prometheus);
* :mod:`~portable_ckpt.manager.records` — what the manager stores in and beside a version.
"""

from __future__ import annotations

from portable_ckpt.manager.decisions import Decision, SavePolicy, decide
from portable_ckpt.manager.retention import (
    Candidate,
    KeepBest,
    RetentionDecision,
    RetentionPolicy,
    plan_retention,
)
from portable_ckpt.manager.telemetry import Telemetry

__all__ = [
    "Candidate",
    "Decision",
    "KeepBest",
    "RetentionDecision",
    "RetentionPolicy",
    "SavePolicy",
    "Telemetry",
    "decide",
    "plan_retention",
]
