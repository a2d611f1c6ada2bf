"""A webhook receiver for Alertmanager that prints each alert on one line (deploy/compose.yaml).

Standard library only; listens on :9099. Replace it with a real receiver to be paged.
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class AlertLog(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            alerts = json.loads(self.rfile.read(length)).get("alerts", [])
        except ValueError:
            alerts = []
        for alert in alerts:
            labels, notes = alert.get("labels", {}), alert.get("annotations", {})
            print(
                alert.get("status", "?").upper(),
                labels.get("severity", "-"),
                labels.get("alertname", "-"),
                labels.get("instance", "-"),
                notes.get("summary", ""),
                flush=True,
            )
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass  # one line per alert is the log


if __name__ == "__main__":
    ThreadingHTTPServer(("", 9099), AlertLog).serve_forever()
