"""polygym.testing calls an environment the way the inline backend does."""

import contextvars
from typing import Any

from polygym.protocol import VerifyRequest, VerifyResponse
from polygym.servers.resources import ResourcesServer
from polygym.testing import serve_in_process, verify

CURRENT = contextvars.ContextVar("current", default="caller")
ROW = {"responses_create_params": {"input": "say yes"}}


class Marks(ResourcesServer):
    """Records what its verifier sees of the caller's context, then changes it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[str] = []

    async def verify(self, body: VerifyRequest) -> VerifyResponse:
        self.seen.append(CURRENT.get())
        CURRENT.set("handler")
        return VerifyResponse(**body.model_dump(), reward=1.0)


async def test_json_routes_go_through_dispatch_as_in_production() -> None:
    server = Marks("env")
    dispatched: list[str] = []
    dispatch = server.dispatch

    async def spy(method: str, path: str, body: bytes, cookies: dict[str, str]) -> Any:
        dispatched.append(path)
        return await dispatch(method, path, body, cookies)

    server.dispatch = spy  # type: ignore[method-assign]
    async with serve_in_process(server) as client:
        assert (await verify(client, ROW, "yes"))["reward"] == 1.0
    assert dispatched == ["/verify"]


async def test_a_handler_sees_the_caller_context_but_cannot_change_it() -> None:
    server = Marks("env")
    async with serve_in_process(server) as client:
        CURRENT.set("rollout 7")
        await verify(client, ROW, "yes")
    assert server.seen == ["rollout 7"] and CURRENT.get() == "rollout 7"
