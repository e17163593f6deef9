"""The store knows which model made its vectors, and `memflow reindex` moves it to another one.

Real parts: an Edge shard in tmp_path and the qdrant-client code path on `QdrantClient(":memory:")`,
the real MiniLM model, and a small deterministic model of our own (characters hashed into 32 dims; a
48-dim one where a second stand-in keeps a test fast) as the other identity. A "process" here is a
catalog: releasing it is what an exit does.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from qdrant_client import QdrantClient

from memflow.pipeline.models import Action, Candidate, Dir, Memory, MType, PutOp, Source, Status, WriteBatch
from memflow.shared.errors import IndexRetired, ModelMismatch, Retryable
from memflow.shared.inference.embedder import Embedder
from memflow.shared.settings import Settings, get_settings
from memflow.shared.storage.edge_shards import EdgeCatalog
from memflow.shared.storage.edge_store import EdgeStore
from memflow.shared.storage.server_store import DIM_KEY, MODEL_KEY, ServerCatalog, ServerStore
from memflow.shared.storage.store import Catalog, Identity, MemoryFilter, Store, index_name, open_current
from memflow.shared.writer.reindex import Step, reindex
from tests.conftest import wait_for
from tests.hash_model import HashModel, other_hash
from tests.test_store import T0, memory

COLLECTION = "memflow"
SUBJECTS = ("alice", "bob", "carol")
# Every status: history is re-embedded too.
STATUSES = (Status.active, Status.superseded, Status.archived, Status.contested, Status.pending_review)
TOPICS = ("prefers short answers", "lives in Shanghai", "drinks oat milk coffee", "deploys never on Fridays",
          "uses PostgreSQL 16 for Atlas", "我不喜欢冗长的解释", "reports to Aisha Khan", "plays the cello")


def identity(model: Any) -> Identity:
    return Identity(model.model_id, model.dim)


@dataclass
class Engine:
    kind: str
    root: Path
    client: QdrantClient | None

    def catalog(self) -> Catalog:
        if self.client is None:
            return EdgeCatalog(self.root, COLLECTION)
        return ServerCatalog(self.client, COLLECTION)

    def release(self, catalog: Catalog) -> None:
        """What a process's exit does: an Edge shard's lock is let go (the in-memory server stays up)."""
        if self.client is None:
            catalog.close()


@pytest.fixture(params=["edge", "server"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    client = QdrantClient(":memory:") if request.param == "server" else None
    yield Engine(request.param, tmp_path / "qdrant", client)
    if client is not None:
        client.close()


def fill(store: Store, model: Any, n: int) -> list[Memory]:
    """n memories over three subjects and every status, each worded apart from the others."""
    made = [memory(SUBJECTS[i % 3], f"{TOPICS[i % len(TOPICS)]} (note {i})", status=STATUSES[i % len(STATUSES)],
                   key=f"topic.{i}") for i in range(n)]
    store.put(made, model.encode_passages([m.content for m in made]))
    return made


def everything(store: Store) -> dict[str, Memory]:
    return {m.id: m for s in SUBJECTS for m in store.get(MemoryFilter(s))}


def made_by(store: Store, model: Any, memories: Sequence[Memory]) -> bool:
    """Whether `model` made each memory's stored dense vector (cosine 1 with its encoding of the memory)."""
    vectors = model.encode_passages([m.content for m in memories])
    scores = [store.query(MemoryFilter(m.subject, ids=[m.id]), mode="dense", limit=1, dense=v)[0].score
              for m, v in zip(memories, vectors, strict=True)]
    return all(score == pytest.approx(1.0, abs=1e-4) for score in scores)


# -- the record ---------------------------------------------------------------------------


