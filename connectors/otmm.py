"""OpenText Media Management: assets (or groups of assets sharing a field value) as objects, masters by REST.

Follows reference/dam-apis.md §2. Session login (`POST /sessions`, then `otmmauthtoken` + `X-Requested-By`,
and the JSESSIONID cookie) or an OAuth password grant; on 401 the connector logs in again once and
repeats the request. Discovery is `search/text` paged with after/limit until a short page, a
folder walk, or an explicit id list. Everything the reference could not confirm is configuration:
the last-modified search field and operator (without them, changes are found by comparing each
asset's date_last_updated), which content is the master (`/contents`, the master rendition, or a
named rendition such as the "Access Files" preview), what content_checksum means, and whether an expired
asset is harvested (OpenText's pyxecm drops it as a deleted one). The session is ended (`DELETE /sessions`) when
the source is closed, so cron runs do not pile sessions up on the server.
"""
from __future__ import annotations

import hashlib
import json
import logging
import threading
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Literal
from urllib.parse import urlsplit

import requests
from pydantic import Field, field_validator, model_validator

from connectors.base import (FetchedFile, LangValue, ListingCut, ListingMoved, SourceItem, SourceObject,
                             UnreadableObject, checked_source_url_template, source_url, unreadable)
from connectors.errors import (DESCRIBE_ERRORS, AuthenticationFailed, FetchIntegrityError, ObjectNotFound,
                               SourceDataError, SourceRequestFailed)
from connectors.fetching import fetch_verified, fixity
from connectors.grouping import natural_key
from connectors.http import HttpSession, HttpSourceSettings, refuse_html
from connectors.idlist import IdListSettings
from connectors.redaction import Secret, register
from connectors.retry import RetryBudget
from connectors.timestamps import as_utc, parse_timestamp, within
from gcis_etl.errors import SourceError
from gcis_etl.languages import language_tag
from gcis_etl.settings import Settings

log = logging.getLogger(__name__)

GROUP_SEARCHES = 3  # a group's member search is run up to this many times while its total_hit_count moves


class SearchSettings(Settings):
    """`search/text`. The last-modified field/operator ids are site configuration the reference could not confirm."""

    method: Literal["POST", "GET"] = "POST"
    keyword_query: str = "*"
    modified_field_id: str | None = Field(None, description="the search field holding the assets' date_last_updated, "
                                                            "which is what the window and checkpoint are kept in")
    modified_operator_id: str | None = None
    modified_value_format: str = "%Y-%m-%dT%H:%M:%SZ"
    conditions: tuple[dict[str, Any], ...] = Field((), description="extra SearchScalarConditions, ANDed")
    folder_filter: str | None = None
    search_config_id: str | None = None
    sort: str | None = None
    modified_order: bool = Field(False, description="sort lists assets oldest first on modified_field_id (asc_<id>), "
                                                    "so a run cut short moves the checkpoint to where it stopped")
    page_size: int = Field(100, ge=1, le=10000)
    load_type: str = "system"
    level_of_detail: str = "slim"
    shift_check: bool = Field(True, description="total_hit_count changing between pages, or an empty page short of "
                                                "it, holds the run's checkpoint (turn off only if the server's count "
                                                "is an estimate)")

    @model_validator(mode="after")
    def _pair(self) -> "SearchSettings":
        if (self.modified_field_id is None) != (self.modified_operator_id is None):
            raise ValueError("modified_field_id and modified_operator_id go together")
        return self


class FolderWalkSettings(Settings):
    """Children paged by after/limit; with shift_check each page after the first starts one child early, which
    must be the last child of the page before (it takes a stable order of children, which is not documented)."""

    folder_id: str
    recursive: bool = True
    page_size: int = Field(100, ge=1)
    shift_check: bool = True


class GroupSettings(Settings):
    """Assets sharing `field_id`'s value form one object, ordered by `sequence_field_id` (natural order)."""

    field_id: str
    sequence_field_id: str | None = None
    operator_id: str = "ARTESIA.OPERATOR.CHAR.CONTAINS"


