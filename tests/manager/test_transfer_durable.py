"""A file a node-local tier copies to a peer node is durable, name included, before the copy is
reported (R-COMMIT-17: the commit record that follows counts on it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from portable_ckpt.torch.launch import run_group


@pytest.mark.parametrize("partial", [False, True])
def test_received_files_and_their_directory_are_fsynced_before_run_transfers_returns(
    tmp_path: Path, partial: bool
) -> None:
    """R-COMMIT-17: the receiving rank fsyncs the file and its directory before it returns.

    ``partial``: a receiver killed mid-file left a short file under the final name, which
    refused every later fetch ("attempts never overwrite files"; attack review F14): it is
    replaced by the peer's copy.
    """
    roots = [str(tmp_path / "node0"), str(tmp_path / "node1")]
    for r in roots:
        os.makedirs(r)
    res = run_group(
        "_transfer_workers:send_and_trace",
        2,
        [roots, partial],
        timeout=120.0,
        sys_path=[os.path.dirname(__file__)],
    )
    res.raise_for_errors()
    recv = res.results[1]
    assert recv["moved"] == 1000
    data_dir = os.path.join(roots[1], "attempt-x", "data")
    target = os.path.join(data_dir, "w00000.safetensors")
    assert (Path(target).read_bytes()) == b"\x01" * 1000
    fsynced = [os.path.realpath(p) for p in recv["fsynced"]]
    assert os.path.realpath(target) in fsynced, "the received file's data was not fsynced"
    assert os.path.realpath(data_dir) in fsynced, "the received file's name was not made durable"


def test_a_sender_that_cannot_read_voids_the_file_and_both_ranks_go_on(tmp_path: Path) -> None:
    """The node exchange could not report a sender's read error mid-file: the receiver waited
    for the collective timeout. The sender sends the declared bytes and a trailer voiding the
    file; the receiver keeps nothing of it, and the next file still arrives."""
    roots = [str(tmp_path / "node0"), str(tmp_path / "node1")]
    for r in roots:
        os.makedirs(r)
    res = run_group("_transfer_workers:sender_cannot_read", 2, [roots], timeout=120.0,
                    sys_path=[os.path.dirname(__file__)])
    res.raise_for_errors()
    sender, receiver = res.results
    assert sender["code"].startswith("PCK-STORAGE") and "Input/output error" in sender["code"]
    assert receiver["code"].startswith("PCK-STORAGE") and "could not read" in receiver["code"]
    assert sender["seconds"] < 30 and receiver["seconds"] < 30
    data = Path(roots[1], "attempt-x", "data")
    assert not (data / "w00000.safetensors").exists()
    assert (data / "w00001.safetensors").read_bytes() == b"\x02" * 500
