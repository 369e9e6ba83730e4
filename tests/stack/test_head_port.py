"""The head's default port: NeMo Gym's 11000 when free, any free port when another stack holds it.

The end-to-end tests start every stack on port 0 (tests/conftest.py), so this fallback is held here.
"""

from __future__ import annotations

import contextlib
import socket
from types import SimpleNamespace

import pytest

from polygym.net.listen import PortInUseError, bind_socket
from polygym.stack.backend import LaunchError
from polygym.stack.launcher import DEFAULT_HEAD_PORT, Stack


def bind_head(port: int | None) -> socket.socket:
    return Stack._bind_head(SimpleNamespace(head_host="127.0.0.1", head_port=port))  # type: ignore[arg-type]


def test_a_taken_default_port_falls_back_to_any_free_one() -> None:
    with contextlib.ExitStack() as held:
        with contextlib.suppress(PortInUseError):  # taken already by someone else: as good for this test
            held.callback(bind_socket("127.0.0.1", DEFAULT_HEAD_PORT).close)
        head = bind_head(None)
        held.callback(head.close)
        assert head.getsockname()[1] not in (0, DEFAULT_HEAD_PORT)


def test_a_taken_port_the_user_named_is_an_error_naming_it() -> None:
    with contextlib.closing(bind_socket("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(LaunchError, match=f"port {port}.*--head-port"):
            bind_head(port)
