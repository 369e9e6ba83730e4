"""``gym eval reverify``: recompute the rewards of stored rollouts through their environments' ``/verify``.

A verifier gets fixed (a regex that missed ``\\boxed{ 42 }``), a judge was down for part of a run,
or a grader's prompt changed: the responses are still good, only their rewards are not. Playing
the rollouts again would cost the model calls and change the responses; reverification sends
each stored response to its environment's ``/verify`` again, exactly as the agent did at the end
of the rollout (``polygym.servers.agent``): ``/seed_session`` with the row as sent, ``/verify``
with the row and the stored response in that session, ``/end_session`` (a NeMo Gym server's
``/close_session``) in every case. Stateful environments get their session back that way;
stateless ones ignore it. A server reverified only
because of ``--force`` (NeMo Gym's, whose ``/reverify_mode`` is not ``stateless``) gets ``/verify``
alone, as NeMo Gym's reverify sends it: a session seeded afresh would hold none of the rollout's
state, and a stateful server would score that empty trajectory where NeMo Gym's refuses the row.

For ``--rollouts X.jsonl`` (never touched) the run writes new files next to it:
``X_reverified.jsonl`` the rows with recomputed rewards, ``X_reverified_failures.jsonl`` the rows
whose verification failed (each with its stored response under ``row``, so a later
``--failed-only`` can run it again), ``X_reverified_aggregate_metrics.json``, the run files that
make it resumable (``run_files``, ``run_lock``: record, lock, the payloads as sent), and
``X_reverify_diff.json``: per environment how many rewards stayed, rose or fell, how many rows
newly failed and how many failed rows verified now.

``failed_only`` re-verifies only the rows the run could not score: rows of ``X_failures.jsonl``
that carry a response, and rows of ``X.jsonl`` marked as judge failures; the other rows are
carried into the output unchanged, so the output is again one complete set (NeMo Gym's
``--judge-failed-only``). A failure without a response (the model call failed) cannot be
reverified; it is counted, and ``gym eval run --resume`` is what redoes it.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from polygym import row as rows
from polygym.collect.dataset import Row, agent_of
from polygym.collect.eval_run import RunSummary, write_aggregate_metrics
from polygym.collect.eval_settings import ALLOW_STACK_CHANGE, DISABLE_AGGREGATION
from polygym.collect.failure_budget import MAX_FAILURES, NO_FAILURES, FailureBudget
from polygym.collect.head_config import head_config
from polygym.collect.rollouts import DEFAULT_CONCURRENCY, MAX_CONCURRENCY, Limits, Result, collect
from polygym.collect.run_files import RolloutWriter, RunFileError, RunFiles, finished_keys, prepare
from polygym.collect.run_lock import RunLock
from polygym.collect.run_stack import check_stack, read_identity
from polygym.collect.task_source import TASK_SOURCE, TaskRoutes, head_task_routes
from polygym.jsonl import JsonlAppender, count_rows, iter_jsonl
from polygym.kinds import AGENT_KIND, RESOURCES_KIND
from polygym.net.client import ServerCallError, ServerClient
from polygym.net.retry import RetryPolicy
from polygym.row import ALL_ENVS, FAILURE_CLASS_FIELDS, NG_FAILURE_PREFIX, ROLLOUT_INDEX, TASK_INDEX, Job
from polygym.servers.judge import JUDGE_FAILED
from polygym.servers.session_release import SessionRelease
from polygym.settings import cli
from polygym.suggest import unknown_name_message

REVERIFIED = "_reverified.jsonl"
DIFF = "_reverify_diff.json"
RESULT_FIELDS = ("response", "reward")
"""Fields of a stored rollout that ``/verify`` produced or scored, left out of a rebuilt input row."""
ROLLOUT_INPUTS = ("deliverables_dir", "reference_ids")
"""Verifier inputs that a rollout produced (an artifact folder, the reference subset an adaptive
comparison used): taken from the stored row even when the materialized input is at hand."""
TASK_INPUT = "task_input"
NOT_STATELESS = frozenset({"unsupported", "unknown"})
"""``GET /reverify_mode`` answers (NeMo Gym) for which NeMo Gym's reverify asks ``force``: the
server's rewards cannot be recomputed (``unsupported``), or it never said (``unknown``, the
default of NeMo Gym's resources servers)."""
DEFAULT_VERIFY_TIMEOUT_S = 300.0
"""One row: seed, verify (a judge call included) and retries; the agent's own ``verify_timeout_s``."""
OUTCOMES = ("unchanged", "raised", "lowered", "newly_failed", "fixed", "still_failed", "carried")


