"""Log set-up for the commands: plain lines for people, JSON lines (`--log-json`) for log shippers; and what
every process of ours (the Celery workers too) does to its logging to keep secrets out of it."""
from __future__ import annotations

import json
import logging
import re
import sys
import threading
import warnings
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Iterator, Mapping

import click

from connectors.redaction import ScrubbingFilter

_NOISY = ("botocore", "boto3", "s3transfer", "urllib3")
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}
# C0 and C1 controls and DEL (a newline forging a log line, ESC starting a terminal sequence), line and paragraph
# separators, bidirectional overrides and isolates (text shown in another order than it is), lone surrogates
# (a name's bytes that are not UTF-8, as os.fsdecode holds them)
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_ONCE = "Unverified HTTPS request"  # urllib3's InsecureRequestWarning, whose message names the host
_warned: set[str] = set()
_warned_lock = threading.Lock()


def printable(text: str) -> str:
    """`text` from a source (an object or item id, a file name, a reason quoting one) as it may reach a terminal,
    a plain-text log or cron's mail: on one line, each control character escaped as Python writes it (\\n,
    \\x1b), a byte that is not UTF-8 as \\xNN. --log-json needs none of it: JSON escapes them."""
    return _UNPRINTABLE.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    char = match[0]
    if "\udc80" <= char <= "\udcff":  # a byte os.fsdecode could not decode
        return f"\\x{ord(char) - 0xdc00:02x}"
    return char.encode("unicode_escape").decode("ascii")


class PlainFormatter(logging.Formatter):
    """`LEVEL message`, the values put in the message (`log.warning("... %s", object_id)`) printable: an id holding
    a newline and a terminal's escape sequences forged log lines (a run that never happened). The message's own
    text keeps its line breaks (a configuration error's lines). The record itself, which other handlers may
    write, is left as it is."""

    def __init__(self) -> None:
        super().__init__("%(levelname)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        shown = logging.makeLogRecord(record.__dict__)
        if isinstance(record.args, Mapping):
            shown.args = {key: _printable_value(value) for key, value in record.args.items()}
        elif record.args:
            shown.args = tuple(_printable_value(value) for value in record.args)
        return super().format(shown)


def _printable_value(value: object) -> object:
    """A value as it is when its text is printable (so %d or %r still format it), else its text escaped."""
    text = str(value)
    clean = printable(text)
    return value if clean == text else clean


class JsonFormatter(logging.Formatter):
    """One JSON object per line; `extra=` fields become keys (never put a secret in them)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(),
                 "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage()}
        entry.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")})
        if record.exc_info:
            entry["exception"] = record.exc_text or self.formatException(record.exc_info)  # ScrubbingFilter scrubbed it
        return json.dumps(entry, default=str)


def configure(json_lines: bool, verbose: int) -> None:
    """The process's logging for a command: what kept() puts back."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else PlainFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose > 1 else logging.INFO if verbose or json_lines else logging.WARNING)
    guard(root)
    warnings.showwarning = _log_warning


@contextmanager
def kept() -> Iterator[None]:
    """Everything configure() changes put back as it was when the block ends: the root logger's handlers and level,
    the levels guard() gives the AWS and HTTP libraries' loggers (a host's own choice for them stood lowered to
    WARNING), Python's warning hook. For a command run in a host's process (gcis_etl.migration.run_script)."""
    root = logging.getLogger()
    handlers, level, showwarning = list(root.handlers), root.level, warnings.showwarning
    levels = {name: logging.getLogger(name).level for name in _NOISY}
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, noisy in levels.items():
            logging.getLogger(name).setLevel(noisy)
        warnings.showwarning = showwarning


def _log_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int, file=None,
                 line=None) -> None:
    """A Python warning (a library's InsecureRequestWarning, DeprecationWarning...) as one log line: printed as
    `warnings` prints it, two raw lines on stderr, it broke --log-json and made cron mail every run.

    urllib3 shows its InsecureRequestWarning on every request ("always"); the operator chose verify_tls: false,
    so once per host (its message names the host) says it. Not by a "once" filter: `warnings` forgets what it
    showed whenever its filters change, which any `warnings.catch_warnings()` does (botocore, the imaging
    libraries, mid-run), and two threads could both pass its check."""
    text = str(message)
    if text.startswith(_ONCE):
        with _warned_lock:
            if text in _warned:
                return
            _warned.add(text)
    logging.getLogger("py.warnings").warning("%s: %s", category.__name__, text, extra={"warning": category.__name__})


def guard(logger: logging.Logger, **_: object) -> None:
    """Whatever the level (-vv, a Celery worker's --loglevel DEBUG): the AWS and HTTP libraries log at WARNING
    and above only (botocore's DEBUG lines carry each request's headers, the Authorization header's
    Credential= and X-Amz-Security-Token among them; urllib3's, query strings), and every line `logger`'s
    handlers write is scrubbed of registered secrets. Also a Celery after_setup_logger handler."""
    for noisy in _NOISY:
        logging.getLogger(noisy).setLevel(logging.WARNING)
    for handler in logger.handlers:
        if not any(isinstance(f, ScrubbingFilter) for f in handler.filters):
            handler.addFilter(ScrubbingFilter())


def say(message: str, level: int = logging.ERROR, **fields: object) -> None:
    """A message for whoever runs the command (run stopped, lock held, configuration error): under --log-json a
    JSON log line like every other, as a log shipper reads nothing else; otherwise the plain text, whatever the
    log level (the JSON message leaves out the blank line padding a terminal's ^C). The plain text is printable
    line by line: an error may quote what a source sent (an id, a server's error page) and its escape
    sequences must not reach the terminal."""
    if any(isinstance(handler.formatter, JsonFormatter) for handler in logging.getLogger().handlers):
        logging.getLogger("gcis_etl.cli").log(level, message.strip(), extra=fields)
    else:
        click.echo("\n".join(printable(line) for line in message.split("\n")), err=True)
