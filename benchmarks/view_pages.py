"""gym view on 100,000 rollouts: time to index, and time per page (first paint and filtering).

Writes a synthetic run of N rollouts shaped like the scripted model's (a tool call, its output
and an answer; four environments, 8 repeats per task, 1% failures), indexes it as `gym view`
does, then times each page through the app in-process (Starlette's test client, no socket):
overview, steps-less rollout list (first page, a far page), filters by environment, reward range,
failure class and a text search (first and cached), a rollout page and the compare page.

    python benchmarks/view_pages.py [--rows 100000] [--dir /tmp/view_bench]
Targets (issue #16): index under 5 s, each page under 300 ms.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import orjson
from starlette.testclient import TestClient

from polygym.view.app import create_app
from polygym.view.viewer import open_runs

ENVS = ("weather", "synonyms", "math", "code")


def write_run(path: Path, rows: int, seed: int) -> None:
    rng = random.Random(seed)
    with path.open("wb") as out, path.with_name(path.stem + "_failures.jsonl").open("wb") as failures:
        for i in range(rows):
            env, task, repeat = ENVS[i % 4], i // 8, i % 8
            row = {
                "responses_create_params": {
                    "input": [{"role": "user", "content": f"{env} task {task}: " + "word " * 60}]
                },
                "agent_ref": {"type": "responses_api_agents", "name": env},
                "_ng_task_index": task,
                "_ng_rollout_index": repeat,
            }
            if rng.random() < 0.01:
                failures.write(
                    orjson.dumps({**row, "error_class": "Timeout", "error": "slow", "row": row}) + b"\n"
                )
                continue
            call = f"call_{i}"
            row["response"] = {
                "output": [
                    {
                        "type": "function_call",
                        "call_id": call,
                        "name": "lookup",
                        "arguments": orjson.dumps({"q": task}).decode(),
                    },
                    {"type": "function_call_output", "call_id": call, "output": "value " * 40},
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": f"answer {rng.random()}"}],
                    },
                ],
                "usage": {"input_tokens": 300, "output_tokens": 40, "total_tokens": 340},
            }
            row["reward"] = float(rng.random() < 0.6)
            out.write(orjson.dumps(row) + b"\n")


def timed(client: TestClient, path: str) -> float:
    began = time.perf_counter()
    reply = client.get(path)
    elapsed = time.perf_counter() - began
    assert reply.status_code == 200, (path, reply.status_code)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/view_bench"))
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    base, new = args.dir / "base.jsonl", args.dir / "new.jsonl"
    began = time.perf_counter()
    write_run(base, args.rows, 1)
    write_run(new, args.rows, 2)
    print(
        f"wrote 2 x {args.rows} rows ({base.stat().st_size / 1e6:.0f} MB each)"
        f" in {time.perf_counter() - began:.1f}s"
    )
    began = time.perf_counter()
    indexes = open_runs([base], echo=lambda _: None)
    print(f"index {args.rows} rows + overview: {time.perf_counter() - began:.2f} s (target < 5 s)")
    began = time.perf_counter()
    indexes = open_runs([base, new], echo=lambda _: None)
    print(f"index 2 x {args.rows} rows + overviews + comparison: {time.perf_counter() - began:.2f} s")
    client = TestClient(create_app(indexes, wait_s=600))  # each page with its numbers
    far = args.rows // 50 // 2
    pages = [
        ("overview (first paint)", "/run/0"),
        ("overview (again)", "/run/0"),
        ("rollout list, page 1", "/run/0/rollouts"),
        (f"rollout list, page {far}", f"/run/0/rollouts?page={far}"),
        ("filter: environment", "/run/0/rollouts?env=math"),
        ("filter: reward range", "/run/0/rollouts?min=0.5&max=1"),
        ("filter: failed + class", "/run/0/rollouts?status=failed&class=Timeout"),
        ("filter: text search (first)", "/run/0/rollouts?q=task+4242%3A"),
        ("filter: text search (page 2, cached)", "/run/0/rollouts?q=task+4242%3A&page=2"),
        ("rollout page", "/run/0/rollouts/12345"),
        ("compare (first)", "/compare/0/1"),
        ("compare (again)", "/compare/0/1"),
    ]
    for name, path in pages:
        print(f"{name:40s} {timed(client, path) * 1000:7.1f} ms")


if __name__ == "__main__":
    main()
