"""Which commit a source tree is checked out at, read from its `.git` without running git (a host may not
have it): a `.git` directory, or a `.git` file naming one (worktrees, submodules); HEAD as a commit or as a
ref, looked up loose or in packed-refs. None where the tree is no git checkout (a Nix store copy, a tarball).
"""

from __future__ import annotations

import re
from pathlib import Path

_COMMIT = re.compile(r"[0-9a-f]{40}")
_MAX_BYTES = 1 << 20  # HEAD, a ref and packed-refs are small; a larger file is not git's


def _read(path: Path) -> str | None:
    try:
        with path.open("rb") as f:
            return f.read(_MAX_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return None


def _git_dir(tree: Path) -> Path | None:
    dot_git = tree / ".git"
    if dot_git.is_dir():
        return dot_git
    text = _read(dot_git) if dot_git.is_file() else None
    if text is not None and text.startswith("gitdir:"):
        named = Path(text.removeprefix("gitdir:").strip())
        return named if named.is_absolute() else tree / named
    return None


def checkout_commit(tree: Path) -> str | None:
    """The commit `tree` has checked out, or None where it cannot be told."""
    git_dir = _git_dir(tree)
    head = _read(git_dir / "HEAD") if git_dir is not None else None
    if git_dir is None or head is None:
        return None
    head = head.strip()
    if _COMMIT.fullmatch(head):
        return head
    if not head.startswith("ref:"):
        return None
    ref = head.removeprefix("ref:").strip()
    # a worktree keeps its HEAD but shares the refs of the main repository (commondir)
    common = _read(git_dir / "commondir")
    roots = [git_dir] + ([(git_dir / common.strip()).resolve()] if common else [])
    for root in roots:
        loose = _read(root / ref)
        if loose is not None and _COMMIT.fullmatch(loose.strip()):
            return loose.strip()
        for line in (_read(root / "packed-refs") or "").splitlines():
            parts = line.split(" ", 1)
            if len(parts) == 2 and parts[1].strip() == ref and _COMMIT.fullmatch(parts[0]):
                return parts[0]
    return None


__all__ = ["checkout_commit"]
