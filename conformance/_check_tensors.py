"""The version checker's checks of tensors (§8, §8.5).

Every tensor record, its ranges against the shard headers and the frames they hold,
exactly-once coverage, and format 1.1 tensor tables (the manifest's and a writer index's),
with the rules of format versions for dtypes.
"""

from __future__ import annotations

import math
import re
from typing import Any

from conformance._check_base import CheckerBase, is_int
from conformance.coverage import check_coverage
from conformance.documents import JsonPath, Located
from conformance.spec import (
    DTYPE_SINCE,
    DTYPES,
    MAX_NDIM,
    MAX_SIZE,
    NEWEST_FORMAT_VERSION,
    NEWEST_MINOR,
    TABLE_EXTENSION,
    dtype_not_allowed,
    has_control_chars,
    path_problem,
)
from conformance.store import (
    ZSTD_HEADER_MAX,
    Problem,
    StHeader,
    parse_safetensors_header,
    zstd_check_header,
    zstd_decode,
)
from conformance.table import TensorTable, load_table

__all__ = ["TensorChecks"]


class TensorChecks(CheckerBase):
    """Tensors, their ranges and tensor tables (§8, §8.5), and the dtypes' format versions."""

    # -- tensor tables (format 1.1) --------------------------------------------------------------
    def check_version_use(self, m: dict[str, Any]) -> None:
        """R-VERSION-2 is a writer rule; a reader accepts any 1.x, so ``check`` warns.

        The writer harness, where only the writer under test wrote the attempt, fails it.
        """
        fv, mu = m.get("format_version"), m.get("must_understand")
        mv = re.fullmatch(r"1\.(0|[1-9][0-9]{0,8})", fv) if isinstance(fv, str) else None
        if mv is not None and int(mv.group(1)) > NEWEST_MINOR:
            # Valid for a reader (§16.2), but no writer of this text records it: a writer that
            # stamps a version it does not implement passed the harness (review C2).
            self.r.warn(f"{self.name}: format_version {fv} is newer than this checker's "
                        f"{NEWEST_FORMAT_VERSION} and was checked as {NEWEST_FORMAT_VERSION}; a "
                        "writer of this text records '1.0', '1.1' for a tensor table, or '1.3' "
                        "for a dtype of 1.3 (R-VERSION-2)")
        elif fv == "1.2":
            # 1.2 changes verification records only (spec §14.5): a manifest uses none of it.
            self.r.warn(f"{self.name}: format_version 1.2 in a manifest: 1.2 adds nothing to "
                        "manifests; a writer records '1.0', '1.1' for a tensor table, or '1.3' "
                        "for a dtype of 1.3 (R-VERSION-2)")
        if fv == "1.1" and "tensor_table" not in m:
            self.r.warn(f"{self.name}: format_version 1.1 without a tensor table: writers record "
                        "'1.0' in documents that use no 1.1 feature (R-VERSION-2)")
        if isinstance(mu, list) and TABLE_EXTENSION in mu and "tensor_table" not in m:
            self.r.warn(f"{self.name}: must_understand lists {TABLE_EXTENSION!r} but the "
                        "manifest has no tensor_table")

    def check_dtype_version_use(self, m: dict[str, Any], used: set[str]) -> None:
        """R-VERSION-2, R-VERSION-7 for the dtypes of 1.3 (a writer rule: ``check`` warns).

        ``used``: the dtypes of the manifest's tensors, its table's included.
        """
        fv, mu = m.get("format_version"), m.get("must_understand")
        later = {DTYPE_SINCE[d][1]: d for d in DTYPE_SINCE}
        if fv == "1.3" and not used & set(DTYPE_SINCE):
            self.r.warn(f"{self.name}: format_version 1.3 without a tensor of a dtype of 1.3: "
                        "writers record '1.0', or '1.1' for a tensor table (R-VERSION-2)")
        for ext in sorted(set(mu) & set(later) if isinstance(mu, list) else ()):
            if later[ext] not in used:
                self.r.warn(f"{self.name}: must_understand lists {ext!r} but the manifest has "
                            f"no tensor of dtype {later[ext]!r} (R-VERSION-2)")

    def check_table_member(self, m: dict[str, Any]) -> bool:
        """R-TABLE-1/-2 in code as well (the 1.1 schema encodes them; it may be absent)."""
        problems = []
        if m.get("tensors") != {}:
            problems.append("a manifest with a tensor_table must have tensors {} (R-TABLE-1)")
        mu = m.get("must_understand")
        if not isinstance(mu, list) or TABLE_EXTENSION not in mu:
            problems.append(f"a manifest with a tensor_table must list {TABLE_EXTENSION!r} in "
                            "must_understand (R-TABLE-2)")
        if m.get("format_version") == "1.0":
            problems.append("a manifest with a tensor_table must have format_version 1.1 or a "
                            "later 1.x (R-TABLE-2)")
        for msg in problems:
            self.err("PCK-SCHEMA", msg)
        return not problems

    def read_table(self, doc: dict[str, Any], what: str) -> TensorTable | None:
        """Load and validate the table of a manifest or writer index (R-TABLE-1, -3 … -6, -8).

        Problems already reported elsewhere (an unsafe path or unknown codec found by the schema,
        a table file with a bad record or size) are not reported twice.
        """
        ref = doc.get("tensor_table")
        files = doc.get("files")
        if not isinstance(ref, dict) or not isinstance(files, dict):
            return None  # the schema check has reported it
        rel, codec = ref.get("file"), ref.get("codec")
        if path_problem(rel) is not None or codec not in ("none", "zstd"):
            return None  # reported by the schema check with its specific code
        if rel in self.bad_files:
            return None
        try:
            return load_table(self.vf, ref, files, what)
        except Problem as exc:
            self.err(exc.code, exc.message)
        except OSError as exc:
            self.err("PCK-STORAGE", f"{what}: table {rel!r}: {exc}")
        return None

    def check_index_table(self, doc: dict[str, Any], rel: str) -> TensorTable | None:
        """A writer index's table: decoded and validated, every record's box in bounds.

        Returns the table, or None when it could not be read or breaks a rule (reported: its
        tensors are then not compared with the manifest's, one report per defect).
        """
        before = len(self.r.errors)
        table = self.read_table(doc, rel)
        if table is None:
            return None
        for dtype in sorted(set(table.dtypes)):
            # R-DTYPE-3 per version, as for the index's JSON tensors (which its schema checks)
            later = dtype_not_allowed(dtype, doc.get("format_version"), None)
            if later:
                self.err("PCK-DTYPE-UNSUPPORTED", f"{rel}: its tensor table: {later} (R-DTYPE-3)")
        for t, key in enumerate(table.keys):
            shape = table.shapes[t]
            isz = DTYPES[table.dtypes[t]][1]
            if math.prod(d for d in shape if d) * isz > MAX_SIZE:
                self.err("PCK-LIMIT", f"{rel}: tensor {key!r} of shape {list(shape)} exceeds the "
                         "format's limits (R-TENSOR-1)")
                continue
            offs, lens = table.boxes(t)
            for o, ln in zip(offs, lens, strict=True):
                if any(o[d] < 0 or ln[d] < 1 or o[d] + ln[d] > shape[d] for d in range(len(o))):
                    self.err("PCK-RANGE-BOUNDS", f"{rel}: tensor {key!r}: box offsets={o} "
                             f"lengths={ln} is empty or outside shape {list(shape)}")
                    break
        return table if len(self.r.errors) == before else None

    def header(self, rel: str) -> StHeader | None:
        """The safetensors header of file ``rel``, parsed once (None: reported)."""
        if rel not in self.headers:
            try:
                self.headers[rel] = parse_safetensors_header(self.vf, rel)
            except Problem as exc:
                self.err(exc.code, exc.message)
                self.headers[rel] = None
        return self.headers[rel]

    # -- tensors -------------------------------------------------------------------------------
    def check_tensor(self, key: str, t: Any) -> None:
        """Tensor ``key``: dtype, shape, every range, and exactly-once coverage (§8)."""
        if not key or len(key) > 1024 or has_control_chars(key):
            raise Problem("PCK-SCHEMA", "key must be 1..1024 characters without control characters")
        if not isinstance(t, dict):
            raise Problem("PCK-SCHEMA", "tensor record is not an object")
        dtype, shape, ranges = t.get("dtype"), t.get("shape"), t.get("ranges")
        at: JsonPath = ("tensors", key)
        if dtype not in DTYPES:
            raise Located("PCK-DTYPE-UNSUPPORTED", f"dtype {dtype!r} is not in the format's "
                           "table", (*at, "dtype"))
        later = dtype_not_allowed(dtype, self.doc_version, self.doc_must_understand)
        if later:
            raise Located("PCK-DTYPE-UNSUPPORTED", f"{later} (R-DTYPE-3)", (*at, "dtype"))
        st_dtype, itemsize = DTYPES[dtype]
        if not isinstance(shape, list) or not all(is_int(d) and d >= 0 for d in shape):
            raise Located("PCK-SCHEMA", f"shape {shape!r} must be a list of integers >= 0",
                           (*at, "shape"))
        # R-TENSOR-1: also the product of the non-zero dimensions (zero-size tensors included).
        if len(shape) > MAX_NDIM or any(d > MAX_SIZE for d in shape) or \
                math.prod(d for d in shape if d) * itemsize > MAX_SIZE:
            raise Located("PCK-LIMIT", f"shape {shape} exceeds the format's limits",
                           (*at, "shape"))
        if not isinstance(ranges, list):
            raise Located("PCK-SCHEMA", "ranges must be a list", (*at, "ranges"))
        ndim = len(shape)
        boxes: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
        for i, rr in enumerate(ranges):
            where = f"range {i}"
            rat: JsonPath = (*at, "ranges", i)
            if not isinstance(rr, dict):
                raise Located("PCK-SCHEMA", f"{where} is not an object", rat)
            offs, lens = rr.get("offsets"), rr.get("lengths")
            if (not isinstance(offs, list) or not isinstance(lens, list)
                    or not all(is_int(x) for x in offs + lens)):
                raise Located("PCK-SCHEMA", f"{where}: offsets/lengths must be integer lists",
                               rat)
            if len(offs) != ndim or len(lens) != ndim:
                raise Located("PCK-RANGE-BOUNDS", f"{where}: box of rank "
                               f"{len(offs)}/{len(lens)} for a tensor of rank {ndim}", rat)
            for d in range(ndim):
                if offs[d] < 0 or lens[d] < 1 or offs[d] + lens[d] > shape[d]:
                    raise Located("PCK-RANGE-BOUNDS", f"{where}: box offsets={offs} "
                                   f"lengths={lens} is empty or outside shape {shape} (dim {d})",
                                   rat)
            boxes.append((tuple(offs), tuple(lens)))
            self.check_range_data(key, where, rr, st_dtype, itemsize, lens, rat)
        if self.record_only:
            return  # coverage is decided when the tensor is first read (§4.1, R-COVER-3)
        sig = (tuple(shape), tuple(boxes))
        if sig in self.coverage_cache:
            hit = self.coverage_cache[sig]
            if hit is not None:
                raise Located(hit.code, hit.message, (*at, "ranges"))
            return
        try:
            check_coverage(shape, boxes)
        except Problem as exc:
            self.coverage_cache[sig] = exc
            raise Located(exc.code, exc.message, (*at, "ranges")) from None
        self.coverage_cache[sig] = None

    def check_range_data(self, key: str, where: str, rr: dict[str, Any], st_dtype: str,
                         itemsize: int, lens: list[int], at: JsonPath = ()) -> None:
        """A range's file, its tensor in that file's header, and the frame it holds."""
        rel, name, codec = rr.get("file"), rr.get("name"), rr.get("codec")
        if codec not in ("none", "zstd"):
            raise Located("PCK-CODEC", f"{where}: unknown codec {codec!r}", (*at, "codec"))
        why = path_problem(rel)
        if why is not None:
            raise Located("PCK-PATH-UNSAFE", f"{where}: {why}", (*at, "file"))
        assert isinstance(rel, str)
        if rel in self.bad_files:
            return  # already reported for the file itself
        if rel not in self.vf.records:
            raise Problem("PCK-SCHEMA", f"{where}: file {rel!r} is not listed in files "
                          "(R-FILES-2)")
        if self.record_only:
            return
        hdr = self.header(rel)
        if hdr is None:
            return
        if not isinstance(name, str) or name not in hdr.tensors:
            raise Problem("PCK-SHARD-MISMATCH", f"{where}: {rel!r} has no tensor named {name!r}")
        st = hdr.tensors[name]
        nbytes = math.prod(lens) * itemsize
        if codec == "none":
            if st.dtype != st_dtype or st.shape != lens:
                raise Problem("PCK-SHARD-MISMATCH", f"{where}: {rel!r}:{name} is {st.dtype}"
                              f"{st.shape}, the range record needs {st_dtype}{lens}")
            if self.deep and st_dtype == "BOOL":
                _check_bool_bytes(self.vf.read(rel, st.begin, st.end - st.begin),
                                  f"{where}: {rel!r}:{name}")
            return
        if st.dtype != "U8" or len(st.shape) != 1 or st.shape[0] < 1:
            raise Problem("PCK-SHARD-MISMATCH", f"{where}: zstd range {rel!r}:{name} must be a "
                          f"1-D U8 tensor of at least one byte, is {st.dtype}{st.shape}")
        stored = st.end - st.begin
        if self.deep:
            frame = self.vf.read(rel, st.begin, stored)
            raw = zstd_decode(frame, where=f"{where}: {rel!r}:{name}", limit=nbytes, exact=nbytes)
            if st_dtype == "BOOL":
                _check_bool_bytes(raw, f"{where}: {rel!r}:{name} (decoded)")
        else:
            # R-VERIFY-2: the frame header's declared size and bounds are metadata (R-TENSOR-7,
            # R-TENSOR-10), decided from the first 18 bytes; decoding is left to --deep.
            head = self.vf.read(rel, st.begin, min(ZSTD_HEADER_MAX, stored))
            zstd_check_header(head, stored=stored, where=f"{where}: {rel!r}:{name}",
                              limit=nbytes, exact=nbytes)



def _check_bool_bytes(data: bytes, where: str) -> None:
    """R-DTYPE-4: a bool element is the byte 0x00 or 0x01."""
    bad = data.translate(None, b"\x00\x01")
    if bad:
        at = next(i for i, b in enumerate(data) if b > 1)
        raise Problem("PCK-DTYPE-VALUE", f"{where}: bool element {at} is stored as byte "
                      f"0x{data[at]:02x}, not 0x00 or 0x01 (R-DTYPE-2)")
