"""The one resilient HTTP session every HTTP connector uses.

Why our own loop rather than urllib3's Retry: the budget must span a request *and* the streaming of
its body (a truncated download is retried by fetching.py within the same limits), 401 must be able
to trigger a transparent re-login instead of a retry, some 500s are application answers (SOAP
faults) that must not be retried, and every message must be scrubbed of credentials. urllib3's Retry
does each of these partially or not at all.

Retried: connection errors, connect/read timeouts, bodies ending early or trickling in slower than the
policy's min_transfer_bytes_per_second (TransferPace, as downloads are: requests would bound a body it
reads for us by the read timeout alone, which a body trickling in never trips), and the policy's retry_statuses
(429/5xx by default) honouring Retry-After. Not retried: 401 (AuthenticationFailed, after at most one
re-login when the connector installed `on_unauthorized`), 403 (PermissionDenied), other 4xx
(SourceRequestFailed with .status). An answer read whole (anything but a download) is refused as it arrives
once it decodes to more than answer_bytes (SourceDataError): a gzip of gigabytes of zeros must not fill memory.

Redirects are followed, but a hop to another origin (scheme, host or port) carries none of the headers
a connector set (session tokens, gateway keys, Authorization, cookies): requests itself strips only
Authorization. A download redirected to a presigned S3 or CDN URL needs none of them.
"""
from __future__ import annotations

import email.utils
import html
import logging
import os
import re
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Annotated, Callable, Iterator
from urllib.parse import unquote, urlsplit, urlunsplit

import requests
import urllib3
from pydantic import AfterValidator, BeforeValidator, Field
from urllib3.exceptions import ProtocolError, ReadTimeoutError

from connectors.errors import (AuthenticationFailed, PermissionDenied, SourceDataError, SourceRequestFailed,
                               SourceUnavailable, TransferInterrupted)
from connectors.fetching import CHUNK_SIZE, Body
from connectors.redaction import credential_keys, register, scrub, scrub_url
from connectors.retry import RetryBudget, RetryPolicy, TransferPace
from gcis_etl.settings import Settings, checked_url

log = logging.getLogger(__name__)

_TRANSIENT = (requests.exceptions.ConnectionError, requests.exceptions.Timeout,
              requests.exceptions.ChunkedEncodingError, requests.exceptions.ContentDecodingError)


# What a request may still carry to another origin: nothing a connector or the cookie jar added.
_PORTABLE_HEADERS = frozenset({"user-agent", "accept", "accept-encoding", "accept-language", "connection",
                               "proxy-authorization"})  # set by requests for the new hop's own proxy
_DEFAULT_PORTS = {"http": 80, "https": 443}
# what an error body is read of: a connector's ErrorWords may need it whole (OTMM's JSON puts its debug_message, which
# may echo the whole request, before the message that says what is wrong, and only a whole body parses); the excerpt
# quoted stays 200 characters
_HINT_BYTES = 64 * 1024
ANSWER_BYTES = 256 << 20
"""The most an answer read whole (search pages, XML, JSON; not a download) may decode to: HttpSession.answer_bytes."""

ErrorWords = Callable[[str], str | None]
"""A connector's reading of its server's error body (decoded): what it says, what it means first, or None for a body
not in that server's own shape (a proxy's page in front of it), which is then read as any web server's is."""


_SWITCHES = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


def tls_switch(value: str) -> bool | None:
    """verify_tls given as a string (${VAR} fills in strings): the switch it spells, or None for a CA bundle's
    path. Validated as `bool | str`, 'false' would stay a string: a bundle named false, verification on."""
    return _SWITCHES.get(value.strip().lower())


def _tls_setting(value: object) -> object:
    """A verify_tls value as validated: a string spelling a switch becomes it, anything else stays."""
    switch = tls_switch(value) if isinstance(value, str) else None
    return value if switch is None else switch


def _tls_bundle(value: bool | str) -> bool | str:
    """A CA bundle that is not there is refused when the settings load (`config check`), not at the run's first
    request (requests raises a bare OSError for it; boto3 retries it as an outage)."""
    if isinstance(value, str) and not os.path.exists(value):
        raise ValueError(f"no CA bundle at {value}: expected true, false, or the path of a CA bundle file "
                         "(or of a c_rehash'ed directory of CA certificates)")
    return value


VerifyTls = Annotated[bool | str, BeforeValidator(_tls_setting), AfterValidator(_tls_bundle),
                      Field(description="false, true, or the path of a CA bundle")]
