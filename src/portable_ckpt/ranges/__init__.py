"""Range arithmetic and planning: boxes, exactly-once coverage, read plans (no I/O)."""

from portable_ckpt.ranges.box import Box, contiguous_prefix, intersect, strides_of
from portable_ckpt.ranges.coverage import (
    LayoutCache,
    check_coverage,
    check_coverage_arrays,
    find_overlap,
)
from portable_ckpt.ranges.planning import RangeIndex, ReadItem, intersect_arrays, plan_reads

__all__ = [
    "Box",
    "LayoutCache",
    "RangeIndex",
    "ReadItem",
    "check_coverage",
    "check_coverage_arrays",
    "contiguous_prefix",
    "find_overlap",
    "intersect",
    "intersect_arrays",
    "plan_reads",
    "strides_of",
]
