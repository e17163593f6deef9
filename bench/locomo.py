"""`memflow bench locomo`: LoCoMo evidence recall, memflow next to two baselines, in one run.

Every conversation is one subject. Each turn is published as a chat event whose id is
its dialogue id ("D3:7"), so a memory's `source_event_ids` say which turns it came from,
which is what the paper's recall counts. Both speakers are people, so both publish as
role "user" (the extractor reads facts only from user turns) with their name in
`meta.speaker`. A shared photo is part of what was said: its caption is appended to the
text as " [shares a photo: …]". Turns carry their session's date and time, a few
seconds apart; a `session_end` closes each session. Every question is then asked once
for the top 50, as of just after the last session; k = 5, 10 and 25 are its prefixes.
Context budgets are packed, in rank order, from a second, deeper search (top 100).

The baselines see the same turns as the same "Speaker: text" that memflow's episodes
hold: flat dense (cosine top-k with the same model) and BM25 (memflow's own tokeniser
and term weights, IDF over the conversation's turns), both in this process.
"""

from __future__ import annotations

import contextlib
import re
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from itertools import groupby
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import orjson

from memflow.bench.ablation import built, ingest_key, ladder, split
from memflow.bench.llm_echo import echo
from memflow.bench.llm_stub import ScriptedLLM
from memflow.bench.recall import BUDGETS_TOKENS, CATEGORIES, KS, Answered, Item, percentile_ms, summarise
from memflow.pipeline.models import Hit, SearchResult
from memflow.pipeline.ranking import RankingProfiles
from memflow.shared.inference.embedder import Embedder
from memflow.shared.inference.llm import usage as llm_usage
from memflow.shared.redisdb.keys import STAGES
from memflow.shared.settings import Settings
from memflow.shared.storage import sparse
from memflow.shared.storage.store import MemoryFilter
from memflow.shared.streaming import dlq
from memflow.shared.streaming.backlog import backlog
from memflow.workers.embedded import Embedded, embedded

DEPTH = max(KS)
# Budgets are packed from a deeper list than the top 50: 50 turns are ~1,600 tokens, so a
# 2,000-token budget would otherwise be capped by the list, not by the budget.
POOL_DEPTH = 100
DRAGON = {"5": 56.7, "10": 66.2, "25": 76.7, "50": 82.7}  # paper, Table 3: DRAGON over dialog turns
TURN_GAP = timedelta(seconds=5)
ASKED_AFTER = timedelta(minutes=1)  # "now" for the questions, after the last session_end
LIFECYCLE_JOBS = ("decay", "consolidate", "review")
IDLE_TIMEOUT_S = 3600.0
SESSION = re.compile(r"session_(\d+)")
SYSTEMS = {"memflow": "memflow", "flat_dense": "flat dense", "bm25": "bm25"}

CountTokens = Callable[[str], int]
Rank = Callable[[str], Sequence[int]]


# -- the data -------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    dia_id: str
    session: int
    speaker: str
    text: str
    ts: datetime

    @property
    def said(self) -> str:
        """The turn as an item: what memflow's episode of it holds, and what the baselines index."""
        return f"{self.speaker}: {self.text}"


@dataclass(frozen=True)
class Question:
    text: str
    category: int
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class Conversation:
    sample_id: str
    turns: tuple[Turn, ...]
    session_ends: tuple[tuple[int, datetime], ...]
    questions: tuple[Question, ...]

    @property
    def now(self) -> datetime:
        return self.session_ends[-1][1] + ASKED_AFTER


def parse_session_time(text: str) -> datetime:
    """"1:56 pm on 8 May, 2023" → 2023-05-08 13:56 UTC (the dataset gives no zone)."""
    return datetime.strptime(" ".join(text.split()), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)


def split_evidence(evidence: Sequence[str]) -> tuple[str, ...]:
    """Dialogue ids; some entries hold several ("D8:6; D9:17", "D9:1 D4:4 D4:6")."""
    return tuple(part for entry in evidence for part in re.split(r"[;\s]+", entry) if part)


