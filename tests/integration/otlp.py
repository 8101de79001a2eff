"""An OTLP/HTTP metrics receiver for tests: decodes each ExportMetricsServiceRequest (opentelemetry-proto)
into (name, unit, attributes, value) points, as a collector would see them."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)


def _value(attr) -> str:
    return attr.value.string_value or str(attr.value.int_value)


class OtlpReceiver:
    def __init__(self):
        self.points: list[tuple[str, str, dict, float]] = []
        self.resources: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportMetricsServiceRequest.FromString(body)
                receiver._add(request, self.path)
                reply = ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _add(self, request, path: str) -> None:
        assert path == "/v1/metrics", path
        for rm in request.resource_metrics:
            self.resources.append({a.key: _value(a) for a in rm.resource.attributes})
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    kind = m.WhichOneof("data")
                    for p in getattr(m, kind).data_points:
                        value = (p.count if kind == "histogram" else p.as_int if p.HasField("as_int") else p.as_double)
                        self.points.append((m.name, m.unit, {a.key: _value(a) for a in p.attributes}, value))

    def latest(self, name: str, **attrs) -> dict[tuple, float]:
        """The last value of each series of `name` whose attributes include `attrs` (keys with _ for .)."""
        want = {k.replace("__", "."): v for k, v in attrs.items()}
        out = {}
        for n, _, a, v in self.points:
            if n == name and all(a.get(k) == w for k, w in want.items()):
                out[tuple(sorted(a.items()))] = v
        return out

    def close(self) -> None:
        self.server.shutdown()