class OtmmSettings(HttpSourceSettings):
    api_path: str = "/otmmapi/v6"
    auth: Literal["session", "oauth"] = "session"
    username: str
    password: Secret
    client_id: str | None = None
    client_secret: Secret | None = None
    bearer_otmm_token: bool = Field(False, description="also send Authorization: Bearer otmmToken <digest>")
    relogin_statuses: frozenset[int] = frozenset({401})
    extra_headers: dict[str, str] = Field(default_factory=dict, description="e.g. X-OTMM-Locale: en_US")
    discovery: Literal["search", "folder", "ids"] = "search"
    search: SearchSettings = SearchSettings()
    folder: FolderWalkSettings | None = None
    id_list: IdListSettings = IdListSettings()
    group: GroupSettings | None = Field(None, description="None: each asset is an object")
    content: Literal["contents", "master", "rendition"] = "contents"
    rendition: str = Field("preview", description="rendition_content.<rendition>_content when content=rendition")
    contents_params: dict[str, str] = Field(default_factory=dict, description="e.g. disposition: attachment")
    content_checksum: Literal["auto", "md5", "none"] = Field(
        "auto", description="what the content's content_checksum is (undocumented). auto: one of 32 hex digits is "
        "taken for an MD5 of the content, and a master that disagrees is downloaded again: two downloads that agree "
        "mean the site's checksum is something else (warned of once; set none), two that differ a damaged "
        "transfer (the item fails, the next run tries again). md5: an MD5 the master must match. none: not used")
    metadata_map: dict[str, str] = Field(default_factory=dict,
                                         description="field id (or asset.<property>) -> manifest metadata key")
    include_unmapped: bool = True
    metadata_language: str | None = None
    source_url_template: str | None = None
    expired: Literal["skip", "harvest"] = Field("skip", description="an asset whose `expired` is true: skipped as "
                                                                    "a deleted one is (as OpenText's pyxecm does), "
                                                                    "or harvested")
    versions: Literal["latest", "all"] = Field("latest", description="latest: an asset whose latest_version is "
                                               "false (a new version was checked in under another asset_id, same "
                                               "original_asset_id) is passed over as a deleted one is; all: every "
                                               "version is harvested, each as its own asset")

    @field_validator("source_url_template")
    @classmethod
    def _fillable(cls, value: str | None) -> str | None:
        return checked_source_url_template(value, "base_url")

    @field_validator("metadata_language")
    @classmethod
    def _language(cls, value: str | None) -> str | None:
        """Every value's language in the manifests: refused at load, as manifests.default_language is, rather
        than written into every manifest (language_tag reads a POSIX locale, en_US, as en-US)."""
        return language_tag(value) if value is not None else None

    def credential_settings(self) -> tuple[str, ...]:
        """A session's login sends the user's; the OAuth password grant the client's too (a client_secret
        left set under `auth: session` is sent nowhere)."""
        user = ("username", "password")
        return user + ("client_id", "client_secret") if self.auth == "oauth" else user

    @model_validator(mode="after")
    def _consistent(self) -> "OtmmSettings":
        if self.auth == "oauth" and not (self.client_id and self.client_secret):
            raise ValueError("auth: oauth needs client_id and client_secret")
        if self.discovery == "folder" and self.folder is None:
            raise ValueError("discovery: folder needs a `folder:` section with folder_id")
        if self.discovery == "ids" and not (self.id_list.file or self.id_list.ids):
            raise ValueError("discovery: ids needs id_list.file or id_list.ids")
        if not self.relogin_statuses <= {401, 403}:
            raise ValueError("relogin_statuses may hold 401 and/or 403 only")
        api_path = "/" + self.api_path.strip("/")
        if api_path != "/" and (urlsplit(self.base_url).path.rstrip("/") + "/").endswith(api_path + "/"):
            # every request would go to <api_path><api_path>/..., the login's refused as if for its credentials
            raise ValueError(f"base_url ends with api_path ({api_path}), which is added to it: give the server's "
                             f"root (without {api_path})")
        search = self.search
        if search.modified_order and (self.discovery != "search" or self.group is not None
                                      or not search.modified_field_id
                                      or search.sort != f"asc_{search.modified_field_id}"):
            raise ValueError("search.modified_order: true needs discovery: search, no `group:` (a group's time is "
                             "its newest asset's, ahead of its place in the listing), modified_field_id, and sort: "
                             "asc_<modified_field_id>")
        return self


@dataclass
class _Overlap:
    """Paging by offset with shift_check: each page after the first is asked for from one item early, which must
    be the last item of the page before. When it is not, the listing moved under the paging (one item gone and
    another come between two pages move a later one back onto a page already read, with no count changing): the
    page is taken whole (the item that moved back may be in it) and a ListingMoved comes with it. It takes a
    stable order, which is not documented for a folder's children."""

    enabled: bool
    last: str | None = None  # the item ending the page before, asked for again at the start of the next

    def window(self, after: int, size: int) -> tuple[int, int]:
        """The `after` and `limit` to ask for the page at `after`."""
        early = self.last is not None
        return after - early, size + early

    def split(self, page: list[dict], start: int, moved: str, item: str) -> tuple[list[dict], ListingMoved | None]:
        """The page's new items, and whether the listing moved (`moved` says what moved, `item` what it lists)."""
        if self.last is None:
            return page, None
        if page and page[0].get("asset_id") == self.last:
            return page[1:], None
        return page, ListingMoved(f"{moved} ({item} {self.last} is no longer at position {start}): one may have "
                                  "been passed over")

    def ended(self, page: list[dict]) -> None:
        self.last = page[-1].get("asset_id") if self.enabled and page else None


