"""Token capture's fields written, stripped and read back by the one module that names them."""

from __future__ import annotations

import pytest

from polygym.token_fields import (
    CALL_TOKEN_FIELDS,
    LOGPROB_SEMANTICS_FIELD,
    POLICY_VERSION_FIELD,
    PROMPT_CONTINUATION_FIELD,
    attach_token_fields,
    carries_tokens,
    logprob_semantics,
    read_ids,
    read_log_probs,
    read_stamp,
    strip_token_fields,
)


def test_what_a_server_attaches_a_trainer_reads_back_and_an_upstream_never_sees() -> None:
    output = [{"type": "reasoning"}, {"type": "message", "role": "assistant", "content": []}]
    semantics = logprob_semantics("vllm", 1.0, "raw")
    attach_token_fields(output, (1, 2), [3], [-0.5], semantics, {"exact": True}, policy_version=4)
    item = output[-1]
    assert not carries_tokens(output[0]) and carries_tokens(item)
    assert read_ids(item) == ([1, 2], [3]) and read_log_probs(item) == [-0.5]
    assert read_stamp(item, LOGPROB_SEMANTICS_FIELD) == semantics
    assert read_stamp(item, PROMPT_CONTINUATION_FIELD) == {"exact": True}
    assert item[POLICY_VERSION_FIELD] == 4
    assert not any(key in part for part in strip_token_fields(output) for key in CALL_TOKEN_FIELDS)


def test_a_stamp_that_is_not_an_object_reads_as_absent_and_bad_ids_raise() -> None:
    item = {"generation_token_ids": ["x"], PROMPT_CONTINUATION_FIELD: "exact"}
    assert read_stamp(item, PROMPT_CONTINUATION_FIELD) is None
    with pytest.raises(ValueError):
        read_ids(item)