def turn_text(raw: dict[str, Any]) -> str:
    caption = raw.get("blip_caption")
    return f"{raw['text']} [shares a photo: {caption}]" if caption else str(raw["text"])


def read_conversation(sample: dict[str, Any]) -> Conversation:
    """One sample; `session_N_date_time` keys without a `session_N` are ignored."""
    conv = sample["conversation"]
    numbers = sorted(int(m.group(1)) for key in conv if (m := SESSION.fullmatch(key)))
    turns: list[Turn] = []
    ends: list[tuple[int, datetime]] = []
    for n in numbers:
        start = parse_session_time(conv[f"session_{n}_date_time"])
        raw_turns = conv[f"session_{n}"]
        turns += [Turn(t["dia_id"], n, t["speaker"], turn_text(t), start + i * TURN_GAP)
                  for i, t in enumerate(raw_turns)]
        ends.append((n, start + len(raw_turns) * TURN_GAP))
    questions = tuple(Question(q["question"], int(q["category"]), split_evidence(q.get("evidence", [])))
                      for q in sample["qa"])
    return Conversation(sample["sample_id"], tuple(turns), tuple(ends), questions)


def load(path: Path, limit: int | None = None) -> list[Conversation]:
    samples = orjson.loads(path.read_bytes())
    return [read_conversation(s) for s in samples[:limit]]


def events_of(conv: Conversation) -> list[dict[str, Any]]:
    """The conversation as memflow hears it: each session's turns, then its session_end."""
    events: list[dict[str, Any]] = []
    for n, end in conv.session_ends:
        session = f"session_{n}"
        events += [{"event_id": t.dia_id, "subject": conv.sample_id, "session_id": session, "kind": "message",
                    "role": "user", "text": t.text, "ts": t.ts, "meta": {"speaker": t.speaker}}
                   for t in conv.turns if t.session == n]
        events.append({"event_id": f"{session}:end", "subject": conv.sample_id, "session_id": session,
                       "kind": "session_end", "ts": end})
    return events


# -- progress (stderr) --------------------------------------------------------------