class OtmmSource:
    # Settings that change how OTMM is reached, not what it lists (gcis_etl.pipelines.TRANSPORT).
    transport_settings = ("auth", "username", "client_id", "bearer_otmm_token", "relogin_statuses", "extra_headers",
                          "api_path", "contents_params", "search.method", "search.page_size", "search.shift_check",
                          "folder.page_size", "folder.shift_check")
    def __init__(self, settings: OtmmSettings, name: str = "otmm"):
        self.name = name
        self.settings = settings
        self.http = HttpSession(settings, _error_words)
        self.http.headers.update({"Accept": "application/json", **settings.extra_headers})
        register(settings.password.get_secret_value(),
                               settings.client_secret.get_secret_value() if settings.client_secret else None)
        register(*settings.extra_headers.values())  # where a gateway's API key or Authorization header goes
        self.http.on_unauthorized = self._relogin
        self.http.relogin_statuses = settings.relogin_statuses
        self._token: str | None = None
        self._login_lock = threading.Lock()
        self._api = self.http.url(settings.api_path.strip("/"))  # no user-info: locators are made from it
        self._unread_counts: set[str] = set()  # the search counts warned of as not numbers
        self._checksum_not_md5 = False  # warned of (content_checksum: auto)
        self._warn_lock = threading.Lock()
        self.lists_in_modified_order = settings.search.modified_order  # validated: sorted on the modified field
        field = settings.search.modified_field_id or "<search.modified_field_id>"
        self.modified_order_setting = (f"search.sort: asc_{field} and search.modified_order: true"
                                       if settings.discovery == "search" and settings.group is None else None)
        # an asset id is the asset's wherever it is grouped: one whose group field changed has moved (alone, each
        # asset is its own object and never moves)
        self.item_ids_unique = settings.group is not None

    # --- the Source protocol ----------------------------------------------------------------------------

    def changes(self, since: datetime | None = None,
                until: datetime | None = None) -> Iterator[SourceObject | UnreadableObject]:
        since = as_utc(since) if since else None
        until = as_utc(until) if until else None
        groups_done: set[str] = set()
        assets_seen: set[str] = set()
        grouped = self.settings.group is not None
        for summary in self._discover(since):
            if isinstance(summary, ListingMoved):
                yield summary
                continue
            if not grouped and self._left_out(summary):
                continue  # a withdrawn member is read all the same: its group (one of its fields) goes on without it
            relisted = summary["asset_id"] in assets_seen  # the listing moved: the run must see its group again
            assets_seen.add(summary["asset_id"])
            if not within(_updated(summary), since, until):
                continue
            object_id = summary["asset_id"]  # the asset's group, once the asset is read
            try:
                asset = self._read(summary["asset_id"])
                if (not grouped and self._left_out(asset)) or not within(_updated(asset), since, until):
                    continue
                if not grouped:
                    obj = self._object(object_id, [asset])
                else:
                    object_id = self._group_value(asset) or asset["asset_id"]
                    if object_id in groups_done and not relisted:
                        continue
                    groups_done.add(object_id)
                    obj = self._group(object_id, asset)
                    if obj is None:
                        continue
            except DESCRIBE_ERRORS as exc:
                if not (isinstance(exc, ObjectNotFound) and self._left_out(summary)):  # listed withdrawn, gone since
                    yield unreadable(self, object_id, _updated(summary), exc)
                continue
            yield replace(obj, listed_at=_updated(summary))  # where the listing had it, not as read since

    def get(self, object_ids: Iterable[str]) -> Iterator[SourceObject]:
        for object_id in object_ids:
            if self.settings.group is None:
                yield self._object(object_id, [self._asset(object_id)])
                continue
            members = self._group_members(object_id)
            if not members:
                raise ObjectNotFound(f"{self.name}: no asset has {self.settings.group.field_id} = {object_id!r}")
            yield self._object(object_id, members)

    def fetch(self, item: SourceItem, dest_dir: Path) -> FetchedFile:
        """contents_params are added here, not to the locator, which a Celery task message carries: they may be
        credentials."""
        params = self.settings.contents_params if self.settings.content == "contents" else None
        ours = self.http.on_source(item.locator)  # a content URL on another host goes without credentials

        def open_body(budget):
            self._ensure_login()
            return self.http.download(item.locator, budget, params=params, credentials=ours)

        if self.settings.content_checksum != "auto" or item.fixity is None:
            return fetch_verified(item, Path(dest_dir), open_body, self.settings.retry)
        unchecked = replace(item, fixity=None)
        return self._checked_by_content_checksum(
            item, lambda: fetch_verified(unchecked, Path(dest_dir), open_body, self.settings.retry))

    def _checked_by_content_checksum(self, item: SourceItem, download: Callable[[], FetchedFile]) -> FetchedFile:
        """content_checksum: auto. Whether an asset's content_checksum is an MD5 of its content is not documented:
        a master whose MD5 is not it is downloaded again. The second matching it, the first was damaged on the
        way; the two agreeing with each other, the site's checksum is something else (warned of once, and taken
        unchecked); the two differing, the transfer damages masters: the item fails, and the next run tries it
        again."""
        first = download()
        if _md5(first.path) == item.fixity.value:
            return replace(first, item=item, fixity_verified=True)
        first_sha256 = first.sha256
        first.path.unlink()  # before the second arrives: scratch holds one master, and has room for it
        second = download()
        if _md5(second.path) == item.fixity.value:
            log.info("%s: asset %s: the first download did not have the content_checksum's MD5, the second has",
                     self.name, item.id)
            return replace(second, item=item, fixity_verified=True)
        if second.sha256 == first_sha256:
            with self._warn_lock:
                warn, self._checksum_not_md5 = not self._checksum_not_md5, True
            if warn:
                log.warning("%s: asset %s: two downloads of the master agree with each other but not with its "
                            "content_checksum, so this site's content_checksum is no MD5 of the content: such a "
                            "master is downloaded twice and taken unchecked; set content_checksum: none under the "
                            "pipeline's source: to download each once", self.name, item.id)
            return second
        second.path.unlink(missing_ok=True)
        raise FetchIntegrityError(f"{self.name}: asset {item.id}: two downloads of the master differ (SHA-256 "
                                  f"{first_sha256[:16]}…, {second.sha256[:16]}…) and neither has the MD5 of its "
                                  "content_checksum: a damaged transfer (the next run tries again)")

    def reachable(self) -> None:
        """The root folders (documented, a handful), on the session: the API every asset is described and
        served by answers (connectors.base.source_down)."""
        self._ensure_login()
        self.http.answers(f"{self._api}/folders/rootfolders", {"load_type": "system", "limit": "0"})

    def close(self) -> None:
        """End the session (`DELETE /sessions`), which the server would otherwise keep until it times out: every
        cron run logs in anew. Best effort, asked once: a failure is logged, never raised (the run's outcome does
        not hang on it). An OAuth token has no logout; it is dropped all the same. The source logs in again if
        used after."""
        with self._login_lock:
            if self._token is None:
                return
            self._token = None
            if self.settings.auth == "session":
                once = RetryBudget(self.settings.retry.model_copy(update={"max_attempts": 1}))
                once.start_attempt()  # the request's own, as a caller's budget has it counted
                try:
                    self.http.request("DELETE", f"{self._api}/sessions", relogin=False, budget=once)
                    log.debug("%s: logged out of OTMM", self.name)
                except SourceError as exc:
                    log.log(logging.DEBUG if isinstance(exc, AuthenticationFailed) else logging.WARNING,
                            "%s: the OTMM session was not ended (the server ends it when it times out): %s",
                            self.name, exc)

    # --- session ----------------------------------------------------------------------------------------

    def _ensure_login(self) -> None:
        if self._token is None:
            with self._login_lock:
                if self._token is None:
                    self._login()

    def _relogin(self, response: requests.Response) -> None:
        """Called on 401: log in again unless another thread already did since this request was sent (asked under
        the lock, where a login under way has finished: parallel downloads on one expired session log in once)."""
        sent = (response.request.headers.get("otmmauthtoken"),
                response.request.headers.get("Authorization", "").rpartition(" ")[2])
        with self._login_lock:
            if self._token is None or self._token in sent:
                self._login()

    def _login(self) -> None:
        """A damaged answer (not JSON, a token that cannot go in a header) says nothing of the credentials: the
        login is asked for again, as after a transient failure, within the same retry budget."""
        budget = RetryBudget(self.settings.retry)
        while True:
            budget.start_attempt()
            try:
                token, headers = self._new_session(budget)
                break
            except SourceDataError as exc:
                budget.after_failure(str(exc), give_up=SourceDataError)
        self.http.headers.update(headers)
        self._token = token
        log.info("%s: logged in to OTMM as %s (%s)", self.name, self.settings.username, self.settings.auth)

    def _new_session(self, budget: RetryBudget) -> tuple[str, dict[str, str]]:
        """The token that authenticates, and the headers that carry it."""
        s = self.settings
        credentials = {"username": s.username, "password": s.password.get_secret_value()}
        if s.auth == "oauth":
            data = self._json(self.http.request("POST", f"{self._api}/sessions/oauth2/token", relogin=False,
                                                budget=budget, data={
                **credentials, "grant_type": "password", "client_id": s.client_id,
                "client_secret": s.client_secret.get_secret_value()}), "OAuth token")
            token = _header_value(_path(data, "token_info", "oauth_token", "accessToken"), "OAuth access token")
            register(token)
            return token, {"Authorization": f"Bearer {token}"}
        response = self.http.request("POST", f"{self._api}/sessions", relogin=False, budget=budget, data=credentials)
        session = _path(self._json(response, "session"), "session_resource", "session")
        token = _header_value(_path(session, "message_digest"), "session's message_digest")
        session_id = _header_value(_path(session, "id"), "session's id")
        # the cookie authenticates as the digest does; the session id goes with it (X-Requested-By)
        register(token, response.cookies.get("JSESSIONID"), session_id)
        headers = {"X-Requested-By": session_id, "otmmauthtoken": token}
        if s.bearer_otmm_token:
            headers["Authorization"] = f"Bearer otmmToken {token}"
        return token, headers

    def _get(self, path: str, params: dict | None = None, what: str = "") -> Any:
        self._ensure_login()
        return self._json(self.http.request("GET", f"{self._api}/{path}", params=params), what or path)

    def _json(self, response: requests.Response, what: str) -> Any:
        try:
            return response.json()
        except ValueError:
            refuse_html(response.content, response.headers.get("Content-Type"), f"{self.name}: {what}", "JSON")
            raise SourceDataError(f"{self.name}: {what}: the response is not JSON") from None

    # --- discovery --------------------------------------------------------------------------------------

    def _discover(self, since: datetime | None) -> Iterator[dict | ListingMoved]:
        if self.settings.discovery == "search":
            if since is None and self.settings.search.modified_field_id:
                self._probe_modified_clause()
            return self._search(self._conditions(since))
        if self.settings.discovery == "folder":
            return self._walk(self.settings.folder.folder_id)
        return ({"asset_id": asset_id} for asset_id in dict.fromkeys(self.settings.id_list.read()))  # once each

    def _conditions(self, since: datetime | None) -> list[dict]:
        s = self.settings.search
        conditions = [dict(c) for c in s.conditions]
        if since and s.modified_field_id:
            conditions.append({"type": "com.artesia.search.SearchScalarCondition",
                               "metadata_field_id": s.modified_field_id,
                               "relational_operator_id": s.modified_operator_id,
                               "value": since.strftime(s.modified_value_format)})
        for condition in conditions[1:]:
            condition.setdefault("relational_operator", "and")
        return conditions

    def _probe_modified_clause(self) -> None:
        """The probe: a listing without `since` (a first run, a dry run, a full listing) sends no date clause, so a
        wrong modified_field_id or modified_operator_id would pass it and fail only the next run, once a checkpoint
        is kept. The date query is sent first, once, since the epoch with limit 1: a server refusing it fails this
        run at once, with _search_page's message naming the search settings."""
        self._ensure_login()
        self._search_page({**self._search_params(self._conditions(datetime(1970, 1, 1, tzinfo=timezone.utc))),
                           "after": "0", "limit": "1"})

    def _search_params(self, conditions: list[dict]) -> dict[str, str]:
        """A search's parameters but its page's (after, limit)."""
        s = self.settings.search
        params = {"keyword_query": s.keyword_query, "load_type": s.load_type, "level_of_detail": s.level_of_detail}
        for name, value in (("folder_filter", s.folder_filter), ("search_config_id", s.search_config_id),
                            ("sort", s.sort)):
            if value:
                params[name] = value
        if conditions:
            params["search_condition_list"] = json.dumps({"search_condition_list": {"search_condition": conditions}})
        return params

    def _search(self, conditions: list[dict]) -> Iterator[dict | ListingMoved]:
        """Paged by offset, each page after the first overlapping the one before (_Overlap): a total_hit_count
        that changes between pages, or a page not starting with the last asset of the one before, says the result
        moved under the listing (one deleted and one added between two pages leave the count as it was).
        The count alone does not end it (a capped or estimated count would pass over the rest): a full page is
        followed by another; a short one ends it once the count is reached (less means the server caps its
        pages); without a count, only a page with nothing new does. Such a page short of the count says the rest
        went unserved (a deep-paging cap): a ListingCut."""
        s = self.settings.search
        base = self._search_params(conditions)
        after, total = 0, None
        overlap = _Overlap(s.shift_check)
        previous: set[str] = set()
        while True:
            self._ensure_login()
            start, limit = overlap.window(after, s.page_size)
            params = {**base, "after": str(start), "limit": str(limit)}
            response = self._search_page(params)
            resource = _path(self._json(response, "search"), "search_result_resource")
            result = _path(resource, "search_result")
            assets = resource.get("asset_list") or [{"asset_id": i} for i in result.get("asset_id_list", [])]
            count = self._count(result, "total_hit_count", "paging on until a page comes back empty, and unable to "
                                                           "tell whether the search moved between pages")
            # an empty page says nothing of its first asset: the counts tell a shrunk search or a deep-paging cap
            new, moved = overlap.split(assets, start, "the search changed while it was paged", "asset") if assets \
                else ([], None)
            if s.shift_check and None not in (total, count) and count != total:
                moved = ListingMoved(f"the search's total_hit_count went from {total} to {count} between two pages "
                                     f"(at after={after}): assets left or joined it while it was paged, and one may "
                                     "have been passed over")
            total = count
            previous = self._advancing(new, previous, f"the search's page at after={start}")
            hits = self._count(result, "hit_count", "counting the assets the page holds")
            hits = len(assets) if hits is None else hits
            served, after = after, start + hits  # served: the assets before this page
            cut = None
            if not new and s.shift_check and total is not None and served < total:
                cut = ListingCut(f"the server gave no more assets at after={served} of total_hit_count {total}: "
                                 "the assets past it were not served (as by a server that caps how deep it pages)")
            yield from filter(None, (moved, cut))
            yield from new
            if not new or (hits < limit and total is not None and after >= total):
                return
            overlap.ended(assets)

    def _search_page(self, params: dict) -> requests.Response:
        """A search the server refuses as a bad request (400) is refused for a search setting, whatever the run
        does again: the message names the settings that make the search."""
        method = self.settings.search.method
        try:
            return (self.http.request("POST", f"{self._api}/search/text", data=params) if method == "POST"
                    else self.http.request("GET", f"{self._api}/search/text", params=params))
        except SourceRequestFailed as exc:
            if exc.status != 400:
                raise
            raise SourceRequestFailed(f"{exc}; the server refused the search itself: check the search settings "
                                      "under source.search (modified_field_id, modified_operator_id, "
                                      "modified_value_format, conditions, sort, search_config_id, folder_filter, "
                                      "keyword_query, method); running again will not help", 400) from None

    def _advancing(self, page: list[dict], previous: set[str], where: str) -> set[str]:
        """The page's asset ids. A page holding only assets of the page before is the server not paging (it
        ignores `after`): paging on would ask for the same page for ever. Only the page before is kept: a
        listing of millions holds no set of them all."""
        ids = {asset.get("asset_id") for asset in page}
        if page and ids <= previous:
            raise SourceDataError(f"{self.name}: {where} holds only assets of the page before, where the next ones "
                                  "were expected: the server does not page by `after`")
        return ids

    def _count(self, result: dict, key: str, instead: str) -> int | None:
        """One of the search result's counts; None when it is absent or no whole number ("many", "1,234"), which
        is warned of once: the listing is not lost for a count it can do without."""
        value = result.get(key)
        if (isinstance(value, int) and not isinstance(value, bool)
                or isinstance(value, str) and value.isascii() and value.isdigit()):
            return int(value)
        if value is not None and key not in self._unread_counts:
            self._unread_counts.add(key)
            log.warning("%s: the search's %s is %r, not a number; %s", self.name, key, value, instead)
        return None

    def _walk(self, folder_id: str) -> Iterator[dict | ListingMoved]:
        folder = self.settings.folder
        after, overlap = 0, _Overlap(folder.shift_check)
        previous: set[str] = set()
        while True:
            start, limit = overlap.window(after, folder.page_size)
            page = _path(self._get(f"folders/{folder_id}/children", {
                "after": str(start), "limit": str(limit), "load_type": "system",
                "level_of_detail": "slim"}), "folder_children").get("asset_list", [])
            new, moved = overlap.split(page, start, f"folder {folder_id} changed while its children were paged",
                                        "child")
            previous = self._advancing(new, previous, f"folder {folder_id}'s page of children at after={start}")
            if moved:
                yield moved
            for child in new:
                if child.get("data_type") == "CONTAINER":
                    if folder.recursive:
                        yield from self._walk(child["asset_id"])
                else:
                    yield child
            if len(page) < limit:
                return
            after = start + len(page)
            overlap.ended(page)

    # --- objects ----------------------------------------------------------------------------------------

    def _withdrawn(self, asset: dict) -> str | None:
        """Why an asset is not to be harvested: deleted, expired unless `expired: harvest` (OpenText's own
        pyxecm treats an expired asset as a deleted one, dam-apis.md 2.4), or an old version unless `versions:
        all` (whether a search lists old versions is not documented: they are passed over wherever they come)."""
        if asset.get("deleted"):
            return "deleted"
        if asset.get("expired") and self.settings.expired == "skip":
            return "expired (expired: skip)"
        if asset.get("latest_version") is False and self.settings.versions == "latest":
            return (f"an old version of {asset.get('original_asset_id') or 'its original'}, not its latest "
                    "(versions: latest)")
        return None

    def _left_out(self, asset: dict) -> bool:
        """A listed asset that is withdrawn is passed over, with a note, not failed: there is nothing to harvest."""
        withdrawn = self._withdrawn(asset)
        if withdrawn:
            log.info("%s: asset %s is %s; nothing to harvest", self.name, asset.get("asset_id"), withdrawn)
        return withdrawn is not None

    def _asset(self, asset_id: str) -> dict:
        """An asset asked for by id, or as a group's member: a withdrawn one is not there to harvest."""
        asset = self._read(asset_id)
        withdrawn = self._withdrawn(asset)
        if withdrawn:
            raise ObjectNotFound(f"{self.name}: asset {asset_id} is {withdrawn}")
        return asset

    def _read(self, asset_id: str) -> dict:
        try:
            return _path(self._get(f"assets/{asset_id}", {"load_type": "full", "level_of_detail": "full"},
                                   f"asset {asset_id}"), "asset_resource", "asset")
        except SourceRequestFailed as exc:
            if exc.status == 404:
                raise ObjectNotFound(f"{self.name}: no asset {asset_id} "
                                     f"(or not visible to {self.settings.username})") from None
            raise

    def _group_value(self, asset: dict) -> str | None:
        values = _flatten(asset).get(self.settings.group.field_id, [])
        return values[0] if values else None

    def _group(self, key: str, asset: dict) -> SourceObject | None:
        """The changed asset's group, without the asset if it is withdrawn (it has left the group, which changed
        with it); None when nothing of it is left to harvest."""
        if not self._group_value(asset):
            return None if self._left_out(asset) else self._object(key, [asset])
        members = self._group_members(key)
        withdrawn = self._withdrawn(asset)
        if withdrawn is None:
            return self._object(key, members or [asset])
        log.info("%s: asset %s is %s; it has left group %s%s", self.name, asset["asset_id"], withdrawn, key,
                 "" if members else ", which has no other member: nothing to harvest")
        return self._object(key, members) if members else None

    def _group_members(self, value: str) -> list[dict]:
        """A member search that moved while paged may have passed a member over, and an old member is never listed
        again to bring its group back: the search is run again, and a group that keeps moving is not described."""
        group = self.settings.group
        condition = {"type": "com.artesia.search.SearchScalarCondition", "metadata_field_id": group.field_id,
                     "relational_operator_id": group.operator_id, "value": value}
        for _ in range(GROUP_SEARCHES):
            listed = list(self._search([condition]))
            if not any(isinstance(s, ListingMoved) for s in listed):
                # a summary carrying the field (search.load_type: metadata) with another value is another group's
                # asset that the operator matched (CONTAINS finds O1 in O10, O100...): it is not read to be told so
                listed = [s for s in listed if self._group_value(s) in (None, value)]
                members = [m for m in map(self._member, listed) if m is not None]
                return [m for m in members if self._group_value(m) == value]
        raise SourceDataError(f"{self.name}: the members of group {value!r} ({group.field_id}) changed while they "
                              f"were listed, {GROUP_SEARCHES} times in a row (assets joined or left it between two "
                              "pages of its search): one may have been passed over, so it is not deposited short; "
                              "the next run tries again")

    def _member(self, summary: dict) -> dict | None:
        """A listed member's asset; None when it is withdrawn (deleted or expired, _withdrawn), or gone since the
        search: it left the group, as one whose group field changed does (an ObjectNotFound here would say the
        whole group is gone)."""
        try:
            return self._asset(summary["asset_id"])
        except ObjectNotFound:
            return None

    def _object(self, object_id: str, assets: list[dict]) -> SourceObject:
        sequence_field = self.settings.group.sequence_field_id if self.settings.group else None

        def order(asset: dict) -> tuple:
            sequence = (_flatten(asset).get(sequence_field) or [""])[0] if sequence_field else ""
            return natural_key(sequence), natural_key(asset.get("name", ""))

        assets = sorted(assets, key=order)
        items = tuple(self._item(asset, n) for n, asset in enumerate(assets, 1))
        metadata: dict[str, list[LangValue]] = {}
        for asset in assets:
            for key, values in self._metadata(asset).items():
                known = metadata.setdefault(key, [])
                known += [v for v in values if v not in known]
        modified = max([m for m in (_updated(a) for a in assets) if m] or [datetime.now(timezone.utc)])
        return SourceObject(id=object_id, modified=modified, items=items,
                            metadata={k: tuple(v) for k, v in metadata.items()},
                            source_url=source_url(self.settings.source_url_template, object_id,
                                                  base_url=self.http.base_url))

    def _item(self, asset: dict, sequence: int) -> SourceItem:
        s = self.settings
        asset_id = asset["asset_id"]
        master = asset.get("master_content_info") or (asset.get("asset_content_info") or {}).get("master_content")
        if s.content == "rendition":
            info = (asset.get("rendition_content") or {}).get(f"{s.rendition}_content")
            if not info or not info.get("url"):
                raise SourceDataError(f"{self.name}: asset {asset_id} has no {s.rendition} rendition")
        elif s.content == "master" and not master:
            raise SourceDataError(f"{self.name}: asset {asset_id} has no master content")
        else:
            info = master or {}  # contents: the master's size and checksum when given, else none to check
        if s.content == "contents":
            locator = f"{self._api}/assets/{asset_id}/contents"
        else:
            if not info.get("url"):
                raise SourceDataError(f"{self.name}: asset {asset_id}: the {s.content} content has no url")
            locator = self._content_url(info["url"])
        size = info.get("content_size")
        checksum = info.get("content_checksum")
        return SourceItem(
            id=asset_id, sequence=sequence, original_name=info.get("name") or asset.get("name") or asset_id,
            size=int(size) if isinstance(size, int) or str(size).isdigit() else None, modified=_updated(asset),
            fixity=fixity("md5", checksum) if s.content_checksum != "none" and checksum else None,
            label=None, locator=locator)

    def _content_url(self, url: str) -> str:
        """A content field's url: a path on the API's host (as documented), or an absolute URL, used as it is
        (without user-info, which the session sends itself)."""
        return self.http.credential_free(url) if urlsplit(url).scheme else self.http.url(url)

    def _metadata(self, asset: dict) -> dict[str, list[LangValue]]:
        s = self.settings
        fields = _flatten(asset)
        fields.update({f"asset.{k}": [str(v)] for k, v in asset.items() if isinstance(v, (str, int, float))})
        metadata: dict[str, list[LangValue]] = {}
        for field_id, values in fields.items():
            key = s.metadata_map.get(field_id)
            if key is None and not (s.include_unmapped and not field_id.startswith("asset.")):
                continue
            for value in values:
                metadata.setdefault(key or field_id, []).append(LangValue(value, s.metadata_language))
        return metadata


