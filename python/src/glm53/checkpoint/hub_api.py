"""What glm53 asks of the Hugging Face Hub's HTTP API, and the checkpoint lock made from its metadata alone.

`lock_from_hub` reads the model info at a pinned revision (each LFS file's sha256 and size); small non-LFS files
and the safetensors headers are fetched with HTTP range requests, so no weights are downloaded. The helpers
check what goes into a URL or a header (repository id, endpoint, token) before anything is asked, and
`hub_errors` turns huggingface_hub's and the network's exceptions into errors that say what to do. The download
itself is `glm53.checkpoint.hub`.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ValidationError

from glm53.checkpoint.lock import CheckpointLock, LockedFile, LockedSafetensors, is_tool_file, require_full_revision
from glm53.checkpoint.safetensors_header import MAX_HEADER_SIZE, parse_header_bytes
from glm53.errors import BadInput, Glm53Error, Unavailable, invalid_document
from glm53.fsutil import parse_json, safe_relative_path

# Non-LFS files fetched whole to hash them when locking from the Hub (configs, index, tokenizer).
MAX_INLINE_FETCH = 64 * 1024 * 1024


class _HubLfs(BaseModel):
    sha256: str
    size: int


class _HubSibling(BaseModel):
    rfilename: str
    size: int | None = None
    lfs: _HubLfs | None = None


class _HubModelInfo(BaseModel):
    """The two fields of the Hub's model-info answer a lock needs; the rest is ignored."""

    sha: str | None = None
    siblings: list[_HubSibling] | None = None


# The most a Hub API answer (JSON) may hold: a repository's file list is kilobytes, not gigabytes.
MAX_API_ANSWER = 64 * 1024 * 1024


def _read_limited(response: Any, limit: int) -> bytes:
    """At most `limit` bytes of a streamed response's body (a server may send more than asked)."""
    chunks: list[bytes] = []
    have = 0
    for chunk in response.iter_bytes():
        chunks.append(chunk)
        have += len(chunk)
        if have >= limit:
            break
    return b"".join(chunks)[:limit]


def _not_the_hub(url: str, response: Any, what: str, endpoint: str | None) -> Unavailable:
    content_type = response.headers.get("Content-Type") or "no Content-Type"
    return Unavailable(
        f"{url} answered something that is not the Hub's API ({what}; {content_type})",
        fix=f"check HF_ENDPOINT (now {endpoint or 'unset: https://huggingface.co'}) and that no proxy or "
        "captive portal (a hotel or office login page) intercepts the connection",
    )


def _api_timeout() -> float:
    # heavy: huggingface_hub takes ~0.4 s to import; only Hub commands pay it
    from huggingface_hub import constants

    return float(max(30, constants.HF_HUB_DOWNLOAD_TIMEOUT))


def _model_info(session: Any, repo: str, revision: str, endpoint: str | None, headers: dict[str, str]) -> _HubModelInfo:
    """GET /api/models/REPO/revision/REV?blobs=true, read bounded and parsed by the one JSON reader."""
    # heavy: huggingface_hub takes ~0.4 s to import; only Hub commands pay it
    from huggingface_hub import constants, hf_raise_for_status

    base = (endpoint or constants.ENDPOINT).rstrip("/")
    url = f"{base}/api/models/{repo}/revision/{revision}"
    with session.stream(
        "GET", url, params={"blobs": "true"}, headers=headers, follow_redirects=True, timeout=_api_timeout()
    ) as response:
        if response.status_code >= 400:
            response.read()
            hf_raise_for_status(response)
        raw = _read_limited(response, MAX_API_ANSWER + 1)
        if len(raw) > MAX_API_ANSWER:
            raise _not_the_hub(url, response, f"more than {MAX_API_ANSWER:,} bytes", endpoint)
        try:
            parsed = parse_json(raw, what=f"the Hub's answer from {url}")
            return _HubModelInfo.model_validate(parsed)
        except BadInput as exc:
            raise _not_the_hub(url, response, exc.message.rsplit(": ", 1)[-1][:200], endpoint) from exc
        except ValidationError as exc:
            bad = invalid_document(exc, "model info")
            raise _not_the_hub(url, response, bad.message, endpoint) from exc


