"""URL passwords of any character, JWTs and Slurm's token header never survive :func:`redact`."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_cost.core.redact import redact

HOST = "prom.example:9090"
# RFC 3986 userinfo: unreserved, sub-delims and ":" (plus percent-encoded bytes, drawn below); an
# unquoted "@" is what people write too, and the password runs to the last one before the host
ALLOWED = "ABCXYZabcxyz0189-._~!$&'()*+,;=:@"
password = st.lists(st.one_of(st.sampled_from(ALLOWED), st.integers(0, 255).map(lambda b: f"%{b:02X}")),
                    min_size=1, max_size=24).map("".join)
# where a Prometheus URL ends up: a problem, a config's repr, quoted in a message, a JSON document (XCom)
CONTEXTS = [
    lambda url: f"prometheus: Prometheus at {url}/api/v1/query cannot be reached",
    lambda url: f"PromConfig(url={url!r})",
    lambda url: f"url='{url}' refused",
    lambda url: json.dumps({"problems": [f"GET {url}/api/v1/query failed"]}),
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pw=password, context=st.sampled_from(range(len(CONTEXTS))), scheme=st.sampled_from(["http", "https"]))
def test_a_url_password_of_any_allowed_characters_is_removed(pw: str, context: int, scheme: str) -> None:
    url = f"{scheme}://agent:{pw}@{HOST}"
    text = CONTEXTS[context](url)
    out = redact(text)
    masked = text.replace(f"agent:{pw}@", "agent:***@")
    assert out == masked
    assert f"{scheme}://agent:***@{HOST}" in out  # the host stays visible
    if pw not in masked:  # "a" also appears in "example": only a password the rest lacks can be looked for
        assert pw not in out
    assert redact(out) == out


@pytest.mark.parametrize(("text", "expected"), [
    ("Prometheus at http://prom:Pa'ss0rd@prom.example:9090 down", "Prometheus at http://prom:***@prom.example:9090 down"),
    ("http://o'brien:s3'cr3t!$&()*+,;=:x@h:1/p", "http://o'brien:***@h:1/p"),
    ("http://agent:p%27w%40d@h/", "http://agent:***@h/"),
    ("{'url': 'https://agent:it\\'s@h:9090'}", "{'url': 'https://agent:***@h:9090'}"),
], ids=["quote", "sub-delims", "percent-encoded", "escaped-in-repr"])
def test_passwords_with_quotes_and_sub_delims(text: str, expected: str) -> None:
    assert redact(text) == expected


JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJleHAiOjE4MDAwMDAwMDAsInN1biI6ImdwdWNvc3QifQ"
       ".c2lnbmF0dXJlLW9mLXRoZS10b2tlbg")


@pytest.mark.parametrize(("text", "expected"), [
    (f"token {JWT} refused", "token *** refused"),
    (f"SLURM_JWT={JWT}", "SLURM_JWT=***"),
    ("X-SLURM-USER-TOKEN: opaque-token-value", "X-SLURM-USER-TOKEN: ***"),
    ("{'X-SLURM-USER-NAME': 'gpucost', 'X-SLURM-USER-TOKEN': 'opaque'}",
     "{'X-SLURM-USER-NAME': 'gpucost', 'X-SLURM-USER-TOKEN': '***'}"),
    ('{"x-slurm-user-token": "abc"}', '{"x-slurm-user-token": "***"}'),
    ("Authorization: Bearer lettersonly", "Authorization: Bearer ***"),
    ("{'Authorization': 'Bearer lettersonly'}", "{'Authorization': 'Bearer ***'}"),
], ids=["jwt", "slurm-jwt-env", "header", "headers-repr", "headers-json", "authorization-bearer",
        "authorization-repr"])
def test_tokens_and_token_headers_are_redacted(text: str, expected: str) -> None:
    assert redact(text) == expected
    assert redact(expected) == expected


def test_the_user_name_header_is_kept() -> None:
    assert redact("X-SLURM-USER-NAME: gpucost") == "X-SLURM-USER-NAME: gpucost"
