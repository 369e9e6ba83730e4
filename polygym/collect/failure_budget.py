"""How many failed rollouts a run may end with and still exit 0: ``--max-failures N`` or ``N%``.

Trainers and pipelines act on exit codes, so a run whose rollouts failed must not look like a run
that succeeded: by default (``0``) one failed rollout makes the run exit 1. A user who expects some
failures says how many (a count) or what share of the rollouts the run sent (a rate, ``5%``: at
most 5 in 100; exactly 5% passes). Every command that collects or verifies rollouts (``gym eval
run``, its ``--blend`` runs, ``gym eval reverify``, ``gym train run``) parses the option with
``FailureBudget.parse`` and ends with ``FailureBudget.verdict``, so the option means the same
everywhere and the last line of every run says how many failed and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from polygym.settings import cli

MAX_FAILURES_HELP = (
    "Failed rollouts the run may end with and still exit 0: a count (N) or a share of the rollouts "
    "it sent (N%, e.g. 5%). Any more and it exits 1."
)


class FailureBudgetError(ValueError):
    """A ``--max-failures`` value that is neither a whole number nor a percentage from 0 to 100."""


@dataclass(frozen=True)
class Verdict:
    """The end of a run: whether its failures are within the budget, and the line that says so."""

    ok: bool
    line: str


@dataclass(frozen=True)
class FailureBudget:
    """At most ``count`` failed rollouts, or at most ``share`` of those sent (one of the two is set)."""

    count: int | None = 0
    share: Fraction | None = None
    text: str = "0"
    """The value as the user wrote it, for messages."""

    @classmethod
    def parse(cls, text: str) -> FailureBudget:
        """``N`` (a whole number, at least 0) or ``N%`` (0 to 100, decimals allowed); exact, so
        ``5%`` of 20 rollouts allows 1 and never 0.999... of one."""
        value = text.strip()
        if value.endswith("%"):
            try:
                share = Fraction(value[:-1].strip()) / 100
            except (ValueError, ZeroDivisionError):
                raise FailureBudgetError(f"'{text}' is not a percentage (N%, e.g. 5%)") from None
            if not 0 <= share <= 1:
                raise FailureBudgetError(f"'{text}' must be from 0% to 100%")
            return cls(count=None, share=share, text=value)
        try:
            count = int(value)
        except ValueError:
            raise FailureBudgetError(f"'{text}' is not a whole number or a percentage (N%)") from None
        if count < 0:
            raise FailureBudgetError(f"'{text}' must be at least 0")
        return cls(count=count, text=value)

    def __str__(self) -> str:
        """As the user wrote it (``--help`` shows the default so)."""
        return self.text

    def allows(self, failed: int, sent: int) -> bool:
        """Whether ``failed`` of ``sent`` rollouts is within the budget (a rate over 0 sent allows all)."""
        if self.share is None:
            return failed <= (self.count or 0)
        return sent == 0 or Fraction(failed, sent) <= self.share

    def verdict(self, failed: int, sent: int, by_class: Mapping[str, int], what: str = "rollouts") -> Verdict:
        """The run's last line: how many of ``sent`` failed, by failure class, and whether that is
        allowed (``ok``: exit 0) or not (exit 1, naming the option that would allow it)."""
        classes = ", ".join(
            f"{name}: {n}" for name, n in sorted(by_class.items(), key=lambda kv: -kv[1]) if n
        )
        count = f"{failed} of {sent} {what} failed" + (f" ({classes})" if classes else "")
        if failed == 0:
            return Verdict(True, f"{count}.")
        if self.allows(failed, sent):
            return Verdict(True, f"{count}: within --max-failures {self.text}.")
        return Verdict(
            False,
            f"{count}: more than --max-failures {self.text} allows, so the run exits 1 "
            "(pass --max-failures N or N% to accept some).",
        )


NO_FAILURES = FailureBudget()
"""The default: any failed rollout makes the run exit 1."""


MAX_FAILURES = cli(MAX_FAILURES_HELP, metavar="N|N%", parse=FailureBudget.parse)
"""``--max-failures N|N%`` of every command that runs rollouts (``polygym.settings``): a
``max_failures: FailureBudget`` field with ``NO_FAILURES`` as its default carries it."""
