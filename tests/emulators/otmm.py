"""OpenText Media Management emulator: the documented REST subset a harvester uses (reference/dam-apis.md §2).

- `POST /otmmapi/v6/sessions` (form username/password) -> session_resource.session{id, message_digest, ...} and a
  JSESSIONID cookie; `GET`/`DELETE /sessions`; `POST /sessions/oauth2/token` (password grant) -> token_info.
- Every other call needs a valid session (JSESSIONID cookie, `otmmauthtoken: <digest>` or
  `Authorization: Bearer otmmToken <digest>`) plus `X-Requested-By: <session id>`, or an OAuth bearer token.
  An unknown or expired session answers 401 with an exception_body; a missing X-Requested-By answers 400.
- `GET|POST /search/text`: keyword_query, after/limit paging (hit_count, total_hit_count, offset),
  search_condition_list of SearchScalarConditions, folder_filter, sort, load_type.
- `GET /assets/{id}` (`expired`, `deleted` true for an Asset so marked; `original_asset_id`, `version` and
  `latest_version` of a checked-in version; no master content info for one without a master),
  `GET /assets/{id}/contents` (or a redirect to where `contents_redirect` says: a presigned storage URL),
  `GET /renditions/{content_id}` (bytes, streamed; content urls absolute when `content_url_base` is set);
  downloads need the user's "download" right (403 otherwise, as Getty restricts "Download Original").
- `GET /folders/rootfolders`, `/folders/{id}/folders`, `/folders/{id}/children` (after/limit).

The reference could not confirm a last-modified search field or date operators; this emulator offers
MODIFIED_FIELD with DATE_OPERATORS, names a connector must be configured with. Bytes are corpus files.
Run standalone: `python -m tests.emulators.otmm --port 11090`.
"""
from __future__ import annotations

import hashlib
import json
import re
import secrets
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from http.cookies import SimpleCookie
from operator import eq, ge, gt, le, lt
from pathlib import Path
from typing import Callable

from tests.emulators.catalogue import CorpusFile, utc
from tests.emulators.server import Request, Response, run_cli

API = "/otmmapi/v6"
MODIFIED_FIELD = "ARTESIA.FIELD.DATE LAST MODIFIED"
DATE_OPERATORS = {"ARTESIA.OPERATOR.DATE.IS ON OR AFTER": ge, "ARTESIA.OPERATOR.DATE.IS AFTER": gt,
                  "ARTESIA.OPERATOR.DATE.IS ON OR BEFORE": le, "ARTESIA.OPERATOR.DATE.IS BEFORE": lt}
ISO = "%Y-%m-%dT%H:%M:%SZ"


@dataclass(frozen=True)
class Domain:
    """A domained field's value: what users see and the stored code."""

    display: str
    code: str


FieldValue = str | Domain | list[str]


@dataclass
class Asset:
    name: str
    master: CorpusFile
    folder: str
    imported: datetime
    updated: datetime
    fields: dict[str, FieldValue]
    preview: CorpusFile = CorpusFile("gray8/hopper_gray.jpg")
    thumbnail: CorpusFile = CorpusFile("png/png-rgb-64x56x8.png")
    expired: bool = False  # past its expiration date: served, listed and downloadable all the same
    deleted: bool = False  # flagged deleted (in the recycle bin): served and listed all the same
    original_asset_id: str | None = None  # a checked-in version's first asset (None: this one)
    version: int = 1
    latest_version: bool = True  # False once a newer version is checked in: listed and served all the same
    has_master: bool = True  # False: a metadata-only asset (content_type NONE), without master content info

    @property
    def asset_id(self) -> str:
        return hashlib.sha1(f"asset:{self.name}".encode()).hexdigest()

    def content_id(self, kind: str) -> str:
        return hashlib.sha1(f"{kind}:{self.name}".encode()).hexdigest()


@dataclass
class Folder:
    asset_id: str
    name: str
    parent: str | None


@dataclass(frozen=True)
class User:
    password: str
    can_download: bool


@dataclass
class Session:
    id: int
    login: str
    digest: str
    cookie: str
    valid: bool = True


