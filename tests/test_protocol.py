"""VerifyResponse.of: the request echoed back with a verdict, dumped as the request was written."""

from __future__ import annotations

from typing import Any

from polygym.protocol import OpenModel, Response, VerifyRequest, VerifyResponse, message_item, new_response

ROW: dict[str, Any] = {
    "responses_create_params": {"input": "2+2?", "temperature": 0.5},
    "expected": "4",
    "reward": 0.0,  # an earlier verdict, as a reverified row carries
    "response": new_response([message_item("4")], "m", {"input_tokens": 3}),
}


def test_of_echoes_the_request_with_the_new_verdict() -> None:
    request = VerifyRequest.model_validate(ROW)
    echoed = VerifyResponse.of(request, reward=1.0, correct=True)
    assert echoed.model_dump(mode="json") == {
        **request.model_dump(mode="json"),
        "reward": 1.0,
        "correct": True,
    }
    assert "model" not in echoed.model_dump()["responses_create_params"]  # unset fields stay out


class LabelledResponse(OpenModel):
    """Another model in the place of the Response, as a subclass may declare."""

    output: list[dict[str, Any]]
    label: str = "relabelled"


class LabelledVerdict(VerifyResponse):
    response: LabelledResponse  # type: ignore[assignment]


def test_a_subclass_that_declares_another_model_reads_it_from_the_dump() -> None:
    request = VerifyRequest.model_validate(ROW)
    echoed = LabelledVerdict.of(request, reward=1.0)
    assert isinstance(request.response, Response) and isinstance(echoed.response, LabelledResponse)
    assert echoed.response.output == request.response.output and echoed.reward == 1.0
