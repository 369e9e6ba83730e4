"""The outcome of checking an environment: one ``CheckResult`` per check, gathered in an ``EnvReport``.

Kept apart from the checks (``polygym.authoring.check``) because its readers are elsewhere: the ``gym env
check`` table and ``--json`` output, scripts and CI that call ``check_env``, and tests that assert
on single checks by name. Only a *fail* makes a report not ok: *warn* flags something worth a look
(e.g. a tool without a description) and *skip* a check that could not run (e.g. no
``example_solution``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

PASS, FAIL, WARN, SKIP = "pass", "fail", "warn", "skip"

Outcome = tuple[str, str]
"""``(status, detail)`` of one check."""


@dataclass
class CheckResult:
    """One check: its name, status (PASS, FAIL, WARN or SKIP), what it found and how long it took."""

    name: str
    status: str
    detail: str = ""
    seconds: float = 0.0


@dataclass
class EnvReport:
    """Every check run on one environment, in order."""

    env: str
    directory: str = ""
    config: str = ""
    results: list[CheckResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures()

    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == FAIL]

    def result(self, name: str) -> CheckResult:
        """The check called ``name`` (KeyError if it did not run)."""
        for result in self.results:
            if result.name == name:
                return result
        raise KeyError(f"no check named {name!r}; ran: {', '.join(r.name for r in self.results)}")

    def counts(self) -> dict[str, int]:
        return {status: sum(r.status == status for r in self.results) for status in (PASS, FAIL, WARN, SKIP)}

    def summary(self) -> str:
        """Plain text, one line per check: handy in assertion messages and logs."""
        lines = [f"{self.env}: {'ok' if self.ok else 'FAILED'} ({self.config})"]
        lines += [f"  {r.status.upper():4} {r.name}: {r.detail}" for r in self.results]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "env": self.env,
            "ok": self.ok,
            "directory": self.directory,
            "config": self.config,
            "seconds": round(self.seconds, 3),
            "counts": self.counts(),
            "checks": [{**asdict(r), "seconds": round(r.seconds, 3)} for r in self.results],
        }