class OtmmCatalogue:
    def __init__(self, assets: list[Asset], folders: list[Folder]):
        self.assets = {a.asset_id: a for a in assets}
        self.folders = {f.asset_id: f for f in folders}
        self.lock = threading.Lock()

    def by_name(self, name: str) -> Asset:
        return next(a for a in self.assets.values() if a.name == name)

    def touch(self, asset_id: str, when: datetime | None = None) -> None:
        with self.lock:
            self.assets[asset_id].updated = (when or datetime.now(timezone.utc)).replace(microsecond=0)

    def in_folder(self, asset: Asset, folder_id: str) -> bool:
        current: str | None = asset.folder
        while current is not None:
            if current == folder_id:
                return True
            current = self.folders[current].parent
        return False


ROOT, SCULPTURE, ARCHIVE = (hashlib.sha1(n.encode()).hexdigest() for n in ("GCIS Masters", "Sculpture", "Archive"))


def seed() -> OtmmCatalogue:
    """Six assets: object 2019.M.1 is three assets (sequences 1, 2, 10), 2019.M.10 contains "2019.M.1" as a
    substring, folders GCIS Masters > Sculpture hold five of them, the sixth is in another root folder."""
    f = CorpusFile

    def fields(title: str, number: str, sequence: str, department: Domain, keywords: list[str]) -> dict:
        return {"GTRUST.FIELD.TITLE": title, "GTRUST.FIELD.OBJECT NUMBER": number, "GTRUST.FIELD.SEQUENCE": sequence,
                "GTRUST.FIELD.DEPARTMENT": department, "GTRUST.FIELD.KEYWORDS": keywords,
                "GTRUST.FIELD.CREDIT LINE": "Digital image courtesy of the Getty's Open Content Program"}

    paintings, sculpture = Domain("Paintings", "PAINT"), Domain("Sculpture & Decorative Arts", "SCULP")
    return OtmmCatalogue([
        Asset("2019_M_1_recto.tif", f("rgb8-tiff-lzw/kodim02-lzw.tif"), ROOT, utc("2023-12-01 10:00:00"),
              utc("2024-01-05 10:00:00"), fields("Irises", "2019.M.1", "1", paintings, ["iris", "flower"])),
        Asset("2019_M_1_verso.tif", f("rgb8-tiff-uncompressed/hopper.tif"), ROOT, utc("2023-12-01 10:00:00"),
              utc("2024-01-06 10:00:00"), fields("Irises", "2019.M.1", "2", paintings, ["verso"])),
        Asset("2019_M_1_detail.jpg", f("jpeg-progressive/bentheim_pulver_turm.jpg"), ROOT,
              utc("2023-12-01 10:00:00"), utc("2024-03-01 10:00:00"),
              fields("Irises", "2019.M.1", "10", paintings, ["detail"])),
        Asset("84_PA_1.png", f("png/png-rgb-64x56x8.png"), SCULPTURE, utc("2023-12-02 10:00:00"),
              utc("2024-02-01 10:00:00"), fields("Bust", "84.PA.1", "1", sculpture, [])),
        Asset("2019_M_10.tif", f("tiled-tiff/tiled-rgb-u8.tif"), SCULPTURE, utc("2023-12-03 10:00:00"),
              utc("2024-04-01 10:00:00"), fields("Vase", "2019.M.10", "1", sculpture, ["vase"])),
        Asset("86_XM_2.jpg", f("icc-adobergb/sample.jpg"), ARCHIVE, utc("2023-12-04 10:00:00"),
              utc("2024-05-01 10:00:00"), fields("Letter", "86.XM.2", "1", paintings, ["archive"])),
    ], [Folder(ROOT, "GCIS Masters", None), Folder(SCULPTURE, "Sculpture", ROOT), Folder(ARCHIVE, "Archive", None)])


USERS = {"tsuper": User("otmm-Secret-3", True), "viewer": User("viewer-Secret-4", False)}
CLIENTS = {"gcis-etl": "client-Secret-5"}


