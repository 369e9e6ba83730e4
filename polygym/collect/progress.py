"""Live progress of a collection run, per environment (agent).

On a terminal: a table redrawn a few times a second (done/total, rate, ETA, failures, running mean
reward per agent and overall). Elsewhere (CI logs, ``nohup``): one plain line every
``interval_s`` seconds, since a redrawn table turns a log file into noise.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from dataclasses import dataclass

from rich.console import Console
from rich.live import Live
from rich.table import Table

from polygym.collect.health import HealthMonitor
from polygym.collect.rollouts import Result
from polygym.row import reward


@dataclass
class AgentTally:
    total: int = 0
    done: int = 0
    failed: int = 0
    scored: int = 0
    reward_sum: float = 0.0

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.scored if self.scored else None


def _fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """Counts results per agent and shows them; ``summary()`` is the closing table."""

    def __init__(
        self,
        totals: dict[str, int],
        already_done: dict[str, int],
        interval_s: float = 10.0,
        health: HealthMonitor | None = None,
    ) -> None:
        self.health = health
        """Shown as each agent's unhealthy count, and QUARANTINED once it is (the collector's own)."""
        self.tallies: dict[str, AgentTally] = defaultdict(AgentTally)
        for agent, total in totals.items():
            self.tallies[agent].total = total
            self.tallies[agent].done = already_done.get(agent, 0)
        self.started = time.monotonic()
        self.new_done = 0
        self.interval_s = interval_s
        self._last_line = 0.0
        self._interactive = sys.stderr.isatty()
        self._console = Console(stderr=True, highlight=False, width=None if self._interactive else 400)
        self._live: Live | None = None

    def __enter__(self) -> Progress:
        if self._interactive:
            # The table is built when Live redraws (4 times a second), not once per result.
            self._live = Live(
                console=self._console, refresh_per_second=4, transient=False, get_renderable=self.table
            )
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.refresh()
            self._live.__exit__(None, None, None)
        else:
            self._console.print(self.line())

    def update(self, result: Result) -> None:
        tally = self.tallies[result.job.agent]
        if result.ok:
            assert result.rollout is not None
            tally.done += 1
            tally.scored += 1
            tally.reward_sum += reward(result.rollout)
            self.new_done += 1
        else:
            tally.failed += 1
        if self._live is None and time.monotonic() - self._last_line >= self.interval_s:
            self._last_line = time.monotonic()
            self._console.print(self.line())

    def _rate(self) -> float:
        elapsed = time.monotonic() - self.started
        finished = self.new_done + sum(t.failed for t in self.tallies.values())
        return finished / elapsed if elapsed > 0 else 0.0

    def _eta(self) -> float | None:
        remaining = sum(t.total - t.done - t.failed for t in self.tallies.values())
        rate = self._rate()
        return remaining / rate if rate > 0 else None

    def line(self) -> str:
        total = sum(t.total for t in self.tallies.values())
        done = sum(t.done for t in self.tallies.values())
        failed = sum(t.failed for t in self.tallies.values())
        parts = [
            (
                f"{name}: {t.done}/{t.total} reward {t.mean_reward:.3f}"
                if t.mean_reward is not None
                else f"{name}: {t.done}/{t.total}"
            )
            + self._health_note(name)
            for name, t in self.tallies.items()
        ]
        return (
            f"[{_fmt_duration(time.monotonic() - self.started)}] {done}/{total} done, {failed} failed, "
            f"{self._rate():.1f}/s, ETA {_fmt_duration(self._eta())} | " + "; ".join(parts)
        )

    def table(self) -> Table:
        table = Table(
            title=f"rollouts: {self._rate():.1f}/s, ETA {_fmt_duration(self._eta())}", title_justify="left"
        )
        for column in ("agent", "done", "total", "failed", "mean reward", "health"):
            table.add_column(column, justify="left" if column in ("agent", "health") else "right")
        for name, tally in self.tallies.items():
            reward = f"{tally.mean_reward:.3f}" if tally.mean_reward is not None else "-"
            health = self._health_note(name).strip(" ()") or "ok"
            table.add_row(name, str(tally.done), str(tally.total), str(tally.failed), reward, health)
        return table

    def _health_note(self, agent: str) -> str:
        """What the health monitor says of ``agent``: `` (3 unhealthy)``, `` (QUARANTINED: ..)`` or ``""``."""
        if self.health is None:
            return ""
        if (why := self.health.quarantined.get(agent)) is not None:
            return f" (QUARANTINED: {why})"
        entry = self.health.envs.get(agent)
        return f" ({entry.unhealthy} unhealthy)" if entry is not None and entry.unhealthy else ""