class ReverifyError(RunFileError):
    """The rollouts cannot be reverified as asked; the message names the file, line or server."""


def reverified_path(rollouts: Path) -> Path:
    """``X_reverified.jsonl`` for ``X.jsonl``: the default output, never the input."""
    return RunFiles(rollouts)._sibling(REVERIFIED)


def diff_path(output: Path) -> Path:
    """``X_reverify_diff.json`` for the output ``X_reverified.jsonl``, else ``O_reverify_diff.json``."""
    name = output.name
    for suffix in (REVERIFIED, ".jsonl"):
        if name.endswith(suffix):
            return output.with_name(name[: -len(suffix)] + DIFF)
    return output.with_name(name + DIFF)


@dataclass(frozen=True)
class Item:
    """One stored row to reverify (``verify``) or to carry into the output unchanged."""

    job: Job
    """``job.row`` is the stored row, response included, so a failure record keeps it."""
    verify: bool
    old_reward: float | None
    """The stored reward; None when the row had failed."""


@dataclass(frozen=True)
class Dropped:
    """A line of the stored run that is not reverified, and why (``kind``, a failure class for the
    unreadable ones; ``DUPLICATE`` for a key already planned, which is verified once)."""

    where: str
    kind: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.where}: {self.kind}" + (f" ({self.detail})" if self.detail else "")


INVALID_UTF8 = "InvalidUTF8"
INVALID_JSON = "BadJSON"
NOT_AN_OBJECT = "NotAnObject"
UNFINISHED = "UnfinishedLine"
DUPLICATE = "Duplicate"


@dataclass
class ReverifyPlan:
    items: list[Item]
    no_response: int = 0
    """Failed rows without a response: nothing to verify (``gym eval run --resume`` redoes them)."""
    dropped: list[Dropped] = field(default_factory=list)
    """Lines not reverified: unreadable (invalid UTF-8 or JSON, not an object, an unfinished last
    line) or a duplicate key; each is counted and named, never skipped in silence."""

    def fingerprint(self, failed_only: bool) -> str:
        digest = hashlib.sha256(b"failed-only" if failed_only else b"all")
        for item in self.items:
            digest.update(orjson.dumps([item.job.key, item.job.agent, item.verify, item.old_reward]))
            digest.update(orjson.dumps(item.job.row.get("response"), option=orjson.OPT_SORT_KEYS))
        return digest.hexdigest()


def judge_failed(row: dict[str, Any]) -> bool:
    """Whether a row is marked as one whose judge gave no verdict."""
    return row.get("judge_failed") is True or any(row.get(f) == JUDGE_FAILED for f in FAILURE_CLASS_FIELDS)


def _key(row: dict[str, Any], where: str) -> tuple[int, int]:
    task, rollout = row.get(TASK_INDEX), row.get(ROLLOUT_INDEX)
    if not isinstance(task, int) or not isinstance(rollout, int):
        raise ReverifyError(f"{where}: no integer {TASK_INDEX} / {ROLLOUT_INDEX}; is this a rollouts file?")
    return task, rollout


