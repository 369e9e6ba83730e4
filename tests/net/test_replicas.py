"""Replica choice: a session's calls stay on the replica that set its cookie; others spread."""

from __future__ import annotations

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
