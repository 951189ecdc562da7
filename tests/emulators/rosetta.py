"""Ex Libris Rosetta emulator: the documented subset a harvester uses (reference/dam-apis.md §1).

- Auth: `Authorization: Basic|local base64("{user}-institutionCode-{INST}:{password}")`; 401 otherwise.
  A valid user without the role gets a UserAuthorizeException SOAP fault, or 403 from delivery.
- SOAP `POST /dpsws/repository/IEWebServices` `getIE(pdsHandle, iePid, flags)`: the AIP METS with DNX
  (flag 32 adds DERIVATIVE_COPY representations); unknown PIDs answer an IEWSException fault (HTTP 500).
- `GET /delivery/DeliveryManagerServlet?dps_pid=FL…&dps_func=stream`: the file's bytes, streamed.
- `GET /oaiprovider/request`: OAI-PMH 2.0 Identify, ListSets, ListMetadataFormats, ListIdentifiers,
  ListRecords (from/until/set, resumptionToken paging, deleted records), GetRecord, protocol errors.
- `GET /search/permanent/ie/sru`: SRU 1.2 searchRetrieve (startRecord/maximumRecords, numberOfRecords,
  nextRecordPosition, DC records with `dc:identifier xsi:type="PID"`, diagnostics) and explain.
  Its date index name, IE.objectCharacteristics.modificationDate, is this emulator's choice: the
  reference could not confirm one (check the site's explain document).
- Misbehaviours, switched on by RosettaEmulator's attributes: SRU surrogate diagnostics and diagnostic 61,
  answers rewritten at will (a proxy's login page in an answer's place is the shared Fault.page).

The seed catalogue's bytes are corpus files. Run standalone: `python -m tests.emulators.rosetta --port 8801`.
"""
from __future__ import annotations

import base64
import binascii
import json
import re
import threading
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Callable

from tests.emulators.catalogue import CorpusFile, utc
from tests.emulators.server import Request, Response, run_cli

NS = {
    "mets": "http://www.loc.gov/METS/",
    "dnx": "http://www.exlibrisgroup.com/dps/dnx",
    "dc": "http://purl.org/dc/elements/1.1/",
    "dcterms": "http://purl.org/dc/terms/",
    "xlink": "http://www.w3.org/1999/xlink",
    "xsi": "http://www.w3.org/2001/XMLSchema-instance",
    "soap": "http://schemas.xmlsoap.org/soap/envelope/",
    "dps": "http://dps.exlibris.com/",
    "oai": "http://www.openarchives.org/OAI/2.0/",
    "oai_dc": "http://www.openarchives.org/OAI/2.0/oai_dc/",
    "srw": "http://www.loc.gov/zing/srw/",
    "diag": "http://www.loc.gov/zing/srw/diagnostic/",
}
for _prefix, _uri in NS.items():
    ET.register_namespace(_prefix, _uri)
XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
DNX_DATE = "%Y-%m-%d %H:%M:%S"
OAI_DATE = "%Y-%m-%dT%H:%M:%SZ"
SRU_DATE_INDEX = "IE.objectCharacteristics.modificationDate"


def q(prefix: str, name: str) -> str:
    return f"{{{NS[prefix]}}}{name}"


@dataclass(frozen=True)
class User:
    password: str
    institution: str
    roles: frozenset[str]


@dataclass
class RosettaFile:
    pid: str
    source: CorpusFile
    label: str
    fixity: tuple[str, ...] = ("MD5",)
    original_name: str | None = None
    modified: datetime | None = None  # the file's own date, later than its IE's once replaced; None: the IE's

    @property
    def name(self) -> str:
        return self.original_name or self.source.name


@dataclass
class Representation:
    pid: str
    preservation_type: str
    files: list[RosettaFile]  # physical (structMap) order
    label: str = ""


@dataclass
class Entity:
    pid: str
    dc: list[tuple[str, str, str | None]]  # ("dc:title", value, language)
    created: datetime
    modified: datetime
    reps: list[Representation]
    sets: set[str] = field(default_factory=lambda: {"gcis"})
    user_defined_a: str = "GCIS"
    deleted: bool = False
    struct_maps: tuple[str, ...] = ("PHYSICAL", "LOGICAL")  # the TYPEs of its METS structMaps (of each representation)


