"""Keep secrets inside their connection: one function that blanks credentials out of any text.

Every place text leaves the agent (an exception message, ``gpu_cost_runs.problems``, an XCom value,
a log record, a notice, the health alert, the weekly report) passes it through :func:`redact`,
which replaces with ``***``:

- the password of a URL's user info: ``https://user:pass@host`` → ``https://user:***@host``, whatever
  it holds (quotes, ``!$&'()*+,;=:``, percent-encoded bytes, an unquoted ``@``);
- credential query parameters: ``?password=``, ``token=``, ``apikey=``/``api_key=``, ``secret=``,
  ``access_token=``, ``signature=`` and their kin → ``?password=***``;
- the secret path of a Slack webhook: ``hooks.slack.com/services/T…/B…/…`` → ``hooks.slack.com/services/***``;
- Slack tokens (``xoxb-…``), JWTs (``eyJ….….…``, what ``scontrol token`` prints), the value of
  slurmrestd's ``X-SLURM-USER-TOKEN`` header (and of ``SLURM_JWT=``), ``Authorization:`` values and
  other ``Bearer``/``Basic`` credentials.

:func:`connection_secrets` lists what one Airflow connection holds that is secret (password, a
URL-valued host, token-like extras, Apprise URLs), and :func:`scrub` blanks those first, then redacts:
the delivery channels pass every error and answer through it.

:func:`install` makes the package's log records pass through it too (see there why not a plain
logger filter).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

#: the package whose log records are redacted
PACKAGE = "gpu_cost"
MASK = "***"

# scheme://user:password@ — the password is everything up to the last "@" before the host: any
# character userinfo allows (quotes and sub-delims included), an unquoted "@", anything but what
# ends an authority ("/?#", whitespace) or cannot be in a URL ('"<>'). A quote after the host
# (url='…') ends nothing here: the password is blanked whole, never cut at a quote it holds.
_USERINFO = re.compile(r"(?P<head>\b[a-z][a-z0-9+.\-]*://[^\s:/?#@\"<>]*):(?P<pw>[^\s/?#\"<>]*)@", re.I)
_QUERY = re.compile(
    r"(?P<head>[?&;](?:[a-z0-9_.\-]*[_.\-])?(?:password|passwd|pwd|token|api[_\-]?key|apikey|secret|signature"
    r"|sig|key|auth)=)(?P<value>[^&#\s'\"<>]+)", re.I)
_SLACK_HOOK = re.compile(r"(?P<head>hooks\.slack(?:-gov)?\.com/(?:services|workflows|triggers)/)[^\s'\"<>)]+", re.I)
_SLACK_TOKEN = re.compile(r"\bxox[abposr]-[A-Za-z0-9-]+")
# a JWT: base64url header (always '{"' → "eyJ"), payload and signature (empty for alg "none")
_JWT = re.compile(r"(?<![A-Za-z0-9_\-])eyJ[A-Za-z0-9_\-]{4,}\.[A-Za-z0-9_\-]{2,}\.[A-Za-z0-9_\-]*")
# a header or variable that is a credential whatever its value looks like: "Name: v", "'Name': 'v'", "NAME=v"
_CRED_HEADER = re.compile(r"(?P<head>\b(?:X-SLURM-USER-TOKEN|SLURM_JWT|Authorization)['\"]?\s*[:=]\s*['\"]?"
                          r"(?:(?:Bearer|Basic|Token|Digest)\s+)?)(?P<value>[^\s'\",;}\]]+)", re.I)
# a bearer token elsewhere has a digit or punctuation in it: "Bearer authentication" stays readable
_BEARER = re.compile(r"(?P<head>\bBearer\s+)(?=[A-Za-z0-9._~+/=\-]*[0-9._~+/=\-])[A-Za-z0-9._~+/=\-]{8,}")


def redact(text: Any) -> str:
    """Return ``text`` (made a string) with every credential it carries replaced by ``***``."""
    s = str(text)
    if not s:
        return s
    s = _USERINFO.sub(lambda m: f"{m['head']}:{MASK}@" if m["pw"] else m[0], s)
    s = _QUERY.sub(lambda m: f"{m['head']}{MASK}", s)
    s = _SLACK_HOOK.sub(lambda m: f"{m['head']}{MASK}", s)
    s = _SLACK_TOKEN.sub("xox*-" + MASK, s)
    s = _JWT.sub(MASK, s)
    s = _CRED_HEADER.sub(lambda m: f"{m['head']}{MASK}", s)
    return _BEARER.sub(lambda m: f"{m['head']}{MASK}", s)


def redact_all(texts: Iterable[Any]) -> list[str]:
    """Return every text of ``texts`` redacted (problems lists, error lists)."""
    return [redact(t) for t in texts]


def connection_secrets(conn: Any) -> list[str]:
    """Return the secret values a connection holds: what :func:`scrub` must blank in any text about it.

    The password, a host that is a whole URL (a webhook), the secret path of a URL-valued password,
    extras named like a token/secret/password/key, and every Apprise URL (``extra.config``: its
    ``path`` values, whose tokens sit in the URL's host and path) with its parts.
    """
    from urllib.parse import urlsplit

    out = []
    host = getattr(conn, "host", None)
    for value in (getattr(conn, "password", None), host if "://" in str(host or "") else None):
        if value and len(str(value)) >= 4:
            out.append(str(value))
    password = str(getattr(conn, "password", "") or "")
    if "://" in password:
        path = urlsplit(password).path
        out += [p for p in (path, path.rsplit("/", 1)[-1]) if len(p) >= 6]
    extra = getattr(conn, "extra_dejson", {}) or {}
    for k, v in extra.items():
        if isinstance(v, str) and len(v) >= 4 and re.search(r"token|secret|password|key|authorization", k, re.I):
            out.append(v)
    for url in _apprise_urls(extra.get("config")):
        parts = urlsplit(url)
        out.append(url)
        out += [p for p in (parts.netloc, parts.path, *parts.path.split("/"), parts.query) if len(p) >= 6]
    return out


def _apprise_urls(config: Any) -> list[str]:
    import json

    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError:
            return [config] if "://" in config else []
    items = config if isinstance(config, list) else [config]
    return [str(i["path"]) for i in items if isinstance(i, dict) and i.get("path")]


def scrub(text: str, secrets: Iterable[str]) -> str:
    """Return ``text`` with each of ``secrets`` (longest first) and any other credential blanked."""
    for s in sorted(secrets, key=len, reverse=True):
        text = text.replace(s, MASK)
    # anything that still looks like a credential: URL passwords, webhook paths, tokens
    return redact(text)


class RedactFilter(logging.Filter):
    """Redact a log record's message, arguments and traceback in place; never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        redact_record(record)
        return True


def redact_record(record: logging.LogRecord) -> logging.LogRecord:
    """Redact ``record`` in place (its formatted message, then its traceback) and return it."""
    try:
        message = record.getMessage()
    except (TypeError, ValueError):  # a malformed %-format: leave it to the handler to report
        return record
    clean = redact(message)
    if clean != message:
        record.msg, record.args = clean, ()
    if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
        text = logging.Formatter().formatException(record.exc_info)
        clean = redact(text)
        if clean != text:
            record.exc_text = clean  # formatters print exc_text when it is set
    if record.stack_info:
        record.stack_info = redact(record.stack_info)
    return record


_FILTER = RedactFilter()
_installed = False


def install() -> None:
    """Redact every log record of the ``gpu_cost`` loggers (idempotent).

    A filter on the ``gpu_cost`` logger alone would miss ``gpu_cost.perceive.prometheus``'s records:
    Python runs only the emitting logger's filters, not its ancestors', on a propagated record. So
    the filter goes on the package logger *and* the record factory passes the package's records
    through it, whatever logger of the package made them and whatever handler prints them.
    """
    global _installed
    if _installed:
        return
    logging.getLogger(PACKAGE).addFilter(_FILTER)
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        name = record.name if isinstance(record.name, str) else ""  # structlog makes records without a name
        if name == PACKAGE or name.startswith(PACKAGE + "."):
            redact_record(record)
        return record

    logging.setLogRecordFactory(factory)
    _installed = True


install()

__all__ = ["MASK", "RedactFilter", "connection_secrets", "install", "redact", "redact_all", "redact_record", "scrub"]
