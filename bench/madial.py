"""`memflow bench madial`: MADial-Bench memory retrieval, memflow next to BM25 and dense, in one run.

The benchmark's own retrieval setting (He et al., NAACL 2025; hejunqing/MADial-Bench,
`embedding_top_20_new.py`): the candidates are the user's memory archive, the query is the
dialogue before the (first) test turn, gold is `relevant-id`. Per language, a fresh memflow
hears every memory as an explicit write (`MemoryClient.write`, one subject per user, the
memory's date as its time) under an event id that names it, so a hit's `source_event_ids`
say which MADial memories it holds. Each dialogue is then searched once for the top 10, as
of a day after the newest memory.

The baselines rank the same `event` texts for the same queries in this process: BM25
(Okapi, over lowercased words and Chinese character unigrams and bigrams) and dense
(cosine with the model memflow is configured with). R@k is the share of a dialogue's gold
found in its top k (the paper's `recall_at_k`), MRR@10 the reciprocal rank of the first
gold; both averaged over dialogues, as fractions (the paper's scale).
"""

from __future__ import annotations

import math
import re
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from memflow.bench.locomo import Progress, dense_ranker, own_namespace, wait_until_idle
from memflow.bench.recall import Item, evidence_recall, percentile_ms
from memflow.pipeline.models import Hit, MType, SearchResult, Status
from memflow.pipeline.models import Memory as Stored
from memflow.pipeline.statements import CJK
from memflow.shared.errors import InvalidInput
from memflow.shared.inference.embedder import Embedder
from memflow.shared.settings import Settings
from memflow.shared.storage.store import MemoryFilter
from memflow.workers.embedded import Embedded, embedded

LANGS = ("zh", "en")
KS = (1, 3, 5, 10)
DEPTH = max(KS)
ASKED_AFTER = timedelta(days=1)  # "now" for the searches: after the newest memory
SYSTEMS = ("memflow", "bm25", "dense")
# Okapi BM25's textbook parameters: this baseline is the classic one, not memflow's tuned sparse
# side (shared/storage/sparse.py), so that the comparison says what memflow adds over plain keywords.
K1 = 1.2
B = 0.75

# A memory ranked by a system: the MADial ids it holds (one for a baseline; a memflow memory
# holds those of every write it was made from).
Ranked = tuple[Item, ...]
Rank = Callable[[str], Sequence[int]]

_TAGGED = re.compile(r"<([^<>:]+)>\s*:\s*(.*)", re.S)
_CJK_RUN = re.compile(f"{CJK.pattern}+")
_WORD = re.compile(r"[^\W_]+")


# -- the data -------------------------------------------------------------------


@dataclass(frozen=True)
class Memory:
    id: str
    user: str
    event: str
    ts: datetime


@dataclass(frozen=True)
class Dialogue:
    id: str
    user: str
    query: str
    gold: tuple[str, ...]


@dataclass(frozen=True)
class Split:
    """One language of the data: every user's memories and the dialogues asking for them."""

    lang: str
    memories: tuple[Memory, ...]
    dialogues: tuple[Dialogue, ...]

    @property
    def now(self) -> datetime:
        return max(m.ts for m in self.memories) + ASKED_AFTER

    def of_user(self, user: str) -> list[Memory]:
        return [m for m in self.memories if m.user == user]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """One JSON object per non-blank line; ValueError naming the line otherwise."""
    rows = []
    for number, line in enumerate(path.read_bytes().splitlines(), 1):
        if line.strip():
            row = orjson.loads(line)
            if not isinstance(row, dict):
                raise ValueError(f"{path.name} line {number}: not a JSON object")
            rows.append(row)
    return rows


def memory_records(path: Path) -> dict[str, dict[str, Any]]:
    """{memory id: its record}; each line holds `{"<id>": {...}}`."""
    return {str(key): record for row in read_jsonl(path) for key, record in row.items()}


def read_memories(records: Mapping[str, dict[str, Any]], users: Mapping[str, str]) -> tuple[Memory, ...]:
    """The memories, their user from the record or else from `users` (the English file has none)."""
    return tuple(Memory(key, user_of(key, record, users), str(record["event"]),
                        datetime.fromisoformat(record["time"]).replace(tzinfo=UTC))
                 for key, record in records.items())


def user_of(memory_id: str, record: Mapping[str, Any], users: Mapping[str, str]) -> str:
    if "user-id" in record:
        return str(record["user-id"])
    if memory_id in users:
        return users[memory_id]
    raise ValueError(f"memory {memory_id}: no user-id, here or in the Chinese memory file")


