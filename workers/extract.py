"""extract: `extract` → `resolve`. Turns triggered text into candidate memories.

The rules (zh + en) always run. With an LLM configured, its replies stand in for the rules'
statements batch by batch (`pipeline.llm_extract`); a batch whose call fails, times out, runs
over the budget or whose reply is refused falls back to the rules' statements of the same
kind and turns, and is counted (per subject and globally) and traced. The verbatim records
are the rules' in every case.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

import redis

from memflow.pipeline import llm_extract
from memflow.pipeline.extract import assemble, read
from memflow.pipeline.fates import NOTHING_IN_IT, FateState
from memflow.pipeline.llm_extract import Batch
from memflow.pipeline.models import Candidate, ExtractTask, TriggerReason
from memflow.pipeline.prompting import Refused
from memflow.shared.inference.llm import LLM, Asked, Reading
from memflow.shared.redisdb.keys import Keys
from memflow.shared.streaming.consumer import StreamConsumer
from memflow.shared.streaming.handlers import Emit, per_item
from memflow.shared.unstored import fates, pending
from memflow.workers.runtime import Context


@dataclass(frozen=True)
class Extractor:
    """What the extract stage touches: the LLM that reads statements (None: the rules alone) and how many calls
    it may have in flight, whether a record keeps the turns around it, and Redis for the pending layer and the
    resolve streams."""

    client: redis.Redis
    keys: Keys
    llm: LLM | None
    max_concurrency: int
    episode_context: bool

    @classmethod
    def of(cls, ctx: Context) -> Extractor:
        return cls(ctx.client, ctx.keys, ctx.llm if ctx.settings.llm.extract else None,
                   ctx.settings.llm.max_concurrency, ctx.settings.write.episode_context)


def build(ctx: Context) -> StreamConsumer[ExtractTask]:
    # Unpacked per task, as the context builds its parts when first used (the LLM client).
    return StreamConsumer(ctx.client, ctx.keys, "extract", ExtractTask,
                          per_item(lambda task: handle(Extractor.of(ctx), task)), ctx.consumer_config())


def handle(stage: Extractor, task: ExtractTask) -> list[Emit]:
    records, rules = read(task)
    llm = stage.llm
    said = llm_statements(llm, stage.max_concurrency, task, rules) if llm is not None else rules
    found = assemble(records, said, episode_context=stage.episode_context)
    if task.reason is not TriggerReason.realtime:  # a closed session's turn that yields nothing is done with
        yielded = {e for c in found for e in c.source_event_ids}
        empty = [t.event_id for t in task.turns if t.event_id not in yielded]
        pending.settle(stage.client, stage.keys, {task.subject: empty})
        fates.record(stage.client, stage.keys, task.subject, FateState.nothing_to_remember, empty, NOTHING_IN_IT)
    return [Emit(stage.keys.work("resolve", candidate.subject), candidate) for candidate in found]


def llm_statements(llm: LLM, max_concurrency: int, task: ExtractTask, rules: list[Candidate]) -> list[Candidate]:
    """The task's statements as the LLM reads them, batch by batch (at most `max_concurrency` calls at once);
    the rules' when no prompt applies."""
    batches = llm_extract.batches(task)
    if not batches:
        return rules
    with ThreadPoolExecutor(max_workers=min(len(batches), max_concurrency)) as pool:
        results = list(pool.map(partial(_read_batch, llm, task, rules), batches))
    said = llm_extract.uncovered(task, rules)
    for asked in results:
        said += asked.value
    from_llm = sum(len(asked.value) for asked in results if asked.fallback is None)
    llm.count(task.subject, {"candidates": from_llm})
    return said


def _read_batch(llm: LLM, task: ExtractTask, rules: list[Candidate], batch: Batch) -> Asked[list[Candidate]]:
    """One batch's candidates: the LLM's, or (`fallback` set) the rules' statements of its kind and turns."""

    def read(reply: str) -> Reading[list[Candidate]]:
        found, dropped = llm_extract.read_reply(task, batch, reply)
        silent = llm_extract.missed(task, batch, found, rules)
        return Reading(found, items=len(found), counts={"dropped_items": dropped},
                       refused=Refused("silent", "the model kept nothing of a turn with an explicit signal")
                       if silent else None)

    def stand_in() -> Reading[list[Candidate]]:
        found = llm_extract.fill_in(batch, rules)
        return Reading(found, items=len(found))

    return llm.ask(task.subject, f"extract:{batch.kind}", llm_extract.prompt(batch), read=read, fallback=stand_in,
                   session_id=task.session_id)
