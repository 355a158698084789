"""What conformance/README.md (and spec §20) state about the suite, held to the suite itself.

Outside review 21b found stale counts and lists (the vector count, the generators, the errata
without vectors, the committer cases) and a pinned tag that named no release.
"""

from __future__ import annotations

import re

from conformance import __version__
from conformance.harness import Options
from conformance.report import EXIT_CODES
from conformance.vectors import RETENTION_DIRS, VECTOR_DIRS, load_cases

from .conftest import REPO

README = (REPO / "conformance" / "README.md").read_text(encoding="utf-8")
SPEC = (REPO / "spec" / "README.md").read_text(encoding="utf-8")


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_the_pinned_version_is_the_packages() -> None:
    """The install pin, the CI job's pin and the --version example name this release."""
    pins = re.findall(r"@conformance-v([0-9][0-9.]*[0-9])#subdirectory=conformance", README)
    assert len(pins) == 2 and set(pins) == {__version__}, pins
    assert f"portable-ckpt-conformance {__version__} (checks format" in README
    yaml = README.split("```yaml", 1)[1].split("```", 1)[0]
    assert f"@conformance-v{__version__}#" in yaml
    assert f"; {__version__}, " in _flat(README)  # its line in the release history


def test_the_committer_case_count() -> None:
    """The README's count of the default committer cases is what the harness runs."""
    from conformance.committer import REFUSALS

    positive = 2 + 3  # the conforming commit with and without a table; twice, same-step, wide
    assert Options().tables == "sometimes"
    n = len(REFUSALS) + positive
    assert f"| {n} cases (one per case named in [Committer cases]" in README
    assert f"{n} committer cases) are a smoke test" in README
    assert f"{n - 1} with `--tensor-table never` or `always`" in README
    rows = re.findall(r"^\| ([a-z0-9-]+(?:, [a-z0-9-]+)?) \| .* \| (?:`PCK-[A-Z-]+`|commits.*) \|$",
                      README.split("### Committer cases", 1)[1].split("###", 1)[0], re.M)
    names = [n for row in rows for n in row.split(", ")]
    assert sorted(names) == sorted([r.name for r in REFUSALS]
                                   + ["commit-twice", "same-step", "world-size-not-writers"])


def test_the_generator_list() -> None:
    files = sorted(p.name for p in (REPO / "conformance" / "vectors").glob("generate_*.py"))
    named = re.findall(r"`(?:vectors/)?(generate_[a-z0-9_]+\.py)`",
                       README.split("The vectors were produced by", 1)[1].split("are frozen", 1)[0])
    assert sorted(set(named)) == files
    assert len(files) == len(VECTOR_DIRS) + len(RETENTION_DIRS)


def test_the_errata_without_vectors() -> None:
    """Every erratum of spec §23 has a vector set or is named among those without one."""
    errata = {int(n) for n in re.findall(r"^\* \*\*Errata (\d+)\*\*", SPEC, re.M)}
    with_sets = {int(k.split("-")[1]) for k in [*VECTOR_DIRS, *RETENTION_DIRS]
                 if k.startswith("errata-")}
    assert with_sets <= errata and max(errata) >= 15
    without = sorted(errata - with_sets)
    words = ", ".join(str(n) for n in without[:-1]) + f" and {without[-1]}"
    assert f"Errata {words} have no vectors" in _flat(README)
    from conformance import vectors

    assert f"Errata {words} have no vectors" in _flat(str(vectors.__doc__))
    assert f"(errata {words} have none)" in _flat(SPEC)


def test_the_vector_counts() -> None:
    """Counts of frozen sets (R-VERSION-9) may be written out; each is the set's."""
    def counts(name: str) -> tuple[int, int, int]:
        cases = load_cases(VECTOR_DIRS[name])
        valid = sum(c["valid"] for c in cases)
        return len(cases), valid, len(cases) - valid

    assert f"`vectors/1.0/` ({counts('1.0')[0]} cases)" in README
    _, valid, invalid = counts("1.1")
    assert f"`vectors/1.1/` (tensor tables: {valid} valid, {invalid} invalid" in _flat(README)
    assert f"format 1.2 (§23), {counts('1.2')[0]} cases" in SPEC
    sets = len(VECTOR_DIRS)
    words = {11: "eleven", 12: "twelve", 13: "thirteen", 14: "fourteen", 15: "fifteen"}
    assert f"There are {words.get(sets, str(sets))} sets" in _flat(SPEC)
    assert not re.search(r"golden vector the suite ships \(\d+\)", README)


def test_the_exit_status_table() -> None:
    table = README.split("## Exit status", 1)[1].split("## Reports", 1)[0]
    rows = [int(n) for n in re.findall(r"^\| (\d) \|", table, re.M)]
    assert rows == sorted(EXIT_CODES), rows
