"""``gym train compare-mixes SPEC --arm NAME=ENV[,ENV...]...``: does training on one environment
hurt the others, and does mixing them help? Several training runs that differ only in the mix.

The claim behind training on many environments at once is that training on one alone can degrade
the others. This command makes it checkable on one's own environments: each **arm** trains a subset
of the spec's environments (``A``, ``A+B``, ``B``...) and every arm is validated on **every**
environment of the spec — the ones it trains and the ones it does not (including the spec's own
``eval_only`` ones, trained by no arm: a held-out variant, say). Arms are made comparable by
construction:

- **the same initial weights**: the policy is loaded once; its initial parameters are kept in
  memory and restored before each arm (so also one process: no arm pays the load again);
- **the same seed and compute**: each arm is a ``gym train run`` (``training.run.train_run``) with
  the same settings, steps and step shape (``prompts_per_step x responses_per_prompt``); only the
  spec's environments the arm does not train become ``eval_only``;
- **the same validation**: greedy, the same rows each time, at step 0, every ``validate_every``
  steps and at the end.

Written to ``--output DIR``: one folder per arm (everything ``gym train run`` writes, plus the arm's
``blend.yaml``), and across arms:

- ``table.json`` / ``table.md``: per arm and environment, the validation reward at step 0 and at
  the end, the delta with its paired-bootstrap 95% interval (same prompts), McNemar's exact test on
  the pass/fail verdicts of the same prompts (``statistics.mcnemar``), the mean output length at
  both ends, and each arm's worst-environment delta;
- ``curves.jsonl`` / ``curves.png``: per environment, the validation reward (and output length) of
  each arm at every validation step;
- ``start.json``: whether every arm's step-0 replies were the same (the check that the arms did
  start from the same weights);
- ``samples.md``: for the first validation prompts of each environment, the step-0 reply and each
  arm's final reply.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from polygym.blend.mix import load_blend, resolve
from polygym.blend.spec import BlendSpec, load_spec
from polygym.collect.statistics import Estimate, delta, mcnemar
from polygym.items import item_text
from polygym.jsonl import iter_jsonl, write_jsonl
from polygym.row import PASS_THRESHOLD, TASK_INDEX, reward, usage
from polygym.training.run import RunSettings, train_run

ARM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_+.-]{0,63}")
SAMPLES_PER_ENV = 3


@dataclass(frozen=True)
class Arm:
    """One mix: a name (also its folder) and the environments it trains."""

    name: str
    trained: tuple[str, ...]


def parse_arm(text: str) -> Arm:
    """``NAME=ENV[,ENV...]`` (``A+B=reasoning_gym,keyword_constraints``); ValueError naming the problem."""
    name, sep, envs = text.partition("=")
    trained = tuple(dict.fromkeys(e.strip() for e in envs.split(",") if e.strip()))
    if not sep or not trained:
        raise ValueError(f"--arm '{text}': expected NAME=ENV[,ENV...]")
    if not ARM_NAME.fullmatch(name):
        raise ValueError(
            f"--arm '{text}': the name must be letters, digits, '_', '+', '.', '-' (a folder name)"
        )
    return Arm(name, trained)


def check_arms(spec: BlendSpec, arms: Sequence[Arm]) -> None:
    """Every arm names environments of ``spec`` and arm names are unique; ValueError otherwise."""
    names = [arm.name for arm in arms]
    if len(arms) < 2:
        raise ValueError("--arm: give at least two arms to compare")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"--arm: repeated arm names: {', '.join(repeated)}")
    known = [env.name for env in spec.environments]
    for arm in arms:
        unknown = [env for env in arm.trained if env not in known]
        if unknown:
            raise ValueError(
                f"--arm {arm.name}: no environment {', '.join(unknown)} in {spec.source} "
                f"(it has {', '.join(known)})"
            )


def arm_spec(spec: BlendSpec, arm: Arm) -> dict[str, Any]:
    """``spec`` as plain data where only ``arm``'s environments are trained (with their spec weights)
    and every other one is ``eval_only``; data paths made absolute, so the file works anywhere."""
    members = {member.name: member for member in resolve(spec)}
    environments: dict[str, dict[str, Any]] = {}
    for env in spec.environments:
        member = members[env.name]
        entry: dict[str, Any] = {"agent": member.agent, "validation": [str(p) for p in member.validation]}
        if env.name in arm.trained:
            entry |= {"train": [str(p) for p in member.train], "weight": env.weight}
            if env.min_per_step:
                entry["min_per_step"] = env.min_per_step
        else:
            entry["eval_only"] = True
        environments[env.name] = entry
    return {
        "environments": environments,
        "prompts_per_step": spec.prompts_per_step,
        "responses_per_prompt": spec.responses_per_prompt,
        "seed": spec.seed,
    }


@dataclass
class CompareSettings:
    spec_path: Path
    output_dir: Path
    arms: tuple[Arm, ...]
    run: RunSettings
    """Every arm's settings; its ``spec_path`` and ``output_dir`` are replaced per arm."""


