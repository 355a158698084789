"""Train a small GPT-like model with FSDP2 and let CheckpointManager handle every checkpoint.

Run it with torchrun (CPU processes over gloo; the model stays on the CPU, also where CUDA is
present: on GPUs, give each rank its device and a NCCL group as in docs/torch.md)::

    torchrun --nproc_per_node 4 examples/train_fsdp2.py --ckpt ckpts/run1 --steps 200
    # stop it any time (Ctrl-C or SIGTERM to torchrun: the step is saved before exiting), then
    torchrun --nproc_per_node 3 examples/train_fsdp2.py --ckpt ckpts/run1 --steps 200 --resize

(After a SIGTERM, torchrun itself prints ``SignalException`` with a traceback and exits 1, as it
does for any job it was told to stop: the workers saved the step and exited first; ``portable-ckpt
ls ckpts/run1`` shows it.)

It uses only the public API of ``portable_ckpt.torch``: the manager decides when to save (every
``--save-every`` steps durably, every ``--fast-every`` steps to the fast tier with ``--fast``), keeps the last
three durable versions and the best by loss, saves synchronously on SIGTERM or Ctrl-C (SIGINT,
which torchrun forwards to its workers), resumes from the newest verified version over both
tiers, and records telemetry in ``--events``. The loss is the global batch's on any world size,
so the losses after a resume on another world size continue the interrupted run's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import portable_ckpt.torch as pckt


class Block(torch.nn.Module):
    """Pre-norm attention + MLP block (the shape of a GPT layer, small)."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(d)
        self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Causal self-attention, then the MLP, each with a residual."""
        h = self.ln1(x)
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool), 1)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(torch.nn.Module):
    """Token + position embeddings, blocks, tied-free head."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, ctx: int) -> None:
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(ctx, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits for every position."""
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def batch(data: pckt.DataPosition, args: argparse.Namespace, rank: int, world: int) -> torch.Tensor:
    """Return this rank's share of the global batch at the data cursor (deterministic).

    Shares differ by at most one sample (8 on 3 ranks: 3, 3, 2); ranks beyond the batch get none.
    """
    g = torch.Generator().manual_seed(args.seed * 100_003 + data.global_sample_index)
    tokens = torch.randint(0, args.vocab, (args.batch, args.ctx + 1), generator=g)
    return tokens.tensor_split(world)[rank]


def main() -> None:
    """Train, saving and resuming through the manager."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--ckpt", required=True, help="durable checkpoint root (path or s3://)")
    p.add_argument("--fast", default=None, help="fast tier root (local disk / tmpfs)")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--save-every", type=int, default=20)
    p.add_argument("--fast-every", type=int, default=5, help="fast-tier save every N steps (with --fast)")
    p.add_argument("--events", default=None, help="telemetry: JSON lines or a .prom textfile")
    p.add_argument("--resize", action="store_true", help="accept resuming on another world size")
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ctx", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step (demos)")
    args = p.parse_args()

    dist.init_process_group("gloo")  # the model, mesh and batches below are CPU tensors
    try:
        train(args)
    finally:
        # Also when train() raises: a process that exits with its groups alive can abort in
        # torch's own teardown ("terminate called"), hiding the error that stopped it.
        dist.destroy_process_group()


def train(args: argparse.Namespace) -> None:
    """The training loop of one rank; the manager owns every checkpoint."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = TinyGPT(args.vocab, args.dim, args.layers, args.heads, args.ctx)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    for b in model.blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 10) * 0.5 * (1 + math.cos(math.pi * s / args.steps))
    )
    data = pckt.DataPosition(0, 0, {"seed": args.seed})
    # Live objects, asked for their state at each save: nothing stale is ever saved.
    state = {
        "train": pckt.ModelOptimizerState(model, opt),
        "sched": sched,
        "data": data,
        "rng": pckt.RNGState(),
    }
    with pckt.CheckpointManager(
        args.ckpt,
        save_every=args.save_every,
        keep_last=3,
        keep_best=("loss", 1, "min"),
        fast_root=args.fast,
        fast_every=args.fast_every if args.fast else None,
        verify_sample=0.25,
        events=args.events,
        handle_sigint=True,  # Ctrl-C saves the step and stops, like SIGTERM
    ) as mgr:
        info = mgr.restore(state, allow_statistical=args.resize)  # None on the first run
        start = info.step + 1 if info is not None else 1
        if rank == 0:
            print(json.dumps({"world": world, "restored_step": info and info.step}), flush=True)
        last = start - 1
        n_global = args.batch * args.ctx  # predicted tokens in the global batch
        for step in range(start, args.steps + 1):
            tokens = batch(data, args, rank, world)
            logits = model(tokens[:, :-1])
            loss_sum = torch.nn.functional.cross_entropy(
                logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1), reduction="sum"
            )
            opt.zero_grad(set_to_none=True)
            # FSDP averages gradients over ranks: this gives the global batch's mean-loss
            # gradient whatever each rank's share (an empty share contributes zero).
            (loss_sum * world / n_global).backward()
            opt.step()
            sched.step()
            data.global_sample_index += args.batch
            total = loss_sum.detach().double().reshape(1)
            dist.all_reduce(total)  # the sum over the global batch
            mean = float(total.item()) / n_global
            last = step
            mgr.maybe_save(step, state, metrics={"loss": mean})
            if rank == 0:
                print(json.dumps({"step": step, "loss": round(mean, 4)}), flush=True)
            if mgr.preempted:  # SIGTERM or Ctrl-C: this step was just saved synchronously
                break
            time.sleep(args.step_sleep)
    if rank == 0:
        print(json.dumps({"done": last, "preempted": mgr.preempted}), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main()
