"""keyword_constraints: each constraint of the verifier, garbage replies, and the shipped data."""

from __future__ import annotations

from pathlib import Path

import pytest

from polygym import ServerCallError
from polygym.testing import assert_generator_reproduces, read_splits, serve_in_process, verify
from resources_servers.keyword_constraints.app import KeywordConstraints, check
from resources_servers.keyword_constraints.data.generate import HELD_WORDS, SPLITS, TRAIN_WORDS

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
LOADED = read_splits(DATA_DIR, SPLITS)
ROW = {
    "responses_create_params": {"input": 'Write one sentence that contains the word "river".'},
    "keyword": "river",
    "max_words": 6,
}


@pytest.fixture
async def env():
    async with serve_in_process(KeywordConstraints("keyword_constraints", {})) as client:
        yield client


@pytest.mark.parametrize(
    ("text", "reward"),
    [
        ("The river runs fast.", 1.0),
        ('"The River runs fast."', 1.0),  # quotes around and case do not matter
        ("  The river's bank   ", 1.0),  # a possessive is the word
        ("By the river we sat down and wept.", 0.0),  # 8 words > 6
        ("The river runs. It is cold.", 0.0),  # two sentences
        ("Sure! The river runs fast.", 0.0),  # a preamble is a sentence of its own
        ("The rivers run fast.", 0.0),  # the keyword is a whole word
        ("The well-kept river shines.", 1.0),  # a hyphenated word counts once (4 words)
        ("", 0.0),
        ("...", 0.0),
    ],
)
async def test_reward_is_one_only_when_every_constraint_holds(env, text, reward):
    assert (await verify(env, ROW, text))["reward"] == reward


async def test_the_response_says_which_constraint_failed(env):
    result = await verify(env, ROW, "A river, a lake, a sea, a bay.")
    assert result["word_count"] == 8
    assert (result["single_sentence"], result["keyword_found"], result["within_limit"]) == (True, True, False)
    assert result["keyword"] == "river"  # the row is echoed


def test_position_first_needs_the_keyword_as_first_word():
    assert check("River water is cold.", "river", "first", 8)["keyword_found"]
    assert not check("The river is cold.", "river", "first", 8)["keyword_found"]


async def test_replies_past_the_size_limit_score_zero_unread(env):
    assert (await verify(env, ROW, "river " + " " * 5_000))["reward"] == 0.0


@pytest.mark.parametrize(
    ("patch", "needle"),
    [({"keyword": ""}, "keyword"), ({"keyword": "two words"}, "keyword"), ({"max_words": 0}, "max_words"),
     ({"position": "last"}, "position")],
)  # fmt: skip
async def test_malformed_rows_get_422_naming_the_field(env, patch, needle):
    with pytest.raises(ServerCallError) as err:
        await verify(env, {**ROW, **patch}, "The river runs.")
    assert err.value.status == 422
    assert needle in err.value.detail


@pytest.mark.parametrize("split", list(SPLITS))
async def test_example_solution_scores_one_on_every_shipped_row(env, split):
    for row in LOADED[split]:
        assert (await verify(env, row, KeywordConstraints.example_solution(row)))["reward"] == 1.0


def test_splits_have_their_sizes_pools_and_positions():
    assert {split: len(rows) for split, rows in LOADED.items()} == SPLITS
    for split in ("example", "train"):
        assert {r["keyword"] for r in LOADED[split]} <= set(TRAIN_WORDS)
        assert {r["position"] for r in LOADED[split]} == {"anywhere"}
    assert {r["keyword"] for r in LOADED["validation"] + LOADED["heldout"]} <= set(HELD_WORDS)
    assert {r["position"] for r in LOADED["heldout"]} == {"first"}
    for rows in LOADED.values():
        keys = [(r["keyword"], r["max_words"]) for r in rows]
        assert len(keys) == len(set(keys))


def test_generator_reproduces_the_shipped_files(tmp_path):
    assert_generator_reproduces(DATA_DIR, tmp_path)