# ------------------------------------------------------------------------------- reading the arms


@dataclass(frozen=True)
class Reply:
    reward: float
    output_tokens: float | None
    text: str
    prompt: str


def validation_files(arm_dir: Path) -> dict[int, Path]:
    """``{step: rollout file}`` of one arm's validations (``validation.jsonl`` lists the steps)."""
    steps = sorted({line["step"] for line in iter_jsonl(arm_dir / "validation.jsonl")})
    files = {}
    for step in steps:
        if step == 0:
            files[step] = arm_dir / "validation_before.jsonl"
        elif step == steps[-1]:
            files[step] = arm_dir / "validation_after.jsonl"
        else:
            files[step] = arm_dir / "validation" / f"step_{step}.jsonl"
    return files


def _prompt(rollout: dict[str, Any]) -> str:
    given = (rollout.get("responses_create_params") or {}).get("input")
    if isinstance(given, str):
        return given
    messages = [m for m in given or [] if isinstance(m, dict) and m.get("role") == "user"]
    return item_text(messages[-1]) if messages else ""


def read_replies(path: Path, agents: dict[str, str]) -> dict[str, dict[int, Reply]]:
    """``{env: {task index: reply}}`` of one validation file (env found from the agent)."""
    found: dict[str, dict[int, Reply]] = {env: {} for env in agents.values()}
    for rollout in iter_jsonl(path):
        env = agents.get((rollout.get("agent_ref") or {}).get("name", ""))
        if env is None or not isinstance(rollout.get(TASK_INDEX), int):
            continue
        response = rollout.get("response")
        output = response.get("output") if isinstance(response, dict) else None
        text = "".join(
            item_text(i) for i in output or [] if isinstance(i, dict) and i.get("type") == "message"
        )
        found[env][rollout[TASK_INDEX]] = Reply(
            reward(rollout), usage(rollout).get("output_tokens"), text, _prompt(rollout)
        )
    return found


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def env_row(env: str, trained: bool, before: dict[int, Reply], after: dict[int, Reply]) -> dict[str, Any]:
    """One line of the table: an environment's change from step 0 to the end in one arm."""
    change: Estimate = delta(
        {k: r.reward for k, r in before.items()}, {k: r.reward for k, r in after.items()}, stratum=env
    )
    test = mcnemar(
        {k: r.reward >= PASS_THRESHOLD for k, r in before.items()},
        {k: r.reward >= PASS_THRESHOLD for k, r in after.items()},
    )
    return {
        "env": env,
        "trained": trained,
        "n": change.n,
        "reward_before": _mean([r.reward for r in before.values()]),
        "reward_after": _mean([r.reward for r in after.values()]),
        "delta": change.mean,
        "delta_low": change.low,
        "delta_high": change.high,
        "pass_before": _mean([float(r.reward >= PASS_THRESHOLD) for r in before.values()]),
        "pass_after": _mean([float(r.reward >= PASS_THRESHOLD) for r in after.values()]),
        "mcnemar_lost": test.lost,
        "mcnemar_gained": test.gained,
        "mcnemar_p": test.p_value,
        "output_tokens_before": _mean([r.output_tokens for r in before.values()]),
        "output_tokens_after": _mean([r.output_tokens for r in after.values()]),
    }


@dataclass
class ArmResult:
    arm: Arm
    rows: list[dict[str, Any]]
    curves: list[dict[str, Any]]
    replies: dict[int, dict[str, dict[int, Reply]]]
    """``{step: {env: {task: reply}}}``"""
    seconds: float

    @property
    def worst(self) -> dict[str, Any] | None:
        """The environment whose validation reward changed least (fell most)."""
        known = [row for row in self.rows if row["delta"] is not None]
        return min(known, key=lambda row: row["delta"]) if known else None