class OtmmEmulator:
    def __init__(self, catalogue: OtmmCatalogue | None = None, users: dict[str, User] | None = None,
                 clients: dict[str, str] | None = None):
        self.catalogue = catalogue or seed()
        self.users = USERS if users is None else users
        self.clients = CLIENTS if clients is None else clients
        self.sessions: dict[int, Session] = {}
        self.tokens: dict[str, str] = {}
        self._lock = threading.Lock()
        self._next_session = 471542185
        # what a search's total_hit_count says of its matches (a server may cap or estimate it, or write it as
        # no number: "many"), and its hit_count of the page's; None leaves it out
        self.reported_total: Callable[[int], int | str | None] = lambda matches: matches
        self.reported_hits: Callable[[int], int | str | None] = lambda served: served
        self.max_limit: int | None = None  # a server's own cap on a search page, below the limit asked
        self.deepest: int | None = None  # a deep-paging cap: search pages from this offset on come back empty
        self.honours_after = True  # False: search and folder pages start at the first match whatever `after` asks
        self.echoed_headers: tuple[str, ...] = ()  # request headers an error body quotes (as a debug page does)
        # /contents answers a redirect to where this says (a presigned storage URL) rather than the bytes
        self.contents_redirect: Callable[[Asset], str] | None = None
        self.content_url_base = ""  # prefixed to the content urls an asset gives (an absolute URL, on any host)
        # what a content's content_checksum is: an MD5 of it here; a site's may be something else (undocumented)
        self.content_checksum: Callable[[CorpusFile], str] = lambda source: source.digest("md5")
        # the next this many downloads of content each come with another byte changed, their size right (a link
        # damaging transfers, where the server's `corrupt` fault changes the same byte every time)
        self.garbled = 0
        self._downloads = 0

    def expire_sessions(self) -> None:
        """Invalidate every session and OAuth token, as a server-side timeout or restart would."""
        with self._lock:
            for session in self.sessions.values():
                session.valid = False
            self.tokens.clear()

    def control(self, name: str, request: Request) -> Response:
        """POST /_emulator/expire-sessions; POST /_emulator/touch?asset_id=… (marks an asset updated now);
        POST /_emulator/withdraw?asset_id=…&flag=expired|deleted (sets the flag, and marks the asset updated now)."""
        if name == "expire-sessions":
            self.expire_sessions()
            return Response.text("ok")
        if name == "touch" and request.arg("asset_id") in self.catalogue.assets:
            self.catalogue.touch(request.arg("asset_id"))
            return Response.text("ok")
        if name == "withdraw" and request.arg("asset_id") in self.catalogue.assets \
                and request.arg("flag") in ("expired", "deleted"):
            setattr(self.catalogue.assets[request.arg("asset_id")], request.arg("flag"), True)
            self.catalogue.touch(request.arg("asset_id"))
            return Response.text("ok")
        return Response.text("unknown control or asset", 404)

    def handle(self, request: Request) -> Response:
        response = self._route(request)
        if response.status >= 400 and self.echoed_headers:
            data = json.loads(response.body)
            data["exception_body"]["debug_message"] = "; ".join(
                f"{name}: {request.headers.get(name)}" for name in self.echoed_headers)
            response.body = json.dumps(data).encode()
        return response

    def _route(self, request: Request) -> Response:
        if not request.path.startswith(API + "/"):
            return _error(404, "Not Found")
        path = request.path[len(API):]
        if path == "/sessions":
            return self._sessions(request)
        if path == "/sessions/oauth2/token" and request.method == "POST":
            return self._token(request)
        login = self._authenticate(request)
        if isinstance(login, Response):
            return login
        user = self.users[login]
        if path == "/search/text" and request.method in ("GET", "POST"):
            return self._search(request)
        match = re.fullmatch(r"/assets/([0-9a-f]{40})(/contents)?", path)
        if match and request.method == "GET":
            asset = self.catalogue.assets.get(match.group(1))
            if asset is None:
                return _error(404, "Either the asset does not exist or you do not have permission to view the asset")
            if match.group(2):
                if self.contents_redirect is not None:
                    return Response(302, headers={"Location": self.contents_redirect(asset)})
                return self._content(user, asset.master)
            detail = self._asset(asset, request.arg("load_type") != "system")
            return Response.json({"asset_resource": {"asset": detail}})
        match = re.fullmatch(r"/renditions/([0-9a-f]{40})", path)
        if match and request.method == "GET":
            for asset in self.catalogue.assets.values():
                for kind, source in (("master", asset.master), ("preview", asset.preview),
                                     ("thumbnail", asset.thumbnail)):
                    if asset.content_id(kind) == match.group(1):
                        return self._content(user, source)
            return _error(404, "Content not found")
        if path == "/folders/rootfolders":
            return Response.json({"folders_resource": {"folder_list": [
                self._folder(f) for f in self.catalogue.folders.values() if f.parent is None]}})
        match = re.fullmatch(r"/folders/([0-9a-f]{40})/(folders|children)", path)
        if match and match.group(1) in self.catalogue.folders:
            return self._children(match.group(1), match.group(2), request)
        return _error(404, f"No resource at {path}")

    # --- sessions -------------------------------------------------------------------------------------

    def _sessions(self, request: Request) -> Response:
        if request.method == "POST":
            login, password = request.arg("username") or "", request.arg("password") or ""
            user = self.users.get(login)
            if user is None or user.password != password:
                return _error(401, "Invalid username or password", "AUTHENTICATION_FAILED")
            with self._lock:
                self._next_session += 1
                session = Session(self._next_session, login, secrets.token_hex(20), secrets.token_hex(16))
                self.sessions[session.id] = session
            return Response.json(self._session_resource(session),
                                 headers={"Set-Cookie": f"JSESSIONID={session.cookie}; Path=/otmmapi; HttpOnly"})
        session = self._session(request)
        if session is None:
            return _error(401, "Session is not valid")
        if request.method == "DELETE":
            session.valid = False
            return Response(200)
        return Response.json(self._session_resource(session))

    def _token(self, request: Request) -> Response:
        user = self.users.get(request.arg("username") or "")
        if request.arg("grant_type") != "password":
            return _error(400, "unsupported grant_type")
        if self.clients.get(request.arg("client_id") or "") != request.arg("client_secret"):
            return _error(401, "Invalid client", "INVALID_CLIENT")
        if user is None or user.password != request.arg("password"):
            return _error(401, "Invalid username or password", "AUTHENTICATION_FAILED")
        token = secrets.token_hex(24)
        with self._lock:
            self.tokens[token] = request.arg("username")
        return Response.json({"token_info": {"oauth_token": {"accessToken": token, "tokenType": "Bearer",
                                                             "expiresIn": 3600}}})

    @staticmethod
    def _session_resource(session: Session) -> dict:
        return {"session_resource": {"session": {
            "domain_name": "OTMM", "id": session.id, "local_session": False, "login_name": session.login,
            "message_digest": session.digest, "role_name": "Administrator", "user_full_name": session.login,
            "user_id": "1001", "user_role_id": 1, "validation_key": -2045393682}}}

    def _session(self, request: Request) -> Session | None:
        cookies = SimpleCookie(request.headers.get("Cookie") or "")
        digest = request.headers.get("otmmauthtoken")
        authorization = request.headers.get("Authorization") or ""
        if authorization.startswith("Bearer otmmToken "):
            digest = digest or authorization.split(" ", 2)[2]
        with self._lock:
            for session in self.sessions.values():
                if session.valid and (session.digest == digest or
                                      ("JSESSIONID" in cookies and cookies["JSESSIONID"].value == session.cookie)):
                    return session
        return None

    def _authenticate(self, request: Request) -> str | Response:
        """The login name behind a request, or the error response real OTMM would give."""
        authorization = request.headers.get("Authorization") or ""
        if authorization.startswith("Bearer ") and not authorization.startswith("Bearer otmmToken "):
            with self._lock:
                login = self.tokens.get(authorization[len("Bearer "):].strip())
            return login if login else _error(401, "The access token is not valid", "INVALID_TOKEN")
        session = self._session(request)
        if session is None:
            return _error(401, "Session is not valid or has expired", "SESSION_EXPIRED")
        if request.headers.get("X-Requested-By") != str(session.id):
            return _error(400, "The X-Requested-By header must carry the session id", "CSRF")
        return session.login

    # --- search ---------------------------------------------------------------------------------------

    def _search(self, request: Request) -> Response:
        try:
            after, limit = int(request.arg("after", "0")), int(request.arg("limit", "25"))
            conditions = json.loads(request.arg("search_condition_list") or '{"search_condition_list": {}}')
            conditions = conditions["search_condition_list"].get("search_condition", [])
            keyword = (request.arg("keyword_query") or "*").strip().lower()
            folder = request.arg("folder_filter")
            matches = [a for a in self.catalogue.assets.values()
                       if (keyword in ("", "*") or keyword in a.name.lower())
                       and (not folder or self.catalogue.in_folder(a, folder))
                       and _conditions_hold(a, conditions)]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return _error(400, f"Invalid search request: {exc}", "INVALID_SEARCH")
        sort = request.arg("sort") or ""
        direction, _, sort_field = sort.partition("_")
        key = {"NAME": lambda a: a.name, MODIFIED_FIELD: lambda a: (a.updated, a.asset_id)}.get(
            sort_field, lambda a: a.asset_id)
        matches.sort(key=key, reverse=direction == "desc")
        if self.max_limit is not None:
            limit = min(limit, self.max_limit) if limit > 0 else self.max_limit
        after = after if self.honours_after else 0
        page = matches[after:after + limit] if limit > 0 else matches[after:]
        page = [] if self.deepest is not None and after >= self.deepest else page
        load = request.arg("load_type") not in (None, "system")
        result = {"asset_group_count": {"entry": []}, "asset_id_list": [a.asset_id for a in page],
                  "contains_invalid_conditions": False, "facet_field_response_list": [], "offset": after}
        for key, count in (("total_hit_count", self.reported_total(len(matches))),
                           ("hit_count", self.reported_hits(len(page)))):
            if count is not None:
                result[key] = count
        return Response.json({"search_result_resource": {
            "search_result": result, "asset_list": [self._asset(a, load) for a in page]}})

    # --- assets, contents, folders --------------------------------------------------------------------

    def _asset(self, asset: Asset, with_metadata: bool) -> dict:
        def content(source: CorpusFile, kind: str) -> dict:
            return {"id": asset.content_id(kind), "content_kind": kind.upper(),
                    "content_manager_id": "ARTESIA.CONTENT.DEFAULT", "content_checksum": self.content_checksum(source),
                    "content_size": source.size, "mime_type": source.mime, "name": source.name,
                    "content_path": f"data/repository/{kind}/{source.name}", "unit_of_size": "BYTES",
                    "height": -1, "width": -1,
                    "url": f"{self.content_url_base}{API}/renditions/{asset.content_id(kind)}"}

        data = {
            "asset_id": asset.asset_id, "original_asset_id": asset.original_asset_id or asset.asset_id,
            "name": asset.name, "mime_type": asset.master.mime, "content_type": "BITMAP" if asset.has_master else "NONE",
            "content_size": asset.master.size, "version": asset.version, "latest_version": asset.latest_version,
            "deleted": asset.deleted, "expired": asset.expired, "locked": False,
            "checked_out": False, "asset_state": "NORMAL", "content_state": "NORMAL", "data_type": "ASSET",
            "date_imported": asset.imported.strftime(ISO), "date_last_updated": asset.updated.strftime(ISO),
            "metadata_model_id": "GTRUST.MODEL.MUSEUM", "legacy_model_id": 104,
            "master_content_info": content(asset.master, "master"),
            "rendition_content": {"thumbnail_content": content(asset.thumbnail, "thumbnail"),
                                  "preview_content": content(asset.preview, "preview")},
            "asset_content_info": {"master_content": content(asset.master, "master")},
            "thumbnail_content_id": asset.content_id("thumbnail"),
        }
        if not asset.has_master:
            del data["master_content_info"], data["asset_content_info"]
        if with_metadata:
            data["metadata"] = {"type": "com.artesia.metadata.MetadataModel", "id": "GTRUST.MODEL.MUSEUM",
                                "name": "Museum asset", "has_multilingual_fields": False, "legacy_id": 104,
                                "metadata_element_list": [
                                    _category("ARTESIA.CATEGORY.GENERAL", "General",
                                              {"ARTESIA.FIELD.ASSET NAME": asset.name}),
                                    _category("GTRUST.CATEGORY.OBJECT", "Object", asset.fields)]}
        return data

    def _content(self, user: User, source: CorpusFile) -> Response:
        if not user.can_download:
            return _error(403, "The user does not have permission to download this content", "FORBIDDEN")
        body: bytes | Path = source.path
        with self._lock:
            self._downloads += 1
            count, garble, self.garbled = self._downloads, self.garbled > 0, max(0, self.garbled - 1)
        if garble:
            data = bytearray(source.path.read_bytes())
            data[count * 7919 % len(data)] ^= 0xFF
            body = bytes(data)
        return Response(200, body, source.mime, {"Content-Disposition": f'attachment; filename="{source.name}"'})

    @staticmethod
    def _folder(folder: Folder) -> dict:
        return {"asset_id": folder.asset_id, "name": folder.name, "data_type": "CONTAINER",
                "container_type_id": "ARTESIA.BASIC.FOLDER"}

    def _children(self, folder_id: str, kind: str, request: Request) -> Response:
        folders = [self._folder(f) for f in self.catalogue.folders.values() if f.parent == folder_id]
        if kind == "folders":
            return Response.json({"folders_resource": {"folder_list": folders}})
        assets = [self._asset(a, request.arg("load_type") not in (None, "system"))
                  for a in sorted(self.catalogue.assets.values(), key=lambda a: a.name) if a.folder == folder_id]
        after, limit = int(request.arg("after", "0")) if self.honours_after else 0, int(request.arg("limit", "25"))
        children = folders + assets
        return Response.json({"folder_children": {"asset_list": children[after:after + limit]}})


