"""The dev schema registry: an in-memory HTTP server speaking the part of the Confluent Schema Registry
REST API that confluent-kafka's SchemaRegistryClient and its Avro, Protobuf and JSON Schema
serializers and deserializers use.

Only the demo and the tests use it (the real registry is a JVM service that cannot be installed
here). Everything else talks to it through confluent-kafka's client, so a real registry works
unchanged. Deliberate simplifications: compatibility levels are stored and reported but not
enforced, nothing is ever deleted, and PROTOBUF schemas are answered as registered whatever
`format` asks for (the Python client registers base64 FileDescriptorProtos, which is also what
it asks for with format=serialized).
"""
from __future__ import annotations

import base64
import collections
import json
import re
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

import fastavro
import jsonschema.validators

_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
_TYPES = ("AVRO", "PROTOBUF", "JSON")
_LEVELS = ("NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE")


class _Error(Exception):
    """An answer in the registry's error shape: HTTP status and {"error_code", "message"}."""

    def __init__(self, status: int, code: int, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.0 (the default): one request per connection, so after stop() no kept-alive
    # connection is left to answer and clients really see the outage.

    def do_GET(self):
        self._serve("GET")

    def do_POST(self):
        self._serve("POST")

    def do_PUT(self):
        self._serve("PUT")

    def do_DELETE(self):
        self._serve("DELETE")

    def _serve(self, method: str) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status, payload = self.server.registry._answer(method, self.path, self.headers.get("Authorization"), raw)
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", _CONTENT_TYPE)
        self.send_header("Content-Length", str(len(data)))
        if status == 401:
            self.send_header("WWW-Authenticate", 'Basic realm="DevRegistry"')
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass  # one line per request would drown the demo's and the tests' own output


class DevRegistry:
    """A schema registry on 127.0.0.1 that lives as long as this object (state survives stop()/start()).

    `requests` counts every request that arrives (also refused and failed ones) by route:
    "schemas/ids", "schemas/ids/versions", "schemas/ids/subjects", "schemas/types", "subjects",
    "register" (POST /subjects/S/versions), "lookup" (POST /subjects/S), "subjects/versions",
    "subjects/version" (GET /subjects/S/versions/V), "subjects/metadata", "config", "unknown".
    """

    def __init__(self, port: int = 0, host: str = "127.0.0.1", user_info: str | None = None):
        self.host, self.port = host, port
        self._auth = "Basic " + base64.b64encode(user_info.encode()).decode() if user_info else None
        self._lock = threading.Lock()
        self._schemas: dict[int, dict] = {}  # id -> the registered body (schema, schemaType, references, ...)
        self._ids: dict[tuple, int] = {}  # identity of a schema -> its id, shared by all subjects
        self._subjects: dict[str, list[int]] = {}  # subject -> ids, version n at index n - 1
        self._config: dict[str | None, dict] = {None: {"compatibilityLevel": "BACKWARD"}}  # None: global
        self._fault: list | None = None  # [status, requests left or None, monotonic deadline or None]
        self.requests: collections.Counter[str] = collections.Counter()
        routes = [
            ("GET", r"/schemas/ids/(\d+)", "schemas/ids", self._get_schema),
            ("GET", r"/schemas/ids/(\d+)/versions", "schemas/ids/versions", self._get_schema_versions),
            ("GET", r"/schemas/ids/(\d+)/subjects", "schemas/ids/subjects", self._get_schema_subjects),
            ("GET", r"/schemas/types", "schemas/types", lambda q, b: list(_TYPES)),
            ("GET", r"/subjects", "subjects", self._list_subjects),
            ("POST", r"/subjects/([^/]+)/versions", "register", self._register),
            ("POST", r"/subjects/([^/]+)", "lookup", self._lookup),
            ("GET", r"/subjects/([^/]+)/versions", "subjects/versions", self._list_versions),
            ("GET", r"/subjects/([^/]+)/versions/([^/]+)", "subjects/version", self._get_version),
            ("GET", r"/subjects/([^/]+)/metadata", "subjects/metadata", self._get_latest_with_metadata),
            ("GET", r"/config(?:/([^/]+))?", "config", self._get_config),
            ("PUT", r"/config(?:/([^/]+))?", "config", self._put_config),
        ]
        self._routes = [(method, re.compile(pattern), kind, handler) for method, pattern, kind, handler in routes]
        self._server: ThreadingHTTPServer | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        """Listen again (on the same port after a stop()), with everything registered before."""
        if self._server:
            return
        self._server = ThreadingHTTPServer((self.host, self.port), _Handler)  # SO_REUSEADDR: rebinding works at once
        self._server.registry = self
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="devregistry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Close the listening socket: clients get connection refused until start()."""
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
            self._server = None

    def fail(self, status: int = 503, *, times: int | None = None, seconds: float | None = None) -> None:
        """Answer every request with HTTP `status` until heal(), or only the next `times` requests, or for `seconds`."""
        with self._lock:
            self._fault = [status, times, None if seconds is None else time.monotonic() + seconds]

    def heal(self) -> None:
        with self._lock:
            self._fault = None

    def __enter__(self) -> "DevRegistry":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _answer(self, method: str, target: str, authorization: str | None, raw: bytes) -> tuple[int, object]:
        url = urlsplit(target)
        kind, handler, args = "unknown", None, ()
        for route_method, pattern, route_kind, route_handler in self._routes:
            match = pattern.fullmatch(url.path.rstrip("/") or "/")
            if match and route_method == method:
                kind, handler, args = route_kind, route_handler, [unquote(g) for g in match.groups() if g is not None]
                break
        with self._lock:
            self.requests[kind] += 1
            fault = self._take_fault()
            try:
                if fault:
                    raise _Error(fault, fault, f"injected failure (DevRegistry.fail({fault}))")
                if self._auth and authorization != self._auth:
                    raise _Error(401, 401, "Unauthorized")
                if handler is None:
                    raise _Error(404, 404, "HTTP 404 Not Found")
                try:
                    body = json.loads(raw) if raw else None
                except ValueError as exc:
                    raise _Error(400, 400, f"Malformed JSON: {exc}")
                return 200, handler(parse_qs(url.query), body, *args)
            except _Error as err:
                return err.status, {"error_code": err.code, "message": err.message}

    def _take_fault(self) -> int | None:
        if self._fault is None:
            return None
        status, left, deadline = self._fault
        if left == 0 or (deadline is not None and time.monotonic() >= deadline):
            self._fault = None
            return None
        if left is not None:
            self._fault[1] -= 1
        return status

    # Handlers run under self._lock and get (query as parse_qs gives it, JSON body, *path parts).

    def _identity(self, body) -> tuple[dict, tuple]:
        """The body as stored and the key that makes the same schema the same id in every subject."""
        if not isinstance(body, dict) or not isinstance(body.get("schema"), str) or not body["schema"].strip():
            raise _Error(422, 42201, "Empty schema")
        schema_type = body.get("schemaType") or "AVRO"
        if schema_type not in _TYPES:
            raise _Error(422, 42201, f"Invalid schema type {schema_type}")
        stored = {"schema": body["schema"]}
        if schema_type != "AVRO":  # the real registry leaves the default out too
            stored["schemaType"] = schema_type
        for field in ("references", "metadata", "ruleSet"):
            if body.get(field):
                stored[field] = body[field]
        text = body["schema"]
        try:  # Avro and JSON Schema are JSON: whitespace does not make a new schema
            if schema_type != "PROTOBUF":
                text = json.dumps(json.loads(text), separators=(",", ":"))
        except ValueError as exc:
            raise _Error(422, 42201, f"Invalid schema: {exc}")
        extras = json.dumps([stored.get(f) for f in ("references", "metadata", "ruleSet")], sort_keys=True)
        return stored, (schema_type, text, extras)

    def _validate(self, stored: dict) -> None:
        named: dict = {}
        for ref in stored.get("references", []):  # every reference must exist; Avro ones define named types
            try:
                ref_id = self._version(ref.get("subject"), ref.get("version"))[1]
            except _Error as err:
                raise _Error(422, 42201, f"Invalid schema: reference {ref.get('name')}: {err.message}")
            self._avro_names(self._schemas[ref_id], named)
        try:  # any parse failure of the text is the client's invalid schema
            if "schemaType" not in stored:
                fastavro.parse_schema(json.loads(stored["schema"]), named_schemas=named)
            elif stored["schemaType"] == "JSON":
                doc = json.loads(stored["schema"])
                jsonschema.validators.validator_for(doc).check_schema(doc)
        except Exception as exc:
            raise _Error(422, 42201, f"Invalid schema: {exc}")

    def _avro_names(self, stored: dict, named: dict) -> None:
        for ref in stored.get("references", []):
            self._avro_names(self._schemas[self._version(ref["subject"], ref["version"])[1]], named)
        if "schemaType" not in stored:
            fastavro.parse_schema(json.loads(stored["schema"]), named_schemas=named)

    def _register(self, query, body, subject):
        stored, key = self._identity(body)
        schema_id = self._ids.get(key)
        if schema_id is None:
            self._validate(stored)
            schema_id = self._ids[key] = len(self._schemas) + 1
            self._schemas[schema_id] = stored
        versions = self._subjects.setdefault(subject, [])
        if schema_id not in versions:  # registering an existing version again adds none
            versions.append(schema_id)
        return {"id": schema_id}

    def _lookup(self, query, body, subject):
        versions = self._versions_of(subject)
        schema_id = self._ids.get(self._identity(body)[1])
        if schema_id not in versions:
            raise _Error(404, 40403, "Schema not found")
        return self._version_doc(subject, versions.index(schema_id) + 1, schema_id)

    def _get_schema(self, query, body, schema_id):
        if int(schema_id) not in self._schemas:
            raise _Error(404, 40403, f"Schema {schema_id} not found")
        return self._schemas[int(schema_id)]

    def _get_schema_versions(self, query, body, schema_id):
        self._get_schema(query, body, schema_id)
        return [{"subject": s, "version": v} for s, ids in sorted(self._subjects.items())
                for v, i in enumerate(ids, 1) if i == int(schema_id)]

    def _get_schema_subjects(self, query, body, schema_id):
        return sorted({doc["subject"] for doc in self._get_schema_versions(query, body, schema_id)})

    def _list_subjects(self, query, body):
        prefix = query.get("subjectPrefix", [""])[-1]
        return [s for s in sorted(self._subjects) if s.startswith(prefix)]

    def _list_versions(self, query, body, subject):
        return list(range(1, len(self._versions_of(subject)) + 1))

    def _get_version(self, query, body, subject, version):
        return self._version_doc(subject, *self._version(subject, version))

    def _get_latest_with_metadata(self, query, body, subject):
        # The client URL-encodes each key and value itself before the query string encodes them again.
        wanted = {unquote(k): unquote(v) for k, v in zip(query.get("key", []), query.get("value", []))}
        versions = self._versions_of(subject)
        for version in range(len(versions), 0, -1):
            properties = (self._schemas[versions[version - 1]].get("metadata") or {}).get("properties") or {}
            if wanted.items() <= properties.items():
                return self._version_doc(subject, version, versions[version - 1])
        raise _Error(404, 40403, "Schema not found")

    def _get_config(self, query, body, subject=None):
        if subject in self._config:
            return self._config[subject]
        if query.get("defaultToGlobal") == ["true"]:
            return self._config[None]
        raise _Error(404, 40408, f"Subject '{subject}' does not have subject-level compatibility configured")

    def _put_config(self, query, body, subject=None):
        level = str((body or {}).get("compatibility") or "").upper()
        if level not in _LEVELS:
            raise _Error(422, 42203, f"Invalid compatibility level. Valid values are {', '.join(_LEVELS)}")
        self._config[subject] = {"compatibilityLevel": level}
        return {"compatibility": level}

    def _versions_of(self, subject: str) -> list[int]:
        if subject not in self._subjects:
            raise _Error(404, 40401, f"Subject '{subject}' not found.")
        return self._subjects[subject]

    def _version(self, subject, version) -> tuple[int, int]:
        """(version number, schema id) of a subject's version: a number, "latest" or -1."""
        versions = self._versions_of(subject)
        try:
            n = len(versions) if str(version) in ("latest", "-1") else int(version)
        except ValueError:
            raise _Error(422, 42202, f"The specified version '{version}' is not a valid version id")
        if not 1 <= n <= len(versions):
            raise _Error(404, 40402, f"Version {version} not found.")
        return n, versions[n - 1]

    def _version_doc(self, subject: str, version: int, schema_id: int) -> dict:
        return {"subject": subject, "version": version, "id": schema_id, **self._schemas[schema_id]}


def serve_forever(port: int = 8081, host: str = "127.0.0.1", user_info: str | None = None) -> None:
    """Foreground dev registry: prints its URL, stops on SIGINT/SIGTERM."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with DevRegistry(port, host, user_info) as registry:
        print(registry.url, flush=True)
        stop.wait()


def main(argv: list[str] | None = None) -> None:
    """`python -m ledgerbatch.dev.registry`: the same as `ledgerbatch dev-registry`, without the CLI's imports."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m ledgerbatch.dev.registry", description=serve_forever.__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081, help="0: any free port")
    parser.add_argument("--user-info", metavar="USER:PASSWORD", help="basic auth; requests without it get 401")
    args = parser.parse_args(argv)
    serve_forever(args.port, args.host, args.user_info)


if __name__ == "__main__":
    main()