def test_the_record_is_written_on_create(engine: Engine) -> None:
    catalog = engine.catalog()
    open_current(catalog, identity(HashModel()))
    engine.release(catalog)
    current = engine.catalog().current()
    assert current is not None and current.identity == Identity("test:hash-32", 32)
    if engine.client is None:
        record = json.loads((engine.root / f"{COLLECTION}.json").read_text())
        assert record == {"index": current.name, "model_id": "test:hash-32", "dim": 32}
    else:
        assert engine.client.get_collection(current.name).config.metadata == {MODEL_KEY: "test:hash-32", DIM_KEY: 32}
        assert {a.alias_name: a.collection_name for a in engine.client.get_aliases().aliases}[COLLECTION] == current.name


def test_opening_with_another_model_is_refused_naming_both(engine: Engine, embedder: Embedder) -> None:
    catalog = engine.catalog()
    open_current(catalog, identity(HashModel()))
    engine.release(catalog)
    for other in (identity(embedder), Identity("test:other-32", 32)):  # another dim, and the same dim
        with pytest.raises(ModelMismatch) as refused:
            open_current(engine.catalog(), other)
        message = str(refused.value)
        assert "test:hash-32 (32 dims)" in message and str(other) in message and "memflow reindex" in message


def make_unrecorded(engine: Engine, dim: int) -> Store:
    """A collection as memflow made it before models were recorded: `<collection>`, no record."""
    if engine.client is None:
        store: Store = EdgeStore(engine.root / COLLECTION, dim)
    else:
        store = ServerStore(engine.client, COLLECTION, dim)
    store.ensure()
    return store


def test_an_unrecorded_collection_is_adopted_only_if_its_dimension_matches(
        engine: Engine, embedder: Embedder, caplog: pytest.LogCaptureFixture) -> None:
    old = make_unrecorded(engine, 32)
    kept = fill(old, HashModel(), 5)
    if engine.client is None:
        old.close()  # the process that made it exits
    with pytest.raises(ModelMismatch, match="32-dim vectors of an unrecorded model"):
        open_current(engine.catalog(), identity(embedder))
    catalog = engine.catalog()
    with caplog.at_level("WARNING"):
        adopted = open_current(catalog, identity(HashModel()))
    assert "predates the model record" in caplog.text
    assert sorted(everything(adopted)) == sorted(m.id for m in kept)
    assert catalog.current() is not None and catalog.current().identity == identity(HashModel())  # type: ignore[union-attr]
    engine.release(catalog)


# -- reindex --------------------------------------------------------------------------------


def test_reindex_re_embeds_every_point_and_switches(engine: Engine, embedder: Embedder) -> None:
    old_model = HashModel()
    catalog = engine.catalog()
    before = {m.id: m for m in fill(open_current(catalog, identity(old_model)), old_model, 48)}
    words = open_current(catalog, identity(old_model)).query(MemoryFilter("alice"), mode="sparse", limit=50,
                                                             text="coffee answers Shanghai")
    report = reindex(catalog, embedder, batch=16)
    assert report.switched and report.copied == 48 and report.points == 48
    assert catalog.current().identity == identity(embedder)  # type: ignore[union-attr]
    assert catalog.names() == [catalog.current().name]  # type: ignore[union-attr]  # the old index is gone
    engine.release(catalog)

    catalog = engine.catalog()
    store = open_current(catalog, identity(embedder))
    assert store.count() == 48 and everything(store) == before  # payloads unchanged, none doubled
    assert made_by(store, embedder, list(before.values()))
    for m in list(before.values())[:6]:  # a search with the new model finds each by its own words
        [top] = store.query(MemoryFilter(m.subject), mode="dense", limit=1, dense=embedder.encode_queries([m.content])[0])
        assert top.memory.id == m.id
    again = store.query(MemoryFilter("alice"), mode="sparse", limit=50, text="coffee answers Shanghai")
    assert {s.memory.id: round(s.score, 4) for s in again} == {s.memory.id: round(s.score, 4) for s in words}
    engine.release(catalog)