def turn_text(line: str) -> str | None:
    """`<Bart>:"…"` → `Bart: …`; None for the `<BOD>`/`<EOD>` marks. Lines without a speaker tag
    (a few in the English file) are kept as they are, less their quotes."""
    line = line.strip()
    if line in ("<BOD>", "<EOD>"):
        return None
    tagged = _TAGGED.fullmatch(line)
    speaker, said = (tagged.group(1), tagged.group(2)) if tagged else (None, line)
    said = said.strip().strip('"').strip()
    return f"{speaker}: {said}" if speaker else said


def query_of(lines: Sequence[str], test_turn: int) -> str:
    """The dialogue before the test turn, one turn a line (the index counts the `<BOD>` line)."""
    return "\n".join(t for line in lines[:test_turn] if (t := turn_text(line)))


def read_dialogue(row: dict[str, Any], index: int) -> Dialogue:
    # Some dialogues have several test turns; the benchmark's retrieval uses the first.
    turn = int(row["test-turn"][0])
    return Dialogue(str(row.get("id", index)), str(row["user-id"]), query_of(row["dialogue"], turn),
                    tuple(str(i) for i in row["relevant-id"]))


def user_ids(data: Path) -> dict[str, str]:
    """{memory id: user id} from the Chinese memory file, the only one that carries them."""
    return {key: str(r["user-id"]) for key, r in memory_records(data / "MADial-Bench-zh-memory.json").items()
            if "user-id" in r}


def load(data: Path, lang: str) -> Split:
    """One language; ValueError (or OSError, KeyError) when the files are missing or malformed."""
    records = memory_records(data / f"MADial-Bench-{lang}-memory.json")
    users = {} if all("user-id" in r for r in records.values()) else user_ids(data)
    rows = read_jsonl(data / f"MADial-Bench-{lang}-dialogue.json")
    dialogues = tuple(read_dialogue(row, i) for i, row in enumerate(rows))
    if not records or not dialogues:
        raise ValueError(f"{lang}: no memories or no dialogues")
    return Split(lang, read_memories(records, users), dialogues)


# -- scoring ----------------------------------------------------------------------


def recall_at(gold: Sequence[str], ranked: Ranked, k: int) -> float:
    """Share of the (distinct) gold ids held by the top k memories."""
    return evidence_recall(gold, ranked[:k])


def reciprocal_rank(gold: Sequence[str], ranked: Ranked, k: int = DEPTH) -> float:
    """1 / the rank of the first memory in the top k holding a gold id; 0 when none does."""
    wanted = set(gold)
    return next((1.0 / rank for rank, item in enumerate(ranked[:k], 1) if wanted & set(item.source_ids)), 0.0)


def figures(dialogues: Sequence[Dialogue], ranked: Sequence[Ranked]) -> dict[str, float]:
    """R@1/3/5/10 and MRR@10, each the mean over dialogues, as fractions."""
    pairs = list(zip(dialogues, ranked, strict=True))
    out = {f"R@{k}": _mean(recall_at(d.gold, r, k) for d, r in pairs) for k in KS}
    return out | {f"MRR@{DEPTH}": _mean(reciprocal_rank(d.gold, r) for d, r in pairs)}


def _mean(values: Iterable[float]) -> float:
    listed = list(values)
    return round(sum(listed) / len(listed), 4) if listed else 0.0


# -- memflow ----------------------------------------------------------------------


@dataclass
class Searched:
    """memflow's answers for one split, with what each search took."""

    ranked: list[Ranked] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    failed: int = 0
    stored: dict[str, int] = field(default_factory=dict)  # memories by status after the writes
    # Memories written that no active (or contested) memory holds: a distinct statement lost to another.
    uncovered: list[str] = field(default_factory=list)
    # Points that writing every memory a second time (same event ids: a replay) changed.
    replay_changed: int = -1


def subject_of(lang: str, user: str) -> str:
    return f"madial-{lang}-user-{user}"


def event_id_of(lang: str, memory_id: str) -> str:
    return f"madial-{lang}-{memory_id}"


def write_all(system: Embedded, split: Split) -> int:
    """Every memory written; the count the gate refused at the door (filler, an instruction): those were always
    left unstored, and now the write says so instead of acknowledging them."""
    refused = 0
    for m in split.memories:
        try:
            system.client.write(subject_of(split.lang, m.user), m.event, ts=m.ts, external_ref=m.id,
                                event_id=event_id_of(split.lang, m.id), session_id=f"madial-{split.lang}")
        except InvalidInput:
            refused += 1
    return refused


def stored(system: Embedded, split: Split) -> dict[str, int]:
    found = [m for user in sorted({m.user for m in split.memories})
             for m in system.ctx.store.get(MemoryFilter(subject_of(split.lang, user)))]
    return dict(Counter(m.status.value for m in found).most_common())


def points(system: Embedded, split: Split) -> dict[str, Stored]:
    return {m.id: m for user in sorted({m.user for m in split.memories})
            for m in system.ctx.store.get(MemoryFilter(subject_of(split.lang, user)))}


