"""vllm-router 0.1.17's hashing, bit for bit, so that the capacity model puts a session where the router does.

The router (Rust, src/policies/consistent_hash.rs) hashes with mcrouter's `furc_hash` over MurmurHash64A
(`fbi_hash`: furc_hash into 2^23 - 1 buckets, the bucket re-hashed to 64 bits). Two policies use it:

- consistent_hash: a ring of 160 virtual nodes per worker, node `"{url}:{i}"` at `fbi_hash` of that key; a
  request with an X-Session-ID header goes to the first node at or after `fbi_hash("header:x-session-id:ID")`
  (src/policies/hash_key.rs builds that key), wrapping around;
- sticky_least_loaded (src/policies/sticky_least_loaded.rs): among the workers with the fewest sessions, the
  one with the highest `fbi_hash("{session}:{url}")` (rendezvous hashing; the first in worker order on a tie).

tests/test_fleet_router.py checks both against the installed router's routing.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence

_M = 0xC6A4A7935BD1E995
_MASK = (1 << 64) - 1
_SEED = 4193360111  # hash.c's seed, used throughout
_FURC_SHIFT = 23
_FURC_MODULUS = (1 << 23) - 1  # fbi_hash's bucket count: furc_hash's largest
VIRTUAL_NODES_PER_WORKER = 160
SESSION_HEADER_KEY = "header:x-session-id:"


def murmur_hash_64a(key: bytes, seed: int = _SEED) -> int:
    h = (seed ^ (len(key) * _M)) & _MASK
    whole = len(key) - len(key) % 8
    for i in range(0, whole, 8):
        k = (int.from_bytes(key[i : i + 8], "little") * _M) & _MASK
        k = ((k ^ (k >> 47)) * _M) & _MASK
        h = ((h ^ k) * _M) & _MASK
    if whole < len(key):
        h = ((h ^ int.from_bytes(key[whole:], "little")) * _M) & _MASK
    h = ((h ^ (h >> 47)) * _M) & _MASK
    return h ^ (h >> 47)


def _rehash(k: int) -> int:
    """hash.c's MurmurHash64A of one 64-bit word (furc_hash's next 64 bits)."""
    h = (_SEED ^ (8 * _M)) & _MASK
    k = (k * _M) & _MASK
    k = ((k ^ (k >> 47)) * _M) & _MASK
    h = ((h ^ k) * _M) & _MASK
    h = ((h ^ (h >> 47)) * _M) & _MASK
    return h ^ (h >> 47)


def furc_hash(key: bytes, m: int) -> int:
    """mcrouter's furc_hash: `key` into [0, m), moving as few keys as possible when m changes."""
    if m <= 1:
        return 0
    # The bit stream: MurmurHash64A of the key, then each word re-hashed; one integer, word i at bit 64 i.
    # Nine words cover every bit a first try reads for m < 2^23; later tries extend it.
    word = murmur_hash_64a(key)
    stream, words = word, 1

    def bits_to(index: int) -> None:
        nonlocal stream, words, word
        while words * 64 <= index:
            word = _rehash(word)
            stream |= word << (64 * words)
            words += 1

    bits_to(64 * 9 - 1)
    d = (m - 1).bit_length()
    a = d
    for _ in range(32):
        bits_to(a + _FURC_SHIFT * d)
        while not (stream >> a) & 1:
            if d == 0:
                return 0
            d -= 1
            a = d
        a += _FURC_SHIFT
        num = 1
        for _ in range(d - 1):
            num = (num << 1) | ((stream >> a) & 1)
            a += _FURC_SHIFT
        if num < m:
            return num
    return 0


@functools.lru_cache(maxsize=1 << 18)
def fbi_hash(key: str) -> int:
    """The router's 64-bit hash of a string (cached: the same ring nodes and sessions recur across box counts)."""
    bucket = furc_hash(key.encode(), _FURC_MODULUS)
    return murmur_hash_64a(bucket.to_bytes(4, "little"))


class HashRing:
    """consistent_hash's ring over `urls`, in the router's worker order."""

    def __init__(self, urls: Sequence[str], virtual_nodes: int = VIRTUAL_NODES_PER_WORKER) -> None:
        index = {url: i for i, url in enumerate(urls)}
        # A BTreeMap in the router: a later node at the same point replaces an earlier one.
        nodes: dict[int, int] = {}
        for url in urls:
            for i in range(virtual_nodes):
                nodes[fbi_hash(f"{url}:{i}")] = index[url]
        points = sorted(nodes)
        self._points = points
        self._owners = [nodes[p] for p in points]

    def lookup(self, session_id: str) -> int:
        """The worker index a request with `X-Session-ID: session_id` goes to."""
        h = fbi_hash(SESSION_HEADER_KEY + session_id)
        i = bisect.bisect_left(self._points, h)
        return self._owners[i if i < len(self._points) else 0]


def rendezvous_pick(session_id: str, urls: Sequence[str], candidates: Sequence[int]) -> int:
    """sticky_least_loaded's tie-break among `candidates` (worker indices, in worker order)."""
    best, best_weight = candidates[0], -1
    for i in candidates:
        weight = fbi_hash(f"{session_id}:{urls[i]}")
        if weight > best_weight:
            best, best_weight = i, weight
    return best


__all__ = ["VIRTUAL_NODES_PER_WORKER", "HashRing", "fbi_hash", "furc_hash", "murmur_hash_64a", "rendezvous_pick"]
