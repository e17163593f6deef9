"""extract: `extract` → `resolve`. Turns triggered text into candidate memories.

The rules (zh + en) always run. With an LLM configured, its replies stand in for the rules'
statements batch by batch (`pipeline.llm_extract`); a batch whose call fails, times out, runs
over the budget or whose reply is refused falls back to the rules' statements of the same
kind and turns, and is counted (per subject and globally) and traced. The verbatim records
are the rules' in every case.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from pipeline import llm_extract
from pipeline.extract import assemble, read
from pipeline.llm_extract import Batch
from pipeline.models import Candidate, ExtractTask
from pipeline.prompting import Refused
from shared.llm import LLM, LLMUnavailable
from shared.streams import Emit, StreamConsumer, per_item
from workers.runtime import Context


def build(ctx: Context) -> StreamConsumer[ExtractTask]:
    return StreamConsumer(ctx.client, ctx.keys, "extract", ExtractTask, per_item(partial(handle, ctx)),
                          ctx.consumer_config())


def handle(ctx: Context, task: ExtractTask) -> list[Emit]:
    records, rules = read(task)
    llm = ctx.llm if ctx.settings.llm_extract else None
    said = llm_statements(ctx, llm, task, rules) if llm is not None else rules
    found = assemble(records, said, episode_context=ctx.settings.episode_context)
    return [Emit(ctx.keys.stream("resolve"), candidate) for candidate in found]


def llm_statements(ctx: Context, llm: LLM, task: ExtractTask, rules: list[Candidate]) -> list[Candidate]:
    """The task's statements as the LLM reads them, batch by batch; the rules' when no prompt applies."""
    batches = llm_extract.batches(task)
    if not batches:
        return rules
    with ThreadPoolExecutor(max_workers=min(len(batches), ctx.settings.llm_max_concurrency)) as pool:
        results = list(pool.map(partial(_read_batch, ctx, llm, task, rules), batches))
    said = llm_extract.uncovered(task, rules)
    for candidates, _ in results:
        said += candidates
    from_llm = sum(len(c) for c, ok in results if ok)
    llm.count(task.subject, {"candidates": from_llm})
    return said


def _read_batch(ctx: Context, llm: LLM, task: ExtractTask, rules: list[Candidate],
                batch: Batch) -> tuple[list[Candidate], bool]:
    """One batch's candidates, and whether they are the LLM's (False: the rules stood in)."""
    purpose, started, answer = f"extract:{batch.kind}", time.perf_counter(), None
    try:
        answer = llm.complete(task.subject, purpose, llm_extract.prompt(batch))
        found, dropped = llm_extract.read_reply(task, batch, answer.text)
        llm.count(task.subject, {"dropped_items": dropped})
        if llm_extract.missed(task, batch, found, rules):
            raise Refused("silent", "the model kept nothing of a turn with an explicit signal")
    except (LLMUnavailable, Refused) as exc:
        stand_ins = llm_extract.fill_in(batch, rules)
        ctx.note_llm(purpose, task.subject, started, error=exc, answer=answer, stand_ins=len(stand_ins),
                     session_id=task.session_id)
        return stand_ins, False
    ctx.note_llm(purpose, task.subject, started, answer=answer, items=len(found), session_id=task.session_id)
    return found, True
