"""Write a Python function that passes hidden unit tests; the code runs in a sandboxed process.

The policy answers with a fenced Python code block. ``verify`` takes the code of the last
assistant message, runs it in ``sandbox.Sandbox`` (a separate, resource-limited process, isolated
in its own namespaces when the server runs as root) and calls the row's ``entry_point`` on each
test's arguments. Only the returned values come back; they are compared here with the expected
values the sandbox never sees. Reward is the fraction of tests passed, or 1/0 with
``all_or_nothing: true``; a run that broke a sandbox rule (a limit, the wall clock, forged or
garbled results, a crash) scores 0 with the rule in ``reason``. Nothing the submission does can
block the event loop, outlive its run, or be mistaken for a failure of the server.

The sandbox's isolation is checked when the server starts (a probe run); a server that cannot
have the isolation its config asks for does not start.
"""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import BaseModel, Field

from polygym import ResourcesServer, ResourcesServerConfig, VerifyRequest, VerifyResponse, message_item
from resources_servers.code_exec.sandbox import RunResult, Sandbox, SandboxConfig

FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
PYTHON_TAGS = {"", "python", "python3", "py"}
IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]{0,99}$"


def extract_code(text: str) -> str:
    """The last fenced block tagged python/py (or untagged); without fences, the whole text.

    An unterminated final fence (a reply cut off by max_output_tokens) counts from its opening.
    """
    blocks = [(tag.lower(), body) for tag, body in FENCE.findall(text)]
    python = [body for tag, body in blocks if tag in PYTHON_TAGS]
    if python:
        return python[-1]
    if blocks:
        return ""
    opening = text.rfind("```")
    if opening != -1:
        rest = text[opening + 3 :]
        first_line, _, body = rest.partition("\n")
        return body if first_line.strip().lower() in PYTHON_TAGS else ""
    return text


def values_equal(expected: Any, actual: Any, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    """Structural JSON equality; floats within tolerance, booleans never equal to numbers."""
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(expected) is type(actual) and expected == actual
    if isinstance(expected, int | float) and isinstance(actual, int | float):
        if isinstance(expected, float) or isinstance(actual, float):
            if math.isnan(expected) or math.isnan(actual):
                return math.isnan(expected) and math.isnan(actual)
            return math.isclose(expected, actual, rel_tol=rel_tol, abs_tol=abs_tol)
        return expected == actual
    if isinstance(expected, list) and isinstance(actual, list):
        return len(expected) == len(actual) and all(
            values_equal(e, a, rel_tol, abs_tol) for e, a in zip(expected, actual, strict=True)
        )
    if isinstance(expected, dict) and isinstance(actual, dict):
        return expected.keys() == actual.keys() and all(
            values_equal(expected[k], actual[k], rel_tol, abs_tol) for k in expected
        )
    return type(expected) is type(actual) and expected == actual


class CodeTest(BaseModel):
    """One hidden test: ``entry_point(*args, **kwargs)`` must return ``expected``."""

    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    expected: Any = None


class CodeExecConfig(ResourcesServerConfig):
    all_or_nothing: bool = False
    max_code_chars: int = 50_000
    float_rel_tol: float = 1e-6
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)


class CodeExecVerifyRequest(VerifyRequest):
    entry_point: str = Field(pattern=IDENTIFIER)
    tests: list[CodeTest] = Field(min_length=1, max_length=1000)


class CodeExecVerifyResponse(CodeExecVerifyRequest, VerifyResponse):
    num_passed: int
    num_tests: int
    pass_rate: float
    status: str
    isolation: str | None
    reason: str | None = Field(description="the sandbox rule the run broke (then reward is 0)")
    error: str | None


class CodeExec(ResourcesServer[CodeExecConfig]):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sandbox = Sandbox(self.config.sandbox)

    async def startup(self) -> None:
        """Refuse to start without the configured isolation (SandboxSetupError names what is missing)."""
        await super().startup()
        await self.sandbox.start()

    async def health(self) -> dict[str, Any]:
        return {
            **await super().health(),
            "isolation": self.sandbox.isolation,
            "enforcement": self.sandbox.enforcement,
        }

    @classmethod
    def example_solution(cls, row: dict[str, Any]) -> list[dict[str, Any]]:
        """A correct rollout: the row's reference solution in a python code block."""
        code = row.get("reference_solution")
        if not isinstance(code, str):
            raise ValueError("this row has no reference_solution")
        return [message_item(f"Here is the function.\n\n```python\n{code}```")]

    async def verify(self, body: CodeExecVerifyRequest) -> CodeExecVerifyResponse:
        """Run the last assistant message's code against the hidden tests; reward = share passed."""
        text = body.response.output_text()
        code = extract_code(text)
        if not code.strip():
            return self._result(
                body, 0, "no_code", None, "no Python code found in the last assistant message"
            )
        if len(code) > self.config.max_code_chars:
            return self._result(
                body, 0, "code_too_long", None, f"{len(code)} characters (limit {self.config.max_code_chars})"
            )
        inputs = [{"args": t.args, "kwargs": t.kwargs} for t in body.tests]
        run = await self.sandbox.run(code, body.entry_point, inputs)
        if run.violation:
            detail = run.protocol_error or f"the submission broke the sandbox rule '{run.violation}'"
            return self._result(body, 0, run.status, run.isolation, detail, reason=run.violation)
        passed, first_failure = self._score(body.tests, run)
        return self._result(body, passed, run.status, run.isolation, run.load_error or first_failure)

    def _score(self, tests: list[CodeTest], run: RunResult) -> tuple[int, str | None]:
        passed, first_failure = 0, None
        for index, test in enumerate(tests):
            outcome = run.outcomes.get(index)
            if outcome is not None and outcome.error is None:
                if values_equal(test.expected, outcome.value, self.config.float_rel_tol):
                    passed += 1
                    continue
                failure = f"test {index}: wrong result"
            elif outcome is not None:
                failure = f"test {index}: {outcome.error}"
            else:
                failure = f"test {index}: no result"
            first_failure = first_failure or failure
        return passed, first_failure

    def _result(
        self,
        body: CodeExecVerifyRequest,
        passed: int,
        status: str,
        isolation: str | None,
        error: str | None,
        reason: str | None = None,
    ) -> CodeExecVerifyResponse:
        total = len(body.tests)
        rate = passed / total
        reward = (1.0 if passed == total else 0.0) if self.config.all_or_nothing else rate
        return CodeExecVerifyResponse.of(
            body,
            reward=reward,
            num_passed=passed,
            num_tests=total,
            pass_rate=rate,
            status=status,
            isolation=isolation,
            reason=reason,
            error=error[:500] if error else None,
        )
