"""`glm53 bench run` against TabbyAPI's protocol (the exllamav3 engine).

The server here is a stand-in written from TabbyAPI's endpoint definitions at the pinned commit (TabbyAPI cannot
run without a CUDA GPU): `GET /v1/models` with TabbyAPI's model card (`owned_by: "tabbyAPI"`, the context in
`parameters.max_seq_len`), `POST /v1/token/encode` and `/v1/token/decode` (endpoints/core/types/token.py),
and `POST /v1/completions` taking a text prompt only (endpoints/OAI/types/completion.py: `prompt: str | list[str]`)
with `add_bos_token`, `ignore_eos` and `stream_options.include_usage`, streamed as TabbyAPI streams it.
No `/tokenize` and no `/metrics`: a client that reaches for vLLM's endpoints fails here as it would on TabbyAPI.
"""

from __future__ import annotations

import json
import time
import zlib
from pathlib import Path
from typing import Any, ClassVar

import pytest

from glm53.bench.client import BenchClient
from tests.support.bench_fixtures import QuietHandler, serve_http
from tests.support.cli import run_bench

VOCAB = 4096


def _encode(text: str, *, add_bos: bool) -> list[int]:
    """A word tokenizer: `w123` is token 123, any other word hashes to a token; BOS is token 1."""
    ids = [
        int(word[1:]) if word[:1] == "w" and word[1:].isdigit() else 2 + zlib.crc32(word.encode()) % (VOCAB - 2)
        for word in text.split()
    ]
    return ([1] if add_bos else []) + ids


def _decode(ids: list[int]) -> str:
    return " ".join(f"w{i}" for i in ids if i != 1)


class TabbyLike(QuietHandler):
    prompts: ClassVar[list[dict[str, Any]]] = []
    paths: ClassVar[list[str]] = []
    # ExLlamaV3 1.4.6 generates one token short of max_new_tokens (generator/job.py:
    # `self.max_new_tokens = max_new_tokens - 1 or 1`), and TabbyAPI passes max_tokens through unchanged.
    shortfall: ClassVar[int] = 1

    def do_GET(self) -> None:
        self.paths.append(self.path)
        if self.path == "/v1/models":
            card = {"id": "glm53-tiny", "object": "model", "owned_by": "tabbyAPI", "parameters": {"max_seq_len": 4096}}
            self._json(200, {"object": "list", "data": [card]})
        else:
            self._json(404, {"detail": "Not Found"})

    def encode(self, text: str, *, add_bos: bool) -> list[int]:
        return _encode(text, add_bos=add_bos)

    def decode(self, ids: list[int]) -> str:
        return _decode(ids)

    def do_POST(self) -> None:
        self.paths.append(self.path)
        body = self._read_json()
        if self.path == "/v1/token/encode":
            tokens = self.encode(body["text"], add_bos=body.get("add_bos_token", True))
            self._json(200, {"tokens": tokens, "length": len(tokens)})
        elif self.path == "/v1/token/decode":
            self._json(200, {"text": self.decode(body["tokens"])})
        elif self.path == "/v1/completions":
            self._complete(body)
        else:
            self._json(404, {"detail": "Not Found"})

    def _complete(self, body: dict[str, Any]) -> None:
        if not isinstance(body.get("prompt"), str):
            self._json(422, {"detail": "prompt: Input should be a valid string"})
            return
        self.prompts.append(body)
        prompt = self.encode(body["prompt"], add_bos=body.get("add_bos_token", True))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        created = int(time.time())
        generated = max(body["max_tokens"] - self.shortfall, 1)
        for index in range(generated):
            time.sleep(0.002)  # a decode step
            finish = "length" if index == generated - 1 else None
            choice = {"index": 0, "text": f" w{index}", "token": index, "finish_reason": finish}
            event = {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": created,
                "model": "glm53-tiny",
                "choices": [choice],
            }
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.flush()
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": generated,
            "total_tokens": len(prompt) + generated,
        }
        final = {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": created,
            "model": "glm53-tiny",
            "choices": [],
            "usage": usage,
        }
        self.wfile.write(f"data: {json.dumps(final)}\n\ndata: [DONE]\n\n".encode())
        self.wfile.flush()