def _category(category_id: str, name: str, fields: dict[str, FieldValue]) -> dict:
    elements = []
    for field_id, value in fields.items():
        if isinstance(value, list):
            elements.append({"type": "com.artesia.metadata.MetadataTableField", "id": field_id,
                             "name": field_id.rpartition(".")[2].title(), "metadata_element_list": [
                                 {"type": "com.artesia.metadata.MetadataField", "id": f"{field_id} VALUE",
                                  "values": [{"value": {"type": "string", "value": v}} for v in value]}]})
        elif isinstance(value, Domain):
            elements.append({"type": "com.artesia.metadata.MetadataField", "id": field_id, "domained": True,
                             "value": {"value": {"type": "string", "display_value": value.display,
                                                 "field_value": {"type": "string", "value": value.code}}}})
        else:
            elements.append({"type": "com.artesia.metadata.MetadataField", "id": field_id,
                             "name": field_id.rpartition(".")[2].title(),
                             "value": {"value": {"type": "string", "value": value}}})
    return {"type": "com.artesia.metadata.MetadataCategory", "id": category_id, "name": name,
            "metadata_element_list": elements}


def _conditions_hold(asset: Asset, conditions: list[dict]) -> bool:
    """SearchScalarConditions, combined left to right with their relational_operator (and|or)."""
    result = True
    for index, condition in enumerate(conditions):
        if condition.get("type") != "com.artesia.search.SearchScalarCondition":
            raise ValueError(f"unsupported condition type {condition.get('type')}")
        holds = _condition_holds(asset, condition["metadata_field_id"], condition["relational_operator_id"],
                                 str(condition.get("value", "")))
        joiner = (condition.get("relational_operator") or "and").lower()
        result = holds if index == 0 else (result or holds) if joiner == "or" else (result and holds)
    return result