def _agent(row: Row, routes: TaskRoutes | None) -> str:
    """The agent a stored row goes to, by the rule ``gym eval run`` routes rows by (``agent_ref``,
    else ``task_source`` resolved in the running config)."""
    if row.data.get("agent_ref") is None and row.data.get(TASK_SOURCE) is None:
        raise ReverifyError(f"{row.where}: field agent_ref (or {TASK_SOURCE}): missing")
    problems: list[str] = []
    agent = agent_of(row, None, (), problems, routes)
    if agent is None or problems:
        raise ReverifyError("\n".join(problems))
    return agent


def _numbered(path: Path, dropped: list[Dropped]) -> Iterator[Row]:
    """The object lines of ``path``; every other non-blank line is added
    to ``dropped`` with why (a stored run a user may have edited is not trusted to be clean)."""
    if not path.exists():
        return
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            where = f"{path}:{number}"
            if not raw.strip():
                continue
            if not raw.endswith(b"\n"):
                dropped.append(Dropped(where, UNFINISHED, "no newline: a write cut short"))
                break
            try:
                raw.decode("utf-8")
                row = orjson.loads(raw)
            except UnicodeDecodeError as exc:
                dropped.append(Dropped(where, INVALID_UTF8, str(exc)))
                continue
            except orjson.JSONDecodeError as exc:
                dropped.append(Dropped(where, INVALID_JSON, str(exc)))
                continue
            if isinstance(row, dict):
                yield Row(row, str(path), number)
            else:
                dropped.append(Dropped(where, NOT_AN_OBJECT, f"a JSON {type(row).__name__}"))


def stored_row(failure: dict[str, Any]) -> dict[str, Any]:
    """The row a failure record keeps: polygym's under ``row``; a NeMo Gym failure row is the result
    itself (a ``judge_failed`` one with its response), less its ``_ng_failure_*`` diagnostics."""
    row = failure.get("row")
    if isinstance(row, dict):
        return row
    return {k: v for k, v in failure.items() if not k.startswith(NG_FAILURE_PREFIX)}


ROUTING_FIELDS = ("agent_ref", TASK_SOURCE)
"""What routes a row to its agent (``collect.dataset.agent_of``); taken from the materialized
input when the stored row lacks it."""


def plan_reverify(
    rollouts: Path,
    failed_only: bool,
    limit: int | None = None,
    sent: dict[tuple[int, int], dict[str, Any]] | None = None,
    routes: TaskRoutes | None = None,
) -> ReverifyPlan:
    """The rows to reverify, in file order (the rollouts', then the failures'), one per key. A
    stored row without ``agent_ref`` or ``task_source`` is routed by its row as ``sent`` (the
    materialized input), as NeMo Gym's reverify routes it (NeMo Gym's stored example rollouts often
    leave them out); ``routes`` resolves ``task_source`` (NeMo Gym's newer rows)."""
    if not rollouts.is_file():
        raise ReverifyError(f"--rollouts {rollouts}: no such file")
    plan = ReverifyPlan([])
    seen: dict[tuple[int, int], str] = {}

    def add(stored: Row, verify: bool, old: float | None) -> None:
        key = _key(stored.data, stored.where)
        if key in seen:
            plan.dropped.append(
                Dropped(stored.where, DUPLICATE, f"task {key[0]} rollout {key[1]}, as {seen[key]}")
            )
            return
        seen[key] = stored.where
        as_sent = (sent or {}).get(key, {})
        row = {**{k: as_sent[k] for k in ROUTING_FIELDS if k in as_sent}, **stored.data}
        routed = Row(row, stored.path, stored.line)
        plan.items.append(Item(Job(_agent(routed, routes), *key, row), verify, old))

    for stored in _numbered(rollouts, plan.dropped):
        if "response" not in stored.data:
            raise ReverifyError(f"{stored.where}: field response: missing, nothing to verify")
        failed = judge_failed(stored.data)
        add(stored, verify=failed or not failed_only, old=None if failed else rows.reward(stored.data))
    for failure in _numbered(RunFiles(rollouts).failures, plan.dropped):
        kept = stored_row(failure.data)
        if "response" not in kept:
            plan.no_response += 1
            continue
        ref = failure.data.get("agent_ref", kept.get("agent_ref"))
        add(Row({**kept, "agent_ref": ref}, failure.path, failure.line), True, None)
    if limit is not None:  # counts the rows to verify; carried rows are all kept
        to_verify = {id(i) for i in [i for i in plan.items if i.verify][:limit]}
        plan.items = [i for i in plan.items if not i.verify or id(i) in to_verify]
    return plan