def _flatten(asset: dict) -> dict[str, list[str]]:
    """metadata_element_list, nested categories and tables, as {field id: [values]} (display values first)."""
    fields: dict[str, list[str]] = {}

    def walk(elements: list, table: str | None) -> None:
        for element in elements or []:
            if not isinstance(element, dict):
                continue
            values = [_scalar(element.get("value"))] + [_scalar(v) for v in element.get("values") or []]
            values = [v for v in values if v]
            for field_id in filter(None, (element.get("id"), table)):
                if values:
                    fields.setdefault(field_id, []).extend(values)
            is_table = str(element.get("type", "")).endswith("TableField")
            walk(element.get("metadata_element_list"), element.get("id") if is_table else table)

    walk(((asset.get("metadata") or {}).get("metadata_element_list")), None)
    return fields


def _scalar(wrapper: Any) -> str | None:
    """A metadata value: {"value": {"value": x}} or {"value": {"display_value": x, "field_value": {...}}}."""
    value = wrapper.get("value") if isinstance(wrapper, dict) else None
    if isinstance(value, dict):
        found = value.get("display_value") or value.get("value") or (value.get("field_value") or {}).get("value")
        return None if found is None or isinstance(found, (dict, list)) else str(found).strip() or None
    return None


def _md5(path: Path) -> str:
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "md5").hexdigest()


