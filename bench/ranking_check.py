"""`python -m memflow.bench.ranking_check`: does a change move the top 10 of any benchmark query? (issue 40)

A refactor of the read path must change no ranking. This check proves it on every query of three sets:
LoCoMo (every question, adversarial included), MADial dev (zh and en) and semantic-dev, each asked as its
own benchmark asks it (bench/locomo.py, bench/madial.py, bench/scenarios.py: the same subject, k and `now`).

- `build STORE`: ingest each set once, as its benchmark does, into STORE and keep it there: a data dir per
  system (its Valkey AOF and its Edge index) and `manifest.json` (what was built, from what, at which commit).
- `record STORE --out FILE`: copy the kept stores aside, start the system on each copy and ask every query;
  write each query's top 10, hit by hit, as an identity (content, type, key, status, whom it is about, the
  events it came from), with its scores and ids beside it.
- `compare A B`: how many queries differ per set, the first few differences; exit code 1 if any differs.

Why a kept store: ingestion runs through asynchronous stages, so what two ingests of the same data store
may differ (which turns share an extraction batch, what the lifecycle jobs find), and a comparison of two
fresh runs would blame the read path for that. Recording against one kept store asks both versions of the
code of the very same memories. `record --fresh` builds a throw-away store first: it also sees changes of
the write path, but two fresh runs of the same code need not agree (see docs/ranking.md, "Checking that a
refactor changes no ranking", for what was measured).

Settings come from the environment as for `memflow bench`, but every system here is the check's own: its
own Valkey in its data dir, the embedded Edge index, no LLM (a model's answers are not reproducible), and
a search timeout long enough that a busy machine never turns a search into a `failed` one.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from memflow.bench import locomo, madial, scenarios
from memflow.bench.locomo import Progress
from memflow.pipeline.models import Hit, SearchResult
from memflow.shared.inference.embedder import Embedder, build_embedder
from memflow.shared.redisdb.connections import RUNNING_FILE
from memflow.shared.redisdb.server import start_redis
from memflow.shared.settings import Settings, get_settings
from memflow.workers.embedded import embedded

FORMAT = 1
TOP = 10
SETS = ("locomo", "madial", "semantic-dev")
MANIFEST = "manifest.json"
SEARCH_TIMEOUT_S = 120.0  # a search slowed by a busy machine is still a ranking, never a `failed`
SHOWN = 5  # differences printed per set
# Two scores closer than this are a tie: the order of the tied hits is the engine's, not the ranking's.
TIE = 1e-9

Identity = dict[str, Any]
Asked = Iterator[tuple[str, str, SearchResult]]  # (query key, query text, what the search returned)


# -- what a hit is ---------------------------------------------------------------------------


def identity(hit: Hit) -> Identity:
    """What makes a hit the same hit in another run: never its id (two stores name a memory differently)
    nor its score (recorded beside it; a compare reports a moved score apart from a moved rank)."""
    return {"content": hit.content, "mtype": hit.mtype.value, "key": hit.key, "status": hit.status.value,
            "about": hit.about, "contested": hit.contested, "sources": sorted(hit.source_event_ids),
            "pending": hit.pending}


def entry(text: str, result: SearchResult, top: int) -> dict[str, Any]:
    """One query's record: its top `top` hits, their scores and ids, and the ties among them."""
    hits = result.hits
    return {"query": text, "status": result.status, "hits": [identity(h) for h in hits[:top]],
            "scores": [h.score for h in hits[:top]], "ids": [h.id for h in hits[:top]],
            "ties": ties(hits[:top + 1])}


def ties(hits: Sequence[Hit]) -> list[int]:
    """Ranks (from 1) whose hit scores the same as the next one: their order is not decided by the score."""
    return [i for i in range(1, len(hits)) if abs(hits[i - 1].score - hits[i].score) <= TIE]


