"""Ex Libris Rosetta: IEs discovered by OAI-PMH, SRU or a PID list; described by getIE's METS; fetched by delivery.

Follows reference/dam-apis.md §1. What the reference marks as inferred or unverified is configuration:
the preservation type selected (MODIFIED_MASTER), the SRU date index, the SOAPAction, the auth scheme
word, the server's timezone for DNX dates. Credentials travel as Basic auth with the documented
`{user}-institutionCode-{INST}:{password}` login on every request (SOAP, delivery, SRU, OAI).
"""
from __future__ import annotations

import base64
import itertools
import logging
import re
import xml.etree.ElementTree as ET
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Iterator, Literal, get_args
from xml.sax.saxutils import escape
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import requests
from pydantic import Field, field_validator, model_validator

from connectors.base import (FetchedFile, Fixity, LangValue, ListingCut, ListingMoved, SourceItem, SourceObject,
                             UnreadableObject, checked_source_url_template, source_url, unreadable)
from connectors.errors import (DESCRIBE_ERRORS, ObjectNotFound, PermissionDenied, SourceDataError,
                               SourceRequestFailed)
from connectors.fetching import CHECKABLE_DIGESTS, Body, fetch_verified, fixity, hashlib_name
from connectors.http import BaseUrl, HttpSession, HttpSourceSettings, refuse_html
from connectors.idlist import IdListSettings
from connectors.redaction import Secret, register, scrub
from connectors.retry import RetryBudget
from connectors.timestamps import as_utc, clock_window, parse_timestamp, within
from gcis_etl.errors import SourceError
from gcis_etl.settings import Settings

log = logging.getLogger(__name__)

NS = {
    "mets": "http://www.loc.gov/METS/",
    "xlink": "http://www.w3.org/1999/xlink",
    "xsi": "http://www.w3.org/2001/XMLSchema-instance",
    "soap": "http://schemas.xmlsoap.org/soap/envelope/",
    "oai": "http://www.openarchives.org/OAI/2.0/",
    "srw": "http://www.loc.gov/zing/srw/",
    "diag": "http://www.loc.gov/zing/srw/diagnostic/",
    "dc": "http://purl.org/dc/elements/1.1/",
}
_PREFIXES = {"http://purl.org/dc/elements/1.1/": "dc", "http://purl.org/dc/terms/": "dcterms"}
_XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
_DERIVATIVES_FLAG = 32  # getIE: the current version with its derivative copies
_SRU_OUT_OF_RANGE = "info:srw/diagnostic/1/61"  # first record position out of range
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)  # before any IE: the date a first run's SRU probe asks from
AuthScheme = Literal["Basic", "local"]
_AUTH_SCHEMES = {word.lower(): word for word in get_args(AuthScheme)}  # what any case of each word stands for


class OaiSettings(Settings):
    """OAI-PMH (`/oaiprovider/request`): the documented "changed since" feed; IEs must be published to `set`."""

    path: str = "/oaiprovider/request"
    set: str | None = None
    verb: Literal["ListIdentifiers", "ListRecords"] = "ListIdentifiers"
    metadata_prefix: str = "oai_dc"
    granularity: Literal["seconds", "days"] = "seconds"
    identifier_pattern: str = Field(r"(IE\d+)$", description="regex; group 1 is the IE PID in the OAI identifier")
    shift_check: bool = Field(True, description="completeListSize changing between pages holds the run's "
                                                "checkpoint (an IE edited past the window's end leaves the list)")


class SruSettings(Settings):
    """SRU searchRetrieve on a date index. The index name is not documented: read the site's explain document."""

    path: str = "/search/permanent/ie/sru"
    modified_index: str = Field(description="e.g. IE.objectCharacteristics.modificationDate (check ?service=explain)")
    modified_format: str = "%Y-%m-%d %H:%M:%S"
    query: str = Field("IE.generalIECharacteristics.status=ACTIVE", description="CQL selecting the IEs to harvest")
    sort_by: str | None = None
    modified_order: bool = Field(False, description="sort_by lists IEs oldest first on modified_index, so a run "
                                                    "cut short moves the checkpoint to where it stopped")
    page_size: int = Field(100, ge=1, le=10000)
    max_records: int = Field(10000, ge=1, description="Rosetta caps a result set at 10,000")
    auth_local: bool = True
    pid_type: str = "PID"
    shift_check: bool = Field(True, description="numberOfRecords changing between pages, or an empty page short of "
                                                "it, holds the run's checkpoint (an IE deleted or leaving the query "
                                                "moves the later ones back)")

    @field_validator("query")
    @classmethod
    def _query(cls, query: str) -> str:
        """SRU requires a query: an empty one failed every first run (no date clause), which recorded no checkpoint,
        so every run was a first run."""
        if not query.strip():
            raise ValueError("SRU needs a CQL query selecting the IEs, e.g. IE.generalIECharacteristics.status=ACTIVE")
        return query

    @model_validator(mode="after")
    def _ascending(self) -> "SruSettings":
        """Order is promised for a sort on the index the incremental query uses, ascending (CQL's default unless
        sort.descending); that it runs as the IEs' modification dates do is inferred, hence an opt-in."""
        index, _, modifiers = (self.sort_by or "").partition("/")
        if self.modified_order and (index.strip() != self.modified_index or "descending" in modifiers):
            raise ValueError("modified_order: true needs sort_by: <modified_index>/sort.ascending "
                             f"({self.modified_index}/sort.ascending)")
        return self