def _condition_holds(asset: Asset, field_id: str, operator: str, value: str) -> bool:
    if field_id == MODIFIED_FIELD:
        if operator not in DATE_OPERATORS:
            raise ValueError(f"operator {operator} does not apply to dates")
        return DATE_OPERATORS[operator](asset.updated, datetime.strptime(value, ISO).replace(tzinfo=timezone.utc))
    if field_id == "ARTESIA.FIELD.ASSET NAME":
        values = [asset.name]
    elif field_id in asset.fields:
        raw = asset.fields[field_id]
        values = raw if isinstance(raw, list) else [raw.code, raw.display] if isinstance(raw, Domain) else [raw]
    else:
        raise ValueError(f"unknown field {field_id}")
    if operator == "ARTESIA.OPERATOR.CHAR.CONTAINS":
        return any(value.lower() in v.lower() for v in values)
    if operator == "ARTESIA.OPERATOR.CHAR.IS":
        return any(value.lower() == v.lower() for v in values)
    if operator == "ARTESIA.OPERATOR.NUMBER.IS":
        return any(_number(v) is not None and eq(_number(v), _number(value)) for v in values)
    raise ValueError(f"unsupported operator {operator}")


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _error(status: int, message: str, code: str = "ERROR") -> Response:
    return Response.json({"exception_body": {"http_response_code": status, "error_code": code,
                                             "debug_message": "", "message": message}}, status)


def _banner(url: str) -> str:
    login, user = next(iter(USERS.items()))
    return (f"OTMM emulator on {url}{API}\n  user {login}, password {user.password}\n"
            f"  OAuth client {next(iter(CLIENTS))}, secret {next(iter(CLIENTS.values()))}\n"
            f"  last-modified search field {MODIFIED_FIELD!r}, operators {', '.join(DATE_OPERATORS)}\n"
            f"  root folder GCIS Masters = {ROOT}\n"
            f"  expire sessions: curl -X POST {url}/_emulator/expire-sessions")


if __name__ == "__main__":
    run_cli("OpenText Media Management emulator (tests/emulators/otmm.py)", OtmmEmulator(), _banner, "/contents")