def test_a_stopped_reindex_resumes_without_redoing_pages(engine: Engine) -> None:
    old_model, new_model = HashModel(), other_hash()
    catalog = engine.catalog()
    made = fill(open_current(catalog, identity(old_model)), old_model, 200)
    first = reindex(catalog, new_model, batch=32, stop_after=3)
    assert not first.switched and first.copied == 96 and new_model.encoded == 96
    assert catalog.current().identity == identity(old_model)  # type: ignore[union-attr]  # not switched yet
    engine.release(catalog)  # the process dies here

    catalog = engine.catalog()
    with pytest.raises(ModelMismatch):  # the new model cannot serve until the reindex switches
        open_current(catalog, identity(new_model))
    second = reindex(catalog, new_model, batch=32)
    assert second.switched and second.resumed_at == 96 and second.copied == 104
    assert new_model.encoded == 200  # the three pages done before were not encoded again
    store = open_current(catalog, identity(new_model))
    assert store.count() == 200 and everything(store) == {m.id: m for m in made}  # none lost, none doubled
    assert made_by(store, new_model, made)
    engine.release(catalog)


def test_writes_during_the_reindex_are_carried_over(engine: Engine, embedder: Embedder) -> None:
    old_model = HashModel()
    catalog = engine.catalog()
    live = open_current(catalog, identity(old_model))  # what the serving processes write through
    made = fill(live, old_model, 48)
    early = sorted(made, key=lambda m: m.id)[:16]  # the first page
    added = [memory("alice", f"a new memory {i}", key=f"new.{i}") for i in range(3)]
    reworded = early[2].model_copy(update={"content": "now prefers long answers", "rev": 2})

    def write_meanwhile(step: Step) -> None:
        if step.phase == "copy" and step.done == 16:  # after the first page, before the second
            live.put(added, old_model.encode_passages([m.content for m in added]))
            live.set_fields(early[0].subject, early[0].id, {"status": "superseded", "access_count": 7})
            live.delete(early[1].subject, [early[1].id])  # forgotten: must not come back
            live.put([reworded], old_model.encode_passages([reworded.content]))

    report = reindex(catalog, embedder, batch=16, on_step=write_meanwhile)
    assert report.switched and report.removed == 1 and report.refreshed >= 2
    store = open_current(catalog, identity(embedder))
    got = everything(store)
    assert set(got) == {m.id for m in made} - {early[1].id} | {m.id for m in added} and store.count() == len(got)
    assert got[early[0].id].status == Status.superseded and got[early[0].id].access_count == 7
    assert got[reworded.id].content == "now prefers long answers"
    assert made_by(store, embedder, list(got.values()))
    engine.release(catalog)


class Watched:
    """The engine's catalog, saying when the switch begins (so the test knows which searches had to
    answer from the old index)."""

    def __init__(self, catalog: Catalog) -> None:
        self.inner, self.switching = catalog, threading.Event()
        self.collection = catalog.collection

    def switch(self, index: Any) -> None:
        self.switching.set()
        self.inner.switch(index)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_searches_keep_answering_on_the_old_vectors_until_the_switch(engine: Engine) -> None:
    old_model, new_model = HashModel(), other_hash()
    catalog = Watched(engine.catalog())
    live = open_current(catalog, identity(old_model))  # type: ignore[arg-type]
    catalog.switching.clear()  # the first open switched to the new collection it made
    made = fill(live, old_model, 160)
    target = made[5]
    probe = old_model.encode_queries([target.content])[0]  # a search as an old-model process makes it
    answers: list[tuple[bool, str]] = []  # (switching yet, top hit id or the error)
    done = threading.Event()

    def search() -> None:
        while not done.is_set():
            switching = catalog.switching.is_set()
            try:
                hits = live.query(MemoryFilter(target.subject), mode="dense", limit=3, dense=probe)
                answers.append((switching, hits[0].memory.id))
            except Exception as exc:  # noqa: BLE001 - once switched, the old index is gone
                answers.append((switching, f"{type(exc).__name__}: {exc}"))

    def each_page_waits_for_a_search(step: Step) -> None:
        if step.phase in ("copy", "final"):  # "final": after the fence, writes to the old index refused
            seen = len(answers)
            wait_for(lambda: len(answers) > seen, timeout_s=10, what=f"a search answered during {step.phase}")

    searcher = threading.Thread(target=search, daemon=True)
    searcher.start()
    try:
        report = reindex(catalog, new_model, batch=32, on_step=each_page_waits_for_a_search)  # type: ignore[arg-type]
    finally:
        done.set()
        searcher.join(timeout=10)
    before_switch = [found for switching, found in answers if not switching]
    assert report.switched and len(before_switch) >= 10  # five pages copied, five checked after the fence
    assert set(before_switch) == {target.id}  # every one answered, and rightly
    fresh = open_current(catalog, identity(new_model))  # type: ignore[arg-type]
    hits = fresh.query(MemoryFilter(target.subject), mode="dense", limit=1, dense=new_model.encode_queries([target.content])[0])
    assert hits[0].memory.id == target.id
    engine.release(catalog.inner)