def input_rows(materialized: Path | None) -> dict[tuple[int, int], dict[str, Any]]:
    """The rows as the run sent them, by key, when its materialized inputs are at hand."""
    if materialized is None:
        return {}
    return {
        (r[TASK_INDEX], r[ROLLOUT_INDEX]): r
        for r in iter_jsonl(materialized)
        if isinstance(r.get(TASK_INDEX), int) and isinstance(r.get(ROLLOUT_INDEX), int)
    }


def check_inputs(plan: ReverifyPlan, sent: dict[tuple[int, int], dict[str, Any]], inputs: Path) -> None:
    """Every row to verify has its input in the materialized inputs, as NeMo Gym's reverify requires:
    a row replayed from its stored copy instead would be verified on other fields than it was."""
    missing = [i.job.key for i in plan.items if i.verify and i.job.key not in sent]
    if missing:
        keys = ", ".join(f"task {t} rollout {r}" for t, r in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise ReverifyError(f"{inputs}: no materialized input for {keys}{more}")


def verify_payload(stored: dict[str, Any], sent: dict[str, Any] | None) -> dict[str, Any]:
    """What the agent sent ``/verify``, built as NeMo Gym 0.7.0's reverify builds it: the row as
    sent (a ``task_input`` container unpacked, its ``task_data`` under its own fields) plus the
    stored response, and the two verifier inputs only the rollout knows (``ROLLOUT_INPUTS``).
    Stored rows keep the verifier's own output fields (``extracted_answer``, ...), which NeMo Gym's
    verifiers refuse as duplicate arguments, so the row as sent is what a replay needs; without
    it, the stored row less ``response`` and ``reward`` stands in for it."""
    if sent is None:
        return {**{k: v for k, v in stored.items() if k not in RESULT_FIELDS}, "response": stored["response"]}
    payload = {**_task_fields(sent), "response": stored["response"]}
    payload.update({key: stored[key] for key in ROLLOUT_INPUTS if key in stored})
    return payload


def _task_fields(sent: dict[str, Any]) -> dict[str, Any]:
    """A row as sent, with NeMo Gym's ``task_input`` container (flat fields, or the older
    ``task_data`` object inside it) unpacked into the row, as its reverify does."""
    task_input = sent.get(TASK_INPUT)
    if not isinstance(task_input, dict):
        return dict(sent)
    fields = dict(task_input)
    task_data = fields.pop("task_data", {})
    if not isinstance(task_data, dict):
        raise ReverifyError(f"{TASK_INPUT}.task_data: must be an object")
    conflicting = sorted(k for k in fields.keys() & task_data.keys() if fields[k] != task_data[k])
    if conflicting:
        raise ReverifyError(
            f"{TASK_INPUT}: field(s) {', '.join(conflicting)} differ inside and outside task_data"
        )
    row = {k: v for k, v in sent.items() if k not in ("task_id", TASK_INPUT)}
    return {**row, **task_data, **fields}


class Verifier:
    """The ``JobCall`` of a reverify (``polygym.collect.rollouts.collect`` runs it): one stored row
    against the resources server of its agent, in a session of its own."""

    def __init__(
        self,
        client: ServerClient,
        resources: dict[str, str],
        sent: dict[tuple[int, int], dict[str, Any]],
        unseeded: frozenset[str] = frozenset(),
    ) -> None:
        self.client = client
        self.resources = resources
        self.sent = sent
        self.unseeded = unseeded
        """Servers verified without a session (the forced ones, as NeMo Gym's reverify does)."""
        self.release = SessionRelease()

    async def __call__(self, job: Job, timeout_s: float, retry: RetryPolicy) -> Any:
        server = self.resources[job.agent]
        payload = verify_payload(job.row, self.sent.get(job.key))
        if server in self.unseeded:
            reply = await self.client.call(server, "/verify", payload, timeout_s=timeout_s, retry=retry)
            return reply.json()
        seeded = await self.client.call(server, "/seed_session", payload, timeout_s=timeout_s, retry=retry)
        cookies = dict(seeded.cookies)
        try:
            reply = await self.client.call(
                server, "/verify", payload, cookies=cookies, timeout_s=timeout_s, retry=retry
            )
        finally:
            await self.release(self.client, server, cookies)
        return reply.json()


async def resources_by_agent(client: ServerClient, agents: Iterable[str] = ()) -> dict[str, str]:
    """Agent -> its resources server, from the head's ``GET /config`` (the same for a started and a
    joined stack).

    A stack with no agent at all and one resources server (a config that starts the environment
    alone: NeMo Gym's ``gdpval.yaml``) routes every one of ``agents`` to that server, as NeMo Gym
    0.7's reverify does, saying so: an agent name that is stale or mistyped goes undetected then.
    """
    if client.head_url is None:
        raise ReverifyError("the stack has no head server to read its config from")
    config = await head_config(client) or {}
    mapping: dict[str, str] = {}
    for name, value in config.items():
        implementations = value.get(AGENT_KIND) if isinstance(value, dict) else None
        for settings in (implementations or {}).values():
            ref = settings.get("resources_server") if isinstance(settings, dict) else None
            if isinstance(ref, dict) and isinstance(ref.get("name"), str):
                mapping[str(name)] = ref["name"]
    environments = [
        str(name) for name, value in config.items() if isinstance(value, dict) and RESOURCES_KIND in value
    ]
    if mapping or len(environments) != 1:
        return mapping
    print(
        f"warning: the stack has no agent; every row's agent is routed to its one resources server "
        f"'{environments[0]}' (as NeMo Gym's reverify routes them)",
        file=sys.stderr,
    )
    return dict.fromkeys(agents, environments[0])


async def unsupported_servers(client: ServerClient, servers: Iterable[str]) -> list[str]:
    """The servers whose NeMo Gym ``GET /reverify_mode`` is not ``stateless`` (``NOT_STATELESS``);
    a server without the route (every polygym one) is reverified through its session."""
    found = []
    for server in sorted(set(servers)):
        with contextlib.suppress(ServerCallError, ValueError):
            reply = await client.call(server, "/reverify_mode", method="GET", timeout_s=30.0)
            if reply.json() in NOT_STATELESS:
                found.append(server)
    return found


@dataclass
class ReverifySettings:
    """Everything one ``gym eval reverify`` is told, each setting declared once (``polygym.settings``:
    ``polygym.cli.reverify`` generates the options from these fields, in this order); the stack
    target aside."""

    rollouts: Path = field(
        metadata=cli(
            "Rollouts JSONL of a gym eval run (read only; its _failures.jsonl is read too).",
            required=True,
        )
    )
    output: Path | None = field(
        default=None,
        metadata=cli(
            "Reverified rollouts JSONL [default: X_reverified.jsonl next to --rollouts X.jsonl].",
            "--output",
            "-o",
        ),
    )
    materialized: Path | None = field(
        default=None,
        metadata=cli(
            "The run's materialized inputs [default: X_materialized_inputs.jsonl when it exists].", "--inputs"
        ),
    )
    failed_only: bool = field(
        default=False,
        metadata=cli(
            "Reverify only rows whose verification failed (failures with a response, judge_failed rows); "
            "carry the others unchanged.",
            "--failed-only",
            "--judge-failed-only",
        ),
    )
    resume: bool = field(
        default=False, metadata=cli("Finish an interrupted reverify: only the missing rows.")
    )
    overwrite: bool = field(default=False, metadata=cli("Replace an existing reverified output."))
    force: bool = field(
        default=False,
        metadata=cli("Reverify also against servers whose reverify_mode is unsupported or unknown."),
    )
    allow_stack_change: bool = field(default=False, metadata=ALLOW_STACK_CHANGE)
    max_failures: FailureBudget = field(default=NO_FAILURES, metadata=MAX_FAILURES)
    concurrency: int = field(
        default=DEFAULT_CONCURRENCY, metadata=cli("Verifications in flight.", min=1, max=MAX_CONCURRENCY)
    )
    limit: int | None = field(default=None, metadata=cli("Reverify only the first N rows.", min=1))
    """Reverify at most this many rows (rows carried by ``failed_only`` are all kept)."""
    timeout_s: float = field(
        default=DEFAULT_VERIFY_TIMEOUT_S,
        metadata=cli("Seconds per row (seed, verify, retries).", "--timeout", min=0, min_open=True),
    )
    disable_aggregation: bool = field(default=False, metadata=DISABLE_AGGREGATION)
    """No ``X_reverified_aggregate_metrics.json`` (NeMo Gym's ``--disable-aggregation``)."""

    def files(self) -> RunFiles:
        output = self.output or reverified_path(self.rollouts)
        source = RunFiles(self.rollouts)
        if output.resolve() in {p.resolve() for p in [*source.all(), source.record]}:
            raise ReverifyError(
                f"--output {output}: is a file of the rollouts' run; reverify never overwrites it"
            )
        return RunFiles(output)

    def inputs(self) -> Path | None:
        if self.materialized is not None:
            if not self.materialized.is_file():
                raise ReverifyError(f"--inputs {self.materialized}: no such file")
            return self.materialized
        default = RunFiles(self.rollouts).materialized
        return default if default.is_file() else None


@dataclass
class ReverifySummary:
    total: int
    skipped: int
    no_response: int
    verified: int = 0
    failed: int = 0
    failures_by_class: Counter[str] = field(default_factory=Counter)
    diff: dict[str, dict[str, int]] = field(default_factory=dict)
    forced: list[str] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)
    """Lines of the stored run not reverified, with why (see ``ReverifyPlan.dropped``)."""

    @property
    def unreadable(self) -> Counter[str]:
        """Lines that could not be read, by class: rows lost to the reverify, so they count as failed."""
        return Counter(d.kind for d in self.dropped if d.kind != DUPLICATE)


