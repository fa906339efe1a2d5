"""Every parser of outside input under generated hostile input (Hypothesis): env files, fleet files, routing
traces (JSONL and .npz), counts, host manifests, image tarballs, and the text checks under them. The property
is the same everywhere: a value that passes every check, or BadInput (exit 2) with a message safe to print;
never another exception, never a hang.

The budget of examples is fixed and the generation derandomized, so CI runs the same cases every time, in a
few seconds; HYPOTHESIS_EXAMPLES=N raises the budget for a longer hunt by hand."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from glm53.errors import BadInput
from glm53.fsutil import parse_json, path_problem
from glm53.output import SafeConsole
from glm53.plan.routing.traces import RoutingCounts, RoutingTrace, read_routing_stats
from glm53.proc import check_url
from glm53.recipe.profiles import KEYS, load_profile, parse_env_text
from glm53.repro.image import compare_image_tarballs
from glm53.repro.manifest import Manifest, diff_manifests, load_manifest
from glm53.router.fleet import Fleet, parse_fleet
from glm53.safetext import hostname_problem, mask_secrets, printable

EXAMPLES = int(os.environ.get("HYPOTHESIS_EXAMPLES", "0"))


def budget(examples: int) -> Any:
    """Fixed, derandomized settings: `examples` cases (or HYPOTHESIS_EXAMPLES), no deadline (CI machines vary),
    no example database (every run the same), the shared tmp_path reused across examples."""
    return settings(
        max_examples=EXAMPLES or examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# Pieces a hostile or clumsy file is made of: controls, escapes, bidi overrides, a BOM, separators that
# str.splitlines() honours, quotes, shell syntax, numbers too long or too deep to read.
NASTY = st.sampled_from(
    [
        "\x00",
        "\x1b[2J",
        "\x1b]0;t\x07",
        "\x9b",
        "\ufeff",
        "\u202e",
        "\u200b",
        "\u2028",
        "\x85",
        "\x1c",
        "\r",
        "\n",
        "\t",
        " ",
        "=",
        "#",
        "'",
        '"',
        "\\",
        "${",
        ":=",
        "}",
        "export ",
        ": ",
        "9" * 5000,
        "[" * 3000,
        "{",
        "true",
        "-1",
        "1e309",
        "NaN",
        "%",
        "$(touch x)",
        "--upload-pack=x",
        "user:SECRET@",
    ]
)
HOSTILE = st.lists(st.one_of(st.text(max_size=12), NASTY), max_size=12).map("".join)


def _message_is_printable(exc: BadInput) -> None:
    assert isinstance(exc.message, str) and exc.message
    printable(exc.message)  # never raises, whatever the message quotes


# ---------------------------------------------------------------- the text checks themselves


@budget(60)
@given(st.text())
def test_printable_leaves_nothing_a_terminal_acts_on(text: str) -> None:
    shown = printable(text)
    assert not any(ord(c) < 0x20 and c not in "\n\t" for c in shown)
    assert not any(0x7F <= ord(c) < 0xA0 for c in shown)
    assert not any(c in shown for c in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200b\ufeff\u2028")
    assert printable(shown) == shown


@budget(40)
@given(HOSTILE, st.text(alphabet=st.characters(blacklist_characters="/@\n", blacklist_categories=["Cs"]), min_size=1))
def test_a_url_secret_is_never_shown(prefix: str, secret: str) -> None:
    text = f"{prefix} https://user:{secret}@example.com/x"
    assert f"user:{secret}@" not in mask_secrets(text)


@budget(40)
@given(HOSTILE)
def test_url_and_hostname_checks_take_any_text(text: str) -> None:
    try:
        url = check_url(text, what="url")
    except BadInput as exc:
        _message_is_printable(exc)
    else:
        assert not url.startswith("-") and url.isprintable() and "://" in url
    problem = hostname_problem(text)
    if problem is None:
        assert text.isprintable() and not any(c.isspace() for c in text)
    if text and "\x00" not in text:
        assert (path_problem(text) is None) == (
            len(text.encode("utf-8", "surrogatepass")) <= 4096
            and all(len(part) <= 255 for part in text.encode("utf-8", "surrogatepass").split(b"/"))
        )


# ---------------------------------------------------------------- env files


ENV_KEY = st.one_of(st.sampled_from(list(KEYS)[:40]), st.sampled_from(["X", "max_model_len", "1A", "A-B", ""]))
ENV_LINE = st.one_of(
    st.builds(lambda k, v: f"{k}={v}", ENV_KEY, HOSTILE),
    st.builds(lambda k, v: f'export {k}="{v}"', ENV_KEY, HOSTILE),
    st.builds(lambda k, v: f': "${{{k}:={v}}}"', ENV_KEY, HOSTILE),
    HOSTILE,
)
ENV_FILE = st.lists(ENV_LINE, max_size=8).map("\n".join)


@budget(40)
@given(ENV_FILE)
def test_env_files_are_read_or_refused(text: str) -> None:
    try:
        lines, comments = parse_env_text(text, source="recipe.env")
    except BadInput as exc:
        _message_is_printable(exc)
        return
    for line in [*(line.value for line in lines), *comments]:
        assert all(c == "\t" or c.isprintable() for c in line)


@budget(25)
@given(ENV_FILE)
def test_env_files_over_a_profile_give_a_profile_or_bad_input(text: str) -> None:
    try:
        load_profile("cpu-tiny", environ={}, env_file=(Path("recipe.env"), text))
    except BadInput as exc:
        _message_is_printable(exc)


# ---------------------------------------------------------------- fleet files

JSON_LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    HOSTILE,
    st.sampled_from(["http://127.0.0.1:8001", "https://h:1", "http://a:b@h:1", "http://[::1]:8100", "consistent_hash"]),
)
FLEET_KEYS = st.sampled_from(
    [
        "backends",
        "url",
        "policy",
        "host",
        "port",
        "listen_all",
        "api_key_file",
        "limits",
        "health",
        "retry",
        "metrics",
        "log_level",
        "queue_size",
        "timeout_secs",
        "endpoint",
        "max_retries",
        "x",
    ]
)
JSON_VALUE = st.recursive(
    JSON_LEAF,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(FLEET_KEYS, inner, max_size=5)),
    max_leaves=20,
)


def _fleet_holds(fleet: Fleet) -> None:
    for host in (fleet.host, fleet.metrics.host):
        assert hostname_problem(host) is None
    assert type(fleet.port) is int and 1 <= fleet.port <= 65535
    for backend in fleet.backends:
        assert backend.url.isprintable() and "@" not in backend.url


@budget(40)
@given(st.dictionaries(FLEET_KEYS, JSON_VALUE, max_size=6))
def test_fleet_files_as_json(document: dict[str, Any]) -> None:
    if "backends" not in document:
        document["backends"] = [{"url": "http://127.0.0.1:8001"}]
    try:
        fleet = parse_fleet(json.dumps(document), source="fleet.json", fmt="json")
    except BadInput as exc:
        _message_is_printable(exc)
    else:
        _fleet_holds(fleet)


@budget(30)
@given(
    st.lists(
        st.one_of(HOSTILE, st.sampled_from(["[[backends]]", 'url = "http://127.0.0.1:8001"', "port = 1"])), max_size=6
    )
)
def test_fleet_files_as_toml(lines: list[str]) -> None:
    try:
        fleet = parse_fleet("\n".join(lines), source="fleet.toml", fmt="toml")
    except BadInput as exc:
        _message_is_printable(exc)
    else:
        _fleet_holds(fleet)


# ---------------------------------------------------------------- routing traces and counts

SMALL_INT = st.one_of(st.integers(min_value=-3, max_value=20), st.sampled_from([2**15, 2**63, -(2**63), 10**30]))
STEP_VALUE = st.one_of(SMALL_INT, st.booleans(), st.none(), st.floats(allow_nan=False), HOSTILE)
HEADER = st.fixed_dictionaries(
    {
        "format": st.one_of(st.just("glm53-routing-trace"), HOSTILE),
        "version": st.one_of(st.just(1), STEP_VALUE),
        "layers": st.one_of(st.just([3, 4]), st.lists(SMALL_INT, max_size=3), STEP_VALUE),
        "experts": st.one_of(st.just(8), SMALL_INT, STEP_VALUE),
        "top_k": st.one_of(st.just(2), SMALL_INT),
    }
)
STEP = st.builds(
    lambda step, rows: {"step": step, "experts": rows},
    SMALL_INT,
    st.one_of(st.lists(st.lists(STEP_VALUE, max_size=3), max_size=3), STEP_VALUE),
)


def _trace_holds(stats: RoutingTrace | RoutingCounts) -> None:
    if isinstance(stats, RoutingTrace):
        assert stats.routes.ndim == 3 and stats.routes.shape[1:] == (len(stats.layers), stats.top_k)
        assert int(stats.routes.min()) >= 0 and int(stats.routes.max()) < stats.experts


@budget(40)
@given(HEADER, st.lists(st.one_of(STEP, HOSTILE), max_size=4))
def test_jsonl_traces_are_read_or_refused(tmp_path: Path, header: dict[str, Any], steps: list[Any]) -> None:
    path = tmp_path / "routing.jsonl"
    lines = [json.dumps(header)] + [json.dumps(s) if isinstance(s, dict) else s for s in steps]
    path.write_bytes("\n".join(lines).encode("utf-8", errors="surrogatepass"))
    try:
        _trace_holds(read_routing_stats(path))
    except BadInput as exc:
        _message_is_printable(exc)


@budget(30)
@given(
    st.dictionaries(st.one_of(st.sampled_from(["3", "4", "03", "-1", "x"]), HOSTILE), st.lists(SMALL_INT, max_size=9)),
    st.one_of(st.just(8), SMALL_INT),
    st.one_of(st.just(100), SMALL_INT, STEP_VALUE),
)
def test_counts_files_are_read_or_refused(tmp_path: Path, layers: dict[str, Any], experts: Any, tokens: Any) -> None:
    path = tmp_path / "counts.json"
    document = {"format": "glm53-routing-counts", "version": 1, "experts": experts, "tokens": tokens, "layers": layers}
    path.write_text(json.dumps(document))
    try:
        read_routing_stats(path)
    except BadInput as exc:
        _message_is_printable(exc)


DTYPES = st.sampled_from(["<i2", "<i8", "<u1", "<f4", "|b1", "<U2"])


@budget(30)
@given(
    HEADER,
    st.lists(st.integers(min_value=0, max_value=4), min_size=0, max_size=4),
    DTYPES,
    st.integers(min_value=0, max_value=2**62),
    st.lists(st.tuples(st.integers(min_value=0, max_value=4000), st.integers(min_value=0, max_value=255)), max_size=3),
)
def test_npz_traces_are_read_or_refused(
    tmp_path: Path,
    header: dict[str, Any],
    shape: list[int],
    dtype: str,
    claimed_rows: int,
    flips: list[tuple[int, int]],
) -> None:
    """A real archive of arrays of any shape and type, one whose routes header claims any number of rows, and
    either with bytes flipped anywhere."""
    path = tmp_path / "routing.npz"
    routes = np.zeros(shape, dtype=dtype)
    buffer = io.BytesIO()
    np.savez(buffer, header=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8), routes=routes)
    data = bytearray(buffer.getvalue())
    if claimed_rows and shape:
        data = bytearray(data.replace(f"({shape[0]},".encode(), f"({claimed_rows},".encode(), 1))
    for offset, value in flips:
        if offset < len(data):
            data[offset] = value
    path.write_bytes(bytes(data))
    try:
        _trace_holds(read_routing_stats(path))
    except BadInput as exc:
        _message_is_printable(exc)


# ---------------------------------------------------------------- host manifests

_BASE_MANIFEST: dict[str, Any] = {
    "schema_version": "glm53.repro-manifest/1",
    "created_at": "2026-01-01T00:00:00+00:00",
    "hostname": "box",
    "host": {
        "machine": "x86_64",
        "kernel_release": "6.1",
        "logical_cpus": 32,
        "cpu_packages": 1,
        "cpu_flags_of_note": ["avx2"],
        "memory_total_bytes": 1 << 37,
        "memory_limit_bytes": None,
        "gpus": [{"index": 0, "name": "RTX 3090", "memory_total_bytes": 1 << 34, "compute_capability": "8.6"}],
        "driver": "580.1",
        "cuda_runtime": "12.8",
    },
    "python": {"version": "3.11.2", "implementation": "CPython", "executable": "/usr/bin/python3"},
    "packages": {"vllm": "0.1", "torch": None},
    "exllamav3_ext": {"prebuilt": False},
    "repro_lock": {"path": None, "sha256": None},
}
MANIFEST_PATHS = [
    ("hostname",),
    ("created_at",),
    ("host", "machine"),
    ("host", "logical_cpus"),
    ("host", "gpus"),
    ("host", "gpus", 0, "name"),
    ("host", "gpus", 0, "memory_total_bytes"),
    ("packages", "vllm"),
    ("packages",),
    ("profile",),
    ("schema_version",),
    ("x",),
]


def _set(document: Any, path: tuple[Any, ...], value: Any) -> None:
    for part in path[:-1]:
        document = document[part]
    document[path[-1]] = value


@budget(30)
@given(st.lists(st.tuples(st.sampled_from(MANIFEST_PATHS), JSON_VALUE), max_size=3))
def test_manifests_are_read_or_refused_and_shown_safely(tmp_path: Path, edits: list[tuple[Any, Any]]) -> None:
    document = json.loads(json.dumps(_BASE_MANIFEST))
    for path, value in edits:
        _set(document, path, value)
    file = tmp_path / "m.json"
    file.write_text(json.dumps(document))
    try:
        manifest = load_manifest(file)
    except BadInput as exc:
        _message_is_printable(exc)
        return
    from glm53.repro.render import render_manifest_diff

    diff = diff_manifests(Manifest.model_validate(_BASE_MANIFEST), manifest)
    out = io.StringIO()
    render_manifest_diff(diff, SafeConsole(file=out, width=120))
    assert "\x1b" not in out.getvalue() and "\u202e" not in out.getvalue()


# ---------------------------------------------------------------- image tarballs

MEMBER_NAME = st.one_of(
    st.sampled_from(["manifest.json", "c.json", "l/layer.tar", "../x", "/abs", "a/../../b", "."]),
    st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]), min_size=1, max_size=20),
)
MEMBER = st.tuples(
    MEMBER_NAME,
    st.sampled_from([tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.DIRTYPE, tarfile.FIFOTYPE]),
    MEMBER_NAME,
    st.one_of(st.binary(max_size=64), st.just(b"[" * 3000), st.sampled_from([b"{}", b"[]", b"9" * 5000])),
)
LISTING = st.one_of(
    st.just([{"Config": "c.json", "Layers": ["l/layer.tar"]}]),
    JSON_VALUE,
    st.lists(
        st.dictionaries(st.sampled_from(["Config", "Layers"]), st.one_of(MEMBER_NAME, st.lists(MEMBER_NAME))),
        max_size=2,
    ),
)


def _tarball(members: list[tuple[str, bytes, str, bytes]], listing: Any) -> bytes:
    buffer = io.BytesIO()
    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w") as layer:
        info = tarfile.TarInfo("app/run.py")
        info.size = 3
        layer.addfile(info, io.BytesIO(b"x=1"))
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        base = [("l/layer.tar", tarfile.REGTYPE, "", inner.getvalue()), ("c.json", tarfile.REGTYPE, "", b"{}")]
        listing_member = ("manifest.json", tarfile.REGTYPE, "", json.dumps(listing).encode())
        for name, kind, linkname, data in [*base, *members, listing_member]:
            info = tarfile.TarInfo(name)
            info.type = kind  # type: ignore[assignment]
            info.linkname = linkname
            payload = data if kind == tarfile.REGTYPE else b""
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


@budget(60)
@given(st.lists(MEMBER, max_size=4), LISTING, st.lists(MEMBER, max_size=2), st.binary(max_size=8))
def test_image_tarballs_are_compared_or_refused(
    tmp_path: Path, members: list[Any], listing: Any, more: list[Any], tail: bytes
) -> None:
    a, b = tmp_path / "a.tar", tmp_path / "b.tar"
    a.write_bytes(_tarball(members, listing))
    b.write_bytes(_tarball(members + more, listing)[: -len(tail) or None] + tail)
    try:
        audit = compare_image_tarballs(a, b)
    except BadInput as exc:
        _message_is_printable(exc)
        assert "image A" in exc.message or "image B" in exc.message
    else:
        assert audit.identical == (a.read_bytes() == b.read_bytes())


# ---------------------------------------------------------------- JSON itself


@budget(40)
@given(st.one_of(HOSTILE, st.binary(max_size=64).map(lambda b: b.decode("latin-1"))))
def test_json_is_parsed_or_refused(text: str) -> None:
    try:
        parse_json(text, what="document")
    except BadInput as exc:
        _message_is_printable(exc)


def test_the_budget_is_fixed() -> None:
    """CI runs the same examples every time: derandomized, no database, a fixed count."""
    configured = test_fleet_files_as_json._hypothesis_internal_use_settings  # type: ignore[attr-defined]
    assert configured.derandomize and configured.database is None and configured.deadline is None
    assert configured.max_examples == (EXAMPLES or 40)


pytestmark = pytest.mark.filterwarnings("ignore::numpy.exceptions.VisibleDeprecationWarning")
