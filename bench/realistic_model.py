"""The realistic state: a GPT-like model under FSDP2 on gloo ranks, AdamW, ``get_state_dict``.

Model: token embedding, position embedding, ``layers`` blocks of (layer norm, qkv, proj, layer
norm, fc, fc2 — every linear with a bias), final layer norm, head. Every parameter is sharded on
dim 0 by ``fully_shard`` (one FSDP unit per block plus the root), so with AdamW each rank holds
per parameter: its shard of the weight and of the two moments (DTensors) and the ``step``
scalar (a plain tensor, written once). The ``full`` preset is ~82 M parameters: 404 tensors per
rank, 939 MiB per version.

Parameters are created on the meta device and materialised shard by shard (``to_empty``), so no
rank ever holds the whole model.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["PRESETS", "ModelConfig", "build", "local_tensors", "state_digest", "train_step"]


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the GPT-like model and of one training step."""

    vocab: int = 16000
    d_model: int = 768
    layers: int = 8
    context: int = 1024
    batch: int = 1  # sequences per rank and step
    seq: int = 64  # tokens per sequence in a training step

    @property
    def params(self) -> int:
        d = self.d_model
        block = 12 * d * d + 13 * d
        return self.layers * block + 2 * self.vocab * d + self.context * d + 2 * d

    @property
    def state_bytes(self) -> int:
        """fp32 weights + two AdamW moments (the scalars' bytes are negligible)."""
        return 12 * self.params

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "params": self.params, "state_bytes": self.state_bytes}


PRESETS: dict[str, ModelConfig] = {
    # ~82 M parameters, 404 tensors per rank, 939 MiB per version (the state).
    "full": ModelConfig(),
    # ~2 M parameters, 25 MB per version: the small model.
    "small": ModelConfig(vocab=1700, d_model=128, layers=8, context=256, seq=64),
    # Tiny, for the test suite's smoke run.
    "smoke": ModelConfig(vocab=64, d_model=32, layers=2, context=16, seq=8),
}


def _modules(cfg: ModelConfig) -> Any:
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.ln2 = nn.LayerNorm(d)
            self.fc = nn.Linear(d, 4 * d)
            self.fc2 = nn.Linear(4 * d, d)
            self.heads = max(1, d // 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            h = self.heads
            q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
            a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(nn.functional.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
            self.pos = nn.Embedding(cfg.context, cfg.d_model)
            self.blocks = nn.ModuleList(Block(cfg.d_model) for _ in range(cfg.layers))
            self.ln_f = nn.LayerNorm(cfg.d_model)
            self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.tok(idx) + self.pos(pos)
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln_f(x))  # type: ignore[no-any-return]

    return GPT


def build(cfg: ModelConfig, rank: int, world: int, seed: int = 0) -> dict[str, Any]:
    """Build the FSDP2 model and AdamW on this rank and take one step (creates the moments)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    with torch.device("meta"):
        model = _modules(cfg)()
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    g = torch.Generator().manual_seed(seed * 7919 + rank)
    with torch.no_grad():
        for p in model.parameters():
            p.to_local().normal_(0.0, 0.02, generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    env = {"model": model, "opt": opt, "cfg": cfg, "gen": g}
    train_step(env, tokens=(1, min(8, cfg.context)))
    return env


def train_step(env: dict[str, Any], tokens: tuple[int, int] | None = None) -> float:
    """One forward/backward/AdamW step on random tokens; returns its seconds."""
    import torch

    cfg: ModelConfig = env["cfg"]
    b, t = tokens or (cfg.batch, cfg.seq)
    t0 = time.perf_counter()
    idx = torch.randint(0, cfg.vocab, (b, t), generator=env["gen"])
    logits = env["model"](idx)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab), idx.reshape(-1))
    loss.backward()
    env["opt"].step()
    env["opt"].zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def state_of(env: dict[str, Any]) -> dict[str, Any]:
    """The state a job saves: ``get_state_dict`` of model and optimizer."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(env["model"], env["opt"])
    return {"model": msd, "optim": osd}


def local_tensors(state: Any, prefix: str = "") -> dict[str, Any]:
    """Flatten a state to ``{key: local tensor}`` (DTensors to their local shard)."""
    import torch

    out: dict[str, Any] = {}
    if isinstance(state, dict):
        for k, v in state.items():
            out.update(local_tensors(v, f"{prefix}{k}."))
    elif isinstance(state, list | tuple):
        for i, v in enumerate(state):
            out.update(local_tensors(v, f"{prefix}{i}."))
    elif isinstance(state, torch.Tensor):
        local = state.to_local() if hasattr(state, "to_local") else state
        out[prefix[:-1]] = local
    return out


def local_bytes(state: Any) -> tuple[int, int]:
    """(number of tensors, bytes of this rank's local tensors)."""
    ts = local_tensors(state)
    return len(ts), sum(t.numel() * t.element_size() for t in ts.values())


def state_digest(state: Any) -> str:
    """A digest of every local tensor's bytes (to prove two loads delivered the same values)."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for k, t in sorted(local_tensors(state).items()):
        h.update(k.encode())
        h.update(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def zero_(state: Any) -> None:
    """Overwrite every local tensor with zeros (so a load provably writes every byte)."""
    import torch

    with torch.no_grad():
        for t in local_tensors(state).values():
            t.zero_()