# -- the kept store ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sources:
    locomo: Path
    madial: Path
    semantic: Path
    conversations: int | None = None  # LoCoMo's first N (None: all ten)
    sets: tuple[str, ...] = SETS

    def as_json(self) -> dict[str, Any]:
        return {"locomo": str(self.locomo.resolve()), "madial": str(self.madial.resolve()),
                "semantic": str(self.semantic.resolve()), "conversations": self.conversations,
                "sets": list(self.sets)}

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Sources:
        return cls(Path(raw["locomo"]), Path(raw["madial"]), Path(raw["semantic"]), raw["conversations"],
                   tuple(raw["sets"]))


def own(base: Settings, data_dir: Path, name: str, redis_url: str | None = None) -> Settings:
    """A system of the check's own, named alike in every build and record (see the module's docstring)."""
    return base.replace(data_dir=data_dir, stream_prefix=f"rc-{name}:", collection=f"rc_{name}".replace("-", "_"),
                        redis_url=redis_url, qdrant_url=None, llm_base_url=None, search_timeout_s=SEARCH_TIMEOUT_S)


@contextlib.contextmanager
def valkey_in(data_dir: Path, settings: Settings) -> Iterator[str]:
    """A server on `data_dir`'s AOF (semantic-dev's systems share one, as `memflow eval`'s do)."""
    server = start_redis(data_dir / "redis", binary=settings.redis.server)
    try:
        yield server.url
    finally:
        server.stop()