def test_an_old_model_process_cannot_write_once_fenced() -> None:
    """Server, where processes on the old model may still run: from the fence on, their writes are refused
    (Retryable: they wait in their streams) while their searches answer until the switch; after it, both
    are refused. (An Edge shard has one process: the one that reindexes.)"""
    client = QdrantClient(":memory:")
    old_model, new_model = HashModel(), other_hash()
    old_process = open_current(ServerCatalog(client, COLLECTION), identity(old_model))
    fill(old_process, old_model, 20)
    late = memory("alice", "written by a process still on the old model")
    fenced: list[str] = []

    def meanwhile(step: Step) -> None:
        if step.phase == "final" and not fenced:
            with pytest.raises(IndexRetired) as refused:
                old_process.put([late], old_model.encode_passages([late.content]))
            assert isinstance(refused.value, Retryable)  # its stream entry waits, never dead-lettered
            fenced.append(old_process.query(MemoryFilter("alice"), mode="sparse", limit=1, text="answers")[0].memory.id)

    assert reindex(ServerCatalog(client, COLLECTION), new_model, batch=16, on_step=meanwhile).switched
    assert fenced, "the old process searched after the fence"
    with pytest.raises(IndexRetired):
        old_process.query(MemoryFilter("alice"), mode="sparse", limit=3, text="answers")
    new_process = open_current(ServerCatalog(client, COLLECTION), identity(new_model))
    assert new_process.count() == 20 and late.id not in everything(new_process)
    client.close()


def test_reindex_to_the_current_model_does_nothing_and_drops_leftovers(engine: Engine) -> None:
    model = HashModel()
    catalog = engine.catalog()
    fill(open_current(catalog, identity(model)), model, 10)
    leftover = catalog.create(Identity("test:abandoned", 8))  # a build an earlier run left behind
    report = reindex(catalog, model)
    assert report.already and not report.switched and report.points == 10 and model.encoded == 10
    assert leftover.name not in catalog.names()
    engine.release(catalog)


# -- a backlog across the switch --------------------------------------------------------------


def test_a_write_batch_embedded_by_another_model_is_decided_again(settings: Settings) -> None:
    from memflow.workers import upsert
    from memflow.workers.runtime import Context

    ctx = Context.from_settings(settings)
    ctx._embedder = HashModel()  # type: ignore[assignment]
    candidate = Candidate(subject="alice", mtype=MType.preference, dir=Dir.preferences, key="reply.length",
                          content="prefers short answers", confidence=0.9, source=Source.explicit,
                          source_event_ids=["e1"], ts=T0)
    stale = WriteBatch(subject="alice", action=Action.add, why="new", candidate=candidate,
                       ops=[PutOp(memory=memory())], vector=[0.0] * 31 + [1.0], vector_model="st:all-MiniLM-L6-v2")
    [emit] = upsert.handle(upsert.Upserter.of(ctx), stale)  # never reaches the store: no store is opened
    assert emit.stream == ctx.keys.work("resolve", "alice") and emit.message.content == candidate.content
    assert ctx._store is None