"""Every source's verify_tls (HTTP and S3)."""


_URL_EXPECTED = "expected an http(s) URL such as https://host[:port][/prefix]"


def _parsable(url: str) -> str:
    """Checked here rather than by a Field pattern, which ran first and answered with its regex ("String should
    match pattern '^https?://[^/?#]+'") for a URL written without its scheme or with a misspelt one."""
    if "://" not in url:
        raise ValueError(f"{_URL_EXPECTED}: the scheme is missing (http:// or https:// before the host)")
    checked_url(url, ("http", "https"), f"{_URL_EXPECTED}: the scheme is neither http:// nor https://")
    if not urlsplit(url).hostname:
        raise ValueError(f"{_URL_EXPECTED}: no host after the scheme")
    return url


BaseUrl = Annotated[str, Field(description="scheme and host[:port], optional path prefix"), AfterValidator(_parsable)]
"""A source's URL: refused at load when a password in it has an unencoded '#', '?' or '/' (which would end its
host part early), rather than failing at the first request with a message quoting the password's start."""


class HttpSourceSettings(Settings):
    """What every HTTP connector's settings share."""

    base_url: BaseUrl
    retry: RetryPolicy = RetryPolicy()
    verify_tls: VerifyTls = True
    user_agent: str = "gcis-etl"

    def credential_settings(self) -> tuple[str, ...] | None:
        """The fields the configured auth authenticates with, which a 401 names (never their values): for a model
        whose auth modes use different ones, or a plain-text one (a username, a client id). None: each Secret
        field set (connectors.redaction.credential_keys)."""
        return None


class _Session(requests.Session):
    """requests.Session whose redirects to another origin go without the credentials the first request carried."""

    def rebuild_auth(self, prepared_request: requests.PreparedRequest, response: requests.Response) -> None:
        """Called by requests for every redirect hop, after it has set the hop's URL, method, body and cookies."""
        if _origin(prepared_request.url) != _origin(response.request.url):
            if prepared_request.body is not None:
                raise SourceRequestFailed(
                    f"{response.request.method} {scrub_url(response.request.url)} was redirected to another host "
                    f"({scrub_url(prepared_request.url)}) with its request body, which may hold credentials: "
                    f"not followed; configure the URL the source redirects to")
            for name in [n for n in prepared_request.headers if n.lower() not in _PORTABLE_HEADERS]:
                del prepared_request.headers[name]
        super().rebuild_auth(prepared_request, response)


