"""Rank functions of tests/torch/test_logs_torch.py: each collects its own job log."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import portable_ckpt.torch as pckt
from portable_ckpt.errors import CheckpointError
from portable_ckpt.logs import EVENT_ATTR, LOGGER_NAME


class Events(logging.Handler):
    """The event objects of every record, as an application's handler would see them."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.docs: list[dict[str, Any]] = []
        self.names: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        doc = getattr(record, EVENT_ATTR, None)
        if doc is not None:
            self.docs.append(doc)
            self.names.append(record.name)


def save_load_refuse(rank: int, world: int, root: str) -> dict[str, Any]:
    """Save a sharded state, load it back, then try a load the checkpoint cannot satisfy."""
    log = logging.getLogger(LOGGER_NAME)
    events = Events()
    log.addHandler(events)
    log.setLevel(logging.INFO)
    mesh = init_device_mesh("cpu", (world,))
    w = torch.arange(64 * 32, dtype=torch.float32).reshape(64, 32)
    state = {"model": {"w": distribute_tensor(w, mesh, [Shard(0)]), "b": torch.ones(16)}}
    pckt.save(state, root, step=7)
    target = {"model": {"w": distribute_tensor(torch.zeros(64, 32), mesh, [Shard(0)]),
                        "b": torch.zeros(16)}}
    pckt.load(target, root)
    code = None
    try:
        pckt.load({"model": {"missing": torch.zeros(2)}}, root)
    except CheckpointError as exc:
        code = exc.code
    log.removeHandler(events)
    return {"events": events.docs, "loggers": events.names, "code": code,
            "restored": bool(torch.equal(target["model"]["w"].full_tensor(), w))}