async def reverify(client: ServerClient, settings: ReverifySettings) -> ReverifySummary:
    """Reverify ``settings.rollouts`` into new files; cancellation leaves a resumable run."""
    files = settings.files()
    inputs = settings.inputs()
    as_sent = input_rows(inputs)
    routes = await head_task_routes(client)
    plan = plan_reverify(settings.rollouts, settings.failed_only, settings.limit, as_sent, routes)
    agents = {i.job.agent for i in plan.items if i.verify}
    resources = await resources_by_agent(client, agents)
    missing = sorted(agents - set(resources))
    if missing:
        raise ReverifyError(
            "\n".join(
                f"{settings.rollouts}: {unknown_name_message('agent', a, sorted(resources))}" for a in missing
            )
        )
    needed = {resources[i.job.agent] for i in plan.items if i.verify}
    forced = await unsupported_servers(client, needed)
    if forced and not settings.force:
        raise ReverifyError(
            f"resources server(s) {', '.join(forced)} do not say their rewards can be recomputed "
            "(reverify_mode unsupported or unknown, which NeMo Gym's reverify also refuses); "
            "pass --force to reverify anyway"
        )
    if inputs is not None:
        check_inputs(plan, as_sent, inputs)
    verifier = Verifier(client, resources, as_sent, frozenset(forced))
    limits = Limits(concurrency=settings.concurrency, timeout_s=settings.timeout_s)
    with RunLock(files):
        prepare(
            files, settings.resume, settings.overwrite, fingerprint=plan.fingerprint(settings.failed_only)
        )
        check_stack(files, await read_identity(client), settings.allow_stack_change)
        done = finished_keys(files) if settings.resume else set()
        summary = ReverifySummary(
            len(plan.items), len(done & {i.job.key for i in plan.items}), plan.no_response
        )
        summary.forced = forced
        summary.dropped = plan.dropped
        written = count_rows(files.materialized) if settings.resume else 0
        with RolloutWriter(files) as writer, JsonlAppender(files.materialized) as sent:
            for item in plan.items:
                if not item.verify and item.job.key not in done:
                    writer.rollout(item.job.row)  # carried as it is
            todo = _dispatch(plan.items, done, sent, written, verifier)
            async for result in collect(todo, client, limits, call=verifier):
                _record(result, writer, summary)
        summary.diff = write_diff(settings.rollouts, plan, files, forced)
        if not settings.disable_aggregation:
            await write_aggregate_metrics(files, client, RunSummary(summary.total, summary.skipped))
    return summary