def uncovered(split: Split, stored_points: Mapping[str, Stored]) -> list[str]:
    """The MADial ids of memories that no live memory was made from (episodes aside)."""
    live = [m for m in stored_points.values() if m.status in (Status.active, Status.contested)]
    held = {e for m in live if m.mtype is not MType.episode for e in m.source_event_ids}
    return [m.id for m in split.memories if event_id_of(split.lang, m.id) not in held]


def replayed(system: Embedded, split: Split, progress: Progress) -> int:
    """How many points writing every memory again (the same event ids) changes: 0 when replays are idempotent."""
    before = points(system, split)
    write_all(system, split)
    wait_until_idle(system, progress)
    after = points(system, split)
    return sum(before.get(i) != after.get(i) for i in set(before) | set(after))


def madial_ids(hits: Sequence[Hit], by_event: Mapping[str, str]) -> Ranked:
    """Each hit as the MADial ids of the writes it was made from (none for anything else)."""
    return tuple(Item(tuple(by_event[e] for e in h.source_event_ids if e in by_event), 0) for h in hits)


def search(system: Embedded, split: Split, d: Dialogue) -> SearchResult:
    """One dialogue as the benchmark asks it: the top 10 of its user's memories, as of a day after the newest
    (bench/ranking_check.py asks the same way)."""
    return system.client.search(subject_of(split.lang, d.user), d.query, DEPTH, now=split.now)


def search_all(system: Embedded, split: Split, progress: Progress) -> Searched:
    """One top-10 search per dialogue through the RPC path, as an agent would ask it."""
    searched, by_event = Searched(), {event_id_of(split.lang, m.id): m.id for m in split.memories}
    for d in split.dialogues:
        started = time.perf_counter()
        result = search(system, split, d)
        searched.latencies_s.append(time.perf_counter() - started)
        searched.failed += result.status == "failed"
        searched.ranked.append(madial_ids(result.hits, by_event))
        progress.note(f"memflow {split.lang}: {len(searched.ranked)}/{len(split.dialogues)} dialogues")
    return searched


def run_memflow(split: Split, base: Settings, embedder: Embedder | None, light_in_process: bool,
                progress: Progress) -> tuple[Searched, Embedder]:
    """A fresh system (own data dir, prefix, collection): every write, then every search.
    Returns the model it loaded, for the next language and the dense baseline."""
    with tempfile.TemporaryDirectory(prefix="memflow-madial-") as tmp:
        settings = base.replace(**own_namespace(Path(tmp), "madial"))
        with embedded(settings, light_in_process=light_in_process, embedder=embedder) as system:
            refused = write_all(system, split)
            progress.note(f"memflow {split.lang}: wrote {len(split.memories)} memories, {refused} refused by the gate",
                          force=True)
            wait_until_idle(system, progress)
            searched = search_all(system, split, progress)
            searched.stored = stored(system, split)
            searched.uncovered = uncovered(split, points(system, split))
            searched.replay_changed = replayed(system, split, progress)
            return searched, system.ctx.embedder


# -- the baselines ----------------------------------------------------------------


def terms(text: str) -> list[str]:
    """Lowercased words, and each run of Chinese characters as its unigrams and bigrams
    (Chinese has no spaces to split on; bigrams catch most two-character words)."""
    lowered = text.lower()
    runs = _CJK_RUN.findall(lowered)
    grams = [g for run in runs for g in (*run, *(run[i:i + 2] for i in range(len(run) - 1)))]
    return _WORD.findall(_CJK_RUN.sub(" ", lowered)) + grams


