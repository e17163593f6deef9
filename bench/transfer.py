"""Export → import of the whole MADial development split into a fresh deployment, and what differs after
(docs/export-format.md). Run once, by hand:

    python -m memflow.bench.transfer [--data ../shared/datasets/madial] [--with-vectors]

Two fresh embedded systems on one Redis (each its own prefix, data dir and collection, one embedder). The
first is written every memory of both languages; then every subject is exported, imported into the second,
and compared: `inspect` (every memory's fields but the store's own `last_op`/`last_count`, and the people),
the `history` of every memory, and one top-10 search per dialogue (ids in order, and scores). Prints one
JSON line: sizes, times, and the counts of what differs (all 0 when the round trip holds).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from memflow.bench.locomo import Progress, own_namespace, wait_until_idle
from memflow.bench.madial import LANGS, Split, load, subject_of, write_all
from memflow.shared.settings import Settings
from memflow.shared.storage.store import MemoryFilter, Optimizable
from memflow.workers.embedded import Embedded, embedded

OWN = {"last_op", "last_count"}
# Scores of vectors encoded again differ in the encoder's last digits (a batch sums in another order).
SCORE_TOLERANCE = 1e-4


def state(system: Embedded, subject: str, splits: Sequence[Split]) -> dict[str, Any]:
    """What the round trip must keep of a subject: inspect, every history, every search of its dialogues."""
    client, now = system.client, max(s.now for s in splits)
    report = client.inspect(subject, now=now)
    memories = [m.model_dump(mode="json", exclude=OWN) for m in report.memories]
    histories = {m.id: client.history(m.id, subject=subject).model_dump(mode="json")
                 for m in system.ctx.store.get(MemoryFilter(subject))}
    queries = [d.query for s in splits for d in s.dialogues if subject_of(s.lang, d.user) == subject]
    searches = [[(h.id, h.score) for h in client.search(subject, q, k=10, now=now).hits] for q in queries]
    return {"inspect": memories, "people": [p.model_dump(mode="json") for p in report.people],
            "history": histories, "search": searches}


def differences(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, int]:
    scores = [(a[1], b[1]) for x, y in zip(ours["search"], theirs["search"], strict=True)
              for a, b in zip(x, y, strict=False)]
    return {"inspect": sum(a != b for a, b in zip(ours["inspect"], theirs["inspect"], strict=False))
            + abs(len(ours["inspect"]) - len(theirs["inspect"])) + (ours["people"] != theirs["people"]),
            "history": sum(ours["history"].get(i) != theirs["history"].get(i)
                           for i in set(ours["history"]) | set(theirs["history"])),
            "search_order": sum([h[0] for h in x] != [h[0] for h in y]
                                for x, y in zip(ours["search"], theirs["search"], strict=True)),
            "search_scores": sum(abs(a - b) > SCORE_TOLERANCE for a, b in scores),
            "max_score_delta_e6": round(max((abs(a - b) for a, b in scores), default=0.0) * 1e6)}


def settled(system: Embedded, optimize: bool) -> None:
    """`optimize`: build the engine's indexes and merge its segments first (what the `index` job does), so that
    both stores are compared in the same shape and not as one was written bit by bit, the other at once."""
    if optimize and isinstance(system.ctx.store, Optimizable):
        system.ctx.store.optimize()


def run(data: Path, settings: Settings, with_vectors: bool, optimize: bool = False) -> dict[str, Any]:
    splits = [load(data, lang) for lang in LANGS]
    progress = Progress(tag="transfer")
    with tempfile.TemporaryDirectory(prefix="memflow-transfer-") as tmp:
        with embedded(settings.replace(**own_namespace(Path(tmp) / "a", "transfer"))) as source:
            for split in splits:
                write_all(source, split)
            wait_until_idle(source, progress)
            settled(source, optimize)
            subjects = sorted({subject_of(s.lang, m.user) for s in splits for m in s.memories})
            before = {s: state(source, s, splits) for s in subjects}
            # The same searches again on the same store: what differs here is the search's own, not the round trip's.
            again = {s: state(source, s, splits) for s in subjects}
            started = time.perf_counter()
            lines = list(source.client.export(subjects, with_vectors=with_vectors))
            export_s = time.perf_counter() - started
            embedder = source.ctx.embedder
        with embedded(settings.replace(**own_namespace(Path(tmp) / "b", "transfer")), embedder=embedder) as target:
            started = time.perf_counter()
            report = target.client.import_(lines)
            import_s = time.perf_counter() - started
            settled(target, optimize)
            after = {s: state(target, s, splits) for s in subjects}
    diff = {s: differences(before[s], after[s]) for s in subjects}
    itself = {s: differences(before[s], again[s]) for s in subjects}
    return {"subjects": len(subjects), "memories": len(lines) - 2, "bytes": sum(map(len, lines)),
            "with_vectors": with_vectors, "optimized": optimize,
            "export_s": round(export_s, 2), "import_s": round(import_s, 2),
            "written": sum(s.written for s in report.subjects),
            "reembedded": sum(s.reembedded for s in report.subjects),
            "dialogues": sum(len(s.dialogues) for s in splits),
            "differ": _added(diff), "source_against_itself": _added(itself)}


def _added(diff: dict[str, dict[str, int]]) -> dict[str, int]:
    return {k: (max if k.startswith("max") else sum)(d[k] for d in diff.values()) for k in next(iter(diff.values()))}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--data", type=Path, default=Path("../shared/datasets/madial"))
    parser.add_argument("--with-vectors", action="store_true")
    parser.add_argument("--optimize", action="store_true", help="Optimize both stores before comparing them.")
    args = parser.parse_args(argv)
    sys.stdout.write(orjson.dumps(run(args.data, Settings(), args.with_vectors, args.optimize)).decode() + "\n")


if __name__ == "__main__":
    main()
