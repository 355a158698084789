"""Range arithmetic and planning: boxes, exactly-once coverage, read plans (no I/O)."""

from portable_ckpt.ranges.box import Box, contiguous_prefix, intersect, strides_of
from portable_ckpt.ranges.coverage import check_coverage, find_overlap
from portable_ckpt.ranges.planning import RangeIndex, ReadItem, plan_reads

__all__ = [
    "Box",
    "RangeIndex",
    "ReadItem",
    "check_coverage",
    "contiguous_prefix",
    "find_overlap",
    "intersect",
    "plan_reads",
    "strides_of",
]