def code_version() -> str:
    """The commit of the memflow being run (with "+dirty" when its tree has changes), or "unknown"."""
    import memflow

    where = Path(memflow.__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def build(root: Path, sources: Sources, base: Settings, embedder: Embedder, *, light_in_process: bool = False,
          progress: Progress | None = None) -> dict[str, Any]:
    """Ingest each set into `root` as its benchmark does, and write the manifest; returns it."""
    progress = progress or Progress(tag="rankcheck")
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} is not empty: a kept store is built once, into a new directory")
    root.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {"format": FORMAT, "built_by": code_version(), "built_at": _now(),
                                "sources": sources.as_json(), "seconds": {}}
    builders: dict[str, Callable[[], dict[str, Any]]] = {
        "locomo": lambda: build_locomo(root, sources, base, embedder, light_in_process, progress),
        "madial": lambda: build_madial(root, sources, base, embedder, light_in_process, progress),
        "semantic-dev": lambda: build_semantic(root, sources, base, embedder, progress)}
    for name in sources.sets:
        started = time.perf_counter()
        manifest[name] = builders[name]()
        manifest["seconds"][name] = round(time.perf_counter() - started, 1)
        progress.note(f"built {name} in {manifest['seconds'][name]:.0f} s", force=True)
    (root / MANIFEST).write_bytes(orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
    return manifest


def build_locomo(root: Path, sources: Sources, base: Settings, embedder: Embedder, light_in_process: bool,
                 progress: Progress) -> dict[str, Any]:
    """`memflow bench locomo`'s ingest: every event, then the lifecycle jobs as of the questions."""
    convs = locomo.load(sources.locomo, sources.conversations)
    with embedded(own(base, root / "locomo", "locomo"), light_in_process=light_in_process,
                  embedder=embedder) as system:
        figures = locomo.ingest(system, convs, progress)
    return {"conversations": [c.sample_id for c in convs], "ingest": figures}


def build_madial(root: Path, sources: Sources, base: Settings, embedder: Embedder, light_in_process: bool,
                 progress: Progress) -> dict[str, Any]:
    """`memflow bench madial`'s writes, a system per language (its second, replayed pass is left out: the
    benchmark searches before it)."""
    out = {}
    for lang in madial.LANGS:
        split = madial.load(sources.madial, lang)
        with embedded(own(base, root / f"madial-{lang}", f"madial-{lang}"), light_in_process=light_in_process,
                      embedder=embedder) as system:
            madial.write_all(system, split)
            locomo.wait_until_idle(system, progress)
            out[lang] = {"memories": len(split.memories), "stored": madial.stored(system, split)}
    return out


def build_semantic(root: Path, sources: Sources, base: Settings, embedder: Embedder,
                   progress: Progress) -> dict[str, Any]:
    """`memflow eval`'s replay of every runnable scenario but its queries (all of them its last steps), each
    in a namespace of its own on one server."""
    data_dir, kept, skipped = root / "semantic-dev", [], {}
    with valkey_in(data_dir, base) as url:
        for n, item in enumerate(scenarios.load(sources.semantic)):
            problems = scenarios.preflight(item)
            if problems or item.scenario is None:
                skipped[item.id] = "; ".join(problems)
                continue
            settings = own(base, data_dir, f"sd-{n}", url).replace(block_ms=scenarios.EVAL_BLOCK_MS)
            with embedded(settings, light_in_process=True, embedder=embedder) as system:
                scenarios.Replay(item.scenario, system).prepare()
            kept.append(item.id)
            progress.note(f"semantic-dev: {len(kept)} scenarios built")
    return {"scenarios": kept, "not_runnable": skipped}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# -- asking every query of a kept store --------------------------------------------------------------


@contextlib.contextmanager
def copy_of(data_dir: Path) -> Iterator[Path]:
    """A throw-away copy of a kept data dir: a record must leave the store as it found it (starting a system
    writes to its Valkey and its index), so that every record asks the same memories."""
    with tempfile.TemporaryDirectory(prefix="memflow-rankcheck-") as tmp:
        target = Path(tmp) / data_dir.name
        subprocess.run(["cp", "-a", "--sparse=always", str(data_dir), str(target)], check=True)
        (target / RUNNING_FILE).unlink(missing_ok=True)  # a build stopped by a kill leaves its record
        yield target


def ask_locomo(root: Path, sources: Sources, base: Settings, embedder: Embedder, progress: Progress) -> Asked:
    convs = locomo.load(sources.locomo, sources.conversations)
    with copy_of(root / "locomo") as data_dir, \
            embedded(own(base, data_dir, "locomo"), light_in_process=True, embedder=embedder) as system:
        for conv in convs:
            for n, q in enumerate(conv.questions):
                yield f"{conv.sample_id}/{n}", q.text, locomo.search(system, conv, q)
            progress.note(f"locomo: {conv.sample_id} asked")


def ask_madial(root: Path, sources: Sources, base: Settings, embedder: Embedder, progress: Progress) -> Asked:
    for lang in madial.LANGS:
        split = madial.load(sources.madial, lang)
        with copy_of(root / f"madial-{lang}") as data_dir, \
                embedded(own(base, data_dir, f"madial-{lang}"), light_in_process=True, embedder=embedder) as system:
            for d in split.dialogues:
                yield f"{lang}/{d.id}", d.query, madial.search(system, split, d)
        progress.note(f"madial: {lang} asked")


def ask_semantic(root: Path, sources: Sources, base: Settings, embedder: Embedder, progress: Progress) -> Asked:
    built = set(read_manifest(root)["semantic-dev"]["scenarios"])
    with copy_of(root / "semantic-dev") as data_dir, valkey_in(data_dir, base) as url:
        for n, item in enumerate(scenarios.load(sources.semantic)):
            if item.scenario is None or item.id not in built:
                continue
            settings = own(base, data_dir, f"sd-{n}", url).replace(block_ms=scenarios.EVAL_BLOCK_MS)
            with embedded(settings, light_in_process=True, embedder=embedder) as system:
                replay = scenarios.Replay(item.scenario, system)
                for i, step in enumerate(item.scenario.steps):
                    if step.query is not None:
                        yield f"{item.id}/{i}", step.query.text, replay.search(step)
        progress.note("semantic-dev: asked")


ASKERS: dict[str, Callable[[Path, Sources, Settings, Embedder, Progress], Asked]] = {
    "locomo": ask_locomo, "madial": ask_madial, "semantic-dev": ask_semantic}


def read_manifest(root: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = orjson.loads((root / MANIFEST).read_bytes())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{root / MANIFEST}: format {manifest.get('format')!r}, this check reads {FORMAT}")
    return manifest


def record(root: Path, base: Settings, embedder: Embedder, *, top: int = TOP,
           progress: Progress | None = None) -> dict[str, Any]:
    """Every query of every set the store was built with, asked of a copy of it: the record `compare` reads."""
    progress = progress or Progress(tag="rankcheck")
    manifest = read_manifest(root)
    sources = Sources.of(manifest["sources"])
    out: dict[str, Any] = {"format": FORMAT, "top": top, "recorded_by": code_version(), "recorded_at": _now(),
                           "store": {"path": str(root.resolve()), "built_by": manifest["built_by"],
                                     "built_at": manifest["built_at"], "sources": manifest["sources"]},
                           "seconds": {}, "sets": {}}
    for name in sources.sets:
        started = time.perf_counter()
        out["sets"][name] = {key: entry(text, result, top)
                             for key, text, result in ASKERS[name](root, sources, base, embedder, progress)}
        out["seconds"][name] = round(time.perf_counter() - started, 1)
        progress.note(f"recorded {name}: {len(out['sets'][name])} queries in {out['seconds'][name]:.0f} s", force=True)
    return out


def summary(recorded: Mapping[str, Any]) -> str:
    """One line per set: queries, failed searches, and queries with a tie among their top hits."""
    lines = []
    for name, queries in recorded["sets"].items():
        failed = sum(q["status"] == "failed" for q in queries.values())
        tied = [key for key, q in queries.items() if q["ties"]]
        lines.append(f"{name}: {len(queries)} queries, {failed} failed searches, {len(tied)} with tied scores "
                     f"in their top {recorded['top']} (+1)" + (f", e.g. {', '.join(tied[:3])}" if tied else ""))
    return "\n".join(lines)


# -- comparing two records -------------------------------------------------------------------------


@dataclass
class SetDiff:
    """How one set's queries compare: those whose top hits differ, those only one record has, moved scores."""

    name: str
    queries: int
    differ: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    scores_moved: list[str] = field(default_factory=list)

    @property
    def same(self) -> bool:
        return not self.differ and not self.missing


def diff_set(name: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> SetDiff:
    out = SetDiff(name, len(set(a) | set(b)))
    out.missing = sorted(set(a) ^ set(b))
    for key in sorted(set(a) & set(b)):
        qa, qb = a[key], b[key]
        if (qa["status"], qa["hits"]) != (qb["status"], qb["hits"]):
            out.differ.append(key)
        elif any(abs(x - y) > TIE for x, y in zip(qa["scores"], qb["scores"], strict=True)):
            out.scores_moved.append(key)
    return out


def first_difference(qa: Mapping[str, Any], qb: Mapping[str, Any]) -> str:
    """Where two records of one query part: the status, or the first rank whose hit differs."""
    if qa["status"] != qb["status"]:
        return f"status {qa['status']} → {qb['status']}"
    for rank in range(1, max(len(qa["hits"]), len(qb["hits"])) + 1):
        ha, hb = (q["hits"][rank - 1] if rank <= len(q["hits"]) else None for q in (qa, qb))
        if ha != hb:
            return f"rank {rank}: {_brief(ha)} → {_brief(hb)}"
    return "the same"


def _brief(hit: Identity | None) -> str:
    if hit is None:
        return "(none)"
    content = hit["content"] if len(hit["content"]) <= 70 else hit["content"][:67] + "..."
    return f"[{hit['mtype']} {','.join(hit['sources'][:3])}] {content!r}"


def compare(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[list[SetDiff], str]:
    """Each set's diff, and the report to print."""
    lines = [f"A: recorded by {a.get('recorded_by')} at {a.get('recorded_at')} (store {a['store']['path']})",
             f"B: recorded by {b.get('recorded_by')} at {b.get('recorded_at')} (store {b['store']['path']})"]
    if a["top"] != b["top"] or a["store"]["sources"] != b["store"]["sources"]:
        lines.append("WARNING: the records differ in top k or in the data they were built from")
    diffs = []
    for name in sorted(set(a["sets"]) | set(b["sets"])):
        sa, sb = a["sets"].get(name, {}), b["sets"].get(name, {})
        d = diff_set(name, sa, sb)
        diffs.append(d)
        lines.append(f"{name}: {d.queries} queries, {len(d.differ)} differ in their top {a['top']}, "
                     f"{len(d.missing)} in one record only, {len(d.scores_moved)} same hits with moved scores")
        lines += [f"  {key} {sa[key]['query'][:60]!r}: {first_difference(sa[key], sb[key])}"
                  for key in d.differ[:SHOWN]]
        lines += [f"  {key}: only in {'A' if key in sa else 'B'}" for key in d.missing[:SHOWN]]
    same = all(d.same for d in diffs)
    lines.append("IDENTICAL: every query's top hits are the same" if same else "DIFFERENT")
    return diffs, "\n".join(lines)


def load_record(path: Path) -> dict[str, Any]:
    recorded: dict[str, Any] = orjson.loads(path.read_bytes())
    if recorded.get("format") != FORMAT:
        raise ValueError(f"{path}: format {recorded.get('format')!r}, this check reads {FORMAT}")
    return recorded


# -- the command -------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m memflow.bench.ranking_check", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="Ingest every set once into STORE (a new directory) and keep it.")
    b.add_argument("store", type=Path)
    _source_options(b)
    r = sub.add_parser("record", help="Ask every query of a kept STORE (or of a fresh one) and write the top hits.")
    r.add_argument("store", type=Path, nargs="?", help="A kept store (`build`); omit it with --fresh.")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--fresh", action="store_true", help="Build a throw-away store first (sees write-path changes "
                   "too, but two fresh builds need not agree).")
    r.add_argument("--top", type=int, default=TOP)
    _source_options(r)
    c = sub.add_parser("compare", help="Compare two records; exit code 1 if any query's top hits differ.")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    return p


def _source_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--locomo", type=Path, default=Path("../shared/datasets/locomo10.json"))
    p.add_argument("--madial", type=Path, default=Path("../shared/datasets/madial"))
    p.add_argument("--semantic", type=Path, default=Path("../shared/eval/semantic-dev.jsonl"))
    p.add_argument("--conversations", type=int, default=None, help="LoCoMo's first N conversations only.")
    p.add_argument("--sets", default=",".join(SETS), help=f"A comma-separated subset of {', '.join(SETS)}.")
    p.add_argument("--light-in-process", action="store_true", help="Build with every stage in this process.")


def sources_of(args: argparse.Namespace) -> Sources:
    sets = tuple(s for s in SETS if s in args.sets.split(","))
    unknown = set(args.sets.split(",")) - set(SETS)
    if unknown or not sets:
        raise ValueError(f"--sets: {', '.join(sorted(unknown)) or 'none'}: not among {', '.join(SETS)}")
    return Sources(args.locomo, args.madial, args.semantic, args.conversations, sets)


def run(args: argparse.Namespace, settings: Settings, embedder: Embedder | None = None) -> int:
    """Exit code 0 (built, recorded, or identical), 1 (a compare found differences), 2 (bad input)."""
    if args.command == "compare":
        diffs, text = compare(load_record(args.a), load_record(args.b))
        sys.stdout.write(text + "\n")
        return 0 if all(d.same for d in diffs) else 1
    embedder = embedder or warm(build_embedder(settings))
    if args.command == "build":
        build(args.store, sources_of(args), settings, embedder, light_in_process=args.light_in_process)
        return 0
    with contextlib.ExitStack() as stack:
        root = args.store
        if args.fresh:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="memflow-rankcheck-fresh-")))
            build(root / "store", sources_of(args), settings, embedder, light_in_process=args.light_in_process)
            root = root / "store"
        elif root is None:
            raise ValueError("record: name a kept STORE, or say --fresh")
        recorded = record(root, settings, embedder, top=args.top)
    if args.fresh:
        recorded["store"]["path"] = "(fresh)"
    args.out.write_bytes(orjson.dumps(recorded, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    sys.stdout.write(summary(recorded) + "\n")
    return 0


def warm(embedder: Embedder) -> Embedder:
    """The model's first calls pay one-time costs (as `memflow eval` does, before any search)."""
    embedder.encode_queries(["warm-up"])
    return embedder


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level="WARNING", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return run(args, get_settings())
    except (OSError, ValueError, KeyError, FileExistsError) as exc:
        sys.stderr.write(f"ranking_check: {type(exc).__name__}: {exc}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
