"""Describe the machine a run happened on (for the report header)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from typing import Any

__all__ = ["describe", "provenance"]


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _disk_of(path: str) -> str:
    try:
        out = subprocess.run(["findmnt", "-no", "SOURCE,FSTYPE,OPTIONS", "--target", path],
                             capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    dev = out.split()[0] if out else "?"
    model = ""
    name = os.path.basename(dev)
    if name:
        rot = _read(f"/sys/block/{name}/queue/rotational").strip()
        model = _read(f"/sys/block/{name}/device/model").strip()
        kind = {"0": "non-rotational", "1": "rotational"}.get(rot, "")
        model = ", ".join(x for x in (model, kind) if x)
    return f"{out} {('(' + model + ')') if model else ''}".strip()


def describe(scratch: str) -> dict[str, Any]:
    """CPU model, cores, memory, disk of ``scratch``, kernel, Python and library versions."""
    cpu = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), platform.processor() or "?")
    mem = next((int(line.split()[1]) * 1024 for line in _read("/proc/meminfo").splitlines()
                if line.startswith("MemTotal")), 0)
    du = shutil.disk_usage(scratch)
    versions: dict[str, str] = {}
    for mod in ("numpy", "torch", "safetensors", "zstandard", "crc32c", "ml_dtypes", "portable_ckpt"):
        try:
            m = __import__(mod)
            versions[mod] = str(getattr(m, "__version__", "?"))
        except Exception:
            versions[mod] = "not installed"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem / (1 << 30), 1),
        "scratch": scratch,
        "disk": _disk_of(scratch),
        "disk_free_gib": round(du.free / (1 << 30), 1),
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "versions": versions,
    }


def _git(repo: str) -> str:
    """The checkout's commit; ``PCK_BENCH_COMMIT`` names it where the tree was copied without
    its history (a machine the sources were shipped to)."""
    if os.environ.get("PCK_BENCH_COMMIT"):
        return os.environ["PCK_BENCH_COMMIT"]
    try:
        out = subprocess.run(["git", "-C", repo, "describe", "--always", "--dirty", "--abbrev=12"],
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return "?"
    return out.stdout.strip() or "?"


def provenance(scratch: str, argv: list[str] | None = None) -> dict[str, Any]:
    """What a later reader needs to rerun a measurement: command, date, commit and machine.

    Taken when the measurement runs and stored with its raw results, so a report re-rendered
    elsewhere still names the machine and the commit that measured.
    """
    import datetime as dt

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        import torch

        torch_v = f"{torch.__version__} (cuda {torch.version.cuda})"
    except Exception:
        torch_v = "not installed"
    if argv is None:  # `python -m bench.x` leaves the module's path in argv[0]
        mod = os.path.relpath(os.path.abspath(sys.argv[0]), repo)
        mod = mod.removesuffix(".py").removesuffix("/__main__").replace(os.sep, ".")
        argv = [mod, *sys.argv[1:]]
    return {"command": " ".join(["python", "-m", *argv]),
            "date": dt.datetime.now().isoformat(timespec="seconds"), "git": _git(repo),
            "torch": torch_v, "machine": describe(scratch)}