@pytest.mark.parametrize("shortfall", [1, 0], ids=["one-short-as-exllamav3-1.4.6", "exact"])
def test_bench_run_measures_a_tabbyapi_server(tmp_path: Path, shortfall: int) -> None:
    class Engine(TabbyLike):
        pass

    Engine.shortfall, Engine.prompts, Engine.paths = shortfall, [], []
    with serve_http(Engine) as url:
        result = _bench(url, tmp_path / "report", "--shapes", "96:12,300:8", "--runs", "2")
    assert result.code == 0, result.stderr
    report = result.json()
    for shape in report["run"]["shapes"]:
        assert shape["best"]["valid_runs"] == 2
        assert all(run["prompt_tokens"] == shape["prompt_tokens"] for run in shape["runs"])
        assert all(run["completion_tokens"] == shape["output_tokens"] for run in shape["runs"])
    # One short probe measured the shortfall; every measured request asked for that many tokens more.
    probe, *measured = Engine.prompts
    assert probe["max_tokens"] == 4 and len(probe["prompt"].split()) == 8
    assert sorted({p["max_tokens"] for p in measured}) == [8 + shortfall, 12 + shortfall]
    # TabbyAPI's own endpoints, never vLLM's /tokenize; text prompts without BOS or cache_salt.
    assert "/v1/token/encode" in Engine.paths and "/tokenize" not in Engine.paths
    assert all(p["add_bos_token"] is False and "cache_salt" not in p for p in Engine.prompts)
    assert all(p.get("ignore_eos") is True for p in Engine.prompts)
    # Two runs of one shape send different prompts of the same length: no run is served from the page cache.
    first_shape = [p["prompt"] for p in measured if len(p["prompt"].split()) == 96]
    assert len(first_shape) == 2 and first_shape[0] != first_shape[1]


def _bench(url: str, out: Path, *extra: str) -> Any:
    return run_bench("run", url, out, "--no-plots", "--json", *extra)


FIXTURE_TOKENIZER = Path(__file__).parent / "fixtures" / "exl3" / "tokenizer.json"


def test_a_word_level_tokenizer_gets_exact_prompts_from_a_prefix_of_its_decoding(tmp_path: Path) -> None:
    """The EXL3 fixture's own tokenizer (word level, split on spaces, no decoder): Hugging Face's `decode`, which
    ExLlamaV3's `Tokenizer.decode` calls, puts a space between tokens, so decoded text re-encodes to about twice
    as many tokens and the decode/encode rounds never settle (it made every run invalid on the GPU)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(FIXTURE_TOKENIZER))

    class FixtureTokenizer(TabbyLike):
        """Encodes without special tokens, as TabbyAPI's encode endpoint does with `add_bos_token: false`."""

        def encode(self, text: str, *, add_bos: bool) -> list[int]:
            return list(tokenizer.encode(text, add_special_tokens=False).ids)

        def decode(self, ids: list[int]) -> str:
            return str(tokenizer.decode(ids, skip_special_tokens=False))

    FixtureTokenizer.prompts, FixtureTokenizer.paths = [], []
    with serve_http(FixtureTokenizer) as url:
        result = _bench(url, tmp_path / "report", "--shapes", "96:4,301:4", "--runs", "2", "--style", "random")
    assert result.code == 0, result.stderr
    for shape in result.json()["run"]["shapes"]:
        assert shape["best"]["valid_runs"] == 2
        assert all(run["prompt_tokens"] == shape["prompt_tokens"] for run in shape["runs"])
    for prompt in FixtureTokenizer.prompts[1:]:  # the first is the 8-token probe of the output shortfall
        assert len(tokenizer.encode(prompt["prompt"], add_special_tokens=False).ids) in (96, 301)


def test_a_prompt_that_cannot_be_made_exact_is_an_invalid_run_not_a_crash(tmp_path: Path) -> None:
    class Lossy(TabbyLike):
        """Decoding drops every token (as a tokenizer that decodes unknown ids to nothing does)."""

        def do_POST(self) -> None:
            if self.path == "/v1/token/decode":
                self._read_json()
                self._json(200, {"text": ""})
                return
            super().do_POST()

    Lossy.prompts, Lossy.paths = [], []
    with serve_http(Lossy) as url:
        result = _bench(url, tmp_path / "report", "--shapes", "64:4", "--runs", "1", "--retries", "0")
    assert result.code == 1
    run = result.json()["run"]["shapes"][0]["runs"][0]
    assert run["valid"] is False and "no text encodes to exactly 64 tokens" in run["invalid_reason"]
    assert Lossy.prompts == []  # nothing was sent that would have measured another length


def test_no_two_runs_send_the_same_rotation_of_a_prompt() -> None:
    # Two salts may pick one shift, and a tiled (prose) prompt repeats every period: each run still gets a
    # prompt no earlier run sent, so TabbyAPI's page cache never serves it.
    client = BenchClient("http://127.0.0.1:9")
    tiled = [1, 2, 3, 4] * 3
    sent = [tuple(client._unsent_rotation(tiled, 5)) for _ in range(4)]
    assert len(set(sent)) == 4 and all(sorted(rotation) == sorted(tiled) for rotation in sent)
    assert tuple(client._unsent_rotation(tiled, 5)) in sent  # only 4 distinct rotations exist: one repeats
