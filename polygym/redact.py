"""Keeping secrets out of everything polygym prints or serves.

A secret reaches polygym three ways: as a config value under a secret-looking key
(``policy_api_key``, ``wandb_key``, ``credentials: {...}``), embedded in text (a URL's
``user:pass@`` or ``?api_key=`` part, an ``Authorization: Bearer`` header), and as a command-line
option (``--model-api-key sk-...``) that a "resume with:" hint would echo back. Each has one function
here, and every place that shows config, URLs or command lines goes through them, so a new name for
a secret is taught once.

Key names are matched by *word* (``snake_case``, ``kebab-case``, ``camelCase`` all split), because
substring matching either misses (``openai_key``) or over-masks (``max_tokens``, ``tokenizer``,
``author``). Over-masking a harmless string is cheap; leaking a key is not, so the word lists lean
wide.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

MASK = "****"

# A name whose every word is checked: any of these anywhere makes the name secret.
_SECRET_WORDS = frozenset(
    {
        "apikey",
        "auth",
        "authorization",
        "bearer",
        "cookie",
        "credential",
        "credentials",
        "passphrase",
        "passwd",
        "password",
        "pwd",
        "secret",
        "secrets",
    }
)
# Words that make a name secret only as its last word: ``wandb_key``, ``hf_token``, ``private_key``,
# but not ``key_path``, ``token_ids`` or ``max_tokens``.
_SECRET_LAST_WORDS = frozenset({"key", "token", "pat", "dsn"})
# Joined forms of two-word names users write without separators (``apiKey`` splits, ``apikey`` doesn't).
_SECRET_JOINED = ("apikey", "accesskey", "secretkey", "privatekey", "authtoken", "accesstoken")

_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_URL_USERINFO = re.compile(
    r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^/\s:@]*):(?P<password>[^/\s@]+)@"
)
_QUERY_PARAM = re.compile(r"(?P<sep>[?&;])(?P<name>[^=&;#\s]+)=(?P<value>[^&;#\s]*)")
_BEARER = re.compile(
    r"(?P<scheme>\b(?:Bearer|Basic|Token)\s+)(?P<value>[A-Za-z0-9._~+/=-]{4,})", re.IGNORECASE
)
_KEY_LIKE = re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_-]{12,}|\bsk-ant-[A-Za-z0-9_-]{12,}|\bhf_[A-Za-z0-9]{20,}")


def is_secret_key(key: Any) -> bool:
    """Whether a config key, query parameter or option name names a secret."""
    name = str(key)
    words = [word.lower() for word in _WORD.findall(name)]
    if not words:
        return False
    flat = "".join(words)
    if any(joined in flat for joined in _SECRET_JOINED):
        return True
    if any(word in _SECRET_WORDS for word in words):
        return True
    return words[-1] in _SECRET_LAST_WORDS or words[-1].endswith("token")


def mask_secrets(data: Any) -> Any:
    """A copy of plain data with every secret masked: strings under secret keys, and secrets inside text.

    Only strings under a secret key are replaced, because a secret is text and masking numbers would
    hide ``max_tokens: 256``; everything beneath a secret key is masked too (``secrets: {db: ...}``).
    Every other string goes through :func:`redact_text`, so a ``base_url`` with a password shows
    without it.
    """
    return _mask(data, False)


def _mask(data: Any, secret: bool) -> Any:
    if isinstance(data, Mapping):
        return {key: _mask(value, secret or is_secret_key(key)) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [_mask(item, secret) for item in data]
    if isinstance(data, str) and data:
        return MASK if secret else redact_text(data)
    return data


def redact_text(text: str) -> str:
    """``text`` with URL passwords, secret query parameters, bearer tokens and API-key-shaped words masked."""
    text = _URL_USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
    text = _QUERY_PARAM.sub(_mask_query_param, text)
    text = _BEARER.sub(lambda m: f"{m['scheme']}{MASK}", text)
    return _KEY_LIKE.sub(MASK, text)


def _mask_query_param(match: re.Match[str]) -> str:
    if not is_secret_key(match["name"]) or not match["value"]:
        return match[0]
    return f"{match['sep']}{match['name']}={MASK}"


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line safe to print: the value of every secret-looking option masked.

    Handles ``--api-key VALUE``, ``--api-key=VALUE`` and Hydra-style ``++policy_api_key=VALUE``
    overrides; every other word still goes through :func:`redact_text` (a URL with a password).
    """
    shown: list[str] = []
    mask_next = False
    for word in argv:
        if mask_next:
            shown.append(MASK)
            mask_next = False
            continue
        name, eq, value = word.partition("=")
        option = name.lstrip("-+~")
        if eq and option and is_secret_key(option.rsplit(".", 1)[-1]):
            shown.append(f"{name}={MASK}" if value else word)
        elif not eq and word.startswith("-") and option and is_secret_key(option):
            shown.append(word)
            mask_next = True
        else:
            shown.append(redact_text(word))
    return shown
