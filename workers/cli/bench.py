"""`memflow eval` and `memflow bench`: the instruments live in bench/ (they may use everything); these commands
only hand them the flags, importing each when it runs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from memflow.workers.cli.common import JsonFlag, load_settings

if TYPE_CHECKING:
    from memflow.bench.diskload import Bound

bench_app = typer.Typer(help="Benchmarks: LoCoMo and MADial-Bench retrieval, performance.", no_args_is_help=True)

# The disk writer's bound (bench/diskload.py `Bound`), one set of options for every bench with a disk-load mode;
# unset, the writer's own default.
WriterRate = Annotated[float | None, typer.Option(
    "--disk-load-mb-per-s", help="The disk writer's rate cap in MB/s (0: uncapped; default: bench/diskload.py's).")]
WriterFileMb = Annotated[float | None, typer.Option(
    "--disk-load-file-mb", help="The size of each file the disk writer rewrites, in MB (it rotates through 2).")]
WriterMaxMb = Annotated[float | None, typer.Option(
    "--disk-load-max-mb", help="The most the disk writer writes in one phase under load, in MB.")]


def writer_bound(mb_per_s: float | None, file_mb: float | None, max_mb: float | None) -> Bound:
    """The writer's bound: the options given, the writer's defaults for the rest."""
    from dataclasses import replace

    from memflow.bench.diskload import Bound

    base = Bound()
    return replace(base, mb_per_s=base.mb_per_s if mb_per_s is None else mb_per_s,
                   file_mb=base.file_mb if file_mb is None else file_mb,
                   max_mb=base.max_mb if max_mb is None else max_mb)



def eval_scenarios(path: Path, as_json: JsonFlag = False,
                   ablation: Annotated[bool, typer.Option(help="Run the ablation ladder.")] = False) -> None:
    """Replay behaviour scenarios (JSON Lines) against a fresh namespace and score them."""
    from memflow.bench.scenarios import run_cli

    raise typer.Exit(run_cli(path, as_json=as_json, ablation=ablation, settings=load_settings("WARNING")))


@bench_app.command("locomo")
def bench_locomo(data: Annotated[Path, typer.Option(help="locomo10.json")] = Path("../shared/datasets/locomo10.json"),
                 conversations: Annotated[int | None, typer.Option(help="Only the first N.")] = None,
                 as_json: JsonFlag = False,
                 ablation: Annotated[bool, typer.Option(help="Run the ablation ladder.")] = False,
                 variants: Annotated[Path | None, typer.Option(
                     help="JSON {name: {setting: value}}: memflow once per variant (sharing ingests)."
                 )] = None,
                 jobs: Annotated[bool, typer.Option(
                     help="Run decay, consolidate and review as of each conversation's questions.")] = True,
                 llm_stub: Annotated[bool, typer.Option(
                     help="Run the LLM path against the scripted server (bench/llm_echo.py) and report its cost.")]
                 = False) -> None:
    """LoCoMo evidence recall@k for memflow and two baselines, side by side."""
    from memflow.bench.locomo import run_cli

    raise typer.Exit(run_cli(data, conversations=conversations, as_json=as_json, ablation=ablation,
                             settings=load_settings("WARNING"), variants=variants, jobs=jobs, llm_stub=llm_stub))


def _madial_langs(value: str) -> str:
    if value not in ("zh", "en", "both"):
        raise typer.BadParameter(f"{value!r} is not one of zh, en, both")
    return value


@bench_app.command("madial")
def bench_madial(data: Annotated[Path, typer.Option(help="The folder of the MADial-Bench JSON Lines files.")]
                 = Path("../shared/datasets/madial"),
                 lang: Annotated[str, typer.Option(help="zh, en or both.", callback=_madial_langs)] = "both",
                 as_json: JsonFlag = False) -> None:
    """MADial-Bench memory retrieval (R@1/3/5/10, MRR@10) for memflow, BM25 and dense, side by side."""
    from memflow.bench.madial import LANGS, run_cli

    langs = LANGS if lang == "both" else (lang,)
    raise typer.Exit(run_cli(data, langs=langs, as_json=as_json, settings=load_settings("WARNING")))


@bench_app.command("load")
def bench_load(events: int = 10_000, publishers: int = 8, as_json: JsonFlag = False,
               cluster: Annotated[bool, typer.Option(
                   "--cluster", help="On a local 3-master Valkey cluster (writes held by a replica), two consumers "
                   "per stage.")] = False) -> None:
    """A burst from concurrent publishers: accepted and sustained rates, peak lag, drain time, RSS, losses."""
    from memflow.bench.load import run_cli

    raise typer.Exit(run_cli(events=events, publishers=publishers, as_json=as_json, settings=load_settings("WARNING"),
                             cluster=cluster))


@bench_app.command("http")
def bench_http(size: int = 10_000, queries: int = 300, clients: int = 8, requests: int = 4000, batch: int = 50,
               flood: Annotated[int, typer.Option(help="Key A's parallel clients in the two-tenant figure.")] = 8,
               probes: Annotated[int, typer.Option(help="Key B's searches per phase (idle, flood, A's export, "
                                                               "import and refused-import loops).")] = 60,
               tenants_only: Annotated[bool, typer.Option(
                   "--tenants-only", help="Only the two-tenant figures (A's flood, export and import loops).")] = False,
               as_json: JsonFlag = False) -> None:
    """The HTTP API: key B's search p50/p99 while key A floods, exports or imports in a loop, against idle; search over
    HTTP vs MemoryClient vs in-process vs the store alone; write requests/s."""
    from memflow.bench.api import run_cli

    raise typer.Exit(run_cli(size=size, queries=queries, clients=clients, requests=requests, batch=batch,
                             as_json=as_json, settings=load_settings("WARNING"), flood=flood, probes=probes,
                             only_tenants=tenants_only))


@bench_app.command("poisoning")
def bench_poisoning(corpus: Annotated[Path, typer.Option(help="The folder of poisoning.jsonl and preferences.jsonl.")]
                    = Path("tests/corpus"), as_json: JsonFlag = False,
                    verbose: Annotated[bool, typer.Option(help="Each text's outcome, on stderr.")] = False) -> None:
    """Planted orders against genuine wishes: how many the gate refuses, stores, and `pack` renders as rules."""
    from memflow.bench.poisoning import run_cli

    raise typer.Exit(run_cli(corpus, as_json=as_json, verbose=verbose))


@bench_app.command("perf")
def bench_perf(events: int = 5000, queries: int = 500, probes: int = 50, publishes: int = 2000,
               sizes: Annotated[str, typer.Option(help="Store sizes for the search figures.")] = "10000,100000",
               disk_load: Annotated[bool, typer.Option(
                   "--disk-load/--no-disk-load", help="Also search and publish at the largest size idle, then while "
                   "another process writes and fsyncs files beside the data (bench/diskload.py), in the same run.")]
               = False,
               disk_load_mb_per_s: WriterRate = None, disk_load_file_mb: WriterFileMb = None,
               disk_load_max_mb: WriterMaxMb = None, as_json: JsonFlag = False) -> None:
    """Ingest, search, publish and publish→searchable, each next to its physical limit."""
    from memflow.bench.perf import run_cli

    raise typer.Exit(run_cli(events=events, queries=queries, probes=probes, publishes=publishes,
                             sizes=[int(s) for s in sizes.split(",") if s], as_json=as_json,
                             settings=load_settings("WARNING"), with_disk_load=disk_load,
                             bound=writer_bound(disk_load_mb_per_s, disk_load_file_mb, disk_load_max_mb)))


@bench_app.command("jobs")
def bench_jobs(size: Annotated[int, typer.Option(help="Memories in the store (random vectors).")] = 100_000,
               rate: Annotated[float, typer.Option(help="Searches per second, steady.")] = 5.0,
               idle_seconds: Annotated[float, typer.Option(
                   help="How long searches are measured idle (80 s: as many as the index job at 100k meets).")] = 80.0,
               jobs: Annotated[str, typer.Option(help="The jobs run, one after the other (index, consolidate, "
                                                      "decay, review, retag).")] = "index,consolidate",
               disk_load: Annotated[bool, typer.Option(
                   "--disk-load/--no-disk-load", help="Also search idle and during each job while another process "
                   "writes and fsyncs files beside the data (bench/diskload.py), and publish idle and under it next to "
                   "a bare durable XADD, in the same run.")] = False,
               disk_load_mb_per_s: WriterRate = None, disk_load_file_mb: WriterFileMb = None,
               disk_load_max_mb: WriterMaxMb = None,
               publishes: Annotated[int, typer.Option(help="Publishes per publish figure (with --disk-load).")] = 1000,
               as_json: JsonFlag = False) -> None:
    """Search p99 while the index and consolidate jobs run, next to idle; failed searches, partitions lost; with
    --disk-load, the same under a disk writer, and publish next to a bare durable XADD."""
    from memflow.bench.jobs import run_cli

    bound = writer_bound(disk_load_mb_per_s, disk_load_file_mb, disk_load_max_mb) if disk_load else None
    raise typer.Exit(run_cli(size=size, rate=rate, idle_s=idle_seconds, as_json=as_json,
                             jobs=[j for j in jobs.split(",") if j], settings=load_settings("WARNING"), load=bound,
                             publishes=publishes))


@bench_app.command("publish")
def bench_publish(n: Annotated[int, typer.Option(help="Publishes one at a time, per variant (at most).")] = 1000,
                  threads: Annotated[int, typer.Option(help="Publishers at once, for the rates.")] = 8,
                  batch: Annotated[int, typer.Option(help="Events per publish_many.")] = 100,
                  seconds: Annotated[float, typer.Option(help="Time spent on each figure, at most.")] = 5.0,
                  variants: Annotated[str, typer.Option(help="Any of everysec, always, always+waitaof, "
                                                        "everysec+waitaof, everysec+waitaof+hz100, "
                                                        "everysec+waitaof+hz500.")] = (
                      "everysec,always,always+waitaof,everysec+waitaof,everysec+waitaof+hz100,everysec+waitaof+hz500"),
                  as_json: JsonFlag = False) -> None:
    """Publish latency and throughput with an fsynced acknowledgement (appendfsync, WAITAOF), next to bare XADD."""
    from memflow.bench.publish import run_cli

    raise typer.Exit(run_cli(n=n, threads=threads, batch=batch, budget_s=seconds,
                             variants=[v for v in variants.split(",") if v], as_json=as_json,
                             settings=load_settings("WARNING")))


@bench_app.command("pending")
def bench_pending(sizes: Annotated[str, typer.Option(help="Memories in each searched subject.")] = "10000,100000",
                  queries: int = 200, burst: int = 2000, as_json: JsonFlag = False) -> None:
    """Search with and without pending entries (read-your-writes), idle and under a burst, next to the limit."""
    from memflow.bench.pending import run_cli

    raise typer.Exit(run_cli(sizes=[int(s) for s in sizes.split(",") if s], queries=queries, burst=burst,
                             as_json=as_json, settings=load_settings("WARNING")))


@bench_app.command("profile")
def bench_profile(size: Annotated[int, typer.Option(help="Memories in the subject (a realistic mix).")] = 10_000,
                  reads: Annotated[int, typer.Option(help="Reads of each kind.")] = 300,
                  writes: Annotated[int, typer.Option(help="Writes, each followed by the rebuilding read.")] = 20,
                  as_json: JsonFlag = False) -> None:
    """Reading a subject's profile: kept, in process and over HTTP, next to one Redis GET; the rebuild after a
    write."""
    from memflow.bench.profile import run_cli

    raise typer.Exit(run_cli(size=size, reads=reads, writes=writes, as_json=as_json, settings=load_settings("WARNING")))