class RosettaCatalogue:
    def __init__(self, entities: list[Entity]):
        self.entities = {e.pid: e for e in entities}
        self.lock = threading.Lock()

    def entity(self, pid: str) -> Entity | None:
        return self.entities.get(pid)

    def file(self, pid: str) -> RosettaFile | None:
        for entity in self.entities.values():
            for rep in entity.reps:
                for f in rep.files:
                    if f.pid == pid:
                        return f
        return None

    def touch(self, pid: str, when: datetime | None = None) -> None:
        """Mark an IE modified (default: now, to the second) as a curator's edit would."""
        with self.lock:
            self.entities[pid].modified = (when or datetime.now(timezone.utc)).replace(microsecond=0)


def seed() -> RosettaCatalogue:
    """Seven IEs: one with three representations (preservation, modified master, derivative copy) whose
    modified master lists its files in a structMap order different from the fileGrp order; one
    multilingual; one whose master is not an image; one with no modified master (set "other"); one deleted."""
    f = CorpusFile
    return RosettaCatalogue([
        Entity("IE1001", [("dc:title", "Irises, study sheet", "en"), ("dc:creator", "Unknown artist", None),
                          ("dcterms:created", "ca. 1890", None), ("dc:identifier", "2019.M.1", None),
                          ("dc:rights", "No known copyright restrictions", "en")],
               utc("2023-11-02 10:00:00"), utc("2024-01-10 09:00:00"), [
                   Representation("REP1002", "PRESERVATION_MASTER", [
                       RosettaFile("FL1003", f("rgb8-tiff-uncompressed/hopper.tif"), "Recto (preservation)"),
                       RosettaFile("FL1004", f("rgb8-tiff-lzw/hopper_lzw.tif"), "Verso (preservation)")]),
                   Representation("REP1005", "MODIFIED_MASTER", [
                       RosettaFile("FL1008", f("icc-srgb/jpg-icc.jpg"), "Recto", ("SHA256",), "2019_M_1_recto.jpg"),
                       RosettaFile("FL1006", f("jpeg-baseline/flowers.jpeg"), "Verso", ("MD5",), "2019_M_1_verso.jpg"),
                       RosettaFile("FL1007", f("rgb8-tiff-jpeg/quad-jpeg.tif"), "Detail", ("SHA1", "MD5"),
                                   "2019_M_1_detail.tif")]),
                   Representation("REP1009", "DERIVATIVE_COPY", [
                       RosettaFile("FL1010", f("gray8/hopper_gray.jpg"), "Access copy")])]),
        Entity("IE1011", [("dc:title", "Mill at Bentheim", "en")],
               utc("2023-11-03 10:00:00"), utc("2024-02-01 12:30:00"), [
                   Representation("REP1012", "PRESERVATION_MASTER", [
                       RosettaFile("FL1013", f("tiled-tiff/tiled-rgb-u8.tif"), "Image")]),
                   Representation("REP1014", "MODIFIED_MASTER", [
                       RosettaFile("FL1015", f("png/png-rgb-64x56x8.png"), "Image")])]),
        Entity("IE1016", [("dc:title", "Le moulin", "fr"), ("dc:title", "The mill", "en"),
                          ("dc:subject", "Moulins", "fr")],
               utc("2023-11-04 10:00:00"), utc("2024-03-01 08:00:00"), [
                   Representation("REP1017", "MODIFIED_MASTER", [
                       RosettaFile("FL1018", f("jpeg2000/example.jp2"), "Plate 1"),
                       RosettaFile("FL1019", f("gray8/gray.tif"), "Plate 2")])]),
        Entity("IE1020", [("dc:title", "Kodak test image", None)],
               utc("2023-11-05 10:00:00"), utc("2024-04-01 16:45:10"), [
                   Representation("REP1021", "MODIFIED_MASTER", [
                       RosettaFile("FL1022", f("rgb8-tiff-lzw/kodim02-lzw.tif"), "Image", ("MD5",))])]),
        Entity("IE1023", [("dc:title", "Sound recording mislabelled as TIFF", "en")],
               utc("2023-11-06 10:00:00"), utc("2024-05-01 07:00:00"), [
                   Representation("REP1024", "MODIFIED_MASTER", [
                       RosettaFile("FL1025", f("wrong-extension/invalid.tif"), "Image")])]),
        Entity("IE1026", [("dc:title", "Preservation only", "en")],
               utc("2023-11-07 10:00:00"), utc("2024-05-15 07:00:00"), [
                   Representation("REP1027", "PRESERVATION_MASTER", [
                       RosettaFile("FL1028", f("gray8/minisblack-1c-8b.tiff"), "Image")])],
               sets={"other"}, user_defined_a="OTHER"),
        Entity("IE1029", [("dc:title", "Withdrawn", "en")],
               utc("2023-11-08 10:00:00"), utc("2024-06-01 07:00:00"), [
                   Representation("REP1030", "MODIFIED_MASTER", [
                       RosettaFile("FL1031", f("png/exif.png"), "Image")])],
               deleted=True),
    ])


