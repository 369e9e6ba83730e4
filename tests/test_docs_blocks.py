"""The README's and docs/' command blocks run as written, and every relative link resolves.

Which blocks run is explicit, so that a reader can tell from the page itself: a fenced block runs
only when the line before its opening fence is a marker comment

    <!-- docs-test: KIND[ e2e][, with OPTION VALUE ...] -->

where KIND is

- ``run``: a bash block, run with ``bash -euo pipefail``; it must exit 0.
- ``output``: a transcript. Each ``$ COMMAND`` line (continued by a trailing backslash) is run and
  must exit 0, and what it prints on stdout must be the lines that follow it, trailing spaces aside
  and any duration (``0.1s``) standing for any other.
- ``stack``: a bash block holding one ``gym env start`` command, started in the background and kept
  up while the rest of the page's blocks run. ``with OPTION VALUE`` replaces the value of that
  option first: the README's flow names ``--model-type openai_model``, which needs the reader's
  endpoint; the test runs it on ``scripted_model``.

``e2e`` marks a block that starts servers (a ``stack`` block always does). A page's blocks run in
order in one scratch directory that mirrors the repository (its files linked, ``resources_servers/``
a folder of links so that ``gym env init`` writes into the scratch copy, ``results/`` new), with
``gym`` on PATH running this interpreter. The quick test runs the blocks without ``e2e``; the e2e
test runs them all. A block without a marker is not run: it needs a GPU, the network (an install,
an API endpoint), a long run (training), or files only the reader has.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from polygym.jsonl import iter_jsonl

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
MARKER = re.compile(r"<!--\s*docs-test:\s*(?P<spec>.*?)\s*-->")
FENCE = re.compile(r"^(```+|~~~+)")
LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
DURATION = re.compile(r"\b\d+\.\d+s\b")
BLOCK_TIMEOUT_S = 300
KINDS = ("run", "output", "stack")
NOT_MIRRORED = {".git", ".venv", "resources_servers", "results", "env.yaml"}


@dataclass(frozen=True)
class Block:
    """One marked fenced block of a page."""

    page: Path
    line: int
    kind: str
    e2e: bool
    replacements: tuple[tuple[str, str], ...]
    text: str

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def parse_marker(spec: str, where: str) -> tuple[str, bool, tuple[tuple[str, str], ...]]:
    """``KIND[ e2e][, with OPTION VALUE ...]`` as (kind, e2e, replacements); anything else is an error."""
    head, _, tail = spec.partition(",")
    words = head.split()
    if not words or words[0] not in KINDS or any(word != "e2e" for word in words[1:]):
        raise ValueError(f"{where}: docs-test marker {spec!r}: expected KIND[ e2e] with KIND in {KINDS}")
    replacements: tuple[tuple[str, str], ...] = ()
    if tail.strip():
        with_words = tail.split()
        if with_words[0] != "with" or len(with_words) % 2 != 1:
            raise ValueError(f"{where}: docs-test marker {spec!r}: expected ', with OPTION VALUE ...'")
        pairs = with_words[1:]
        replacements = tuple(zip(pairs[::2], pairs[1::2], strict=True))
    kind = words[0]
    return kind, "e2e" in words[1:] or kind == "stack", replacements


def marked_blocks(page: Path) -> list[Block]:
    """The page's marked blocks, in page order (a marker not followed by a fence is an error)."""
    lines = page.read_text().splitlines()
    blocks: list[Block] = []
    for index, line in enumerate(lines):
        marker = MARKER.fullmatch(line.strip())
        if not marker:
            continue
        where = f"{page.relative_to(ROOT)}:{index + 1}"
        fence = FENCE.match(lines[index + 1]) if index + 1 < len(lines) else None
        if not fence:
            raise ValueError(f"{where}: a docs-test marker must stand right before a fenced block")
        end = next(i for i in range(index + 2, len(lines)) if lines[i].startswith(fence.group(1)))
        kind, e2e, replacements = parse_marker(marker.group("spec"), where)
        text = "\n".join(lines[index + 2 : end]) + "\n"
        blocks.append(Block(page, index + 2, kind, e2e, replacements, text))
    return blocks


BLOCKS = {page: marked_blocks(page) for page in PAGES}


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def mirror(sandbox: Path) -> dict[str, str]:
    """Lay the repository out in ``sandbox`` and return the environment its blocks run with."""
    sandbox.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in NOT_MIRRORED:
            (sandbox / entry.name).symlink_to(entry)
    servers = sandbox / "resources_servers"
    servers.mkdir()
    for entry in (ROOT / "resources_servers").iterdir():
        (servers / entry.name).symlink_to(entry)
    bin_dir = sandbox.parent / f"{sandbox.name}-bin"
    bin_dir.mkdir()
    gym = bin_dir / "gym"
    gym.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m polygym "$@"\n')
    gym.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def run_bash(script: str, sandbox: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=sandbox,
        env=env,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
    )