class RosettaSettings(HttpSourceSettings):
    username: str
    institution_code: str | None = Field(None, description="None when the username already carries it")
    password: Secret
    auth_scheme: AuthScheme = "Basic"
    delivery_base_url: BaseUrl | None = Field(None, description="delivery/OAI/SRU host; default base_url")
    discovery: Literal["oai", "sru", "pids"] = "oai"
    oai: OaiSettings = OaiSettings()
    sru: SruSettings | None = None
    pid_list: IdListSettings = IdListSettings()
    ie_service_path: str = "/dpsws/repository/IEWebServices"
    soap_action: str = ""
    get_ie_flags: int = Field(0, ge=0)
    preservation_types: tuple[str, ...] = Field(("MODIFIED_MASTER",), min_length=1,
                                                description="first type present wins; the spelling is inferred")
    representations: Literal["first", "all"] = Field("first", description="an IE with several of the winning type: "
                                                     "the first one's files, or every one's in turn")
    struct_map_type: str = "PHYSICAL"
    missing_representation: Literal["error", "skip"] = "error"
    fixity_preference: tuple[str, ...] = Field(("sha256", "sha1", "md5"), description="as hashlib or Rosetta "
                                               "spell them (sha256 or SHA-256); the first the file has is checked")
    timezone: str = Field("UTC", description="zone of DNX dates, which carry no offset")
    delivery_path: str = "/delivery/DeliveryManagerServlet"
    delivery_params: dict[str, str] = Field(default_factory=dict, description="extra delivery query parameters")
    source_url_template: str | None = "{delivery_base_url}/delivery/DeliveryManagerServlet?dps_pid={id}"
    not_found_fault: str = r"(?i)does not exist|not found|no such|NotInPermanent"
    ie_pid_pattern: str = r"^IE\d+$"

    def credential_settings(self) -> tuple[str, ...]:
        """The login every request carries, {username}-institutionCode-{institution_code}:{password} (whichever
        auth_scheme word goes before it)."""
        return ("username", "institution_code", "password") if self.institution_code else ("username", "password")

    @field_validator("auth_scheme", mode="before")
    @classmethod
    def _scheme_word(cls, value: object) -> object:
        """Scheme words are case-insensitive (RFC 9110 §11.1): `basic` was refused while `Basic` was taken. Sent
        as spelt here, the canonical way."""
        return _AUTH_SCHEMES.get(value.strip().lower(), value) if isinstance(value, str) else value

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {value!r}") from None
        return value

    @field_validator("fixity_preference")
    @classmethod
    def _checkable(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        """Read once, as fetching reads the files' own fixity names: a name that matched none of those would
        turn fixity checking off without a word."""
        unknown = [name for name in value if hashlib_name(name) is None]
        if unknown:
            raise ValueError(f"cannot check {', '.join(map(repr, unknown))}: name digests among "
                             f"{', '.join(CHECKABLE_DIGESTS)} (Rosetta's spelling, as MD5 or SHA-256, will do)")
        return tuple(hashlib_name(name) for name in value)

    @field_validator("source_url_template")
    @classmethod
    def _fillable(cls, value: str | None) -> str | None:
        return checked_source_url_template(value, "delivery_base_url")

    @field_validator("not_found_fault", "ie_pid_pattern")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return value

    @model_validator(mode="after")
    def _discovery_configured(self) -> "RosettaSettings":
        if self.discovery == "sru" and self.sru is None:
            raise ValueError("discovery: sru needs an `sru:` section with at least modified_index")
        if self.discovery == "pids" and not (self.pid_list.file or self.pid_list.ids):
            raise ValueError("discovery: pids needs pid_list.file or pid_list.ids")
        if self.discovery == "oai" and not self.oai.set:
            raise ValueError("discovery: oai needs oai.set (the published set of IEs to harvest)")
        return self

    @model_validator(mode="after")
    def _derivatives_asked_for(self) -> "RosettaSettings":
        """getIE leaves derivative copies out of the METS unless flag 32 is set (dam-apis.md §1.5): without it every
        IE failed with "no representation of preservation type DERIVATIVE_COPY"."""
        if "DERIVATIVE_COPY" in self.preservation_types and not self.get_ie_flags & _DERIVATIVES_FLAG:
            raise ValueError(f"preservation_types names DERIVATIVE_COPY, which getIE leaves out with get_ie_flags: "
                             f"{self.get_ie_flags} (flag {_DERIVATIVES_FLAG} includes derivative copies: "
                             f"get_ie_flags: {self.get_ie_flags | _DERIVATIVES_FLAG})")
        return self


class _SchemeAuth(requests.auth.AuthBase):
    """Basic credentials under a configurable scheme word ("Basic", or "local" as some Rosetta clients send)."""

    def __init__(self, header: str):
        self._header = header

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers["Authorization"] = self._header
        return request

    def __repr__(self) -> str:
        return "<_SchemeAuth ***>"


@dataclass
class _OrderTally:
    """The IEs a listing (or a `get`) described, and those with no structMap of struct_map_type, whose files were
    taken in fileSec order: when not one has such a structMap, the setting is likelier misspelt than every IE odd."""

    described: int = 0
    unordered: int = 0
    types: dict[str, None] = field(default_factory=dict)  # the structMap TYPEs those IEs have, in the order met


class RosettaSource:
    """A Rosetta institution as a source of IEs whose selected representation's files are the masters."""

    # Settings that change how Rosetta is reached, not what it lists (gcis_etl.pipelines.TRANSPORT).
    transport_settings = ("username", "institution_code", "auth_scheme", "soap_action", "ie_service_path",
                          "delivery_path", "delivery_params", "oai.shift_check", "sru.page_size", "sru.max_records",
                          "sru.shift_check", "sru.auth_local")

    # A file PID is unique in the repository but a file belongs to its IE for life (moved content is deposited
    # again, under new PIDs): no file can turn up in another IE, so no run looks for one in the ledger.
    item_ids_unique = False

    def __init__(self, settings: RosettaSettings, name: str = "rosetta"):
        self.name = name
        self.settings = settings
        self.http = HttpSession(settings)
        login = (f"{settings.username}-institutionCode-{settings.institution_code}"
                 if settings.institution_code else settings.username)
        password = settings.password.get_secret_value()
        token = base64.b64encode(f"{login}:{password}".encode()).decode()
        self.http.auth = _SchemeAuth(f"{settings.auth_scheme} {token}")
        register(password, token)
        self._zone = ZoneInfo(settings.timezone)
        # no credential in a locator (they travel in task messages): user-info is sent by the session, and
        # delivery_params are added when fetching
        self._delivery_base = self.http.credential_free(settings.delivery_base_url or settings.base_url).rstrip("/")
        self.lists_in_modified_order = settings.discovery == "sru" and settings.sru.modified_order
        self.modified_order_setting = (f"sru.sort_by: {settings.sru.modified_index}/sort.ascending and "
                                       f"sru.modified_order: true" if settings.discovery == "sru" else None)

    # --- the Source protocol ----------------------------------------------------------------------------

    def changes(self, since: datetime | None = None,
                until: datetime | None = None) -> Iterator[SourceObject | UnreadableObject | ListingMoved]:
        since = as_utc(since) if since else None
        until = as_utc(until) if until else None
        clocked = clock_window(since, until, self._zone)  # for DNX dates, clock time in settings.timezone
        tally = _OrderTally()
        for listed in self._discover(since, until, clocked):
            if isinstance(listed, ListingMoved):
                yield listed
                continue
            pid, stamp = listed
            try:
                obj = self._describe(pid, stamp, explicit=False, tally=tally)
            except DESCRIBE_ERRORS as exc:
                yield unreadable(self, pid, stamp, exc)
                continue
            if obj is None:
                continue
            if self.settings.discovery == "pids" and not within(obj.modified, *clocked):
                continue
            yield obj
        self._said_unordered(tally)

    def get(self, object_ids: Iterable[str]) -> Iterator[SourceObject]:
        tally = _OrderTally()
        for pid in object_ids:
            yield self._describe(pid.strip(), None, explicit=True, tally=tally)
        self._said_unordered(tally)

    def _said_unordered(self, tally: _OrderTally) -> None:
        """Each IE of more than one file without a structMap of struct_map_type was named as it was described;
        all of them without one (single-file IEs counted too) is said once more, as the likely misspelt setting it
        is."""
        if tally.described and tally.unordered == tally.described:
            log.warning("%s: not one of the %d IEs described has a structMap of TYPE %r (they have %s): is "
                        "struct_map_type misspelt? Their files were taken in fileSec order, which may not be their "
                        "page order", self.name, tally.described, self.settings.struct_map_type,
                        ", ".join(tally.types) or "none")

    def fetch(self, item: SourceItem, dest_dir: Path) -> FetchedFile:
        return fetch_verified(item, Path(dest_dir), lambda budget: self._download(item, budget), self.settings.retry)

    @contextmanager
    def _download(self, item: SourceItem, budget: RetryBudget) -> Iterator[Body]:
        """A delivery answering with an HTML page (a login or maintenance page) is Rosetta not being there, not a
        master cut short to retry as one. Told by its first bytes: HttpSession.download gives no Content-Type."""
        params = self.settings.delivery_params  # added here, never to the locator (see __init__)
        with self.http.download(item.locator, budget, params) as body:
            chunks = iter(body.chunks)
            first = next(chunks, b"")
            refuse_html(first, None, f"{item.id}: delivery", "the file's bytes")
            yield replace(body, chunks=itertools.chain((first,), chunks))

    def reachable(self) -> None:
        """The IE web service's WSDL, where every IE is described, and OAI-PMH Identify on a delivery host of its
        own, where listings and downloads go: cheap requests that touch no IE (connectors.base.source_down)."""
        self.http.answers(self.http.url(self.settings.ie_service_path) + "?wsdl", expected="the IEWebServices WSDL")
        if self._delivery_base != self.http.base_url:
            self.http.answers(self._delivery_base + "/" + self.settings.oai.path.lstrip("/"), {"verb": "Identify"},
                              expected="OAI-PMH Identify")

    # --- discovery --------------------------------------------------------------------------------------

    def _discover(self, since: datetime | None, until: datetime | None, clocked: tuple[datetime | None, datetime | None]
                  ) -> Iterator[tuple[str, datetime | None] | ListingMoved]:
        """OAI-PMH datestamps are UTC; the SRU date index holds DNX dates, compared with the `clocked` window."""
        if self.settings.discovery == "oai":
            return self._oai(since, until)
        if self.settings.discovery == "sru":
            return self._sru(*clocked)
        return ((pid, None) for pid in dict.fromkeys(self.settings.pid_list.read()))  # once each: see Harvest.objects

    def _oai(self, since: datetime | None,
             until: datetime | None) -> Iterator[tuple[str, datetime | None] | ListingMoved]:
        """Paged by resumptionToken, which providers often make an offset: an IE edited after the window's end
        (or withdrawn from the set) leaves the list, the later ones move back one place, and one slides onto a
        page already read. The optional completeListSize changing between pages says so."""
        oai = self.settings.oai
        fmt = "%Y-%m-%dT%H:%M:%SZ" if oai.granularity == "seconds" else "%Y-%m-%d"
        params = {"verb": oai.verb, "metadataPrefix": oai.metadata_prefix, "set": oai.set}
        if since:
            params["from"] = since.strftime(fmt)
        if until:
            params["until"] = until.strftime(fmt)
        url = self._delivery_base + "/" + oai.path.lstrip("/")
        pattern = re.compile(oai.identifier_pattern)
        tokens: set[str] = set()
        total = None
        while True:
            root = _answer(self.http.request("GET", url, params=params), "OAI-PMH response", "OAI-PMH")
            error = root.find("oai:error", NS)
            if error is not None:
                if error.get("code") == "noRecordsMatch":
                    return
                raise SourceRequestFailed(
                    f"OAI-PMH {oai.verb}: error {error.get('code')}: {(error.text or '').strip()}")
            container = root.find(f"oai:{oai.verb}", NS)
            if container is None:
                raise SourceDataError(f"OAI-PMH {oai.verb}: the response has no <{oai.verb}> element")
            for header in container.iter(f"{{{NS['oai']}}}header"):
                identifier = (header.findtext("oai:identifier", "", NS)).strip()
                match = pattern.search(identifier)
                if not match:  # e.g. a collection record published to the same set: no IE of this pipeline
                    log.warning("%s: OAI-PMH identifier %r does not match oai.identifier_pattern %r; skipped",
                                self.name, identifier, oai.identifier_pattern)
                    continue
                if header.get("status") == "deleted":
                    log.info("%s: %s is deleted in the OAI-PMH feed; nothing to harvest", self.name, match.group(1))
                    continue
                yield match.group(1), parse_timestamp(header.findtext("oai:datestamp", None, NS))
            resumption = container.find("oai:resumptionToken", NS)
            size = resumption.get("completeListSize") if resumption is not None else None
            if oai.shift_check and size is not None and total is not None and size != total:
                yield ListingMoved(f"OAI-PMH completeListSize went from {total} to {size} between two pages: IEs "
                                   "left or joined the list while it was paged, and one may have been passed over")
            total = size if size is not None else total
            token = ((resumption.text if resumption is not None else "") or "").strip()
            if not token:
                return
            if token in tokens:
                raise SourceDataError(f"OAI-PMH {oai.verb}: the server repeated resumptionToken {token!r}")
            tokens.add(token)
            params = {"verb": oai.verb, "resumptionToken": token}

    def _sru(self, since: datetime | None,
             until: datetime | None) -> Iterator[tuple[str, datetime | None] | ListingMoved]:
        """Paged by startRecord: a numberOfRecords that changes between pages says the result moved under it (a
        ListingMoved), and an empty page short of it that the rest went unserved (a ListingCut). A result past
        Rosetta's cap (max_records) is refused, unless sorted oldest first: then each run takes the first
        max_records of it and ends with a ListingCut, its checkpoint moving to where the listing stopped."""
        sru = self.settings.sru
        clauses = [f"({sru.query})"]
        if since:
            clauses.append(self._sru_date(">=", since))
        if until:
            clauses.append(self._sru_date("<=", until))
        query = " and ".join(clauses) + (f" sortBy {sru.sort_by}" if sru.sort_by else "")
        start, total = 1, None
        while True:
            root = self._sru_page(query, start, min(sru.page_size, sru.max_records - start + 1))
            diagnostic = root.find("srw:diagnostics/diag:diagnostic", NS)  # not a record's own (_sru_pid)
            empty = _out_of_range(diagnostic)
            if diagnostic is not None and not empty:
                raise SourceRequestFailed(f"SRU query {query!r}: {_diagnostic(diagnostic)}")
            if start == 1 and not (since or until):  # a first run's query, known now to be taken
                self._sru_probe()
            if empty:
                # on the first page (startRecord=1) it says the result is empty, as some servers say it
                if total is not None and sru.shift_check:  # past a page within the result: it shrank since
                    yield ListingMoved(f"SRU startRecord={start} is out of range of a result that counted "
                                       f"{total} when the last page was read: IEs left the result while it was "
                                       "paged, and one may have been passed over")
                return
            count = _int(root.findtext("srw:numberOfRecords", None, NS), "SRU numberOfRecords")
            if sru.shift_check and total is not None and count != total:
                yield ListingMoved(f"SRU numberOfRecords went from {total} to {count} between two "
                                   f"pages (at startRecord={start}): IEs left or joined the result while it was "
                                   "paged, and one may have been passed over")
            total = count
            if start == 1 and total > sru.max_records and not sru.modified_order:
                raise SourceRequestFailed(
                    f"SRU query {query!r} matches {total} IEs, more than the {sru.max_records} Rosetta returns: "
                    f"narrow the query, sort it oldest first ({self.modified_order_setting}: each run then takes "
                    "the next ones), harvest with OAI-PMH, or migrate with an explicit PID list")
            records = root.findall("srw:records/srw:record", NS)
            for record in records:
                pid = self._sru_pid(record)
                yield pid if isinstance(pid, ListingMoved) else (pid, None)
            if not records:
                if sru.shift_check and start <= total:
                    yield ListingCut(f"the server gave an empty SRU page at startRecord={start} of numberOfRecords "
                                     f"{total}: the IEs past it were not served")
                return
            following = root.findtext("srw:nextRecordPosition", None, NS)
            position = _int(following, "SRU nextRecordPosition") if following else start + len(records)
            if position <= start:
                raise SourceDataError(f"{self.name}: SRU nextRecordPosition {position} does not advance past "
                                      f"startRecord={start} (expected {start + len(records)}): the server would "
                                      "serve the same page again")
            start = position
            if start > min(total, sru.max_records):
                if sru.modified_order and total >= sru.max_records:  # a capped count may equal the cap
                    yield ListingCut(f"Rosetta serves the first {sru.max_records} IEs of an SRU result "
                                     f"(sru.max_records), and this one counts {total}: the IEs past them were not "
                                     "served")
                return

    def _sru_date(self, relation: str, when: datetime) -> str:
        """A CQL clause on sru.modified_index, `when` written as the index holds DNX dates: clock time, no offset."""
        sru = self.settings.sru
        return f'{sru.modified_index}{relation}"{when.astimezone(self._zone).strftime(sru.modified_format)}"'

    def _sru_page(self, query: str, start: int, maximum: int) -> ET.Element:
        """One searchRetrieve answer, diagnostics and all."""
        sru = self.settings.sru
        params = {"version": "1.2", "operation": "searchRetrieve", "query": query, "startRecord": str(start),
                  "maximumRecords": str(maximum), "recordSchema": "dc"}
        if sru.auth_local:
            params["auth"] = "local"
        url = self._delivery_base + "/" + sru.path.lstrip("/")
        root = _answer(self.http.request("GET", url, params=params), "SRU response", "an SRU response")
        if root.tag != f"{{{NS['srw']}}}searchRetrieveResponse":
            raise SourceDataError(f"SRU response: the document is {root.tag}, not an SRU 1.2 "
                                  f"searchRetrieveResponse ({{{NS['srw']}}})")
        return root

    def _sru_probe(self) -> None:
        """A first run's query has no date clause, every later run's has: a sru.modified_index (or modified_format)
        the server does not take passed the config check, the dry run and the first run, and failed the second.
        The date clause is sent once on a first run (one record asked for, since the epoch), after the first page
        (a diagnostic on it is then the date clause's, not the query's), so that it fails now, before any IE is
        described."""
        query = f"({self.settings.sru.query}) and {self._sru_date('>=', _EPOCH)}"
        diagnostic = self._sru_page(query, 1, 1).find("srw:diagnostics/diag:diagnostic", NS)
        if diagnostic is not None and not _out_of_range(diagnostic):
            raise SourceRequestFailed(f"SRU query {query!r}: {_diagnostic(diagnostic)} (the date clause every later "
                                      "run adds, tried once on this first run: check sru.modified_index and "
                                      "sru.modified_format against the server's ?operation=explain)")

    def _sru_pid(self, record: ET.Element) -> str | ListingMoved:
        """The IE PID an SRU record holds. A record the server could not serve (a surrogate diagnostic in its
        place) or without a PID is one IE not listed, not the listing's end: a ListingMoved, which holds the
        checkpoint, so the next run lists it again."""
        surrogate = record.find("srw:recordData/diag:diagnostic", NS)
        if surrogate is None:
            xsi_type = f"{{{NS['xsi']}}}type"
            for identifier in record.iter(f"{{{NS['dc']}}}identifier"):
                value = (identifier.text or "").strip()
                if identifier.get(xsi_type) == self.settings.sru.pid_type and re.match(self.settings.ie_pid_pattern,
                                                                                      value):
                    return value
        why = (f"a diagnostic in its place: {_diagnostic(surrogate)}" if surrogate is not None else
               f"no dc:identifier of xsi:type {self.settings.sru.pid_type!r} holding an IE PID")
        reason = (f"SRU record {record.findtext('srw:recordPosition', '?', NS).strip()} of the result was not "
                  f"listed ({why})")
        log.warning("%s: %s", self.name, reason)
        return ListingMoved(reason)

    # --- object detail ----------------------------------------------------------------------------------

    def _describe(self, pid: str, stamp: datetime | None, explicit: bool, tally: _OrderTally) -> SourceObject | None:
        if not re.match(self.settings.ie_pid_pattern, pid):
            raise ObjectNotFound(f"{pid!r} is not an IE PID (ie_pid_pattern {self.settings.ie_pid_pattern!r})")
        mets = _xml(self._get_ie(pid).encode("utf-8"), f"{pid}: getIE METS")
        document = _IeDocument(pid, mets, self.settings, self._zone)
        groups = document.representations()
        items = tuple(document.items(groups, self._delivery_url))
        if not items:  # no images to harvest either way: the one missing_representation policy
            wanted, found = " or ".join(self.settings.preservation_types), ", ".join(document.types()) or "none"
            named = ", ".join(g.get("ID", "?") for g in groups)
            message = (f"{pid}: representation {named} ({wanted}) has no files" if len(groups) == 1 else
                       f"{pid}: representations {named} ({wanted}) have no files" if groups
                       else f"{pid}: no representation of preservation type {wanted} (found: {found})")
            if explicit or self.settings.missing_representation == "error":
                raise ObjectNotFound(message)
            log.warning("%s: %s; skipped", self.name, message)
            return None
        tally.described += 1
        if not document.struct_maps():  # SourceObject carries no warning: the log says it, naming the IE
            types = document.struct_map_types()
            tally.unordered += 1
            tally.types.update(dict.fromkeys(types))
            if len(items) > 1:  # one file has no order to lose: not named, though counted
                log.warning("%s: %s has no structMap of TYPE %r (struct_map_type; its TYPEs: %s): its files were "
                            "taken in fileSec order, which may not be their page order", self.name, pid,
                            self.settings.struct_map_type, ", ".join(types) or "none")
        own = document.modified()
        modified = max([m for m in (own, *(i.modified for i in items)) if m] or [stamp or datetime.now(timezone.utc)])
        return SourceObject(id=pid, modified=modified, items=items, metadata=document.metadata(),
                            source_url=source_url(self.settings.source_url_template, pid,
                                                  delivery_base_url=self._delivery_base),
                            listed_at=own if self.settings.discovery == "sru" else None)  # sru.modified_index's

    def _get_ie(self, pid: str) -> str:
        envelope = (f'<soap:Envelope xmlns:soap="{NS["soap"]}" xmlns:dps="http://dps.exlibris.com/"><soap:Body>'
                    f"<dps:getIE><pdsHandle></pdsHandle><iePid>{escape(pid)}</iePid>"
                    f"<flags>{self.settings.get_ie_flags}</flags></dps:getIE></soap:Body></soap:Envelope>")
        response = self.http.request(
            "POST", self.http.url(self.settings.ie_service_path), data=envelope.encode("utf-8"),
            headers={"Content-Type": "text/xml; charset=utf-8", "SOAPAction": f'"{self.settings.soap_action}"'},
            accept_error=_is_soap_fault, label=f"getIE {pid}")
        body = _answer(response, f"{pid}: getIE response", "SOAP").find("soap:Body", NS)
        fault = body.find("soap:Fault", NS) if body is not None else None
        if fault is not None:
            raise self._fault_error(pid, fault)
        answer = next((e for e in (body if body is not None else []) if e.tag.endswith("getIEResponse")), None)
        if answer is None or len(answer) == 0 or not (answer[0].text or "").strip():
            raise SourceDataError(f"{pid}: getIE response carries no METS")
        return answer[0].text

    def _fault_error(self, pid: str, fault: ET.Element) -> SourceError:
        text = (fault.findtext("faultstring") or "").strip()
        detail = fault.find("detail")
        exception = detail[0].tag.rpartition("}")[2] if detail is not None and len(detail) else ""
        message = scrub(f"getIE {pid}: SOAP fault {exception or 'unknown'}: {text}")
        if exception == "UserAuthorizeException":
            return PermissionDenied(f"{message} (IEWebServices needs the Data Manager or Editor role)")
        if re.search(self.settings.not_found_fault, f"{exception} {text}"):
            return ObjectNotFound(message)
        return SourceRequestFailed(message, 500)

    def _delivery_url(self, file_pid: str) -> str:
        prepared = requests.PreparedRequest()
        prepared.prepare_url(self._delivery_base + "/" + self.settings.delivery_path.lstrip("/"),
                             {"dps_pid": file_pid, "dps_func": "stream"})
        return prepared.url


class _IeDocument:
    """An IE's AIP METS: representations by preservation type, files in structMap order, DNX, DC."""

    def __init__(self, pid: str, mets: ET.Element, settings: RosettaSettings, zone: ZoneInfo):
        self.pid = pid
        self.mets = mets
        self.settings = settings
        self.zone = zone
        self.amd = {a.get("ID"): a for a in mets.findall("mets:amdSec", NS)}

    def _dnx(self, admid: str | None, fallback: str) -> dict[str, list[dict[str, str]]]:
        """DNX sections of an amdSec: {section id: [record {key id: value}]}; namespace-agnostic."""
        amd = next((self.amd[i] for i in (admid or "").split() if i in self.amd), None) or self.amd.get(fallback)
        sections: dict[str, list[dict[str, str]]] = {}
        for section in (e for e in (amd.iter() if amd is not None else ()) if _local(e.tag) == "section"):
            records = sections.setdefault(section.get("id", ""), [])
            for record in (r for r in section if _local(r.tag) == "record"):
                records.append({k.get("id", ""): (k.text or "").strip() for k in record if _local(k.tag) == "key"})
        return sections

    def _groups(self) -> list[tuple[ET.Element, str]]:
        return [(g, _first(self._dnx(g.get("ADMID"), f"{g.get('ID')}-amd"), "generalRepCharacteristics",
                           "preservationType")) for g in self.mets.findall("mets:fileSec/mets:fileGrp", NS)]

    def types(self) -> list[str]:
        return [t or "?" for _, t in self._groups()]

    def representations(self) -> list[ET.Element]:
        """The representations of the first preservation type present, in fileSec order: every one with
        `representations: all`, else the first alone. SourceObject carries no warning, so leaving the others out
        is said in the log."""
        groups = self._groups()
        for wanted in self.settings.preservation_types:
            matching = [g for g, t in groups if t == wanted]
            if len(matching) > 1 and self.settings.representations == "first":
                named = ", ".join(g.get("ID", "?") for g in matching)
                log.warning("%s: %d %s representations (%s); taking the first, %s (representations: all takes "
                            "every one)", self.pid, len(matching), wanted, named, matching[0].get("ID"))
                return matching[:1]
            if matching:
                return matching
        return []

    def items(self, groups: list[ET.Element], delivery_url) -> Iterator[SourceItem]:
        """The representations' files, one after another, each's in its structMap's order."""
        ordered: list[tuple[ET.Element, str | None]] = []
        for group in groups:
            files = {f.get("ID"): f for f in group.findall("mets:file", NS)}
            physical = self._physical_order(group.get("ID", ""), files)
            listed = {f for f, _ in physical}
            ordered += [(files[f], label) for f, label in physical]
            ordered += [(element, None) for f, element in files.items() if f not in listed]
        for sequence, (element, div_label) in enumerate(ordered, 1):
            file_id = element.get("ID")
            dnx = self._dnx(element.get("ADMID"), f"{file_id}-amd")
            general = (dnx.get("generalFileCharacteristics") or [{}])[0]
            locat = element.find("mets:FLocat", NS)
            href = locat.get(f"{{{NS['xlink']}}}href", "") if locat is not None else ""
            size = general.get("fileSizeBytes") or element.get("SIZE") or ""
            yield SourceItem(
                id=file_id, sequence=sequence,
                original_name=general.get("fileOriginalName") or href.rpartition("/")[2] or file_id,
                size=int(size) if size.isdigit() else None,
                modified=parse_timestamp(_first(dnx, "objectCharacteristics", "modificationDate")
                                         or general.get("fileModificationDate"), self.zone),
                fixity=self._fixity(dnx.get("fileFixity", [])),
                label=div_label or general.get("label") or None,
                locator=delivery_url(file_id))

    def struct_maps(self) -> list[ET.Element]:
        """The IE's structMaps of the configured TYPE (struct_map_type, in any case)."""
        wanted = self.settings.struct_map_type.upper()
        return [m for m in self.mets.findall("mets:structMap", NS) if (m.get("TYPE") or "").upper() == wanted]

    def struct_map_types(self) -> list[str]:
        """The TYPEs of the IE's structMaps, once each, in document order."""
        return list(dict.fromkeys(m.get("TYPE") or "?" for m in self.mets.findall("mets:structMap", NS)))

    def _physical_order(self, rep_id: str, files: dict) -> list[tuple[str, str | None]]:
        """(file id, div LABEL) in the order of the representation's structMap of the configured TYPE."""
        maps = self.struct_maps()
        maps.sort(key=lambda m: not (m.get("ID") or "").startswith(f"{rep_id}-"))
        for struct_map in maps:
            order = [(fptr.get("FILEID"), div.get("LABEL")) for div in struct_map.iter(f"{{{NS['mets']}}}div")
                     for fptr in div.findall("mets:fptr", NS) if fptr.get("FILEID") in files]
            if order:
                seen: set[str] = set()
                return [(f, label) for f, label in order if not (f in seen or seen.add(f))]
        return []

    def _fixity(self, records: list[dict[str, str]]) -> Fixity | None:
        known = [f for f in (fixity(r.get("fixityType", ""), r.get("fixityValue", "")) for r in records) if f]
        for algorithm in self.settings.fixity_preference:
            for candidate in known:
                if candidate.algorithm == algorithm:
                    return candidate
        return next(iter(known), None)  # one that cannot be checked (CRC32): the fetch says it was not

    def modified(self) -> datetime | None:
        dnx = self._dnx(None, "ie-amd")
        return parse_timestamp(_first(dnx, "objectCharacteristics", "modificationDate")
                               or _first(dnx, "objectCharacteristics", "creationDate"), self.zone)

    def metadata(self) -> dict[str, tuple[LangValue, ...]]:
        """The IE's descriptive DC (dmdSec ie-dmd) keyed "dc:title", "dcterms:created", ... in document order."""
        values: dict[str, list[LangValue]] = {}
        section = next((d for d in self.mets.findall("mets:dmdSec", NS) if d.get("ID") == "ie-dmd"), None)
        data = section.find("mets:mdWrap/mets:xmlData", NS) if section is not None else None
        for record in data if data is not None else ():
            for element in record:
                text = " ".join((element.text or "").split())
                namespace, _, local = element.tag[1:].partition("}")
                if text and local:
                    key = f"{_PREFIXES[namespace]}:{local}" if namespace in _PREFIXES else local
                    values.setdefault(key, []).append(LangValue(text, element.get(_XML_LANG)))
        return {k: tuple(v) for k, v in values.items()}


class _Doctype(Exception):
    pass


class _NoDoctype(ET.TreeBuilder):
    """Refuses a DTD as the parser meets it, in whatever encoding the document is: no entity expansion, no
    external entities (a search of the raw bytes missed UTF-16)."""

    def doctype(self, name: str, pubid: str | None, system: str | None) -> None:
        raise _Doctype(name)


def _xml(data: bytes, what: str) -> ET.Element:
    """Parse with the standard library, refusing DTDs."""
    parser = ET.XMLParser(target=_NoDoctype())
    try:
        parser.feed(data)
        return parser.close()
    except _Doctype:
        raise SourceDataError(f"{what}: a document type declaration is not accepted") from None
    except ET.ParseError as exc:
        raise SourceDataError(f"{what}: not well-formed XML ({exc})") from None


def _answer(response: requests.Response, what: str, expected: str) -> ET.Element:
    """The XML document a response carries (`expected` says which kind, for the message), parsed once: a body that
    is no XML may be an HTML page, and one that is may still start like one (XHTML)."""
    content_type = response.headers.get("Content-Type")
    try:
        root = _xml(response.content, what)
    except SourceDataError:
        refuse_html(response.content, content_type, what, expected)
        raise
    refuse_html(response.content, content_type, what, expected, readable=True)
    return root


def _diagnostic(diagnostic: ET.Element) -> str:
    message, uri, details = (diagnostic.findtext(f"diag:{name}", "", NS).strip()
                             for name in ("message", "uri", "details"))
    return f"{message} ({uri}) {details}".strip()


def _out_of_range(diagnostic: ET.Element | None) -> bool:
    """An SRU diagnostic 61: a startRecord past the result (at 1, the result is empty)."""
    return diagnostic is not None and diagnostic.findtext("diag:uri", "", NS).strip() == _SRU_OUT_OF_RANGE


def _is_soap_fault(response: requests.Response) -> bool:
    return response.status_code == 500 and b"Fault" in response.content and b"Envelope" in response.content


def _local(tag: str) -> str:
    return tag.rpartition("}")[2] if isinstance(tag, str) else ""


def _first(sections: dict[str, list[dict[str, str]]], section: str, key: str) -> str:
    return next((r[key] for r in sections.get(section, []) if r.get(key)), "")


def _int(text: str | None, what: str) -> int:
    try:
        return int((text or "").strip())
    except ValueError:
        raise SourceDataError(f"{what} is not a number: {text!r}") from None