@dataclass
class Progress:
    out: TextIO = field(default_factory=lambda: sys.stderr)
    every_s: float = 10.0
    _last: float = 0.0
    tag: str = "locomo"  # the benchmark speaking (bench.madial shares this)

    def note(self, line: str, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last >= self.every_s:
            self._last = now
            self.out.write(f"[{self.tag}] {line}\n")
            self.out.flush()


# -- memflow ----------------------------------------------------------------------


@dataclass
class Asked:
    """One system's answers to every question, with how long each search took."""

    answers: list[Answered] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    failed: int = 0
    index_s: float = 0.0


def ingest(system: Embedded, convs: Sequence[Conversation], progress: Progress, jobs: bool = True) -> dict[str, Any]:
    """Publish every event, wait until every stage is idle, then (with `jobs`) run the lifecycle
    jobs as of each conversation's questions; what it took and what it made."""
    events = [e for conv in convs for e in events_of(conv)]
    started = time.perf_counter()
    for event in events:
        system.client.publish(event)
    progress.note(f"memflow: published {len(events)} events", force=True)
    wait_until_idle(system, progress)
    seconds = time.perf_counter() - started
    lifecycle = run_lifecycle(system, convs, progress) if jobs else None
    found = [m for conv in convs for m in system.ctx.store.get(MemoryFilter(conv.sample_id))]
    kinds = Counter(m.mtype.value for m in found)
    dead = sum(dlq.count(system.client.redis, system.client.keys, stage) for stage in STAGES)
    return {"events": len(events), "seconds": round(seconds, 1), "events_per_s": round(len(events) / seconds, 1),
            "memories": sum(kinds.values()), "memories_by_type": dict(kinds.most_common()), "dead_letters": dead,
            "by_status": dict(Counter(m.status.value for m in found).most_common()), "lifecycle": lifecycle,
            "llm": llm_cost(system, len(events), len(found)) if system.ctx.llm is not None else None}


def llm_cost(system: Embedded, events: int, memories: int) -> dict[str, Any]:
    """What the LLM path cost during the ingest: calls and tokens, per 1,000 events and per memory written."""
    spent = llm_usage(system.client.redis, system.client.keys, None)
    tokens_in, tokens_out, calls = spent["prompt_tokens"], spent["completion_tokens"], spent["calls"]
    return spent | {"per_1000_events": {"calls": round(1000 * calls / events, 1),
                                        "prompt_tokens": round(1000 * tokens_in / events),
                                        "completion_tokens": round(1000 * tokens_out / events)},
                    "per_memory": {"prompt_tokens": round(tokens_in / max(memories, 1), 1),
                                   "completion_tokens": round(tokens_out / max(memories, 1), 1)}}


def run_lifecycle(system: Embedded, convs: Sequence[Conversation], progress: Progress) -> dict[str, int]:
    """Decay, consolidate and review for each conversation as of its questions, as the scheduler
    would have left it: decay must not eat the long-range memories the questions need."""
    done: Counter[str] = Counter()
    for conv in convs:
        for job in LIFECYCLE_JOBS:
            report = system.client.run_job(job, subject=conv.sample_id, now=conv.now)
            done[f"{job}_changed"] += len(report.changed)
            done[f"{job}_written"] += len(report.written) + len(report.sent)
    progress.note(f"memflow: lifecycle jobs run: {dict(done)}", force=True)
    wait_until_idle(system, progress)
    return dict(done)


def wait_until_idle(system: Embedded, progress: Progress, timeout_s: float = IDLE_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not system.client.is_idle():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the pipeline was not idle after {timeout_s:.0f} s")
        lags = backlog(system.client.redis, system.client.keys, STAGES)
        progress.note("memflow ingest, unread/pending per stage: "
                      + ", ".join(f"{stage} {lag}/{pending}" for stage, (lag, pending) in lags.items()))
        time.sleep(0.2)


def ask_memflow(system: Embedded, convs: Sequence[Conversation], tokens: CountTokens,
                progress: Progress) -> Asked:
    """Every question through the RPC path, as an agent would ask it."""
    asked, total = Asked(), sum(len(c.questions) for c in convs)
    for conv in convs:
        for q in conv.questions:
            started = time.perf_counter()
            top = search(system, conv, q)
            asked.latencies_s.append(time.perf_counter() - started)
            deep = search(system, conv, q, POOL_DEPTH)
            asked.failed += (top.status == "failed") + (deep.status == "failed")
            asked.answers.append(Answered(q.category, q.evidence, _items(top.hits, tokens), _items(deep.hits, tokens)))
            progress.note(f"memflow: {len(asked.answers)}/{total} questions")
    return asked


def search(system: Embedded, conv: Conversation, q: Question, k: int = DEPTH) -> SearchResult:
    """One question as the benchmark asks it: the conversation's subject, as of just after its last session
    (bench/ranking_check.py asks the same way)."""
    return system.client.search(conv.sample_id, q.text, k, now=conv.now)


def _items(hits: Sequence[Hit], tokens: CountTokens) -> tuple[Item, ...]:
    return tuple(Item(tuple(h.source_event_ids), tokens(h.content)) for h in hits)


# -- the baselines ----------------------------------------------------------------


class Bm25:
    """BM25 over a conversation's turns, scored as memflow's store scores its sparse vectors:
    the term-frequency weights of `shared.storage.sparse`, times IDF = ln(1 + (N − df + 0.5) / (df + 0.5))
    (Qdrant's IDF modifier), counted over these turns only. Turns sharing no term are not returned."""

    def __init__(self, texts: Sequence[str]) -> None:
        self._n = len(texts)
        by_term: dict[int, list[tuple[int, float]]] = {}
        for doc, text in enumerate(texts):
            for term, weight in zip(*sparse.embed_document(text), strict=True):
                by_term.setdefault(term, []).append((doc, weight))
        self._postings = {term: self._posting(rows) for term, rows in by_term.items()}

    def _posting(self, rows: list[tuple[int, float]]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        df = len(rows)
        idf = np.log(1.0 + (self._n - df + 0.5) / (df + 0.5))
        docs, weights = zip(*rows, strict=True)
        return np.asarray(docs), np.asarray(weights) * idf

    def rank(self, query: str, limit: int = POOL_DEPTH) -> list[int]:
        scores = np.zeros(self._n)
        for term, weight in zip(*sparse.embed_query(query), strict=True):
            if term in self._postings:
                docs, weights = self._postings[term]
                scores[docs] += weight * weights
        order = np.argsort(-scores, kind="stable")[:limit]
        return [int(i) for i in order if scores[i] > 0]


def dense_ranker(embedder: Embedder) -> Callable[[Sequence[str]], Rank]:
    """Flat dense: cosine over the turns' unit vectors, top-k by a full sort."""

    def build(texts: Sequence[str]) -> Rank:
        matrix = np.asarray(embedder.encode_passages(texts), dtype=np.float32)

        def rank(query: str) -> list[int]:
            scores = matrix @ np.asarray(embedder.encode_queries([query])[0], dtype=np.float32)
            return [int(i) for i in np.argsort(-scores, kind="stable")[:POOL_DEPTH]]

        return rank

    return build


def bm25_ranker(texts: Sequence[str]) -> Rank:
    return Bm25(texts).rank


def ask_baseline(name: str, build: Callable[[Sequence[str]], Rank], convs: Sequence[Conversation],
                 tokens: CountTokens, progress: Progress) -> Asked:
    """Index each conversation's turns, then rank them for each of its questions (in-process)."""
    asked = Asked()
    for conv in convs:
        started = time.perf_counter()
        rank = build([t.said for t in conv.turns])
        asked.index_s += time.perf_counter() - started
        items = [Item((t.dia_id,), tokens(t.said)) for t in conv.turns]
        for q in conv.questions:
            started = time.perf_counter()
            order = rank(q.text)
            asked.latencies_s.append(time.perf_counter() - started)
            pool = tuple(items[i] for i in order)
            asked.answers.append(Answered(q.category, q.evidence, pool[:DEPTH], pool))
        progress.note(f"{name}: {conv.sample_id} done")
    return asked


# -- one run --------------------------------------------------------------------


@dataclass
class Step:
    label: str
    overrides: dict[str, Any] | None  # None: the feature is not built
    ingest: dict[str, Any] | None = None
    asked: Asked | None = None


def own_namespace(data_dir: Path, bench: str) -> dict[str, Any]:
    """Settings that give a run its own data dir, stream prefix and collection (nothing shared with
    another run, or with a `memflow up` on the same Redis)."""
    tag = uuid.uuid4().hex[:8]
    return {"data_dir": data_dir, "stream_prefix": f"{bench}-{tag}:", "collection": f"{bench}_{tag}"}


def run_memflow(steps: Sequence[Step], convs: Sequence[Conversation], base: Settings, embedder: Embedder | None,
                light_in_process: bool, progress: Progress, jobs: bool = True) -> Embedder:
    """A fresh system (own data dir, prefix, collection), one ingest, every question once per step.

    The steps must agree on what is written (`ablation.ingest_key`); between them only the
    query worker's settings change. Returns the model it loaded (for the next steps and the baselines).
    """
    with tempfile.TemporaryDirectory(prefix="memflow-locomo-") as tmp:
        own = own_namespace(Path(tmp), "locomo")
        settings = base.replace(**{**split(steps[0].overrides or {})[0], **own})
        with embedded(settings, light_in_process=light_in_process, embedder=embedder) as system:
            progress.note(f"memflow ({steps[0].label}): ingesting {len(convs)} conversation(s)", force=True)
            figures = ingest(system, convs, progress, jobs)
            tokens = lru_cache(maxsize=None)(system.ctx.embedder.count_tokens)
            for step in steps:
                chosen, tuned = split(step.overrides or {})
                system.ctx.settings = base.replace(**{**chosen, **own})
                system.ctx.ranking = RankingProfiles().tuned(tuned)
                progress.note(f"memflow ({step.label}): asking", force=True)
                step.ingest, step.asked = figures, ask_memflow(system, convs, tokens, progress)
            if figures["llm"] is not None:  # the searches' plans, on top of the ingest's extraction and judgement
                figures["llm_with_questions"] = llm_usage(system.client.redis, system.client.keys, None)
            return system.ctx.embedder


def measure(convs: Sequence[Conversation], settings: Settings, *, ablation: bool, embedder: Embedder | None = None,
            light_in_process: bool = False, progress: Progress | None = None,
            variants: Mapping[str, dict[str, Any]] | None = None, jobs: bool = True) -> dict[str, Any]:
    """The whole benchmark: memflow (once, once per built ablation step, or once per named variant of
    the settings), then the baselines. Consecutive steps that write the same share one ingest."""
    progress = progress or Progress()
    started = time.perf_counter()
    if variants:
        steps = [Step(label, dict(overrides)) for label, overrides in variants.items()]
    elif ablation:
        steps = [Step(label, overrides) for label, overrides in ladder()]
    else:
        steps = [Step("memflow", {})]
    built = [s for s in steps if s.overrides is not None]
    for _, group in groupby(built, key=lambda s: ingest_key(s.overrides or {})):
        embedder = run_memflow(list(group), convs, settings, embedder, light_in_process, progress, jobs)
    assert embedder is not None  # the first step is always built
    tokens = lru_cache(maxsize=None)(embedder.count_tokens)
    baselines = {"flat_dense": ask_baseline("flat dense", dense_ranker(embedder), convs, tokens, progress),
                 "bm25": ask_baseline("bm25", bm25_ranker, convs, tokens, progress)}
    return report(convs, steps, baselines, time.perf_counter() - started)


# -- the report -------------------------------------------------------------------


def system_figures(asked: Asked) -> dict[str, Any]:
    figures = summarise(asked.answers)
    figures |= {"search_p50_ms": percentile_ms(asked.latencies_s, 0.5),
                "search_p95_ms": percentile_ms(asked.latencies_s, 0.95), "failed_searches": asked.failed}
    return figures


def report(convs: Sequence[Conversation], steps: Sequence[Step], baselines: dict[str, Asked],
           wall_s: float) -> dict[str, Any]:
    built = [s for s in steps if s.asked is not None]
    final = built[-1]
    assert final.asked is not None
    systems = {"memflow": system_figures(final.asked)}
    for name, asked in baselines.items():
        systems[name] = system_figures(asked) | {"index_s": round(asked.index_s, 1)}
    out: dict[str, Any] = {
        "conversations": len(convs), "turns": sum(len(c.turns) for c in convs),
        "questions": sum(len(c.questions) for c in convs), "k": list(KS), "budgets_tokens": list(BUDGETS_TOKENS),
        "reference": {"dragon_paper": {"recall": DRAGON}},
        "ingest": final.ingest, "systems": systems, "wall_s": round(wall_s, 1)}
    if len(steps) > 1:
        out["ablation"] = [ablation_row(s) for s in steps]
    return out


def ablation_row(step: Step) -> dict[str, Any]:
    if step.asked is None:
        return {"step": step.label, "built": False}
    figures = system_figures(step.asked)
    return {"step": step.label, "built": True, "overrides": step.overrides, "ingest": step.ingest,
            **{k: figures[k] for k in ("recall", "recall_no_adversarial", "budget_recall", "mean_tokens_at_k",
                                       "search_p50_ms", "search_p95_ms")}}


def _cells(values: Mapping[str, float | None], width: int = 6) -> str:
    return " ".join(f"{'-' if v is None else f'{v:.1f}':>{width}}" for v in values.values())


def render(out: dict[str, Any]) -> str:
    lines = [f"LoCoMo evidence recall: {out['conversations']} conversation(s), {out['turns']} turns, "
             f"{out['questions']} questions. R@k: one top-{DEPTH} search per question, k = 5, 10, 25 its prefixes; "
             f"budgets (tok = model tokens) packed in rank order from a top-{POOL_DEPTH} list",
             _ingest_line(out)]
    lines += _main_table(out["systems"], no_adversarial=False)
    lines += _main_table(out["systems"], no_adversarial=True)
    lines += _category_table(out["systems"])
    if "ablation" in out:
        lines += _ablation_table(out)
    lines.append(f"wall time {out['wall_s']:.0f} s")
    return "\n".join(lines)


def _ingest_line(out: dict[str, Any]) -> str:
    ing, systems = out["ingest"], out["systems"]
    kinds = ", ".join(f"{n} {k}" for k, n in ing["memories_by_type"].items())
    return (f"memflow ingest: {ing['events']} events in {ing['seconds']:.1f} s ({ing['events_per_s']:.1f}/s) → "
            f"{ing['memories']} memories ({kinds}); {ing['dead_letters']} dead letters, "
            f"{systems['memflow']['failed_searches']} failed searches\n"
            f"by status: {ing.get('by_status')}; lifecycle jobs as of the questions: {ing.get('lifecycle')}\n"
            f"baseline indexing: flat dense {systems['flat_dense']['index_s']:.1f} s, "
            f"bm25 {systems['bm25']['index_s']:.1f} s" + _llm_line(ing))


def _llm_line(ing: dict[str, Any]) -> str:
    cost = ing.get("llm")
    if not cost:
        return ""
    per, mem = cost["per_1000_events"], cost["per_memory"]
    asked = ing.get("llm_with_questions") or cost
    return (f"\nLLM during ingest: {cost['calls']} calls ({cost['calls_by_purpose']}), {cost['prompt_tokens']} tokens "
            f"in, {cost['completion_tokens']} out; per 1,000 events {per['calls']} calls, {per['prompt_tokens']} in, "
            f"{per['completion_tokens']} out; per memory written {mem['prompt_tokens']} in, "
            f"{mem['completion_tokens']} out; fallbacks {cost['fallbacks']} {cost['fallbacks_by_reason']}; "
            f"with the questions' plans: {asked['calls']} calls, {asked['prompt_tokens']} in, "
            f"{asked['completion_tokens']} out")


def _main_table(systems: dict[str, Any], no_adversarial: bool) -> list[str]:
    suffix = "_no_adversarial" if no_adversarial else ""
    title = "without adversarial (1-4)" if no_adversarial else "all categories"
    head = f"\n{title:<26}{'R@5':>6} {'R@10':>6} {'R@25':>6} {'R@50':>6} | {'≤500':>6} {'≤1000':>6} {'≤2000':>6} tok"
    if not no_adversarial:
        head += f" | {'tok@5':>6} {'@10':>6} {'@25':>6} {'@50':>6} {'@100':>6} | {'p50 ms':>7} {'p95 ms':>7}"
    rows = [head]
    for name, label in SYSTEMS.items():
        s = systems[name]
        row = f"{label:<26}{_cells(s['recall' + suffix])} | {_cells(s['budget_recall' + suffix])}    "
        if not no_adversarial:
            row += (f" | {_cells(s['mean_tokens_at_k'])} {s['mean_pool_tokens']:>6.1f} | "
                    f"{s['search_p50_ms']:>7.1f} {s['search_p95_ms']:>7.1f}")
        rows.append(row)
    if not no_adversarial:
        rows.append(f"{'DRAGON (paper, all)':<26}{_cells(DRAGON)} |")
    return rows


def _category_table(systems: dict[str, Any]) -> list[str]:
    rows = [f"\n{'by category':<26}{'n':>5} {'R@5':>6} {'R@10':>6} {'R@25':>6} {'R@50':>6} | "
            f"{'≤500':>6} {'≤1000':>6} {'≤2000':>6} tok"]
    for category in CATEGORIES:
        for i, (name, label) in enumerate(SYSTEMS.items()):
            c = systems[name]["by_category"][str(category)]
            title = f"{c['name']:<13}" if i == 0 else " " * 13
            rows.append(f"{title}{label:<13}{c['questions']:>5} {_cells(c['recall'])} | {_cells(c['budget_recall'])}")
    return rows


def _ablation_table(out: dict[str, Any]) -> list[str]:
    rows = [f"\n{'steps (same data, same k)':<30}{'R@5':>6} {'R@10':>6} {'R@25':>6} {'R@50':>6} | "
            f"{'no-adv R@10':>11} | {'≤500':>6} {'≤1000':>6} {'≤2000':>6} tok"]
    for step in out["ablation"]:
        if not step["built"]:
            rows.append(f"{step['step']:<30}  not built")
            continue
        rows.append(f"{step['step']:<30}{_cells(step['recall'])} | {step['recall_no_adversarial']['10']:>11.1f} | "
                    f"{_cells(step['budget_recall'])}")
    for name in ("flat_dense", "bm25"):
        s = out["systems"][name]
        rows.append(f"{SYSTEMS[name] + ' (baseline)':<30}{_cells(s['recall'])} | "
                    f"{s['recall_no_adversarial']['10']:>11.1f} | {_cells(s['budget_recall'])}")
    return rows


# -- the command ------------------------------------------------------------------


def read_variants(path: Path) -> dict[str, dict[str, Any]]:
    """{name: {setting or tuned ranking value: value}} from a JSON file; ValueError naming the first unknown one."""
    variants = orjson.loads(path.read_bytes())
    if not isinstance(variants, dict) or not all(isinstance(v, dict) for v in variants.values()):
        raise ValueError("expected a JSON object of {name: {setting: value}}")
    for name, overrides in variants.items():
        unknown = sorted(name for name in overrides if not built({name: None}))
        if unknown:
            raise ValueError(f"variant {name!r}: unknown setting(s) or ranking value(s) {', '.join(unknown)}")
    return variants


def run_cli(data: Path, *, conversations: int | None, as_json: bool, ablation: bool, settings: Settings,
            embedder: Embedder | None = None, light_in_process: bool = False, variants: Path | None = None,
            jobs: bool = True, llm_stub: bool = False) -> int:
    """Exit code 0 with the figures on stdout; 2 if the data or the variants cannot be read, 1 if the run failed."""
    try:
        convs = load(data, conversations)
        named = read_variants(variants) if variants else None
    except (OSError, ValueError, KeyError) as exc:
        sys.stderr.write(f"cannot read LoCoMo data or variants ({data}, {variants}): {exc}\n")
        return 2
    try:
        with contextlib.ExitStack() as stack:
            if llm_stub:  # the LLM path against the scripted server: what it costs in calls and tokens
                server = stack.enter_context(ScriptedLLM(echo))
                settings = settings.replace(llm_base_url=server.url, llm_model="scripted")
            out = measure(convs, settings, ablation=ablation, embedder=embedder,
                          light_in_process=light_in_process, variants=named, jobs=jobs)
    except TimeoutError as exc:
        sys.stderr.write(f"locomo: {exc}\n")
        return 1
    sys.stdout.write((orjson.dumps(out).decode() if as_json else render(out)) + "\n")
    return 0