class HttpSession:
    """requests with bounded retries, timeouts, optional re-login on 401 and redacted errors.

    It takes HttpSourceSettings: a connector's settings model subclasses it (a 401 names the fields its
    credential_settings() gives, else its Secret fields set), or, where reaching a server is optional for the source,
    builds one from its own settings (HttpSourceSettings(base_url=..., retry=..., verify_tls=...)). `error_words` is
    the connector's reading of its server's error bodies (OTMM's JSON); without it, or where it reads nothing, an
    error quotes an HTML page's title or text, else the body."""

    def __init__(self, settings: HttpSourceSettings, error_words: ErrorWords | None = None):
        self.settings = settings
        self.error_words = error_words
        self.policy = settings.retry
        self.headers: dict[str, str] = {"User-Agent": settings.user_agent}
        self.auth: requests.auth.AuthBase | None = None
        self.on_unauthorized: Callable[[requests.Response], None] | None = None
        self.relogin_statuses: frozenset[int] = frozenset({401})
        self.answer_bytes = ANSWER_BYTES
        self._clients: dict[bool, requests.Session] = {}
        self._pid = 0
        self._userinfo: dict[tuple[str, str | None, int | None], requests.auth.HTTPBasicAuth] = {}
        self.base_url = self.credential_free(settings.base_url).rstrip("/")
        # what a 401 names to fix: the keys (never the values) of the settings the session authenticates with
        self.credentials = (credential_keys(settings, settings.credential_settings())
                            + (("source.base_url's user-info",) if self._userinfo else ()))

    def url(self, path: str) -> str:
        return self.base_url + "/" + path.lstrip("/")

    def on_source(self, url: str) -> bool:
        """Whether `url` is on the source's own origin (scheme, host and port of base_url)."""
        return _origin(url) == _origin(self.base_url)

    def credential_free(self, url: str) -> str:
        """`url` without its user-info, which this session sends instead (Basic) with every request to that
        origin: what a connector makes its addresses from, a SourceItem.locator above all, since a locator
        travels in Celery task messages (broker, `celery inspect`, task events, worker logs). A worker opening
        the same source from the same settings learns the same user-info when its connector calls this."""
        parts = urlsplit(url)
        if "@" not in parts.netloc:
            return url
        if parts.username or parts.password:
            password = unquote(parts.password or "")
            register(password)
            self._userinfo[_origin(url)] = requests.auth.HTTPBasicAuth(unquote(parts.username or ""), password)
        return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, parts.query, parts.fragment))

    def _client(self, credentials: bool) -> requests.Session:
        """One requests.Session per process (pooled sockets must not be shared across a fork), and another for
        requests sent without credentials: its cookie jar holds none of the source's (a cookie is not scoped to a
        port, so another service on the source's host would be sent the source's session cookie)."""
        if self._pid != os.getpid():
            self._clients, self._pid = {}, os.getpid()
        if credentials not in self._clients:
            self._clients[credentials] = _Session()
        return self._clients[credentials]

    def describe(self, method: str, url: str, params: dict | None = None) -> str:
        prepared = requests.PreparedRequest()
        try:
            prepared.prepare_url(url, params)
        except requests.exceptions.InvalidURL:  # its message quotes the URL, password included
            raise SourceRequestFailed(f"{method} {scrub(url)}: not a valid URL (percent-encode the "
                                      f"reserved characters of a user name or password)") from None
        return f"{method} {scrub_url(prepared.url)}"

    def request(self, method: str, url: str, *, params: dict | None = None, budget: RetryBudget | None = None,
                accept_error: Callable[[requests.Response], bool] | None = None, relogin: bool = True,
                stream: bool = False, headers: dict[str, str] | None = None, label: str | None = None,
                credentials: bool = True, **kwargs) -> requests.Response:
        """Send a request, retrying transient failures within `budget` (a fresh one per call by default).

        `accept_error(response)` lets the caller take an error response as its answer (a SOAP fault). `label`
        names what is asked where the URL does not (a SOAP call's object), in every message and retry line.
        `credentials=False` sends none of the connector's headers or user-info (a URL on another host).

        verify= goes with each request: requests lets REQUESTS_CA_BUNDLE/CURL_CA_BUNDLE override a session's
        verify (requests#3829), and verify_tls: false or a bundle of its own must win over the environment.
        A 401/403 from a host that had none of the source's credentials (one a redirect led to, an expired
        presigned URL; or a URL on another host, asked without them) is no verdict on the configured user: no
        re-login; a redirect is asked for once more, fresh, before it fails.
        """
        counted = budget is not None  # a caller's budget has already counted this first attempt
        budget = budget or RetryBudget(self.policy)
        what = f"{label}: {self.describe(method, url, params)}" if label else self.describe(method, url, params)
        timeout = (self.policy.connect_timeout_seconds, self.policy.read_timeout_seconds)
        relogged = reasked = False
        # the URL's own user-info goes to its own host whatever `credentials` (it is that host's, not the source's)
        auth = (self.auth if credentials else None) or self._userinfo.get(_origin(url))
        while True:
            if not counted:
                budget.start_attempt()
            counted = False
            sent_headers = {**self.headers, **(headers or {})}  # a re-login changes self.headers
            if not credentials:
                sent_headers = {k: v for k, v in sent_headers.items() if k.lower() in _PORTABLE_HEADERS}
            try:
                response = self._client(credentials).request(
                    method, url, params=params, headers=sent_headers, auth=auth, timeout=timeout, stream=True,
                    verify=self.settings.verify_tls, **kwargs)
            except requests.exceptions.SSLError as exc:
                raise SourceRequestFailed(f"{what}: TLS failure ({_root_cause(exc)})") from None
            except _TRANSIENT as exc:
                budget.after_failure(f"{what}: {self._explain(exc)}")
                continue
            except requests.exceptions.RequestException as exc:
                raise SourceRequestFailed(f"{what}: {type(exc).__name__}") from None
            except OSError as exc:  # requests' own, setting up TLS: a CA bundle gone since the settings loaded
                raise SourceRequestFailed(f"{what}: cannot set up TLS with verify_tls "
                                          f"{self.settings.verify_tls!r}: {exc}") from None
            if not stream:  # what requests does for stream=False (its own fields), but at the policy's pace
                try:
                    response._content, response._content_consumed = self._read(response, what), True
                except TransferInterrupted as exc:
                    response.close()
                    budget.after_failure(str(exc))
                    continue
                except SourceDataError:
                    response.close()
                    raise
            status = response.status_code
            if status < 400 or (accept_error and accept_error(response)):
                return response
            reason = f"{what}: HTTP {status} {response.reason or ''}".rstrip()
            redirected = _origin(response.url) != _origin(url)
            if (redirected or not credentials) and status in (401, 403):
                response.close()
                if redirected and not reasked:
                    reasked = True
                    continue
                host = urlsplit(response.url).netloc
                how = ("where the source redirected it (twice, a fresh redirect the second time)" if redirected
                       else "asked without the source's credentials (another host's URL)")
                raise SourceRequestFailed(f"{reason} from {host}, {how}: {host} refused it, not the source (an "
                                          "expired or invalid presigned URL?)", status)
            if status in self.relogin_statuses and relogin and self.on_unauthorized and not relogged:
                response.close()
                self.on_unauthorized(response)
                relogged = counted = True
                continue
            if status in self.policy.retry_statuses:
                retry_after = _retry_after(response.headers.get("Retry-After"))
                response.close()
                budget.after_failure(reason, retry_after)
                continue
            hint = self._hint(response, what, stream)
            response.close()
            if status == 401:
                keys = f" ({', '.join(self.credentials)})" if self.credentials else ""
                raise AuthenticationFailed(f"{reason}: the source refused the configured credentials{keys}{hint}")
            if status == 403:
                raise PermissionDenied(f"{reason}: the configured user is not allowed to do this{hint}")
            raise SourceRequestFailed(f"{reason}{hint}", status)

    def answers(self, url: str, params: dict | None = None, expected: str = "the API's answer") -> None:
        """A GET for a source's `reachable()`: raises as `request` does when the server cannot be reached now
        (SourceUnavailable) or refuses the credentials (AuthenticationFailed), and for an HTML page answered with
        success (refuse_html); any other answer, an error page too, is the server answering."""
        try:
            response = self.request("GET", url, params=params)
        except (PermissionDenied, SourceRequestFailed):
            return
        # the body is not read as what was expected: only a page starting like HTML is refused, not a WSDL or JSON
        # a server labels text/html
        refuse_html(response.content, response.headers.get("Content-Type"), self.describe("GET", url, params),
                    expected, readable=True)

    @contextmanager
    def download(self, url: str, budget: RetryBudget, params: dict | None = None,
                 credentials: bool = True) -> Iterator[Body]:
        """Open a streamed GET for fetching.fetch_verified; errors while reading become TransferInterrupted.

        Content-Length counts the bytes on the wire, which a Content-Encoding the server applies anyway
        (we ask for identity) makes fewer than the decoded master: the Body says how many arrived.
        """
        what = self.describe("GET", url, params)
        response = self.request("GET", url, params=params, budget=budget, stream=True,
                                headers={"Accept-Encoding": "identity"}, credentials=credentials)
        try:
            length = response.headers.get("Content-Length", "")
            yield Body(self._chunks(response, what), int(length) if length.isdigit() else None,
                       transferred=response.raw.tell)
        finally:
            response.close()

    def _chunks(self, response: requests.Response, what: str, pace: TransferPace | None = None) -> Iterator[bytes]:
        """The decoded body as it arrives (read1: a full chunk may take for ever on a trickling body), cut off
        when it comes slower than `pace` (a download's is checked by fetching.py, which paces every source's)."""
        try:
            while chunk := response.raw.read1(CHUNK_SIZE, decode_content=True):
                if pace is not None:
                    pace.arrived(len(chunk))
                yield chunk
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise TransferInterrupted(f"{what}: {self._explain(exc)}") from None
        except TransferInterrupted as exc:
            raise TransferInterrupted(f"{what}: {exc}") from None

    def _read(self, response: requests.Response, what: str, limit: int | None = None) -> bytes:
        """The decoded body, or its first `limit` bytes, read at the policy's pace (TransferInterrupted). A whole
        body is refused (SourceDataError) as soon as it decodes to more than answer_bytes: read as it arrives, an
        endless answer or a small gzip of gigabytes of zeros takes no more memory than that."""
        body = bytearray()
        for chunk in self._chunks(response, what, TransferPace(self.policy)):
            body += chunk
            if limit is not None and len(body) >= limit:
                return bytes(body[:limit])
            if len(body) > self.answer_bytes:
                raise SourceDataError(f"{what}: the answer decodes to more than {self.answer_bytes} bytes, the most "
                                      "an API answer may be: refused")
        return bytes(body)

    def _explain(self, exc: Exception) -> str:
        if isinstance(exc, requests.exceptions.ConnectTimeout):
            return f"connect timed out after {self.policy.connect_timeout_seconds:g}s"
        if any(isinstance(e, (requests.exceptions.ReadTimeout, ReadTimeoutError, TimeoutError)) for e in _chain(exc)):
            return f"read timed out after {self.policy.read_timeout_seconds:g}s"
        if isinstance(exc, (requests.exceptions.ChunkedEncodingError, ProtocolError)):
            return f"response body ended early ({_root_cause(exc)})"
        return f"connection failed ({_root_cause(exc)})"

    def _hint(self, response: requests.Response, what: str, streamed: bool) -> str:
        """A short, scrubbed excerpt of an error body: the source's own words help the operator (not when they
        only repeat the status's reason, as Rosetta's "Unauthorized" page does)."""
        try:
            head = self._read(response, what, _HINT_BYTES) if streamed else response.content[:_HINT_BYTES]
        except TransferInterrupted:
            return ""
        # scrubbed before the cut: a secret the cut splits would no longer match
        text = scrub(" ".join(self._server_words(head, response.encoding or "utf-8").split()))[:200]
        return f": {text}" if text and text.lower() != (response.reason or "").lower() else ""

    def _server_words(self, head: bytes, charset: str) -> str:
        """What an error body says in the server's words: as the connector reads its server's own shape
        (error_words), else as any web server's, an HTML page's title or text (Rosetta's), else the body."""
        text = head.decode(charset, "replace")
        said = self.error_words(text) if self.error_words else None
        if said is not None:
            return said
        if _HTML_START.match(head):
            title = _TITLE.search(text)
            return html.unescape(title.group(1) if title else _TAG.sub(" ", text))
        return text


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """An exception and those it wraps (requests and urllib3 nest them in args, .reason and __cause__)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        reason = getattr(current, "reason", None)
        wrapped = current.args[0] if current.args and isinstance(current.args[0], BaseException) else None
        current = (reason if isinstance(reason, BaseException) else None) or wrapped \
            or current.__cause__ or current.__context__


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port or _DEFAULT_PORTS.get(parts.scheme)


def _root_cause(exc: BaseException) -> str:
    """The innermost exception's class name: informative, and free of URLs and credentials."""
    return type(list(_chain(exc))[-1]).__name__


