"""`glm53.host.source_tree.checkout_commit` on git's own on-disk layouts, and a TabbyAPI tree at another commit
than the lock's refused before a start (`glm53.serve.engines.exllamav3.tabby_check`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from glm53.errors import BadInput
from glm53.host.source_tree import checkout_commit
from glm53.recipe.pins import load_repro_lock
from glm53.recipe.profiles import load_profile
from glm53.serve.engines.exllamav3.tabby import build_tabby_launch
from glm53.serve.engines.exllamav3.tabby_check import require_tabby_config, tabby_config_check

STAND_IN = Path(__file__).parent / "fixtures" / "tabbyapi"
PINNED = load_repro_lock(Path(__file__).parents[1] / "repro.lock.json").engine.tabbyapi.rev
OTHER = "0123456789abcdef0123456789abcdef01234567"


def _tree(tmp_path: Path) -> Path:
    tree = tmp_path / "tabby"
    shutil.copytree(STAND_IN, tree, ignore=shutil.ignore_patterns("__pycache__"))
    return tree


def _git(tree: Path, head: str, files: dict[str, str] | None = None) -> None:
    """A .git directory as git writes it: HEAD, and refs where HEAD names one."""
    git = tree / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text(head + "\n")
    for name, text in (files or {}).items():
        (git / name).parent.mkdir(parents=True, exist_ok=True)
        (git / name).write_text(text)


def test_a_detached_head_loose_and_packed_refs_and_a_gitdir_file(tmp_path: Path) -> None:
    detached = tmp_path / "detached"
    detached.mkdir()
    _git(detached, OTHER)
    assert checkout_commit(detached) == OTHER
    loose = tmp_path / "loose"
    loose.mkdir()
    _git(loose, "ref: refs/heads/main", {"refs/heads/main": OTHER + "\n"})
    assert checkout_commit(loose) == OTHER
    packed = tmp_path / "packed"
    packed.mkdir()
    _git(packed, "ref: refs/heads/main", {"packed-refs": f"# pack-refs with: peeled\n{OTHER} refs/heads/main\n"})
    assert checkout_commit(packed) == OTHER
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / ".git").write_text(f"gitdir: {loose / '.git'}\n")
    assert checkout_commit(linked) == OTHER


@pytest.mark.parametrize("head", ["ref: refs/heads/gone", "not a commit", ""])
def test_what_cannot_be_told_is_none(tmp_path: Path, head: str) -> None:
    _git(tmp_path, head)
    assert checkout_commit(tmp_path) is None
    assert checkout_commit(tmp_path / "no-such-tree") is None


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_a_real_git_checkout(tmp_path: Path) -> None:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    (tmp_path / "f").write_text("x")
    for args in (["init", "-q"], ["add", "f"], ["commit", "-q", "-m", "x"]):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, env=env)
    rev = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    assert checkout_commit(tmp_path) == rev.stdout.strip()
    subprocess.run(["git", "-C", str(tmp_path), "pack-refs", "--all"], check=True)
    assert checkout_commit(tmp_path) == rev.stdout.strip()


def _launch(tree: Path):  # type: ignore[no-untyped-def]
    return build_tabby_launch(
        load_profile("exl3-1gpu", environ={}),
        model_dir=tree,
        host="127.0.0.1",
        port=8000,
        listen_all=False,
        plan=None,
        api_key=False,
        environ={"GLM53_TABBYAPI_DIR": str(tree), "XDG_RUNTIME_DIR": str(tree)},
        python=sys.executable,
    )


def test_a_tabbyapi_checkout_of_another_commit_is_refused_before_a_start(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    _git(tree, OTHER)
    spec = _launch(tree)
    with pytest.raises(BadInput) as err:
        require_tabby_config(spec)
    assert f"checked out at {OTHER}, but repro.lock.json pins {PINNED}" in err.value.message
    assert err.value.fix == f"git -C {tree} checkout {PINNED} (or point GLM53_TABBYAPI_DIR at a tree of that commit)"
    check = tabby_config_check(spec)
    assert not check.checked and OTHER in (check.reason or "")


def test_a_checkout_of_the_pinned_commit_and_a_tree_without_git_pass(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    assert "accepted by TabbyAPI's schema" in require_tabby_config(_launch(tree))  # no .git: a store copy
    assert PINNED is not None
    _git(tree, PINNED)
    assert "accepted by TabbyAPI's schema" in require_tabby_config(_launch(tree))
