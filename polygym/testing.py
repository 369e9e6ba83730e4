"""What tests of environments, agents and model servers are written with: ``polygym.testing``.

A server folder's tests (``resources_servers/<name>/tests/``, and the same for agents and model
servers) import only from ``polygym`` and from here, as its ``app.py`` imports only from
``polygym`` (model servers also from ``polygym.models``); an import-linter contract in
``pyproject.toml`` holds them to it, so the library's modules can move without breaking them.

Calling a server:

- ``serve_in_process(server)``: the server's lifespan entered and a ``ServerClient`` that calls it
  in-process under the name ``env``, through the same path as the inline backend (so a test sees
  what production does); ``in_process_client(server)`` when the test manages the lifespan itself
  (a module-scoped server, say);
- ``synthetic_response(output)`` and ``verify(client, row, output)``: a Responses object built from
  output items or from the text of a final answer, and the verifier's JSON reply to it;
- ``AppServer(app, bind_socket())``: an app on a real loopback socket (port 0), for what only a
  socket shows (an SDK client, streaming, a fake upstream); ``ServerClient.request_url`` calls it
  (``retry=NO_RETRY`` to see every status as it is) and returns a ``Reply``;
- ``inline_stack(...)``: a whole stack in this process (the environment, its agent, a model),
  and ``collect_rollouts(...)`` to run a dataset's rows through an agent of it.

Checking files and configs:

- ``read_jsonl``, ``read_splits`` and ``assert_generator_reproduces``: the shipped dataset files,
  and the check that the generator writes every one of them again, byte for byte;
- ``load_config`` and ``server_class``: the stack config a shipped YAML gives, and the class the
  loader builds from one of its servers.

Nothing here imports pytest: the helpers are plain functions and context managers.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from polygym.collect.dataset import Materialization, load_jobs
from polygym.collect.rollouts import Limits, Result, collect
from polygym.jsonl import read_jsonl
from polygym.net.client import Reply, ServerClient
from polygym.net.listen import AppServer, bind_socket
from polygym.protocol import message_item, new_response
from polygym.servers.base import BaseServer
from polygym.servers.sessions import SESSION_COOKIE
from polygym.stack.catalog import selector_paths
from polygym.stack.config import load_config
from polygym.stack.launcher import Stack
from polygym.stack.loader import server_class

__all__ = [
    "ENV",
    "SESSION_COOKIE",
    "SPLITS",
    "AppServer",
    "Reply",
    "ServerClient",
    "Stack",
    "assert_generator_reproduces",
    "bind_socket",
    "collect_rollouts",
    "in_process_client",
    "inline_stack",
    "load_config",
    "read_jsonl",
    "read_splits",
    "serve_in_process",
    "server_class",
    "synthetic_response",
    "verify",
]

ENV = "env"
"""The name tests call the environment under."""
SPLITS = ("example", "train", "validation")


def in_process_client(server: BaseServer, name: str = ENV) -> ServerClient:
    """A client whose calls to ``name`` go straight into ``server`` (no socket), the way the inline
    backend calls it: JSON routes through ``dispatch``, the rest through its ASGI app."""
    client = ServerClient()
    client.add_local(name, server.app, server.dispatch)
    return client


@asynccontextmanager
async def serve_in_process(server: BaseServer, name: str = ENV) -> AsyncIterator[ServerClient]:
    """Run ``server``'s lifespan (startup, then shutdown on exit) around an ``in_process_client``."""
    client = in_process_client(server, name)
    async with server.app.router.lifespan_context(server.app):
        yield client


def synthetic_response(output: list[dict[str, Any]] | str, model: str = "scripted") -> dict[str, Any]:
    """A Responses object with ``output`` items, or with one assistant message when given its text."""
    return new_response([message_item(output)] if isinstance(output, str) else output, model=model)


async def verify(
    client: ServerClient,
    row: dict[str, Any],
    response: dict[str, Any] | list[dict[str, Any]] | str,
    cookies: dict[str, str] | None = None,
    *,
    name: str = ENV,
) -> dict[str, Any]:
    """``POST /verify`` for ``row`` and ``response``: the verifier's JSON reply.

    ``response`` is a Responses object, or what ``synthetic_response`` builds one from (output
    items, or an answer's text). ``cookies`` carry a seeded session; without them the server uses
    a throwaway one.
    """
    if not isinstance(response, dict):
        response = synthetic_response(response)
    return (await client.call(name, "/verify", {**row, "response": response}, cookies=cookies)).json()


def read_splits(data_dir: Path, splits: Iterable[str] = SPLITS) -> dict[str, list[dict[str, Any]]]:
    """``{split: rows}`` from ``data_dir/<split>.jsonl``."""
    return {split: read_jsonl(data_dir / f"{split}.jsonl") for split in splits}


def _generate(script: Path, *args: str) -> None:
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise AssertionError(f"{script} {' '.join(args)} failed (exit {done.returncode}):\n{done.stderr}")


def assert_generator_reproduces(data_dir: Path, out_dir: Path, single: str = "example") -> None:
    """``data_dir/generate.py`` writes every ``*.jsonl`` shipped in ``data_dir`` again, byte for byte.

    One run writes all splits into ``out_dir`` (``--output-dir``); a second writes the ``single``
    split alone to a file of its own (``--output``), the way a user regenerates one file. Both use
    the command line every generator shares (``polygym.generator_main``).
    """
    script = data_dir / "generate.py"
    shipped = sorted(data_dir.glob("*.jsonl"))
    assert shipped, f"no *.jsonl files in {data_dir}"
    _generate(script, "--output-dir", str(out_dir))
    for path in shipped:
        written = out_dir / path.name
        assert written.exists(), f"{script} did not write {path.name}"
        assert written.read_bytes() == path.read_bytes(), f"{path} is not what {script} writes"
    alone = out_dir / "alone" / f"{single}.jsonl"
    _generate(script, "--output", str(alone))
    assert alone.read_bytes() == (data_dir / f"{single}.jsonl").read_bytes(), f"--output {single} differs"


@asynccontextmanager
async def inline_stack(
    resources_servers: Sequence[str], model_types: Sequence[str], configs: Sequence[str | Path] = ()
) -> AsyncIterator[Stack]:
    """A started stack of the named environments and model types (and extra config files), every
    server in this process, the head on a free port, no stack record and no ``env.yaml``; stopped
    on exit."""
    paths = selector_paths(list(resources_servers), list(model_types), [str(c) for c in configs])
    stack = Stack(load_config(paths, env_files=[]), backend="inline", head_port=0, record=False)
    await stack.start()
    try:
        yield stack
    finally:
        await stack.stop()


async def collect_rollouts(
    client: ServerClient, dataset: Path, agent: str, *, num_repeats: int = 1, concurrency: int = 4
) -> list[Result]:
    """Every row of ``dataset`` run ``num_repeats`` times through ``agent``, as ``gym eval run``
    collects them: one ``Result`` per rollout (``.ok``, ``.rollout``, ``.failure``), in completion order."""
    jobs = load_jobs(dataset, [agent], options=Materialization(num_repeats=num_repeats))
    return [result async for result in collect(jobs, client, Limits(concurrency=concurrency))]
