"""A local stand-in for the model hub's HTTP API, as much of it as the hub client uses to download.

The real hub cannot be reached here, so `dflashctl models fetch` is tested through the real hub
client (huggingface_hub) against this server on loopback: `GET /api/models/<repo>/revision/<rev>`
(the listing with sizes and hashes), `HEAD`/`GET /<repo>/resolve/<rev>/<file>` (with the headers
the client reads: X-Repo-Commit, ETag, Content-Length; Range for resuming).
"""

import hashlib
import http.server
import json
import threading
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


@dataclass
class Repo:
    commit: str
    files: dict[str, bytes]
    lfs: set[str] = field(default_factory=set)  # files stored with LFS (listed with sha256)
    branches: dict[str, str] = field(default_factory=dict)
    tampered: dict[str, bytes] = field(default_factory=dict)  # served instead of the listed bytes
    token: str | None = None  # gated: this bearer token is required

    def listing(self) -> dict:
        siblings = []
        for name, data in sorted(self.files.items()):
            s = {"rfilename": name, "size": len(data), "blobId": git_blob_id(data)}
            if name in self.lfs:
                s["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                            "pointerSize": 134}
            siblings.append(s)
        return {"id": "", "sha": self.commit, "siblings": siblings}

    def etag(self, name: str) -> str:
        data = self.files[name]
        return hashlib.sha256(data).hexdigest() if name in self.lfs else git_blob_id(data)


class FakeHub:
    def __init__(self, repos: dict[str, Repo]):
        self.repos = repos
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Authorization)
        self.ranges: list[str] = []  # Range headers of GETs (resumed downloads)
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_HEAD(self):
                hub._serve(self, body=False)

            def do_GET(self):
                hub._serve(self, body=True)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def downloads(self) -> list[str]:
        return [p for m, p, _ in self.requests if m == "GET" and "/resolve/" in p]

    def _repo_rev(self, parts: list[str]) -> tuple[str, str, list[str]] | None:
        for n in (2, 1):  # org/name or name
            repo = "/".join(parts[:n])
            if repo in self.repos:
                return repo, parts[n], parts[n + 1:]
        return None

    def _serve(self, h, body: bool):
        path = unquote(urlsplit(h.path).path)
        auth = h.headers.get("Authorization")
        self.requests.append((h.command, path, auth))
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "models"] and "revision" in parts:
            i = parts.index("revision")
            repo_id, rev = "/".join(parts[2:i]), parts[i + 1]
            return self._listing(h, repo_id, rev, auth, body)
        if "resolve" in parts:
            i = parts.index("resolve")
            repo_id, rev, name = "/".join(parts[:i]), parts[i + 1], "/".join(parts[i + 2:])
            return self._file(h, repo_id, rev, name, auth, body)
        self._error(h, 404, "not found")

    def _find(self, h, repo_id, rev, auth):
        repo = self.repos.get(repo_id)
        if repo is None:
            self._error(h, 404, "Repository not found")
            return None
        if repo.token and auth != f"Bearer {repo.token}":
            self._error(h, 401, "Access to model is restricted")
            return None
        if rev not in (repo.commit, *repo.branches) :
            self._error(h, 404, "Revision not found")
            return None
        return repo

    def _listing(self, h, repo_id, rev, auth, body):
        repo = self._find(h, repo_id, rev, auth)
        if repo is None:
            return
        data = json.dumps({**repo.listing(), "id": repo_id}).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if body:
            h.wfile.write(data)

    def _file(self, h, repo_id, rev, name, auth, body):
        repo = self._find(h, repo_id, rev, auth)
        if repo is None:
            return
        if name not in repo.files:
            return self._error(h, 404, "Entry not found")
        data = repo.tampered.get(name, repo.files[name])
        start = 0
        rng = h.headers.get("Range")
        if rng and rng.startswith("bytes=") and body:
            self.ranges.append(rng)
            start = int(rng[6:].split("-")[0] or 0)
        h.send_response(206 if start else 200)
        h.send_header("X-Repo-Commit", repo.commit)
        h.send_header("ETag", f'"{repo.etag(name)}"')
        h.send_header("Content-Length", str(len(data) - start))
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.end_headers()
        if body:
            h.wfile.write(data[start:])

    def _error(self, h, code, message):
        data = json.dumps({"error": message}).encode()
        h.send_response(code)
        h.send_header("Content-Type", "application/json")
        h.send_header("X-Error-Message", message)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)