def _dispatch(
    items: list[Item], done: set[tuple[int, int]], sent: JsonlAppender, written: int, verifier: Verifier
) -> Iterator[Job]:
    """The rows still to verify, in plan order; each one past the ``written`` already in the
    payloads file is appended there (as sent to ``/verify``) as it is taken."""
    for verified, item in enumerate(i for i in items if i.verify):
        if verified >= written:
            sent.write(verify_payload(item.job.row, verifier.sent.get(item.job.key)))
        if item.job.key not in done:
            yield item.job


def _record(result: Result, writer: RolloutWriter, summary: ReverifySummary) -> None:
    if result.rollout is not None:
        writer.rollout(result.rollout)
        summary.verified += 1
        return
    assert result.failure is not None
    writer.failure(result.failure)
    summary.failed += 1
    summary.failures_by_class[result.failure["error_class"]] += 1


def classify(item: Item, new_reward: float | None) -> str:
    """How one row's reward moved: ``new_reward`` None means its reverification failed."""
    if not item.verify:
        return "carried"
    old = item.old_reward
    if old is None:
        return "still_failed" if new_reward is None else "fixed"
    if new_reward is None:
        return "newly_failed"
    return "unchanged" if new_reward == old else ("raised" if new_reward > old else "lowered")


def diff_counts(plan: ReverifyPlan, files: RunFiles) -> dict[str, dict[str, int]]:
    """Per environment (and ``_all``) how many rows fell in each of ``OUTCOMES``, over the whole
    output, so a resumed run counts the rows of its earlier attempts too."""
    new = {(r[TASK_INDEX], r[ROLLOUT_INDEX]): rows.reward(r) for r in iter_jsonl(files.output)}
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for item in plan.items:
        outcome = classify(item, new.get(item.job.key))
        counts[item.job.agent][outcome] += 1
        counts[ALL_ENVS][outcome] += 1
    return {env: {name: counts[env][name] for name in OUTCOMES} for env in sorted(counts)}


def write_diff(
    rollouts: Path, plan: ReverifyPlan, files: RunFiles, forced: list[str]
) -> dict[str, dict[str, int]]:
    """Write ``X_reverify_diff.json`` and return its per-environment counts."""
    counts = diff_counts(plan, files)
    total = counts.get(ALL_ENVS, {})
    report = {
        "rollouts": str(rollouts),
        "reverified": str(files.output),
        "changed": total.get("raised", 0) + total.get("lowered", 0),
        "not_reverifiable_no_response": plan.no_response,
        "forced_unsupported": forced,
        "per_environment": counts,
    }
    diff_path(files.output).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    return counts
