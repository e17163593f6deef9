"""Ingest encodes each passage once (issue 17: ingest ≥ 0.8× the raw encode throughput): a process keeps
the vectors of the passages it encoded, so that a statement said in real time and again at its session's
close, or a candidate sent back to resolve, reaches the model once; and the memories come out the same."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from memflow.pipeline.models import ChatEvent, Kind, Role
from memflow.shared.errors import EmbedderUnavailable
from memflow.shared.inference.embedder import CachedPassages, Embedder, OpenAIEmbedder, build_embedder, uncached
from memflow.shared.settings import Settings
from memflow.shared.storage.store import MemoryFilter
from tests.conftest import System, start_system
from tests.hash_model import HashModel

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


class Counting:
    """The real model, counting every passage that reaches it (queries are not counted)."""

    def __init__(self, inner: Embedder) -> None:
        self.inner, self.passages, self.calls = inner, Counter[str](), 0
        self.model_id, self.dim = inner.model_id, inner.dim
        self.fail_next = False

    def encode_passages(self, texts: Sequence[str]) -> list[list[float]]:
        if self.fail_next:
            self.fail_next = False
            raise EmbedderUnavailable("injected: the model is away for one call")
        self.calls += 1
        self.passages.update(texts)
        return self.inner.encode_passages(texts)

    def encode_queries(self, texts: Sequence[str]) -> list[list[float]]:
        return self.inner.encode_queries(texts)

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)


# -- the cache itself --------------------------------------------------------------------------


def test_a_passage_seen_before_reaches_the_model_once_and_keeps_its_vector() -> None:
    model = Counting(HashModel())
    cached = CachedPassages(model)
    first = cached.encode_passages(["a cat", "a dog", "a cat"])
    assert model.calls == 1 and model.passages == Counter({"a cat": 1, "a dog": 1})  # one call, each text once
    assert first == HashModel().encode_passages(["a cat", "a dog", "a cat"])  # in order, the model's vectors
    again = cached.encode_passages(["a dog", "a bird", "a cat"])
    assert model.passages == Counter({"a cat": 1, "a dog": 1, "a bird": 1})
    assert again == HashModel().encode_passages(["a dog", "a bird", "a cat"])
    assert cached.encode_passages(["a cat"]) == [first[0]] and model.calls == 2  # all known: no call at all
    assert cached.encode_passages([]) == [] and model.calls == 2
    assert (cached.model_id, cached.dim) == (model.model_id, model.dim)


def test_queries_are_not_kept_and_a_returned_vector_is_the_callers_own() -> None:
    model = Counting(HashModel())
    cached = CachedPassages(model)
    cached.encode_queries(["a cat"])
    assert model.passages == Counter()
    vector = cached.encode_passages(["a cat"])[0]
    vector[0] = 99.0  # a caller that changes what it got changes nothing kept
    assert cached.encode_passages(["a cat"])[0] == HashModel().encode_passages(["a cat"])[0]


def test_the_cache_holds_at_most_its_size_and_forgets_the_least_recently_used() -> None:
    model = Counting(HashModel())
    cached = CachedPassages(model, size=2)
    cached.encode_passages(["one", "two"])
    cached.encode_passages(["one"])  # used again: "two" is now the oldest
    cached.encode_passages(["three"])
    assert len(cached) == 2
    cached.encode_passages(["one", "three"])
    assert model.passages["one"] == 1 and model.passages["three"] == 1
    cached.encode_passages(["two"])
    assert model.passages["two"] == 2


def test_a_failed_call_keeps_nothing_and_raises() -> None:
    model = Counting(HashModel())
    cached = CachedPassages(model)
    model.fail_next = True
    with pytest.raises(EmbedderUnavailable):
        cached.encode_passages(["a cat"])
    assert len(cached) == 0
    assert cached.encode_passages(["a cat"]) == HashModel().encode_passages(["a cat"])


def test_every_backend_is_built_cached_and_the_raw_model_is_at_hand() -> None:
    built = build_embedder(Settings(embedder="openai", embedder_url="http://127.0.0.1:9/v1", embedder_dim=8))
    assert isinstance(built, CachedPassages)
    assert isinstance(uncached(built), OpenAIEmbedder)
    assert built.model_id == "openai:http://127.0.0.1:9/v1#text-embedding-3-small" and built.dim == 8
    plain = HashModel()
    assert uncached(plain) is plain


# -- on the pipeline -------------------------------------------------------------------------


def conversation(subject: str) -> list[ChatEvent]:
    """Statements with realtime signals (each extracted at once, and again at the session's close), a
    correction of one of them, and plain turns."""
    said = [("s1", "I prefer short answers."), ("s1", "My manager is Tom Becker."),
            ("s1", "We went to the aquarium and saw the dolphins, it was great."),
            ("s1", "Remember that I am allergic to peanuts."),
            ("s2", "Correction: my manager is now Aisha Khan."), ("s2", "I always write tests first."),
            ("s2", "We went to the aquarium and saw the sharks, it was scary.")]
    events = []
    for i, (session, text) in enumerate(said):
        events.append(ChatEvent(event_id=f"{subject}-m{i}", subject=subject, session_id=session, kind=Kind.message,
                                role=Role.user, text=text, ts=T0 + timedelta(hours=i)))
        if i in (3, 6):
            events.append(ChatEvent(event_id=f"{subject}-end{i}", subject=subject, session_id=session,
                                    kind=Kind.session_end, ts=T0 + timedelta(hours=i, minutes=5)))
    return events


def ingest(system: System, subject: str) -> list[tuple[Any, ...]]:
    """The conversation published whole, then once more (a replay), drained; the memories that came out (without
    their ids: each deployment names them with its own secret, pipeline/ids.py)."""
    for _ in range(2):
        for event in conversation(subject):
            system.client.publish(event)
        assert system.client.wait_idle(60), "the pipeline did not drain"
    return sorted((m.key, m.status.value, m.version, m.rev, m.content, tuple(m.source_event_ids))
                  for m in system.ctx.store.get(MemoryFilter(subject)))


@pytest.fixture
def counted(embedder: Embedder) -> Counting:
    return Counting(embedder)


@pytest.fixture
def cached_system(settings: Settings, counted: Counting) -> Iterator[System]:
    running = start_system(settings, CachedPassages(counted))
    yield running
    running.shutdown()


def test_ingest_encodes_each_passage_once_and_the_same_memories_come_out(cached_system: System,
                                                                         counted: Counting,
                                                                         settings: Settings,
                                                                         embedder: Embedder) -> None:
    with_cache = ingest(cached_system, "enc")
    twice = [text for text, n in counted.passages.items() if n > 1]
    assert not twice, f"encoded more than once: {twice}"
    assert len(with_cache) >= 7
    # The same conversation on a process without the cache: the same memories, by key, version, rev and content.
    apart = settings.replace(stream_prefix=f"{settings.redis.stream_prefix}plain:", data_dir=settings.store.data_dir / "plain")
    plain = start_system(apart, Counting(embedder))
    try:
        assert ingest(plain, "enc") == with_cache
    finally:
        plain.shutdown()
