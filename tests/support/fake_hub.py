"""A local HTTP server speaking the subset of the Hugging Face Hub protocol that huggingface_hub uses to
describe a model repository and download its files. Point huggingface_hub at it with HF_ENDPOINT (or an
`endpoint=` argument); the real Hub is unreachable from the tests.

Served, for model repositories whose files come from local folders:
- GET  /api/models/{repo}[/revision/{rev}]          model info; `?blobs=true` adds size, blobId and lfs
- GET  /api/models/{repo}/tree/{rev}[/{path}]        file listing (`recursive`), as list_repo_tree reads it
- POST /api/models/{repo}/paths-info/{rev}           form field `paths`
- HEAD/GET /{repo}/resolve/{rev}/{path}              X-Repo-Commit, ETag / X-Linked-Etag, X-Linked-Size,
                                                      Content-Length, Accept-Ranges and `Range` (206)
Errors carry X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound) like the Hub's.
Files named *.safetensors or larger than `lfs_threshold` are LFS files (ETag = their sha256).
Breaking transfers, to test resuming (each keyed by the file's path in the repo):
- `drop_after`: the first whole-file GET of the file closes the connection after N body bytes;
- `cut_at`: every GET of the file stops at byte N of the file and closes the connection (a request that starts
  at or past N gets its headers and no body), until the key is removed: retries within one run are exhausted;
- `ignore_range`: GETs of these files answer 200 with the whole file whatever their `Range`, like a CDN that
  drops the header;
- `stall_after`: the first whole-file GET of the file sends N body bytes, sets `stalled`, then sends nothing
  more until `release` is set, and closes the connection: the test kills the downloading process meanwhile.
Not being the Hub:
- `canned`: (status, content type, body) answers every request, e.g. a captive portal's HTML login page.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, unquote, urlsplit

if TYPE_CHECKING:
    import pytest

# The repository and revision the checkpoint tests serve and ask for.
REPO = "turboderp/GLM-5.3-Flash-exl3"
REV = "332ab457b709b7ba30dd9a448be5de03b80a7ac9"


@dataclass
class _RepoFile:
    path: str
    local: Path
    size: int
    sha256: str
    git_oid: str
    lfs: bool

    def describe(self) -> dict[str, object]:
        entry: dict[str, object] = {"type": "file", "oid": self.git_oid, "size": self.size, "path": self.path}
        if self.lfs:
            entry["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": 134}
        return entry


@dataclass
class Request:
    method: str
    path: str
    range: str | None


@dataclass
class FakeHub:
    """Repos: repo id -> commit -> folder with its files; branches: repo id -> name -> commit."""

    lfs_threshold: int = 10 * 1024 * 1024
    repos: dict[str, dict[str, dict[str, _RepoFile]]] = field(default_factory=dict)
    branches: dict[str, dict[str, str]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    drop_after: dict[str, int] = field(default_factory=dict)
    cut_at: dict[str, int] = field(default_factory=dict)
    ignore_range: set[str] = field(default_factory=set)
    stall_after: dict[str, int] = field(default_factory=dict)
    stalled: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    canned: tuple[int, str, bytes] | None = None
    url: str = ""

    def add_repo(self, repo: str, commit: str, folder: Path, *, branch: str = "main") -> None:
        files: dict[str, _RepoFile] = {}
        for local in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
            rel = local.relative_to(folder).as_posix()
            data = local.read_bytes()
            lfs = rel.endswith(".safetensors") or len(data) > self.lfs_threshold
            git_oid = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            files[rel] = _RepoFile(rel, local, len(data), hashlib.sha256(data).hexdigest(), git_oid, lfs)
        self.repos.setdefault(repo, {})[commit] = files
        self.branches.setdefault(repo, {})[branch] = commit

    def downloaded_bytes(self, path_suffix: str = "") -> int:
        """Bytes requested by GETs of resolve URLs (for asserting what was fetched)."""
        total = 0
        for r in self.requests:
            if r.method == "GET" and "/resolve/" in r.path and r.path.endswith(path_suffix):
                total += -1 if r.range is None else _range_length(r.range)
        return total

    def gets(self, path_suffix: str) -> list[Request]:
        """The GETs of resolve URLs ending with `path_suffix`, in arrival order."""
        return [
            r for r in self.requests if r.method == "GET" and "/resolve/" in r.path and r.path.endswith(path_suffix)
        ]

    def _resolve_revision(self, repo: str, rev: str) -> str | None:
        commits = self.repos.get(repo, {})
        if rev in commits:
            return rev
        return self.branches.get(repo, {}).get(rev)


def _range_length(spec: str) -> int:
    m = re.fullmatch(r"bytes=(\d+)-(\d*)", spec)
    if not m:
        return -1
    return (int(m.group(2)) - int(m.group(1)) + 1) if m.group(2) else -1


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    # --- helpers -----------------------------------------------------------------------------------
    def _send(
        self,
        status: int,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self._send(status, body, {"X-Error-Code": code, "X-Error-Message": message})

    def _json(self, value: object, headers: dict[str, str] | None = None) -> None:
        self._send(200, json.dumps(value).encode(), headers)

    def _repo_and_rest(self, path: str, prefix: str) -> tuple[str, str] | None:
        rest = path[len(prefix) :]
        for repo in self.hub.repos:
            if rest == repo or rest.startswith(repo + "/"):
                return repo, rest[len(repo) :].lstrip("/")
        return None

    # --- routes --------------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._route()

    def do_HEAD(self) -> None:
        self._route()

    def do_POST(self) -> None:
        self._route()

    def _route(self) -> None:
        parts = urlsplit(self.path)
        path = unquote(parts.path)
        query = parse_qs(parts.query)
        self.hub.requests.append(Request(self.command, path, self.headers.get("Range")))
        if self.hub.canned is not None:
            status, content_type, body = self.hub.canned
            return self._send(status, body, content_type=content_type)
        if path.startswith("/api/models/"):
            found = self._repo_and_rest(path, "/api/models/")
            if found is None:
                return self._error(404, "RepoNotFound", "Repository not found")
            repo, rest = found
            return self._api(repo, rest, query)
        found = self._repo_and_rest(path, "/")
        if found is None or not found[1].startswith("resolve/"):
            return self._error(404, "RepoNotFound", "Repository not found")
        repo, rest = found
        rev, _, file_path = rest[len("resolve/") :].partition("/")
        return self._resolve(repo, rev, file_path)

    def _api(self, repo: str, rest: str, query: dict[str, list[str]]) -> None:
        if rest == "" or rest.startswith("revision/"):
            rev = rest[len("revision/") :] if rest else "main"
            commit = self.hub._resolve_revision(repo, rev)
            if commit is None:
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            files = self.hub.repos[repo][commit]
            blobs = query.get("blobs", ["false"])[0].lower() == "true"
            siblings = []
            for f in files.values():
                sibling: dict[str, object] = {"rfilename": f.path}
                if blobs:
                    sibling |= {"size": f.size, "blobId": f.git_oid}
                    if f.lfs:
                        sibling["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": 134}
                siblings.append(sibling)
            return self._json(
                {
                    "_id": repo,
                    "id": repo,
                    "modelId": repo,
                    "sha": commit,
                    "private": False,
                    "siblings": siblings,
                    "tags": [],
                    "downloads": 0,
                    "likes": 0,
                }
            )
        kind, _, tail = rest.partition("/")
        rev, _, sub = tail.partition("/")
        commit = self.hub._resolve_revision(repo, rev)
        if commit is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        files = self.hub.repos[repo][commit]
        if kind == "tree":
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            prefix = sub.rstrip("/") + "/" if sub else ""
            entries: list[dict[str, object]] = []
            folders: set[str] = set()
            for f in files.values():
                if not f.path.startswith(prefix):
                    continue
                inner = f.path[len(prefix) :]
                if "/" in inner and not recursive:
                    folders.add(prefix + inner.split("/", 1)[0])
                    continue
                if recursive:
                    parents = inner.split("/")[:-1]
                    folders.update(prefix + "/".join(parents[: i + 1]) for i in range(len(parents)))
                entries.append(f.describe())
            entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": d} for d in sorted(folders)]
            return self._json(entries)
        if kind == "paths-info" and self.command == "POST":
            length = int(self.headers.get("Content-Length") or 0)
            form = parse_qs(self.rfile.read(length).decode())
            wanted = form.get("paths", [])
            return self._json([files[p].describe() for p in wanted if p in files])
        return self._error(404, "EntryNotFound", f"unknown API route {rest}")

    def _resolve(self, repo: str, rev: str, file_path: str) -> None:
        commit = self.hub._resolve_revision(repo, rev)
        if commit is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        f = self.hub.repos[repo][commit].get(file_path)
        if f is None:
            return self._error(404, "EntryNotFound", f"{file_path} does not exist at {rev}")
        headers = {"X-Repo-Commit": commit, "Accept-Ranges": "bytes", "ETag": f'"{f.sha256 if f.lfs else f.git_oid}"'}
        if f.lfs:
            headers |= {"X-Linked-Etag": f'"{f.sha256}"', "X-Linked-Size": str(f.size)}
        start, end = 0, f.size
        status = 200
        spec = self.headers.get("Range") if f.path not in self.hub.ignore_range else None
        if spec:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", spec.strip())
            if not m or int(m.group(1)) >= max(f.size, 1):
                return self._send(416, b"", {"Content-Range": f"bytes */{f.size}"})
            start = int(m.group(1))
            end = min(int(m.group(2)) + 1, f.size) if m.group(2) else f.size
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{f.size}"
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        if self.command == "HEAD":
            return
        drop = self.hub.drop_after.pop(f.path, None) if self.command == "GET" and not spec else None
        stall = self.hub.stall_after.pop(f.path, None) if self.command == "GET" and not spec else None
        cut = self.hub.cut_at.get(f.path)
        stop = end
        if drop is not None:
            stop = min(stop, start + drop)
        if stall is not None:
            stop = min(stop, start + stall)
        if cut is not None:
            stop = max(start, min(stop, cut))
        with open(f.local, "rb") as handle:
            handle.seek(start)
            remaining = stop - start
            while remaining > 0:
                chunk = handle.read(min(remaining, 1 << 20))
                if not chunk:
                    break
                self.wfile.write(chunk)
                remaining -= len(chunk)
        if stop == end:
            return
        try:
            self.wfile.flush()
            if stall is not None:
                self.hub.stalled.set()
                self.hub.release.wait()
            self.close_connection = True
            self.connection.shutdown(2)
        except OSError:  # the client is gone already (killed while the transfer stalled)
            self.close_connection = True


@contextmanager
def serve_fake_hub(hub: FakeHub | None = None) -> Iterator[FakeHub]:
    """Run `hub` on 127.0.0.1 at a free port for the duration of the block; `hub.url` is its endpoint."""
    hub = hub or FakeHub()
    handler = type("BoundHandler", (_Handler,), {"hub": hub})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="fake-hub", daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextmanager
def serve_repo(source: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """A fake Hub serving the folder `source` as REPO at REV, with HF_ENDPOINT pointing at it."""
    with serve_fake_hub() as hub:
        hub.add_repo(REPO, REV, source)
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        yield hub


def download_args(target: Path) -> list[str]:
    """`glm53 model download` of REPO at REV into `target`."""
    return ["model", "download", REPO, "--revision", REV, "--model-dir", str(target)]


__all__ = ["REPO", "REV", "FakeHub", "Request", "download_args", "serve_fake_hub", "serve_repo"]
