"""DCP's async staging kept across saves: the fair peer of our reused staging buffers.

``dcp.async_save`` with its defaults (``FileSystemWriter`` as the stager) makes a new CPU copy
of the state at every save; ours copies into buffers it keeps. The benchmarks run DCP both
ways: with its defaults and with one stager kept across saves (its first call untimed).
"""

from __future__ import annotations

from typing import Any

__all__ = ["reused_stager"]


def reused_stager(cuda: bool, process: bool) -> Any:
    """A DCP stager that keeps its staging buffers across saves; staging stays synchronous.

    On CUDA, ``BlockingAsyncStager(cache_staged_state_dict=True)`` (pinned buffers; what
    ``FileSystemWriter(cache_staged_state_dict=True)`` does): torch 2.11's ``DefaultStager``
    failed on the realistic state (``KeyError: <class 'type'>`` in its deep copy). On the CPU,
    where pinning needs an accelerator, ``DefaultStager`` without pinning (shared memory for
    the process mode).
    """
    from torch.distributed.checkpoint.staging import (
        BlockingAsyncStager,
        DefaultStager,
        StagingOptions,
    )

    if cuda:
        return BlockingAsyncStager(cache_staged_state_dict=True)
    return DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=process,
                                        use_async_staging=False, use_non_blocking_copy=False))