class Bm25:
    """Okapi BM25 with IDF = ln(1 + (N − df + 0.5) / (df + 0.5)); each distinct query term counts
    once (as memflow's sparse query does). Memories sharing no term are not returned."""

    def __init__(self, texts: Sequence[str], k1: float = K1, b: float = B) -> None:
        counts = [Counter(terms(t)) for t in texts]
        lengths = np.asarray([sum(c.values()) for c in counts], dtype=float)
        self._n = len(texts)
        self._norm = k1 * (1 - b + b * lengths / max(float(lengths.mean()), 1.0)) if self._n else lengths
        self._k1 = k1
        by_term: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for doc, count in enumerate(counts):
            for term, tf in count.items():
                by_term[term].append((doc, tf))
        self._postings = {term: self._posting(rows) for term, rows in by_term.items()}

    def _posting(self, rows: list[tuple[int, int]]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        idf = math.log(1.0 + (self._n - len(rows) + 0.5) / (len(rows) + 0.5))
        docs = np.asarray([d for d, _ in rows])
        tf = np.asarray([t for _, t in rows], dtype=float)
        return docs, idf * tf * (self._k1 + 1) / (tf + self._norm[docs])

    def rank(self, query: str) -> list[int]:
        scores = np.zeros(self._n)
        for term in set(terms(query)):
            if term in self._postings:
                docs, weights = self._postings[term]
                scores[docs] += weights
        order = np.argsort(-scores, kind="stable")[:DEPTH]
        return [int(i) for i in order if scores[i] > 0]


def bm25_ranker(texts: Sequence[str]) -> Rank:
    return Bm25(texts).rank


def ask_baseline(build: Callable[[Sequence[str]], Rank], split: Split) -> list[Ranked]:
    """Index each user's memory texts, then rank them for each of that user's dialogues."""
    users = sorted({m.user for m in split.memories})
    mine = {user: split.of_user(user) for user in users}
    ranks = {user: build([m.event for m in memories]) for user, memories in mine.items()}
    return [tuple(Item((mine[d.user][i].id,), 0) for i in ranks[d.user](d.query)[:DEPTH])
            if d.user in ranks else () for d in split.dialogues]


# -- one run --------------------------------------------------------------------


@dataclass
class Run:
    """What a run found: `figures` is the --json output; the rest is for the table."""

    figures: dict[str, Any]
    splits: Sequence[Split]
    searched: dict[str, Searched]
    wall_s: float


def measure(splits: Sequence[Split], settings: Settings, *, embedder: Embedder | None = None,
            light_in_process: bool = False, progress: Progress | None = None) -> Run:
    """memflow once per language (a fresh system each), then both baselines over the same texts."""
    progress = progress or Progress(tag="madial")
    started = time.perf_counter()
    searched: dict[str, Searched] = {}
    for split in splits:
        searched[split.lang], embedder = run_memflow(split, settings, embedder, light_in_process, progress)
    assert embedder is not None  # there is always a split, so memflow ran and loaded it
    rankers = {"bm25": bm25_ranker, "dense": dense_ranker(embedder)}
    systems = {"memflow": {s.lang: figures(s.dialogues, searched[s.lang].ranked) for s in splits}}
    systems |= {name: {s.lang: figures(s.dialogues, ask_baseline(build, s)) for s in splits}
                for name, build in rankers.items()}
    latencies = [t for s in searched.values() for t in s.latencies_s]
    out = {"systems": systems,
           "writes": {lang: {"uncovered": s.uncovered, "replay_changed": s.replay_changed}
                      for lang, s in searched.items()},
           "search_ms": {"p50": percentile_ms(latencies, 0.5), "p95": percentile_ms(latencies, 0.95)}}
    return Run(out, splits, searched, time.perf_counter() - started)


# -- the report -------------------------------------------------------------------


def render(run: Run) -> str:
    metrics = [*(f"R@{k}" for k in KS), f"MRR@{DEPTH}"]
    lines = ["MADial-Bench retrieval: one top-10 search per dialogue over the user's memories; "
             "R@k = share of the gold in the top k, MRR@10; means over dialogues"]
    lines += [_split_line(s, run.searched[s.lang]) for s in run.splits]
    lines.append(f"\n{'system':<10}{'lang':<6}" + "".join(f"{m:>8}" for m in metrics))
    for s in run.splits:
        for name in SYSTEMS:
            row = run.figures["systems"][name][s.lang]
            lines.append(f"{name:<10}{s.lang:<6}" + "".join(f"{row[m]:>8.3f}" for m in metrics))
    ms = run.figures["search_ms"]
    lines.append(f"\nmemflow search p50 {ms['p50']:.1f} ms, p95 {ms['p95']:.1f} ms; wall time {run.wall_s:.0f} s")
    return "\n".join(lines)


def _split_line(split: Split, searched: Searched) -> str:
    return (f"{split.lang}: {len(split.memories)} memories written, {len(split.dialogues)} dialogues; "
            f"memflow stored {searched.stored}, {searched.failed} failed searches; "
            f"{len(searched.uncovered)} memories held by no live memory, {searched.replay_changed} points "
            f"changed by writing them all again")


# -- the command ------------------------------------------------------------------


def run_cli(data: Path, *, langs: Sequence[str] = LANGS, as_json: bool, settings: Settings,
            embedder: Embedder | None = None, light_in_process: bool = False) -> int:
    """Exit code 0 with the figures on stdout; 2 if the data cannot be read, 1 if the run timed out."""
    try:
        splits = [load(data, lang) for lang in langs]
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        sys.stderr.write(f"madial: cannot read MADial-Bench data in {data}: {type(exc).__name__}: {exc}\n")
        return 2
    try:
        run = measure(splits, settings, embedder=embedder, light_in_process=light_in_process)
    except TimeoutError as exc:
        sys.stderr.write(f"madial: {exc}\n")
        return 1
    sys.stdout.write((orjson.dumps(run.figures).decode() if as_json else render(run)) + "\n")
    return 0