def transcript(text: str) -> list[tuple[str, list[str]]]:
    """An ``output`` block as (command, expected stdout lines) pairs."""
    steps: list[tuple[str, list[str]]] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if not line.startswith("$ "):
            raise ValueError(f"transcript line {line!r} comes before any '$ ' command")
        command = [line[2:]]
        while command[-1].endswith("\\"):
            index += 1
            command.append(lines[index])
        index += 1
        expected: list[str] = []
        while index < len(lines) and not lines[index].startswith("$ "):
            expected.append(lines[index])
            index += 1
        steps.append(("\n".join(command), expected))
    return steps


def normalized(lines: list[str]) -> list[str]:
    out = [DURATION.sub("<duration>", line.rstrip()) for line in lines]
    while out and not out[-1]:
        out.pop()
    return out


def stack_args(block: Block) -> list[str]:
    """The ``gym env start`` arguments of a ``stack`` block, with the marker's replacements made."""
    words = shlex.split(block.text.replace("\\\n", " "), comments=True)
    assert words[:3] == ["gym", "env", "start"], f"{block.where()}: a stack block is one `gym env start`"
    args = words[3:]
    for option, value in block.replacements:
        assert option in args, f"{block.where()}: `with {option}` but the command has no {option}"
        args[args.index(option) + 1] = value
    return args


def check_transcript(block: Block, sandbox: Path, env: dict[str, str]) -> None:
    """Each command of an ``output`` block exits 0 and prints what the page says it prints."""
    for command, expected in transcript(block.text):
        done = run_bash(command, sandbox, env)
        where = f"{block.where()}: `{command}`"
        assert done.returncode == 0, f"{where} exited {done.returncode}:\n{done.stderr}"
        assert normalized(done.stdout.splitlines()) == normalized(expected), f"{where} printed\n{done.stdout}"


def run_blocks(blocks: list[Block], sandbox: Path, start_stack: Any) -> None:
    """Run ``blocks`` in order in ``sandbox``; the first that fails fails the test, naming its line."""
    env = mirror(sandbox)
    for block in blocks:
        if block.kind == "stack":
            start_stack(*stack_args(block), cwd=sandbox)
        elif block.kind == "run":
            done = run_bash(block.text, sandbox, env)
            output = f"{done.stdout}{done.stderr}"
            assert done.returncode == 0, f"{block.where()} exited {done.returncode}:\n{output}"
        else:
            check_transcript(block, sandbox, env)


QUICK_PAGES = [page for page, blocks in BLOCKS.items() if any(not b.e2e for b in blocks)]
E2E_PAGES = [page for page, blocks in BLOCKS.items() if any(b.e2e for b in blocks) and page != README]


@pytest.mark.parametrize("page", QUICK_PAGES, ids=page_id)
def test_the_pages_quick_blocks_run_as_written(page: Path, tmp_path: Path, start_stack: Any) -> None:
    run_blocks([b for b in BLOCKS[page] if not b.e2e], tmp_path / "repo", start_stack)


@pytest.mark.e2e
@pytest.mark.parametrize("page", E2E_PAGES, ids=page_id)
def test_the_pages_blocks_run_as_written_with_their_stacks(
    page: Path, tmp_path: Path, start_stack: Any
) -> None:
    run_blocks(BLOCKS[page], tmp_path / "repo", start_stack)


@pytest.mark.e2e
def test_the_readmes_two_environment_flow_collects_every_row(tmp_path: Path, start_stack: Any) -> None:
    """The README's flow, on the scripted model: 10 rollouts, none failed, each rewarded 1.0 (the
    scripted policy solves both example environments)."""
    sandbox = tmp_path / "repo"
    run_blocks(BLOCKS[README], sandbox, start_stack)
    rollouts = list(iter_jsonl(sandbox / "results" / "test_multiverifier_outputs.jsonl"))
    failures = list(iter_jsonl(sandbox / "results" / "test_multiverifier_outputs_failures.jsonl"))
    assert (len(rollouts), len(failures)) == (10, 0)
    assert {row["reward"] for row in rollouts} == {1.0}


def slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def prose(page: Path) -> list[str]:
    """The page's lines outside fenced blocks (a link inside a code block is code, not a link)."""
    lines: list[str] = []
    fence: str | None = None
    for line in page.read_text().splitlines():
        opening = FENCE.match(line)
        if fence is None and opening:
            fence = opening.group(1)
        elif fence is not None and line.startswith(fence):
            fence = None
        elif fence is None:
            lines.append(line)
    return lines


def anchors(page: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in prose(page) if line.startswith("#")}


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_relative_link_resolves(page: Path) -> None:
    broken: list[str] = []
    for line in prose(page):
        for link in LINK.finditer(line):
            target = link.group("target")
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # an absolute URL: nothing to check offline
            path_part, _, anchor = target.partition("#")
            path = (page.parent / path_part).resolve() if path_part else page
            if not path.exists():
                broken.append(f"{target} (no file {path})")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{target} (no heading #{anchor} in {path.name})")
    assert not broken, f"{page_id(page)}: broken links: {broken}"
