"""What a conformance check found: :class:`Finding` (one violation) and :class:`Report`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Finding", "Report"]



@dataclass
class Finding:
    """One violation: spec error code, message, and the version it was found in."""

    code: str
    message: str
    version: str = ""  # the version directory it was found in ("" for the root)

    def to_json(self) -> dict[str, str]:
        """``{"code", "message", "version"}`` as printed by ``--json``."""
        return {"code": self.code, "message": self.message, "version": self.version}


@dataclass
class Report:
    """Result of a check: errors (violations) and warnings (allowed but suspicious)."""

    errors: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no error was found."""
        return not self.errors

    @property
    def codes(self) -> set[str]:
        """The set of error codes found."""
        return {e.code for e in self.errors}

    def error(self, code: str, message: str) -> None:
        """Record a violation."""
        self.errors.append(Finding(code, message))

    def warn(self, message: str) -> None:
        """Record a warning (not a violation)."""
        self.warnings.append(Finding("WARNING", message))

    def to_json(self) -> dict[str, Any]:
        """``{"ok", "errors", "warnings", "versions"}``."""
        return {"ok": self.ok, "errors": [e.to_json() for e in self.errors],
                "warnings": [w.message for w in self.warnings], "versions": self.versions}