def _retry_after(value: str | None) -> float | None:
    """Retry-After as seconds: delta-seconds or an HTTP-date (RFC 9110 §10.2.3)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())



_HTML_START = re.compile(rb"(?:\xef\xbb\xbf)?\s*(?:<\?xml[^>]*>\s*)?(?:<!--.*?-->\s*)*<(?:!doctype\s+html|html)[\s>]",
                         re.IGNORECASE | re.DOTALL)
_HTML_TYPES = ("text/html", "application/xhtml+xml")
_TITLE = re.compile(r"<title[^>]*>(.*?)</title", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"<[^>]*>")


def refuse_html(body: bytes, content_type: str | None, what: str, expected: str, readable: bool = False) -> None:
    """An HTML page answered with success where a source's API answers `expected` is a proxy's login or
    maintenance page in front of it: the source is not there (SourceUnavailable), so the run stops
    (connectors.base.source_down) rather than take the page for every object's malformed record, spend their
    attempts and move its checkpoint past them. Told by its start (<html, <!DOCTYPE html), or by an HTML
    Content-Type on a body not `readable` as what was expected (a SOAP answer mislabelled text/html is still one)."""
    media_type = (content_type or "").partition(";")[0].strip().lower()
    if not _HTML_START.match(body) and (media_type not in _HTML_TYPES or readable):
        return
    title = _TITLE.search(body[:65536].decode("utf-8", "replace"))
    named = " ".join(html.unescape(title.group(1)).split())[:120] if title else ""
    raise SourceUnavailable(scrub(
        f"{what}: the server answered with an HTML page" + (f" titled {named!r}" if named else "")
        + (f" (Content-Type {media_type})" if media_type else "") + f", not {expected}: a login or maintenance "
        "page in front of the source?"))
