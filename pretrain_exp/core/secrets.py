"""The one redaction point: credentials never reach a log line, ``config.resolved.yaml``, ``.hydra/``, the W&B
config or the manifest.

What counts as a credential:

- in a URL: the userinfo (``https://user:token@host/...``), the query string (``?X-Amz-Signature=...``,
  ``?sig=...``, ``?token=...``) and the fragment: :func:`redact_url` keeps scheme, host, port and path only;
- the value of any environment variable whose name says it holds one (:data:`SECRET_ENV`: ``WANDB_API_KEY``,
  ``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``R2_SECRET_ACCESS_KEY``, ``*_PASSWORD``, ...)
  wherever it appears in a text, replaced by ``<redacted:NAME>``;
- AWS access key ids (``AKIA...``), Hugging Face tokens (``hf_...``) and W&B keys given as ``WANDB_API_KEY=...``
  in a text.

:func:`redact` cleans a text, :func:`redact_obj` every string of a nested dict/list, and
:func:`install_log_redaction` makes every log record of the process pass through :func:`redact` (a log record
factory, so it holds for every logger and every handler, Hydra's and third-party ones included, whatever
configures the handlers later).
"""

from __future__ import annotations

import logging
import os
import re
import urllib.parse
from typing import Any, Dict

#: environment variable names whose values are credentials (matched case-insensitively, as a search)
SECRET_ENV = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|PRIVATE_?KEY|ACCESS_?KEY|SESSION_KEY|"
                        r"SIGNATURE|AUTH)", re.IGNORECASE)
#: environment values shorter than this are not searched for (``AUTH=1`` is no credential)
MIN_SECRET_LEN = 8
#: credential-carrying parts of URLs: a URL with userinfo, a query string or a fragment
_URL = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.\-]{1,15})://([^\s'\"<>`]+)")
_TOKEN_SHAPES = (
    (re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"), "<redacted:aws-access-key-id>"),
    (re.compile(r"\bhf_[A-Za-z0-9]{30,}\b"), "<redacted:hf-token>"),
    (re.compile(r"(WANDB_API_KEY\s*[=:]\s*)['\"]?[A-Za-z0-9_\-]{20,}['\"]?"), r"\1<redacted>"),
)
REDACTED = "<redacted>"


def redact_url(url: str) -> str:
    """``url`` without userinfo (``user:secret@``), query string and fragment, for messages, logs and files; a
    string without ``://`` is returned as is."""
    if "://" not in url:
        return url
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        if parts.port:
            host = f"{host}:{parts.port}"
    except ValueError:  # a malformed port or IPv6 literal: drop everything after the scheme but the path
        scheme, _, rest = url.partition("://")
        rest = rest.split("?")[0].split("#")[0]
        return f"{scheme}://{rest.rpartition('@')[2]}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def secret_env_values(environ=None) -> Dict[str, str]:
    """``{value: NAME}`` of the environment variables that hold credentials (:data:`SECRET_ENV`), longest
    values first."""
    environ = os.environ if environ is None else environ
    found = {v: k for k, v in environ.items() if SECRET_ENV.search(k) and len(v) >= MIN_SECRET_LEN}
    return dict(sorted(found.items(), key=lambda kv: -len(kv[0])))


def _url_sub(m: re.Match) -> str:
    url = m.group(0)
    tail = ""
    while url and url[-1] in ".,;:)]}":  # sentence punctuation after a URL is not part of it
        tail, url = url[-1] + tail, url[:-1]
    return redact_url(url) + tail


def redact(text: str) -> str:
    """``text`` with every credential (module docstring) removed or replaced."""
    if not isinstance(text, str) or not text:
        return text
    for value, name in secret_env_values().items():
        if value in text:
            text = text.replace(value, f"<redacted:{name}>")
    if "://" in text:
        text = _URL.sub(_url_sub, text)
    for pattern, repl in _TOKEN_SHAPES:
        text = pattern.sub(repl, text)
    return text


def redact_obj(obj: Any) -> Any:
    """A copy of ``obj`` (nested dicts, lists, tuples) with :func:`redact` applied to every string (keys too)."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {redact_obj(k): redact_obj(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact_obj(v) for v in obj)
    return obj


_INSTALLED = "_pretrain_exp_redacting"


def install_log_redaction() -> None:
    """Make every log record of this process carry a redacted message (and traceback text): wraps the logging
    record factory once (idempotent), so it applies to every logger and handler."""
    old = logging.getLogRecordFactory()
    if getattr(old, _INSTALLED, False):
        return

    def factory(*args, **kwargs) -> logging.LogRecord:
        record = old(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: leave it to the handler to report
            return record
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, ()
        if record.exc_info and record.exc_info[0] is not None:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return record

    setattr(factory, _INSTALLED, True)
    logging.setLogRecordFactory(factory)