def lock_from_hub(
    repo: str, revision: str, *, endpoint: str | None = None, token: str | bool | None = None
) -> CheckpointLock:
    """A lock from the Hub's metadata at `revision`, reading only headers and small files."""
    # heavy: huggingface_hub takes ~0.4 s to import; only Hub commands pay it
    from huggingface_hub import get_session, hf_hub_url, hf_raise_for_status

    require_full_revision(revision)
    require_repo_id(repo)
    endpoint = hub_endpoint(endpoint)
    with hub_errors(repo, revision):
        session = get_session()
        headers = hub_headers(token)
        info = _model_info(session, repo, revision, endpoint, headers)
        if info.sha != revision:
            raise BadInput(f"the Hub answered revision {info.sha} for {repo}@{revision}")

        def fetch(filename: str, start: int, end: int) -> bytes:
            try:
                return fetch_range(filename, start, end)
            except Exception as exc:
                if type(exc).__module__.startswith(("httpx", "httpcore", "h11")):
                    raise Unavailable(
                        f"cannot read {repo}/{filename} (bytes {start}-{end - 1}) from the Hub: {exc}",
                        fix="check the network, or HF_ENDPOINT; then run the same command again",
                    ) from exc
                raise

        def fetch_range(filename: str, start: int, end: int) -> bytes:
            url = hf_hub_url(repo, filename, revision=revision, endpoint=endpoint)
            with session.stream(
                "GET",
                url,
                headers={**headers, "Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity"},
                follow_redirects=True,
                timeout=_api_timeout(),
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    hf_raise_for_status(response)
                if response.status_code == 206:
                    content_range = response.headers.get("Content-Range", "")
                    if not content_range.startswith(f"bytes {start}-"):
                        raise _not_the_hub(
                            url, response, f"asked bytes {start}-{end - 1}, got {content_range!r}", endpoint
                        )
                    data = _read_limited(response, end - start)
                else:  # the server ignored the range: read no more than the bytes wanted
                    data = _read_limited(response, end)[start:end]
            if len(data) != end - start:
                raise Unavailable(
                    f"{repo}/{filename}: asked bytes {start}-{end - 1}, got {len(data)} bytes",
                    fix="the connection broke or the server is not the Hub: try again, check HF_ENDPOINT",
                )
            return data

        files: list[LockedFile] = []
        for sibling in sorted(info.siblings or [], key=lambda s: s.rfilename):
            name = sibling.rfilename
            safe_relative_path(name, what=f"Hub file list of {repo}")
            if is_tool_file(name):
                continue
            if sibling.lfs is not None:
                size, sha = int(sibling.lfs.size), str(sibling.lfs.sha256)
            else:
                if sibling.size is None:
                    raise Glm53Error(f"the Hub gave no size for {repo}/{name}")
                if sibling.size > MAX_INLINE_FETCH:
                    raise Glm53Error(f"{repo}/{name} is {sibling.size} bytes and not in LFS: no hash without download")
                size = int(sibling.size)
                sha = hashlib.sha256(fetch(name, 0, size) if size else b"").hexdigest()
            st_info = None
            if name.endswith(".safetensors"):
                st_info = _remote_header(fetch, repo, name, size)
            try:
                files.append(LockedFile(path=name, size=size, sha256=sha, safetensors=st_info))
            except ValidationError as exc:
                bad = invalid_document(exc, f"the Hub's metadata for {repo}/{name}")
                raise Unavailable(
                    bad.message, fix="the server is not the Hub, or answered nonsense: check HF_ENDPOINT"
                ) from exc
    return CheckpointLock(
        repo=repo, revision=revision, source="hub", total_size=sum(f.size for f in files), files=files
    )


def hub_headers(token: str | bool | None = None) -> dict[str, str]:
    """The headers huggingface_hub sends itself (auth from HF_TOKEN or the saved token), refused up front when
    the token holds what an HTTP header cannot carry (non-ASCII, a newline) instead of failing mid-request."""
    # heavy: huggingface_hub takes ~0.4 s to import; only Hub commands pay it
    from huggingface_hub.utils._headers import build_hf_headers

    headers = build_hf_headers(token=token)
    for key, value in headers.items():
        if not value.isascii() or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
            what = "HF_TOKEN (or the saved Hub token)" if key.lower() == "authorization" else f"the {key} header"
            raise BadInput(
                f"{what} holds characters an HTTP header cannot carry (non-ASCII or control characters)",
                fix="set HF_TOKEN to the token itself, e.g. hf_..., without quotes or spaces",
            )
    return headers


def require_repo_id(repo: str) -> str:
    """A Hub repository id (`owner/name`), checked before it goes into a URL."""
    # heavy: huggingface_hub takes ~0.4 s to import; only Hub commands pay it
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils._validators import validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError as exc:
        raise BadInput(
            f"REPO {repo!r} is not a Hub repository id: {exc}",
            fix="pass owner/name, e.g. turboderp/GLM-5.3-Flash-exl3",
        ) from exc
    return repo


def hub_endpoint(endpoint: str | None = None) -> str | None:
    """The argument, else HF_ENDPOINT read now (huggingface_hub itself reads it once, at import); an http(s) URL."""
    from_env = endpoint is None
    value = endpoint or os.environ.get("HF_ENDPOINT") or None
    if value is None:
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        where = f"HF_ENDPOINT={value!r}" if from_env else f"endpoint {value!r}"
        raise BadInput(
            f"{where} is not an http(s) URL of a Hub",
            fix="unset it for huggingface.co, or set e.g. https://hf-mirror.com",
        )
    return value.rstrip("/")


def _remote_header(fetch: Any, repo: str, name: str, size: int) -> LockedSafetensors:
    where = Path(f"{repo}/{name}")
    if size < 8:
        raise BadInput(f"{where}: {size} bytes, too short for a safetensors file")
    (header_size,) = struct.unpack("<Q", fetch(name, 0, 8))
    if header_size > MAX_HEADER_SIZE or 8 + header_size > size:
        raise BadInput(f"{where}: invalid safetensors header length {header_size}")
    header = parse_header_bytes(where, fetch(name, 8, 8 + header_size), size)
    return LockedSafetensors(tensors=len(header.tensors), header_sha256=header.header_sha256)


@contextmanager
def hub_errors(repo: str, revision: str) -> Iterator[None]:
    """Turn huggingface_hub's and the network's exceptions into errors that say what to do."""
    # heavy: huggingface_hub takes ~0.4 s to import; only Hub commands pay it
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{repo}@{revision}"
    try:
        yield
    except Glm53Error:
        raise
    except json.JSONDecodeError as exc:  # huggingface_hub parsing an answer that is not JSON (a login page)
        raise Unavailable(
            f"the Hub answered something that is not its API for {where}: {exc}",
            fix="check HF_ENDPOINT and that no proxy or captive portal intercepts the connection",
        ) from exc
    except HFValidationError as exc:
        raise BadInput(f"{where}: {exc}", fix="pass owner/name and a full 40-hex commit") from exc
    except RevisionNotFoundError as exc:
        raise BadInput(
            f"revision {revision} not found in {repo}", fix="check the commit hash (the full 40 hex digits)"
        ) from exc
    except GatedRepoError as exc:
        raise BadInput(f"{repo} is gated", fix="accept its terms and set HF_TOKEN") from exc
    except RepositoryNotFoundError as exc:
        raise BadInput(
            f"repository {repo} not found on the Hub",
            fix="check the name; private repositories need HF_TOKEN",
        ) from exc
    except EntryNotFoundError as exc:
        raise BadInput(f"a file of {where} is missing on the Hub: {exc}") from exc
    except HfHubHTTPError as exc:
        if exc.response is not None and exc.response.status_code < 500:
            raise BadInput(f"the Hub refused a request for {where}: {exc}") from exc
        raise Unavailable(f"the Hub failed for {where}: {exc}", fix="try again later") from exc
    except Exception as exc:
        if isinstance(exc, OSError) or type(exc).__module__.startswith(("httpx", "httpcore", "h11")):
            raise Unavailable(
                f"cannot reach the Hub for {where}: {exc or type(exc).__name__}",
                fix="check the network, or HF_ENDPOINT",
            ) from exc
        raise


__all__ = ["hub_endpoint", "hub_errors", "hub_headers", "lock_from_hub", "require_repo_id"]
