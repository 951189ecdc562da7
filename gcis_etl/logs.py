"""Log set-up for the commands: plain lines for people, JSON lines (`--log-json`) for log shippers; and what
every process of ours (the Celery workers too) does to its logging to keep secrets out of it."""
from __future__ import annotations

import json
import logging
import sys
import warnings
from datetime import datetime, timezone

import click

from connectors.redaction import ScrubbingFilter

_NOISY = ("botocore", "boto3", "s3transfer", "urllib3")
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


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
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter("%(levelname)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose > 1 else logging.INFO if verbose or json_lines else logging.WARNING)
    guard(root)
    # urllib3 shows its InsecureRequestWarning on every request ("always"); the operator chose verify_tls: false,
    # so once per host (its message names the host) says it
    warnings.filterwarnings("once", message="Unverified HTTPS request")
    warnings.showwarning = _log_warning


def _log_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int, file=None,
                 line=None) -> None:
    """A Python warning (a library's InsecureRequestWarning, DeprecationWarning...) as one log line: printed as
    `warnings` prints it, two raw lines on stderr, it broke --log-json and made cron mail every run."""
    logging.getLogger("py.warnings").warning("%s: %s", category.__name__, message,
                                             extra={"warning": category.__name__})


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
    log level (the JSON message leaves out the blank line padding a terminal's ^C)."""
    if any(isinstance(handler.formatter, JsonFormatter) for handler in logging.getLogger().handlers):
        logging.getLogger("gcis_etl.cli").log(level, message.strip(), extra=fields)
    else:
        click.echo(message, err=True)
