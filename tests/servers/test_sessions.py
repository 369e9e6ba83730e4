"""Session store: creation, release, idle expiry (state must not grow without bound)."""

import asyncio

from polygym.servers.sessions import SessionStore


def test_release_removes_state_and_counts() -> None:
    store = SessionStore()
    session = store.create()
    session.state["x"] = 1
    assert store.get(session.id) is session
    assert store.release(session.id) is True
    assert store.get(session.id) is None
    assert store.release(session.id) is False
    assert store.stats() == {"active": 0, "released": 1, "expired": 0}


def test_idle_sessions_expire_but_used_ones_stay() -> None:
    store = SessionStore(idle_timeout_s=10)
    old, fresh = store.create(), store.create()
    old.last_used -= 11
    assert store.expire_idle() == 1
    assert store.get(old.id) is None
    assert store.get(fresh.id) is fresh
    assert store.stats()["expired"] == 1


async def test_sweeper_expires_in_background() -> None:
    store = SessionStore(idle_timeout_s=0.1)
    store.create()
    store.start_sweeper()
    try:
        deadline = asyncio.get_running_loop().time() + 5
        while len(store) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        assert len(store) == 0
    finally:
        await store.stop_sweeper()


def test_end_is_idempotent_for_remembered_releases_only() -> None:
    store = SessionStore()
    session = store.create()
    assert store.release(session.id) is True
    assert store.end(session.id) is True
    assert store.end("never-existed") is False
    assert store.stats()["released"] == 1