def _updated(asset: dict) -> datetime | None:
    return parse_timestamp(asset.get("date_last_updated")) or parse_timestamp(asset.get("date_imported"))


def _error_words(body: str) -> str | None:
    """What an OTMM error body says (dam-apis.md §2.9), what it means first: exception_body's message and error_code,
    then its debug_message (which comes before them, and may echo the whole request); None for any other body (a
    proxy's page, a gateway's JSON)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: JSON nested deeper than Python parses
        return None
    error = data.get("exception_body") if isinstance(data, dict) else None
    if not (isinstance(error, dict) and (error.get("message") or error.get("error_code"))):
        return None
    message, code, debug = error.get("message"), error.get("error_code"), error.get("debug_message")
    meaning = f"{message} ({code})" if message and code else f"{message or code}"
    return f"{meaning}; {debug}" if debug else meaning


def _header_value(value: Any, what: str) -> str:
    """A login answer's value that goes in a header: printable ASCII, else a SourceDataError (a damaged answer)
    that does not show it, where sending it would fail in http.client's encoding."""
    text = str(value)
    if not (text and text.isascii() and text.isprintable() and text == text.strip()):
        raise SourceDataError(f"OTMM login: the {what} cannot go in a request header (a damaged answer?)")
    return text


def _path(data: Any, *keys: str) -> Any:
    """data[k1][k2]...; a missing key is a SourceDataError naming the path (the JSON shape changed)."""
    for depth, key in enumerate(keys):
        if not isinstance(data, dict) or key not in data:
            raise SourceDataError(f"OTMM response lacks {'.'.join(keys[:depth + 1])}")
        data = data[key]
    return data
