"""A local stand-in for the model hub's upload API (create repo, card check, preupload, commit), for offline push tests.

It answers just what `huggingface_hub.HfApi.create_repo` and `upload_folder` ask for, stores committed files
under `root/<repo_id>/`, and records every request path."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml


class FakeHub:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _reply(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):  # noqa: N802 - the http.server API
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hub.requests.append(self.path)
                path = self.path.split("?")[0]
                if path == "/api/repos/create":
                    spec = json.loads(body)
                    repo = f"{spec.get('organization') or 'user'}/{spec['name']}"
                    (hub.root / repo).mkdir(parents=True, exist_ok=True)
                    return self._reply(200, {"url": f"{hub.url}/{repo}"})
                if path == "/api/validate-yaml":  # the card's metadata block must be YAML, as on the real hub
                    text = json.loads(body)["content"]
                    try:
                        yaml.safe_load(text.split("---")[1]) if text.startswith("---") else None
                    except yaml.YAMLError as err:
                        return self._reply(400, {"error": str(err)})
                    return self._reply(200, {"warnings": []})
                if "/preupload/" in path:
                    files = json.loads(body)["files"]
                    return self._reply(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                                       for f in files]})
                if "/commit/" in path:
                    repo = path.split("/api/models/")[1].split("/commit/")[0]
                    for line in body.decode().splitlines():
                        entry = json.loads(line)
                        if entry["key"] == "file":
                            target = hub.root / repo / entry["value"]["path"]
                            target.parent.mkdir(parents=True, exist_ok=True)
                            target.write_bytes(base64.b64decode(entry["value"]["content"]))
                    return self._reply(200, {"commitUrl": f"{hub.url}/{repo}/commit/1", "commitOid": "1" * 40})
                return self._reply(404, {"error": f"not faked: {path}"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