def read_arm(arm: Arm, arm_dir: Path, agents: dict[str, str], seconds: float) -> ArmResult:
    replies = {step: read_replies(path, agents) for step, path in validation_files(arm_dir).items()}
    first, last = min(replies), max(replies)
    envs = list(agents.values())
    rows = [env_row(env, env in arm.trained, replies[first][env], replies[last][env]) for env in envs]
    curves = [
        {
            "arm": arm.name,
            "step": step,
            "env": env,
            "trained": env in arm.trained,
            "reward_mean": _mean([r.reward for r in by_env[env].values()]),
            "pass_rate": _mean([float(r.reward >= PASS_THRESHOLD) for r in by_env[env].values()]),
            "output_tokens_mean": _mean([r.output_tokens for r in by_env[env].values()]),
            "n": len(by_env[env]),
        }
        for step, by_env in sorted(replies.items())
        for env in envs
    ]
    return ArmResult(arm, rows, curves, replies, seconds)


# ------------------------------------------------------------------------------------- the report


def _num(value: float | None, digits: int = 3, sign: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def table_markdown(results: Sequence[ArmResult]) -> str:
    """The per-arm table as Markdown (what ``table.md`` holds and a README can quote)."""
    lines = [
        "| arm | environment | trained | n | reward step 0 | reward end | delta [95% CI] | "
        "pass 0 -> end | McNemar lost/gained, p | output tokens 0 -> end |",
        "|---|---|---|---:|---:|---:|---|---|---|---|",
    ]
    for result in results:
        for row in result.rows:
            interval = (
                f" [{_num(row['delta_low'], sign=True)}, {_num(row['delta_high'], sign=True)}]"
                if row["delta_low"] is not None
                else ""
            )
            lines.append(
                f"| {result.arm.name} | {row['env']} | {'yes' if row['trained'] else 'no'} | {row['n']} | "
                f"{_num(row['reward_before'])} | {_num(row['reward_after'])} | "
                f"{_num(row['delta'], sign=True)}{interval} | "
                f"{_num(row['pass_before'], 2)} -> {_num(row['pass_after'], 2)} | "
                f"{row['mcnemar_lost']}/{row['mcnemar_gained']}, p={row['mcnemar_p']:.3g} | "
                f"{_num(row['output_tokens_before'], 1)} -> {_num(row['output_tokens_after'], 1)} |"
            )
    lines += ["", "| arm | worst environment | its delta | wall time (s) |", "|---|---|---:|---:|"]
    for result in results:
        worst = result.worst
        lines.append(
            f"| {result.arm.name} | {worst['env'] if worst else '-'} | "
            f"{_num(worst['delta'] if worst else None, sign=True)} | {result.seconds:.0f} |"
        )
    return "\n".join(lines) + "\n"


def samples_markdown(results: Sequence[ArmResult], per_env: int = SAMPLES_PER_ENV) -> str:
    """For the first validation prompts of each environment: the step-0 reply, then each arm's last."""
    first = results[0]
    start = first.replies[min(first.replies)]
    out = ["# Validation replies: step 0 and each arm's last step", ""]
    for env, by_task in start.items():
        out += [f"## {env}", ""]
        for task in sorted(by_task)[:per_env]:
            reply = by_task[task]
            out += [
                f"**prompt** {reply.prompt!r}",
                "",
                f"- step 0 (reward {reply.reward:.2f}): {reply.text!r}",
            ]
            for result in results:
                step = max(result.replies)
                last = result.replies[step][env].get(task)
                if last is not None:
                    out.append(f"- {result.arm.name}, step {step} (reward {last.reward:.2f}): {last.text!r}")
            out.append("")
    return "\n".join(out)


def plot_curves(curves: Sequence[dict[str, Any]], png: Path, title: str) -> None:
    """One column per environment: validation reward (top) and mean output tokens (bottom) per
    step, one line per arm; dashed where the arm does not train that environment."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(dict.fromkeys(c["env"] for c in curves))
    arms = list(dict.fromkeys(c["arm"] for c in curves))
    figure, axes = plt.subplots(
        2,
        len(envs),
        figsize=(4.2 * len(envs), 6),
        sharex=True,
        squeeze=False,
        gridspec_kw={"height_ratios": [3, 2]},
    )
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for column, env in enumerate(envs):
        top, bottom = axes[0][column], axes[1][column]
        for i, arm in enumerate(arms):
            points = [c for c in curves if c["env"] == env and c["arm"] == arm]
            steps = [c["step"] for c in points]
            style = "-" if points and points[0]["trained"] else "--"
            label = f"{arm}{'' if style == '-' else ' (not trained)'}"
            top.plot(
                steps,
                [c["reward_mean"] for c in points],
                style,
                marker="o",
                color=colors[i % len(colors)],
                label=label,
            )
            bottom.plot(
                steps,
                [c["output_tokens_mean"] for c in points],
                style,
                marker=".",
                color=colors[i % len(colors)],
            )
        top.set_title(env)
        top.set_ylim(-0.02, 1.02)  # the whole reward range: a small change must look small
        bottom.set_ylim(bottom=0)
        top.grid(alpha=0.3)
        top.legend(fontsize=8, loc="best")
        bottom.grid(alpha=0.3)
        bottom.set_xlabel("training step")
    axes[0][0].set_ylabel("validation reward (greedy)")
    axes[1][0].set_ylabel("mean output tokens")
    figure.suptitle(title)
    figure.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png, dpi=100)
    plt.close(figure)


# -------------------------------------------------------------------------------------- the runs


def compare_mixes(settings: CompareSettings, echo: Callable[[str], Any] = print) -> list[ArmResult]:
    """Train every arm from the same initial weights, then write the cross-arm files (module docstring)."""
    from polygym.training.models import load_policy

    spec = load_spec(settings.spec_path)
    check_arms(spec, settings.arms)
    agents = {env.agent: env.name for env in load_blend(spec, split="validation").environments}
    out = settings.output_dir
    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    model, tokenizer = load_policy(settings.run.model)
    initial = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    echo(
        f"policy {settings.run.model} loaded once ({time.perf_counter() - began:.0f}s); arms: "
        + "; ".join(f"{a.name} trains {'+'.join(a.trained)}" for a in settings.arms)
    )
    title = f"{settings.run.model}: {settings.run.steps} steps per arm, trainer seed {settings.run.seed}"
    results = []
    for arm in settings.arms:
        model.load_state_dict(initial)
        arm_dir = out / arm.name
        arm_dir.mkdir(parents=True, exist_ok=True)
        arm_path = arm_dir / "blend.yaml"
        arm_path.write_text(yaml.safe_dump(arm_spec(spec, arm), sort_keys=False))
        t = time.perf_counter()
        train_run(
            replace(settings.run, spec_path=arm_path, output_dir=arm_dir),
            echo=lambda line, name=arm.name: echo(f"[{name}] {line}"),
            policy=(model, tokenizer),
        )
        results.append(read_arm(arm, arm_dir, agents, time.perf_counter() - t))
        # after every arm, so a run cut short still leaves the arms it finished compared
        write_report(results, out, title)
    echo(f"compare-mixes done in {time.perf_counter() - began:.0f}s; files in {out}")
    return results


def same_start(results: Sequence[ArmResult]) -> bool:
    """Whether every arm's step-0 replies are the same texts (same weights, greedy: they should be)."""
    starts = [
        {env: {task: reply.text for task, reply in by_task.items()} for env, by_task in r.replies[0].items()}
        for r in results
        if 0 in r.replies
    ]
    return all(start == starts[0] for start in starts)


def write_report(results: Sequence[ArmResult], out: Path, title: str) -> None:
    (out / "start.json").write_text(json.dumps({"step0_replies_identical_across_arms": same_start(results)}))
    table = [
        {
            "arm": r.arm.name,
            "trained": list(r.arm.trained),
            "seconds": round(r.seconds, 1),
            "worst_env": r.worst["env"] if r.worst else None,
            "worst_delta": r.worst["delta"] if r.worst else None,
            "environments": r.rows,
        }
        for r in results
    ]
    (out / "table.json").write_text(json.dumps(table, indent=2))
    (out / "table.md").write_text(table_markdown(results))
    curves = [c for r in results for c in r.curves]
    write_jsonl(curves, out / "curves.jsonl")
    plot_curves(curves, out / "curves.png", title)
    (out / "samples.md").write_text(samples_markdown(results))
