"""`glm53 repro resolve` against real git servers on 127.0.0.1 (`git daemon`), and the NAR hash against Nix's."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import socket
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from glm53.repro.nar import nar_hash_path, nar_hash_tar
from tests.support.cli import run_glm53
from tests.support.nixenv import NIX_ENV

# tarfile's extraction filters arrived in 3.11.4; Debian 12's Python is 3.11.2 (our own archives are safe).
EXTRACT_FILTER: dict[str, str] = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _make_repo(path: Path, commits: int) -> list[str]:
    """A bare repository with `commits` commits on main (fixed dates: the same ids every run); the last one
    holds a file, an executable, a symlink and a sub-directory. Returns the commit ids, oldest first."""
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(path)], check=True)
    stream = io.BytesIO()
    for n in range(commits):
        files = {"README": f"commit {n}\n".encode()}
        if n == commits - 1:
            files |= {"src/engine.py": b"print('engine')\n", "src/deep/x.txt": b"x" * 1000}
        message = f"commit {n}".encode()
        stream.write(b"commit refs/heads/main\n")
        stream.write(f"mark :{n + 1}\ncommitter T <t@example> {1700000000 + n} +0000\n".encode())
        stream.write(b"data %d\n%s\n" % (len(message), message))
        if n:
            stream.write(f"from :{n}\n".encode())
        for name, data in files.items():
            stream.write(f"M 100644 inline {name}\ndata {len(data)}\n".encode() + data + b"\n")
        if n == commits - 1:
            stream.write(b"M 100755 inline run.sh\ndata 10\n#!/bin/sh\n\n")
            stream.write(b"M 120000 inline link\ndata 6\nREADME\n")
    subprocess.run(["git", "-C", str(path), "fast-import", "--quiet"], input=stream.getvalue(), check=True)
    for key in ("uploadpack.allowFilter", "uploadpack.allowAnySHA1InWant"):
        subprocess.run(["git", "-C", str(path), "config", key, "true"], check=True)
    out = subprocess.run(["git", "-C", str(path), "rev-list", "--reverse", "main"], capture_output=True, check=True)
    return out.stdout.decode().split()


Served = tuple[str, dict[str, list[str]], Path]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`git daemon` serving vllm.git (1000 commits: some share a 4-hex prefix), overlay.git and tabby.git."""
    base = tmp_path_factory.mktemp("git")
    repos = {
        "vllm.git": _make_repo(base / "vllm.git", 1000),
        "overlay.git": _make_repo(base / "overlay.git", 3),
        "tabby.git": _make_repo(base / "tabby.git", 3),
    }
    port = _free_port()
    daemon = subprocess.Popen(
        [
            "git",
            "daemon",
            "--export-all",
            "--reuseaddr",
            "--listen=127.0.0.1",
            f"--port={port}",
            f"--base-path={base}",
            str(base),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"git://127.0.0.1:{port}", repos, base
    finally:
        daemon.terminate()
        daemon.wait(timeout=10)


IMAGE_HASH = "sha256-" + "I" * 43 + "="


def _lock_copy(tmp_path: Path, vllm: tuple[str, str], overlay: tuple[str, str], *, image: bool = True) -> Path:
    """The lock with its source pins pointed at local servers; the vendor image's hash filled unless `image`
    is False (then resolving it is part of the run)."""
    text = (ROOT / "repro.lock.json").read_text()
    data = json.loads(text)
    for (url, short), name in ((vllm, "vllm"), (overlay, "glm53_overlay")):
        text = text.replace(f'"url": "{data["engine"][name]["url"]}"', f'"url": "{url}"')
        text = text.replace(f'"short_rev": "{data["engine"][name]["short_rev"]}"', f'"short_rev": "{short}"')
    if image:
        assert text.count('"hash": null,\n        "contents"') == 1
        text = text.replace('"hash": null,\n        "contents"', f'"hash": "{IMAGE_HASH}",\n        "contents"')
    path = tmp_path / "repro.lock.json"
    path.write_text(text)
    return path


def _archive(repo: Path, rev: str, tmp_path: Path) -> Path:
    tar = tmp_path / f"{rev}.tar"
    with tar.open("wb") as out:
        subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", rev], stdout=out, check=True)
    return tar


def _nix_hash_path(path: Path) -> str | None:
    if shutil.which("nix") is None:
        return None
    done = subprocess.run(["nix", "hash", "path", str(path)], capture_output=True, text=True, env=NIX_ENV)
    return done.stdout.strip() if done.returncode == 0 else None


def test_nar_hash_equals_nix_hash_path(tmp_path: Path) -> None:
    if shutil.which("nix") is None:
        pytest.skip("nix is not installed")
    repo = tmp_path / "r.git"
    head = _make_repo(repo, 2)[-1]
    tar = _archive(repo, head, tmp_path)
    tree = tmp_path / "tree"
    tree.mkdir()
    with tarfile.open(tar) as archive:
        archive.extractall(tree, **EXTRACT_FILTER)
    nix = _nix_hash_path(tree)
    assert nix is not None and nix.startswith("sha256-")
    with tar.open("rb") as handle:
        assert nar_hash_tar(handle) == nix
    assert nar_hash_path(tree) == nix
    assert (tree / "run.sh").stat().st_mode & 0o100 and (tree / "link").is_symlink()


def test_resolve_fills_both_pins_with_the_hash_nix_computes(served: Served, tmp_path: Path) -> None:
    url, repos, base = served
    vllm_head, overlay_head = repos["vllm.git"][-1], repos["overlay.git"][-1]
    lock = _lock_copy(tmp_path, (f"{url}/vllm.git", vllm_head[:9]), (f"{url}/overlay.git", overlay_head[:7]))
    before = lock.read_text()

    dry = run_glm53("repro", "resolve", "--lock", str(lock), "--dry-run", "--json")
    assert dry.code == 0 and [p["short_rev"] for p in dry.json()["would_fetch"]] == [vllm_head[:9], overlay_head[:7]]

    refused = run_glm53("repro", "resolve", "--lock", str(lock))  # stdin is not a terminal: no silent write
    assert refused.code == 2 and "--yes" in refused.stderr and lock.read_text() == before
    assert '+      "rev": "' + vllm_head in refused.stdout  # the diff was shown first

    done = run_glm53("repro", "resolve", "--lock", str(lock), "--yes", "--json")
    assert done.code == 0, done.stderr
    after = json.loads(lock.read_text())
    assert after["engine"]["vllm"]["rev"] == vllm_head
    assert after["engine"]["glm53_overlay"]["rev"] == overlay_head
    for name, head in (("vllm", vllm_head), ("glm53_overlay", overlay_head)):
        repo = base / ("vllm.git" if name == "vllm" else "overlay.git")
        with _archive(repo, head, tmp_path).open("rb") as handle:
            assert after["engine"][name]["hash"] == nar_hash_tar(handle)
    nix = _nix_hash_path(_extracted(base / "overlay.git", overlay_head, tmp_path))
    if nix is not None:
        assert after["engine"]["glm53_overlay"]["hash"] == nix
    # Only the four lines changed; the hand formatting of the rest is kept.
    changed = [(a, b) for a, b in zip(before.splitlines(), lock.read_text().splitlines(), strict=True) if a != b]
    assert len(changed) == 4 and all('"rev": null' in a or '"hash": null' in a for a, _ in changed)
    again = run_glm53("repro", "resolve", "--lock", str(lock), "--json")
    assert again.code == 0 and again.json()["would_fetch"] == []


def _extracted(repo: Path, rev: str, tmp_path: Path) -> Path:
    tree = tmp_path / f"tree-{rev[:8]}"
    tree.mkdir()
    with tarfile.open(_archive(repo, rev, tmp_path)) as archive:
        archive.extractall(tree, **EXTRACT_FILTER)
    return tree


def test_an_ambiguous_short_commit_is_named(served: Served, tmp_path: Path) -> None:
    url, repos, _ = served
    seen: dict[str, str] = {}
    prefix = next(c[:4] for c in repos["vllm.git"] if c[:4] in seen or seen.setdefault(c[:4], c) is None)
    lock = _lock_copy(tmp_path, (f"{url}/vllm.git", prefix), (f"{url}/overlay.git", repos["overlay.git"][-1][:7]))
    before = lock.read_text()
    result = run_glm53("repro", "resolve", "--lock", str(lock), "--yes")
    assert result.code == 2 and "ambiguous" in result.stderr and prefix in result.stderr
    assert lock.read_text() == before


def test_a_missing_commit_is_named(served: Served, tmp_path: Path) -> None:
    url, repos, _ = served
    missing = next(p for p in ("0000000", "fffffff", "1234567") if not any(c.startswith(p) for c in repos["vllm.git"]))
    lock = _lock_copy(tmp_path, (f"{url}/vllm.git", missing), (f"{url}/overlay.git", repos["overlay.git"][-1][:7]))
    before = lock.read_text()
    result = run_glm53("repro", "resolve", "--lock", str(lock), "--yes")
    assert result.code == 2 and f"no commit {missing}" in result.stderr
    assert lock.read_text() == before


def test_an_unreachable_server_is_exit_3_and_lists_the_fetches(tmp_path: Path) -> None:
    url = f"git://127.0.0.1:{_free_port()}"  # nothing listens there
    lock = _lock_copy(tmp_path, (f"{url}/vllm.git", "8e685d198"), (f"{url}/overlay.git", "f2935ce"))
    before = lock.read_text()
    result = run_glm53("repro", "resolve", "--lock", str(lock), "--yes")
    assert result.code == 3, result.stderr
    assert "8e685d198" in result.stderr and "nothing was written" in result.stderr
    assert lock.read_text() == before


def test_a_server_dying_mid_fetch_is_exit_3(served: Served, tmp_path: Path) -> None:
    url, repos, _ = served
    upstream_port = int(url.rsplit(":", 1)[1])
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]

    def proxy() -> None:
        """Pass the client's requests on, and the first 3,000 bytes of the answer; then hang up."""
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", upstream_port))

            def forward(src: socket.socket, dst: socket.socket, limit: int | None) -> None:
                """Copy src to dst (at most `limit` bytes), then close both: the server dies."""
                sent = 0
                try:
                    while data := src.recv(512):
                        if limit is not None and sent + len(data) > limit:
                            break
                        dst.sendall(data)
                        sent += len(data)
                except OSError:
                    pass
                for sock in (src, dst):
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                    sock.close()

            threading.Thread(target=forward, args=(client, upstream, None), daemon=True).start()
            threading.Thread(target=forward, args=(upstream, client, 3000), daemon=True).start()

    threading.Thread(target=proxy, daemon=True).start()
    try:
        dying = f"git://127.0.0.1:{port}"
        lock = _lock_copy(tmp_path, (f"{dying}/vllm.git", repos["vllm.git"][-1][:9]), (f"{url}/overlay.git", "0000000"))
        before = lock.read_text()
        result = run_glm53("repro", "resolve", "--lock", str(lock), "--yes")
        assert result.code == 3, result.stderr
        assert "engine.vllm" in result.stderr and lock.read_text() == before
    finally:
        listener.close()


TABBY_URL = "https://github.com/theroyallab/tabbyAPI"


def _serve_tabbyapi_from(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    """The lock keeps TabbyAPI's GitHub address (its model accepts no other); git itself is told to fetch it
    from the local server instead (url.<base>.insteadOf, through git's environment configuration)."""
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", f"url.{url}/tabby.git.insteadOf")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", TABBY_URL)


def _tabby_lock(tmp_path: Path, rev: str | None, hash_: str | None) -> Path:
    """The lock with TabbyAPI's rev and hash as given, and the vLLM pins filled (so that only TabbyAPI is open)."""
    data = json.loads((ROOT / "repro.lock.json").read_text())
    assert data["engine"]["tabbyapi"]["url"] == TABBY_URL
    data["engine"]["tabbyapi"].update(rev=rev, hash=hash_)
    data["engine"]["vllm"]["image"]["hash"] = IMAGE_HASH
    for name in ("vllm", "glm53_overlay"):
        pin = data["engine"][name]
        pin.update(rev=pin["short_rev"].ljust(40, "0"), hash="sha256-" + "A" * 43 + "=")
    path = tmp_path / "repro.lock.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def _date(repo: Path, rev: str) -> str:
    shown = subprocess.run(["git", "-C", str(repo), "log", "-1", "--format=%cs", rev], capture_output=True, check=True)
    return shown.stdout.decode().strip()


def test_resolve_pins_tabbyapi_to_the_upstream_head(
    served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, repos, base = served
    _serve_tabbyapi_from(monkeypatch, url)
    head = repos["tabby.git"][-1]
    lock = _tabby_lock(tmp_path, None, None)
    before = lock.read_text()

    dry = run_glm53("repro", "resolve", "--lock", str(lock), "--dry-run", "--json")
    assert dry.code == 0
    assert [(p["name"], p["rev"]) for p in dry.json()["would_fetch"]] == [("tabbyapi", None)]

    done = run_glm53("repro", "resolve", "--lock", str(lock), "--yes", "--json")
    assert done.code == 0, done.stderr
    pin = json.loads(lock.read_text())["engine"]["tabbyapi"]
    with _archive(base / "tabby.git", head, tmp_path).open("rb") as handle:
        assert (pin["rev"], pin["hash"]) == (head, nar_hash_tar(handle))
    assert pin["date"] == _date(base / "tabby.git", head) == "2023-11-14"
    nix = _nix_hash_path(_extracted(base / "tabby.git", head, tmp_path))
    if nix is not None:
        assert pin["hash"] == nix
    changed = [a for a, b in zip(before.splitlines(), lock.read_text().splitlines(), strict=True) if a != b]
    assert len(changed) == 3 and all(key in a for a, key in zip(changed, ('"rev"', '"hash"', '"date"'), strict=True))


def test_resolve_hashes_a_given_tabbyapi_commit_and_update_moves_it(
    served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, repos, base = served
    _serve_tabbyapi_from(monkeypatch, url)
    first, head = repos["tabby.git"][0], repos["tabby.git"][-1]
    lock = _tabby_lock(tmp_path, first, None)

    done = run_glm53("repro", "resolve", "--lock", str(lock), "--yes", "--json")
    assert done.code == 0, done.stderr
    pin = json.loads(lock.read_text())["engine"]["tabbyapi"]
    with _archive(base / "tabby.git", first, tmp_path).open("rb") as handle:
        assert (pin["rev"], pin["hash"]) == (first, nar_hash_tar(handle))

    assert run_glm53("repro", "resolve", "--lock", str(lock), "--json").json()["would_fetch"] == []
    moved = run_glm53("repro", "resolve", "--lock", str(lock), "--update", "tabbyapi", "--yes", "--json")
    assert moved.code == 0, moved.stderr
    assert json.loads(lock.read_text())["engine"]["tabbyapi"]["rev"] == head

    refused = run_glm53("repro", "resolve", "--lock", str(lock), "--update", "vllm", "--yes")
    assert refused.code == 2 and "only tabbyapi follows an upstream branch" in refused.stderr


SOURCE_TREE = ROOT / "tests" / "fixtures" / "repro" / "source-tree"
# `nix hash path --type sha256 --sri tests/fixtures/repro/source-tree` (Nix 2.8) printed this.
SOURCE_TREE_NAR = "sha256-CkoMn7kh0/2WLzeqhuKFctX84pB6lXpp+FvD3ZoMImU="


def test_a_source_trees_nar_hash_is_nixs_from_disk_and_from_git_archive(tmp_path: Path) -> None:
    """How engine.tabbyapi.hash is made: `git archive` of the commit, hashed as the NAR of the tree it unpacks to
    (what fetchFromGitHub checks). A small committed tree (an executable, an empty file, names whose byte order
    differs from their case-folded order, a sub-folder) stands for the upstream's."""
    assert nar_hash_path(SOURCE_TREE) == SOURCE_TREE_NAR
    repo = tmp_path / "upstream"
    shutil.copytree(SOURCE_TREE, repo)
    git = ["git", "-C", str(repo), "-c", "user.name=T", "-c", "user.email=t@example"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "tree"], check=True)
    tar = _archive(repo / ".git", "HEAD", tmp_path)
    with tar.open("rb") as handle:
        assert nar_hash_tar(handle) == SOURCE_TREE_NAR
    if shutil.which("nix") is None:
        pytest.skip("nix is not installed: compared with the recorded hash only")
    done = subprocess.run(
        ["nix", "hash", "path", "--type", "sha256", "--sri", str(SOURCE_TREE)],
        capture_output=True,
        text=True,
        env=NIX_ENV,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == SOURCE_TREE_NAR


# -- the vendor image's hash, as Nix computes it ---------------------------------------------------------------


def _fake_nix(tmp_path: Path, stderr: str, code: int = 1) -> dict[str, str]:
    """A `nix` that records its argv and answers as `nix build` does for a fixed-output fetch."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (tmp_path / "stderr").write_text(stderr)
    (bin_dir / "nix").write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path / "argv"}\ncat {tmp_path / "stderr"} >&2\nexit {code}\n'
    )
    (bin_dir / "nix").chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


MISMATCH = """error: hash mismatch in fixed-output derivation '/nix/store/x-docker-image-vllm-openai.tar.drv':
         specified: sha256-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=
            got:    sha256-2WI5gKiwd3rr2+HkM0VBYwRfEeS1bPsZqUQoTn5PEDc=
"""


def test_resolve_fills_the_vendor_images_hash_that_nix_reports(
    served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, repos, _ = served
    repo = tmp_path / "repo"
    repo.mkdir()
    lock = _lock_copy(
        repo,
        (f"{url}/vllm.git", repos["vllm.git"][-1][:9]),
        (f"{url}/overlay.git", repos["overlay.git"][-1][:7]),
        image=False,
    )
    (repo / "flake.nix").write_text("{ }\n")
    for key, value in _fake_nix(tmp_path, MISMATCH).items():
        monkeypatch.setenv(key, value)
    dry = run_glm53("repro", "resolve", "--lock", str(lock), "--dry-run", "--json")
    assert dry.code == 0 and dry.json()["would_pull"]["digest"].startswith("sha256:0aea3024")
    done = run_glm53("repro", "resolve", "--lock", str(lock), "--yes", "--json")
    assert done.code == 0, done.stderr
    assert done.json()["image"]["hash"] == "sha256-2WI5gKiwd3rr2+HkM0VBYwRfEeS1bPsZqUQoTn5PEDc="
    after = json.loads(lock.read_text())["engine"]["vllm"]["image"]
    assert after["hash"] == "sha256-2WI5gKiwd3rr2+HkM0VBYwRfEeS1bPsZqUQoTn5PEDc="
    # The pull is the flake's own expression (nix/vendor-pull.nix), with a placeholder hash.
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[-3:] == ["build", "--no-link", f"{repo}#image.probe"]


def test_an_image_nix_cannot_pull_is_exit_3_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    data = json.loads((ROOT / "repro.lock.json").read_text())
    for name in ("vllm", "glm53_overlay"):  # only the image is left to resolve
        pin = data["engine"][name]
        pin.update(rev=pin["short_rev"].ljust(40, "0"), hash="sha256-" + "A" * 43 + "=")
    lock = repo / "repro.lock.json"
    lock.write_text(json.dumps(data, indent=2) + "\n")
    (repo / "flake.nix").write_text("{ }\n")
    before = lock.read_text()
    failure = (
        "error: pinging container registry registry-1.docker.io: dial tcp: lookup registry-1.docker.io: no such host\n"
    )
    for key, value in _fake_nix(tmp_path, failure).items():
        monkeypatch.setenv(key, value)
    result = run_glm53("repro", "resolve", "--lock", str(lock), "--yes")
    assert result.code == 3, result.stderr
    assert "nix could not pull vllm/vllm-openai:qwen38-flash-next" in result.stderr
    assert "nothing was written" in result.stderr and lock.read_text() == before
