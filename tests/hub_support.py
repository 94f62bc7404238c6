"""A Hugging Face hub served on loopback, for the tests that download (models and datasets)."""

from __future__ import annotations

import hashlib
import json


class FakeHub:
    """A minimal Hugging Face hub on 127.0.0.1 (the endpoints snapshot_download uses: repo info,
    tree listing, file resolve) serving real files; it logs every request."""

    def __init__(
        self,
        repos: dict[str, tuple[str, dict[str, bytes]]],
        datasets: dict[str, tuple[str, dict[str, bytes]]] | None = None,
    ):
        import http.server
        import threading

        self.repos = repos  # repo id -> (commit, {path: content})
        self.datasets = datasets or {}  # dataset repositories, the same shape
        self.log: list[tuple[str, str]] = []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                self._serve(body=False)

            def do_GET(self):
                self._serve(body=True)

            def _send(self, code, payload: bytes, headers: dict[str, str], body: bool):
                self.send_response(code)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if body:
                    self.wfile.write(payload)

            def _json(self, obj, body):
                data = json.dumps(obj).encode()
                self._send(200, data, {"Content-Type": "application/json"}, body)

            def _serve(self, body: bool):
                path = self.path.split("?")[0]
                hub.log.append((self.command, path))
                kinds = [("models", "", hub.repos), ("datasets", "/datasets", hub.datasets)]
                for kind, prefix, repo_id, (commit, files) in (
                    (k, pre, r, v) for k, pre, repos in kinds for r, v in repos.items()
                ):
                    api = f"/api/{kind}/{repo_id}/"
                    if path.startswith(api + "revision/"):
                        return self._json(
                            {"id": repo_id, "sha": commit,
                             "siblings": [{"rfilename": f} for f in files]}, body,
                        )  # fmt: skip
                    if path.startswith(api + "tree/"):
                        return self._json(
                            [{"type": "file", "path": f, "size": len(d), "oid": _git_oid(d)}
                             for f, d in files.items()], body,
                        )  # fmt: skip
                    res = f"{prefix}/{repo_id}/resolve/"
                    if path.startswith(res):
                        name = path[len(res) :].split("/", 1)[1]
                        if name in files:
                            data = files[name]
                            return self._send(
                                200, data,
                                {"X-Repo-Commit": commit, "ETag": f'"{_git_oid(data)}"'}, body,
                            )  # fmt: skip
                self._send(404, b"{}", {"X-Error-Code": "RepoNotFound"}, body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
