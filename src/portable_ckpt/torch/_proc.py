"""Resident memory of this process, for the evidence that demo, drills and benchmarks report."""

from __future__ import annotations

__all__ = ["reset_peak_rss", "rss"]


def rss() -> tuple[int, int]:
    """Return ``(current, peak)`` resident set size in bytes (``(0, 0)`` without ``/proc``)."""
    cur = peak = 0
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    cur = int(line.split()[1]) * 1024
                elif line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) * 1024
    except OSError:
        pass
    return cur, peak


def reset_peak_rss() -> None:
    """Reset the kernel's peak-RSS mark (``VmHWM``) so a later :func:`rss` measures one phase."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        pass