# -- killed for real, and the command ---------------------------------------------------------

CHILD = """
import json, sys
from dataclasses import asdict
from pathlib import Path
from memflow.shared.storage.edge_shards import EdgeCatalog
from memflow.shared.writer.reindex import reindex
from tests.hash_model import other_hash
print(json.dumps(asdict(reindex(EdgeCatalog(Path(sys.argv[1]), "memflow"), other_hash(), batch=4))))
"""


def test_a_reindex_killed_with_sigkill_resumes(tmp_path: Path) -> None:
    old_model, new_model = HashModel(), other_hash()
    root = tmp_path / "qdrant"
    catalog = EdgeCatalog(root, COLLECTION)
    made = fill(open_current(catalog, identity(old_model)), old_model, 400)
    catalog.close()
    progress = root / f"{index_name(COLLECTION, identity(new_model))}.reindex.json"

    first = subprocess.Popen([sys.executable, "-c", CHILD, str(root)], stdout=subprocess.PIPE)
    wait_for(lambda: _copied(progress) >= 40, timeout_s=15, what="the first run to save ten pages")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    killed_at = _copied(progress)
    assert 40 <= killed_at < 400

    second = subprocess.run([sys.executable, "-c", CHILD, str(root)], capture_output=True, timeout=60, check=True)
    report = json.loads(second.stdout)
    assert report["switched"] and report["resumed_at"] == killed_at
    assert report["copied"] == 400 - killed_at  # what was saved is not done again (the page in hand is)
    catalog = EdgeCatalog(root, COLLECTION)
    store = open_current(catalog, identity(new_model))
    assert store.count() == 400 and everything(store) == {m.id: m for m in made}
    assert made_by(store, new_model, made[:50])
    catalog.close()


def _copied(progress: Path) -> int:
    try:
        return int(json.loads(progress.read_text())["copied"])
    except (OSError, ValueError):
        return 0


@pytest.fixture
def cli_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, embedder: Embedder) -> Iterator[Path]:
    """`memflow reindex` on an Edge shard in tmp_path, with the session's MiniLM (loaded once per run)."""
    from memflow.workers.cli import maintenance

    monkeypatch.setenv("MEMFLOW_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("MEMFLOW_QDRANT_URL", raising=False)
    monkeypatch.setattr(maintenance, "build_embedder", lambda settings: embedder)
    get_settings.cache_clear()
    yield tmp_path
    get_settings.cache_clear()


def test_memflow_reindex_shows_progress_then_a_summary(cli_settings: Path) -> None:
    from typer.testing import CliRunner

    from memflow.workers.cli import app

    catalog = EdgeCatalog(cli_settings / "qdrant", COLLECTION)
    fill(open_current(catalog, identity(HashModel())), HashModel(), 20)
    catalog.close()
    done = CliRunner().invoke(app, ["reindex", "--batch", "8"])
    assert done.exit_code == 0, done.output
    assert "copy" in done.output and "20/20" in done.output
    assert "reindexed 'memflow': 20 memories now hold vectors of st:all-MiniLM-L6-v2 (384 dims) " \
           "(were test:hash-32 (32 dims)); 20 embedded in" in done.output
    again = CliRunner().invoke(app, ["reindex", "--json"])
    assert again.exit_code == 0 and json.loads(again.stdout)["already"] is True


def test_memflow_reindex_refuses_to_run_beside_memflow_up(cli_settings: Path) -> None:
    from typer.testing import CliRunner

    from memflow.shared.redisdb.connections import announce
    from memflow.workers.cli import app

    announce(cli_settings, "redis://127.0.0.1:1")  # this process stands in for a running `memflow up`
    refused = CliRunner().invoke(app, ["reindex"])
    # Told in one line and exit 1 by the command group itself (workers/cli/lazy.py), as `memflow` shows it.
    assert refused.exit_code == 1 and "stop it, run `memflow reindex`" in refused.output, refused.output
