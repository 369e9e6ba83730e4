"""Secret masking: config keys by word, secrets inside text, and command lines shown in hints."""

from __future__ import annotations

import pytest

from polygym.redact import MASK, is_secret_key, mask_secrets, redact_argv, redact_text


def test_masking_hides_secrets_but_not_token_counts() -> None:
    data = {
        "openai_api_key": "sk-123",
        "max_tokens": 256,
        "max_output_tokens": "512",
        "tokenizer": "Qwen/Qwen3-0.6B",
        "hf_token": "hf_abc",
        "nested": [{"clientSecret": "s"}, {"password": ""}],
        "secrets": {"db": "pw"},
    }
    masked = mask_secrets(data)
    assert masked == {
        "openai_api_key": MASK,
        "max_tokens": 256,
        "max_output_tokens": "512",
        "tokenizer": "Qwen/Qwen3-0.6B",
        "hf_token": MASK,
        "nested": [{"clientSecret": MASK}, {"password": ""}],
        "secrets": {"db": MASK},
    }
    assert data["openai_api_key"] == "sk-123"  # a copy, not in place


@pytest.mark.parametrize(
    "name",
    [
        "openai_key",
        "private_key",
        "credentials",
        "auth_header",
        "wandb_key",
        "bearer",
        "apiKey",
        "x-api-key",
        "AWS_SECRET_ACCESS_KEY",
        "github_pat",
        "accessToken",
        "model-api-key",
        "db_password",
        "sentry_dsn",
    ],
)
def test_secret_names_found_by_word(name: str) -> None:
    assert is_secret_key(name)


@pytest.mark.parametrize(
    "name",
    [
        "max_tokens",
        "max_output_tokens",
        "tokenizer",
        "author",
        "key_path",
        "token_ids",
        "num_keys",
        "keyword",
        "model",
    ],
)
def test_ordinary_names_stay_readable(name: str) -> None:
    assert not is_secret_key(name)


def test_url_passwords_and_secret_query_parameters_are_masked() -> None:
    assert redact_text("https://bob:hunter2@api.example.com/v1") == f"https://bob:{MASK}@api.example.com/v1"
    assert redact_text("http://h/x?api_key=abc&model=m") == f"http://h/x?api_key={MASK}&model=m"
    assert redact_text("http://h/x?token=abc") == f"http://h/x?token={MASK}"
    assert redact_text("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/v1"


def test_bearer_tokens_and_key_shaped_words_are_masked() -> None:
    assert "s3cr3tvalue" not in redact_text("Authorization: Bearer s3cr3tvalue")
    assert redact_text("key sk-proj-abcdefghijklmnop rest") == f"key {MASK} rest"


def test_strings_in_config_pass_through_text_redaction() -> None:
    shown = mask_secrets({"base_url": "https://u:pw@host/v1", "note": "plain"})
    assert shown == {"base_url": f"https://u:{MASK}@host/v1", "note": "plain"}


def test_command_lines_lose_secret_option_values() -> None:
    argv = [
        "eval",
        "run",
        "--model-api-key",
        "sk-live-1",
        "--api-key=sk-live-2",
        "++policy_api_key=sk-live-3",
        "+responses_create_params.temperature=0.5",
        "--model-url",
        "https://u:sk-live-4@host/v1",
        "--limit",
        "3",
    ]
    shown = redact_argv(argv)
    assert not any("sk-live" in word for word in shown), shown
    assert shown[:3] == ["eval", "run", "--model-api-key"]
    assert "+responses_create_params.temperature=0.5" in shown
    assert shown[-2:] == ["--limit", "3"]