USERS = {
    "harvester": User("harvest-Secret-1", "INS00", frozenset({"IEWebServices", "delivery"})),
    "curator": User("curator-Secret-2", "INS00", frozenset()),
}


class RosettaEmulator:
    def __init__(self, catalogue: RosettaCatalogue | None = None, users: dict[str, User] | None = None,
                 oai_page_size: int = 2, repository: str = "rosetta.emulator", zone: tzinfo = timezone.utc):
        """`zone` is the server's clock: DNX dates and the SRU date index are written in it, with no offset."""
        self.catalogue = catalogue or seed()
        self.users = USERS if users is None else users
        self.oai_page_size = oai_page_size
        self.repository = repository
        self.zone = zone
        # a misbehaving SRU server: the nextRecordPosition it gives after a page (from startRecord and
        # maximumRecords), and a deep-paging cap (records from this position on are not served, yet counted)
        self.sru_next_position: Callable[[int, int], int] = lambda start, maximum: start + maximum
        self.sru_deepest: int | None = None
        # SRU records served as a surrogate diagnostic (info:srw/diagnostic/1/64) in their IE's place, and a
        # startRecord past the result answered with diagnostic 61 (as SRU 1.2 says) rather than an empty page
        self.sru_unavailable: set[str] = set()
        self.sru_out_of_range_diagnostic = False
        # any other misbehaviour: every answer goes out through rewrite(request, response)
        self.rewrite: Callable[[Request, Response], Response] = lambda request, response: response

    def handle(self, request: Request) -> Response:
        return self.rewrite(request, self._answer(request))

    def _answer(self, request: Request) -> Response:
        if request.path == "/dpsws/repository/IEWebServices" and request.method == "POST":
            return self._soap(request)
        if request.path == "/delivery/DeliveryManagerServlet":
            return self._deliver(request)
        if request.path == "/oaiprovider/request":
            return self._oai(request)
        if request.path == "/search/permanent/ie/sru":
            return self._sru(request)
        return Response.text("Not Found", 404)

    def control(self, name: str, request: Request) -> Response:
        """POST /_emulator/touch?pid=IE1001 marks an IE modified now (for incremental-harvest demos)."""
        pid = request.arg("pid") or ""
        if name == "touch" and self.catalogue.entity(pid):
            self.catalogue.touch(pid)
            return Response.text("ok")
        return Response.text("unknown control or pid", 404)

    # --- auth -----------------------------------------------------------------------------------------

    def _user(self, request: Request) -> User | None:
        scheme, _, token = (request.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() not in ("basic", "local"):
            return None
        try:
            decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        login, _, password = decoded.partition(":")
        name, separator, institution = login.rpartition("-institutionCode-")
        user = self.users.get(name)
        if separator and user and user.password == password and user.institution == institution:
            return user
        return None

    @staticmethod
    def _unauthorized() -> Response:
        return Response(401, b"<html><body>Unauthorized</body></html>", "text/html",
                        {"WWW-Authenticate": 'Basic realm="Rosetta"'})

    # --- SOAP -----------------------------------------------------------------------------------------

    def _soap(self, request: Request) -> Response:
        user = self._user(request)
        if user is None:
            return self._unauthorized()
        try:
            operation = ET.fromstring(request.body).find("soap:Body", NS)[0]
        except (ET.ParseError, TypeError, IndexError):
            return _fault("soap:Client", "Malformed SOAP request", "IEWSException")
        name = operation.tag.rpartition("}")[2]
        if name != "getIE":
            return _fault("soap:Client", f"Operation {name} is not emulated", "IEWSException")
        if "IEWebServices" not in user.roles:
            return _fault("soap:Server", "User is not authorized for IEWebServices", "UserAuthorizeException")
        pid = (operation.findtext("iePid") or "").strip()
        flags = int((operation.findtext("flags") or "0").strip() or 0)
        entity = self.catalogue.entity(pid)
        if entity is None or entity.deleted:
            return _fault("soap:Server", f"IE with PID {pid} does not exist", "IEWSException")
        envelope = ET.Element(q("soap", "Envelope"))
        wrapper = ET.SubElement(ET.SubElement(envelope, q("soap", "Body")), q("dps", "getIEResponse"))
        ET.SubElement(wrapper, "getIE").text = self._mets(entity, flags)
        return Response.xml(ET.tostring(envelope, xml_declaration=True, encoding="UTF-8"))

    def _mets(self, entity: Entity, flags: int) -> str:
        root = ET.Element(q("mets", "mets"))
        record = _sub(root, "mets:dmdSec", ID="ie-dmd")
        record = _sub(_sub(_sub(record, "mets:mdWrap", MDTYPE="DC"), "mets:xmlData"), "dc:record")
        for qname, value, language in entity.dc:
            element = _sub(record, qname)
            element.text = value
            if language:
                element.set(XML_LANG, language)
        _amd(root, "ie-amd", {
            "generalIECharacteristics": [{"status": "ACTIVE", "IEEntityType": "Image",
                                          "UserDefinedA": entity.user_defined_a}],
            "objectCharacteristics": [{"objectType": "INTELLECTUAL_ENTITY", "creationDate": self._dnx(entity.created),
                                       "createdBy": "emulator", "modificationDate": self._dnx(entity.modified),
                                       "modifiedBy": "emulator", "owner": "CRS00.INS00.DEP"}],
            "internalIdentifier": [{"internalIdentifierType": "PID", "internalIdentifierValue": entity.pid}],
        }, rights={"accessRightsPolicy": [{"policyId": "AR_EVERYONE", "policyDescription": "Everyone"}]})
        reps = [r for r in entity.reps if r.preservation_type != "DERIVATIVE_COPY" or flags & 32]
        for rep in reps:
            _amd(root, f"{rep.pid}-amd", {
                "generalRepCharacteristics": [{"preservationType": rep.preservation_type, "usageType": "VIEW",
                                               "label": rep.label or rep.preservation_type.title(),
                                               "RevisionNumber": "1", "DigitalOriginal": "true"}],
                "objectCharacteristics": [{"objectType": "REPRESENTATION", "parentID": entity.pid,
                                           "modificationDate": self._dnx(entity.modified)}]})
            for f in rep.files:
                file_modified = self._dnx(f.modified or entity.modified)
                _amd(root, f"{f.pid}-amd", {
                    "generalFileCharacteristics": [{
                        "label": f.label, "fileOriginalName": f.name, "fileOriginalPath": f"/deposit/{f.name}",
                        "fileExtension": f.name.rpartition(".")[2], "fileMIMEType": f.source.mime,
                        "fileSizeBytes": str(f.source.size), "fileModificationDate": file_modified}],
                    "fileFixity": [{"agent": "REG_SA_JAVA5_FIXITY", "fixityType": t,
                                    "fixityValue": f.source.digest(t.lower())} for t in f.fixity],
                    "objectCharacteristics": [{"objectType": "FILE", "parentID": rep.pid,
                                               "modificationDate": file_modified}]})
        file_sec = _sub(root, "mets:fileSec")
        for rep in reps:
            group = _sub(file_sec, "mets:fileGrp", USE="VIEW", ID=rep.pid, ADMID=f"{rep.pid}-amd")
            for f in sorted(rep.files, key=lambda x: x.pid):
                element = _sub(group, "mets:file", ID=f.pid, ADMID=f"{f.pid}-amd", MIMETYPE=f.source.mime)
                _sub(element, "mets:FLocat", LOCTYPE="URL", **{q("xlink", "href"): f"/permanent/{f.pid}/{f.name}"})
        for rep in reps:
            for suffix, kind, files in (("1", "PHYSICAL", rep.files), ("2", "LOGICAL", rep.files[::-1])):
                if kind not in entity.struct_maps:
                    continue
                div = _sub(_sub(root, "mets:structMap", ID=f"{rep.pid}-{suffix}", TYPE=kind),
                           "mets:div", LABEL=rep.preservation_type)
                toc = _sub(div, "mets:div", LABEL="Table of Contents")
                for f in files:
                    _sub(_sub(toc, "mets:div", LABEL=f.label, TYPE="FILE"), "mets:fptr", FILEID=f.pid)
        return ET.tostring(root, encoding="unicode")

    # --- delivery -------------------------------------------------------------------------------------

    def _dnx(self, when: datetime) -> str:
        return when.astimezone(self.zone).strftime(DNX_DATE)

    def _deliver(self, request: Request) -> Response:
        user = self._user(request)
        if user is None:
            return self._unauthorized()
        if "delivery" not in user.roles:
            return Response(403, b"<html><body>Access denied</body></html>", "text/html")
        stored = self.catalogue.file(request.arg("dps_pid") or "")
        if stored is None:
            return Response(404, b"<html><body>Object not found</body></html>", "text/html")
        if request.arg("dps_func") != "stream":
            return Response(400, b"<html><body>Only dps_func=stream is emulated</body></html>", "text/html")
        return Response(200, stored.source.path, stored.source.mime,
                        {"Content-Disposition": f'inline; filename="{stored.name}"'})

    # --- OAI-PMH --------------------------------------------------------------------------------------

    def _oai(self, request: Request) -> Response:
        args = {k: v[0] for k, v in {**request.query, **request.form}.items()}
        verb = args.get("verb", "")
        root = ET.Element(q("oai", "OAI-PMH"))
        _sub(root, "oai:responseDate").text = datetime.now(timezone.utc).strftime(OAI_DATE)
        _sub(root, "oai:request", **({"verb": verb} if verb else {})).text = \
            f"http://{request.headers.get('Host')}/oaiprovider/request"
        try:
            handler = {"Identify": self._identify, "ListSets": self._list_sets,
                       "ListMetadataFormats": self._list_formats, "ListIdentifiers": self._list,
                       "ListRecords": self._list, "GetRecord": self._get_record}.get(verb)
            if handler is None:
                raise _OaiError("badVerb", f"Illegal OAI verb {verb!r}")
            handler(root, verb, args)
        except _OaiError as exc:
            _sub(root, "oai:error", code=exc.code).text = exc.message
        return Response.xml(ET.tostring(root, xml_declaration=True, encoding="UTF-8"))

    def _identify(self, root: ET.Element, verb: str, args: dict) -> None:
        identify = _sub(root, "oai:Identify")
        earliest = min(e.modified for e in self.catalogue.entities.values())
        for name, value in (("repositoryName", "Rosetta"), ("baseURL", root.find("oai:request", NS).text),
                            ("protocolVersion", "2.0"), ("adminEmail", "admin@example.org"),
                            ("earliestDatestamp", earliest.strftime(OAI_DATE)), ("deletedRecord", "persistent"),
                            ("granularity", "YYYY-MM-DDThh:mm:ssZ")):
            _sub(identify, f"oai:{name}").text = value

    def _list_sets(self, root: ET.Element, verb: str, args: dict) -> None:
        element = _sub(root, "oai:ListSets")
        for name in sorted({s for e in self.catalogue.entities.values() for s in e.sets}):
            item = _sub(element, "oai:set")
            _sub(item, "oai:setSpec").text = name
            _sub(item, "oai:setName").text = name

    def _list_formats(self, root: ET.Element, verb: str, args: dict) -> None:
        fmt = _sub(_sub(root, "oai:ListMetadataFormats"), "oai:metadataFormat")
        _sub(fmt, "oai:metadataPrefix").text = "oai_dc"
        _sub(fmt, "oai:schema").text = "http://www.openarchives.org/OAI/2.0/oai_dc.xsd"
        _sub(fmt, "oai:metadataNamespace").text = NS["oai_dc"]

    def _list(self, root: ET.Element, verb: str, args: dict) -> None:
        if "resumptionToken" in args:
            if set(args) != {"verb", "resumptionToken"}:
                raise _OaiError("badArgument", "resumptionToken is an exclusive argument")
            try:
                state = json.loads(base64.urlsafe_b64decode(args["resumptionToken"].encode()))
            except (binascii.Error, ValueError):
                raise _OaiError("badResumptionToken", "The value of the resumptionToken argument is invalid")
        else:
            unknown = set(args) - {"verb", "metadataPrefix", "from", "until", "set"}
            if unknown or "metadataPrefix" not in args:
                raise _OaiError("badArgument", "metadataPrefix is required; allowed: from, until, set")
            state = {"prefix": args["metadataPrefix"], "from": args.get("from"), "until": args.get("until"),
                     "set": args.get("set"), "offset": 0}
        if state["prefix"] != "oai_dc":
            raise _OaiError("cannotDisseminateFormat", f"Format {state['prefix']} is not supported")
        start, end = _oai_date(state["from"], False), _oai_date(state["until"], True)
        matches = sorted((e for e in self.catalogue.entities.values()
                          if (not state["set"] or state["set"] in e.sets)
                          and (start is None or e.modified >= start) and (end is None or e.modified <= end)),
                         key=lambda e: (e.modified, e.pid))
        if not matches:
            raise _OaiError("noRecordsMatch", "The combination of the values of the arguments results in an empty list")
        offset = state["offset"]
        page = matches[offset:offset + self.oai_page_size]
        container = _sub(root, f"oai:{verb}")
        for entity in page:
            if verb == "ListIdentifiers":
                self._header(container, entity)
            else:
                self._record(container, entity)
        if offset + len(page) < len(matches) or offset:
            token = _sub(container, "oai:resumptionToken", completeListSize=str(len(matches)), cursor=str(offset))
            if offset + len(page) < len(matches):
                following = {**state, "offset": offset + len(page)}
                token.text = base64.urlsafe_b64encode(json.dumps(following).encode()).decode()

    def _get_record(self, root: ET.Element, verb: str, args: dict) -> None:
        if args.get("metadataPrefix") != "oai_dc":
            raise _OaiError("cannotDisseminateFormat" if "metadataPrefix" in args else "badArgument",
                            "metadataPrefix oai_dc is required")
        entity = self.catalogue.entity(args.get("identifier", "").rpartition(":")[2])
        if entity is None:
            raise _OaiError("idDoesNotExist", f"No matching identifier {args.get('identifier')}")
        self._record(_sub(root, "oai:GetRecord"), entity)

    def _header(self, parent: ET.Element, entity: Entity) -> None:
        header = _sub(parent, "oai:header", **({"status": "deleted"} if entity.deleted else {}))
        _sub(header, "oai:identifier").text = f"oai:{self.repository}:{entity.pid}"
        _sub(header, "oai:datestamp").text = entity.modified.strftime(OAI_DATE)
        for name in sorted(entity.sets):
            _sub(header, "oai:setSpec").text = name

    def _record(self, parent: ET.Element, entity: Entity) -> None:
        record = _sub(parent, "oai:record")
        self._header(record, entity)
        if not entity.deleted:
            dc = _dc(_sub(_sub(record, "oai:metadata"), "oai_dc:dc"), entity)
            _sub(dc, "dc:identifier").text = entity.pid

    # --- SRU ------------------------------------------------------------------------------------------

    def _sru(self, request: Request) -> Response:
        if request.arg("auth") == "local" and self._user(request) is None:
            return self._unauthorized()
        if request.arg("operation") == "explain" or request.arg("service") == "explain":
            return self._explain()
        root = ET.Element(q("srw", "searchRetrieveResponse"))
        _sub(root, "srw:version").text = "1.2"
        try:
            if request.arg("operation") != "searchRetrieve":
                raise _SruError(4, "Unsupported operation")
            if not request.arg("query"):
                raise _SruError(7, "Mandatory parameter not supplied", "query")
            if request.arg("recordSchema", "dc") != "dc":
                raise _SruError(66, "Unknown schema for retrieval", request.arg("recordSchema"))
            try:
                start = int(request.arg("startRecord", "1"))
                maximum = min(int(request.arg("maximumRecords", "10")), 10000)
            except ValueError:
                raise _SruError(6, "Unsupported parameter value", "startRecord/maximumRecords")
            if start < 1 or maximum < 0:
                raise _SruError(6, "Unsupported parameter value", "startRecord/maximumRecords")
            clauses = _cql(request.arg("query"))
            matches = sorted((e for e in self.catalogue.entities.values()
                              if not e.deleted and all(_sru_match(e, *c, self._dnx) for c in clauses)),
                             key=lambda e: (e.modified, e.pid))[:10000]
            if self.sru_out_of_range_diagnostic and start > len(matches):
                raise _SruError(61, "First record position out of range", str(start))
        except _SruError as exc:
            _diagnostic(_sub(root, "srw:diagnostics"), exc)
            return Response.xml(ET.tostring(root, xml_declaration=True, encoding="UTF-8"))
        _sub(root, "srw:numberOfRecords").text = str(len(matches))
        records = _sub(root, "srw:records")
        host = request.headers.get("Host")
        capped = self.sru_deepest is not None and start >= self.sru_deepest
        served = [] if capped else matches[start - 1:start - 1 + maximum]
        for position, entity in enumerate(served, start):
            record = _sub(records, "srw:record")
            if entity.pid in self.sru_unavailable:
                _sub(record, "srw:recordSchema").text = "info:srw/schema/1/diagnostics-v1.1"
                _sub(record, "srw:recordPacking").text = "xml"
                _diagnostic(_sub(record, "srw:recordData"), _SruError(64, "Record temporarily unavailable"))
                _sub(record, "srw:recordPosition").text = str(position)
                continue
            _sub(record, "srw:recordSchema").text = "dc"
            _sub(record, "srw:recordPacking").text = "xml"
            dc = _dc(_sub(_sub(record, "srw:recordData"), "dc:record"), entity)
            _sub(dc, "dc:identifier", **{q("xsi", "type"): "PID"}).text = entity.pid
            _sub(dc, "dc:identifier", **{q("xsi", "type"): "dcterms:URI"}).text = \
                f"http://{host}/delivery/DeliveryManagerServlet?dps_pid={entity.pid}"
            _sub(record, "srw:recordPosition").text = str(position)
        if start - 1 + maximum < len(matches):
            _sub(root, "srw:nextRecordPosition").text = str(self.sru_next_position(start, maximum))
        return Response.xml(ET.tostring(root, xml_declaration=True, encoding="UTF-8"))

    @staticmethod
    def _explain() -> Response:
        root = ET.Element(q("srw", "explainResponse"))
        _sub(root, "srw:version").text = "1.2"
        info = ET.SubElement(ET.SubElement(_sub(_sub(root, "srw:record"), "srw:recordData"), "explain"), "indexInfo")
        for name in _SRU_INDEXES:
            ET.SubElement(ET.SubElement(ET.SubElement(info, "index"), "map"), "name").text = name
        return Response.xml(ET.tostring(root, xml_declaration=True, encoding="UTF-8"))


class _OaiError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


class _SruError(Exception):
    def __init__(self, number: int, message: str, details: str | None = None):
        super().__init__(message)
        self.number, self.message, self.details = number, message, details


_SRU_INDEXES = {
    SRU_DATE_INDEX: lambda e, dnx: [dnx(e.modified)],  # as text, compared as text: the server's clock time
    "IE.generalIECharacteristics.UserDefinedA": lambda e, dnx: [e.user_defined_a],
    "IE.generalIECharacteristics.status": lambda e, dnx: ["ACTIVE"],
    "IE.dc.title": lambda e, dnx: [v for k, v, _ in e.dc if k == "dc:title"],
}
_CLAUSE = re.compile(r'^\s*([\w.]+)\s*(==|>=|<=|=|>|<)\s*(?:"([^"]*)"|(\S+))\s*$')


def _cql(query: str) -> list[tuple[str, str, str]]:
    """A CQL subset: clauses `index relation value` joined by `and`, optionally parenthesised, and a sortBy
    clause (accepted; results are always in modification order)."""
    clauses = []
    query = re.split(r"\s+sortBy\s+", query.strip(), flags=re.IGNORECASE)[0]
    for part in re.split(r"\s+and\s+", query, flags=re.IGNORECASE):
        part = part.strip()
        while part.startswith("(") and part.endswith(")"):
            part = part[1:-1].strip()
        match = _CLAUSE.match(part)
        if not match:
            raise _SruError(10, "Query syntax error", part)
        index, relation, quoted, bare = match.groups()
        if index not in _SRU_INDEXES:
            raise _SruError(16, "Unsupported index", index)
        clauses.append((index, relation, quoted if quoted is not None else bare))
    return clauses


def _sru_match(entity: Entity, index: str, relation: str, value: str, dnx) -> bool:
    values = _SRU_INDEXES[index](entity, dnx)
    if relation in ("=", "=="):
        if index == "IE.dc.title":
            return any(value.lower() in v.lower() for v in values)
        return any(v.lower() == value.lower() or (relation == "=" and v.startswith(value)) for v in values)
    compare = {">": str.__gt__, ">=": str.__ge__, "<": str.__lt__, "<=": str.__le__}[relation]
    return any(compare(v, value) for v in values)


def _oai_date(value: str | None, end: bool) -> datetime | None:
    if value is None:
        return None
    for fmt, span in ((OAI_DATE, timedelta(0)), ("%Y-%m-%d", timedelta(days=1, seconds=-1))):
        try:
            parsed = datetime.strptime(value, fmt).replace(tzinfo=timezone.utc)
        except ValueError:
            continue
        return parsed + span if end else parsed
    raise _OaiError("badArgument", f"Illegal date {value!r}")


def _sub(parent: ET.Element, qname: str, **attributes: str) -> ET.Element:
    prefix, _, name = qname.partition(":")
    return ET.SubElement(parent, q(prefix, name), attributes)


def _dc(parent: ET.Element, entity: Entity) -> ET.Element:
    """`parent` with the entity's Dublin Core elements, as OAI-PMH and SRU both give them (then identifiers)."""
    for qname, value, language in entity.dc:
        element = _sub(parent, qname)
        element.text = value
        if language:
            element.set(XML_LANG, language)
    return parent


def _amd(root: ET.Element, amd_id: str, tech: dict[str, list[dict[str, str]]],
         rights: dict[str, list[dict[str, str]]] | None = None) -> None:
    amd = _sub(root, "mets:amdSec", ID=amd_id)
    for kind, sections in (("techMD", tech), ("rightsMD", rights or {}), ("sourceMD", {}), ("digiprovMD", {})):
        wrap = _sub(_sub(amd, f"mets:{kind}", ID=f"{amd_id}-{kind[:-2].lower()}"), "mets:mdWrap",
                    MDTYPE="OTHER", OTHERMDTYPE="dnx")
        dnx = _sub(_sub(wrap, "mets:xmlData"), "dnx:dnx")
        for section_id, records in sections.items():
            section = _sub(dnx, "dnx:section", id=section_id)
            for values in records:
                record = _sub(section, "dnx:record")
                for key, value in values.items():
                    _sub(record, "dnx:key", id=key).text = value


def _diagnostic(parent: ET.Element, error: _SruError) -> None:
    diagnostic = _sub(parent, "diag:diagnostic")
    _sub(diagnostic, "diag:uri").text = f"info:srw/diagnostic/1/{error.number}"
    _sub(diagnostic, "diag:message").text = error.message
    if error.details:
        _sub(diagnostic, "diag:details").text = error.details


def _fault(code: str, message: str, exception: str) -> Response:
    envelope = ET.Element(q("soap", "Envelope"))
    fault = _sub(_sub(envelope, "soap:Body"), "soap:Fault")
    ET.SubElement(fault, "faultcode").text = code
    ET.SubElement(fault, "faultstring").text = message
    ET.SubElement(_sub(ET.SubElement(fault, "detail"), f"dps:{exception}"), "message").text = message
    return Response(500, ET.tostring(envelope, xml_declaration=True, encoding="UTF-8"), "text/xml; charset=UTF-8")




def _banner(url: str) -> str:
    user, account = next(iter(USERS.items()))
    return (f"Rosetta emulator on {url}\n"
            f"  user {user}, institution {account.institution}, password {account.password}\n"
            f"  OAI-PMH {url}/oaiprovider/request?verb=ListIdentifiers&metadataPrefix=oai_dc&set=gcis\n"
            f"  SRU     {url}/search/permanent/ie/sru?version=1.2&operation=searchRetrieve"
            f"&query=IE.generalIECharacteristics.UserDefinedA=GCIS\n"
            f"  touch   curl -X POST '{url}/_emulator/touch?pid=IE1001'")


if __name__ == "__main__":
    run_cli("Ex Libris Rosetta emulator (tests/emulators/rosetta.py)", RosettaEmulator(), _banner,
            "DeliveryManagerServlet")
