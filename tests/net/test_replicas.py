"""Replica choice: a session's calls stay on the replica that set its cookie; others spread."""

from __future__ import annotations

import pytest

from polygym.net import replicas as replicas_module
from polygym.net.replicas import Replicas

URLS = ["http://a", "http://b", "http://c"]


def test_calls_go_to_the_replica_with_fewest_in_flight() -> None:
    replicas = Replicas()
    replicas.set("env", URLS)
    with replicas.outstanding("http://a"), replicas.outstanding("http://b"):
        assert replicas.pick("env", None) == "http://c"
        with replicas.outstanding("http://c"), replicas.outstanding("http://c"):
            assert replicas.pick("env", None) == "http://a"
    assert [replicas.in_flight(u) for u in URLS] == [0, 0, 0]


def test_a_session_cookie_sticks_to_the_replica_that_set_it() -> None:
    replicas = Replicas()
    replicas.set("env", URLS)
    replicas.remember("http://b", {"polygym_session": "s1"})
    with replicas.outstanding("http://b"):
        assert replicas.pick("env", {"polygym_session": "s1"}) == "http://b"
    assert replicas.pick("env", {"polygym_session": "unknown"}) == "http://a"


def test_an_affinity_to_a_replica_that_left_is_not_used() -> None:
    replicas = Replicas()
    replicas.set("env", URLS)
    replicas.remember("http://c", {"sid": "s1"})
    replicas.set("env", ["http://a", "http://b"])  # c died; the head no longer lists it
    assert replicas.pick("env", {"sid": "s1"}) == "http://a"


def test_affinities_are_bounded_oldest_first() -> None:
    replicas = Replicas(max_affinities=2)
    replicas.set("env", URLS)
    for i, url in enumerate(URLS):
        replicas.remember(url, {"sid": f"s{i}"})
    assert replicas.pick("env", {"sid": "s0"}) == "http://a"  # forgotten: least outstanding
    assert replicas.pick("env", {"sid": "s2"}) == "http://c"


def test_a_replica_that_refused_is_passed_over_while_another_is_left() -> None:
    replicas = Replicas()
    replicas.set("env", ["http://a", "http://b"])
    replicas.refused("http://a")  # dead, the head still lists it: nothing in flight there
    with replicas.outstanding("http://b"), replicas.outstanding("http://b"):
        assert replicas.pick("env", None) == "http://b"
    replicas.set("env", ["http://a", "http://b"])  # listed again by the head: still passed over
    assert replicas.pick("env", None) == "http://b"
    replicas.refused("http://b")
    assert replicas.pick("env", None) == "http://a"  # every one refused: the call says so itself


def test_a_refusal_mark_ends_when_the_head_drops_the_replica_or_after_its_hold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr(replicas_module.time, "monotonic", lambda: now[0])
    replicas = Replicas()
    replicas.set("env", ["http://a", "http://b"])
    replicas.refused("http://a")
    assert not replicas.look_again("env")  # the head was just asked
    now[0] += replicas_module.LOOKUP_AGAIN_S + 0.1
    assert replicas.look_again("env")
    replicas.set("env", ["http://b", "http://a2"])  # restarted at a new address
    assert not replicas.look_again("env") and replicas.pick("env", None) == "http://b"
    replicas.set("env", ["http://a", "http://b"])  # an address used again starts unmarked
    assert replicas.pick("env", None) == "http://a"
    replicas.refused("http://a")
    now[0] += replicas_module.REFUSED_HOLD_S + 1
    assert replicas.pick("env", None) == "http://a" and not replicas.look_again("env")


def test_a_replica_that_answers_again_is_no_longer_passed_over() -> None:
    replicas = Replicas()
    replicas.set("env", ["http://a", "http://b"])
    replicas.refused("http://a")
    replicas.remember("http://a", {})
    assert replicas.pick("env", None) == "http://a" and not replicas.look_again("env")
    replicas.set("solo", ["http://s"])
    replicas.refused("http://s")
    assert replicas.look_again("solo")  # nothing else to pick: ask the head at once
