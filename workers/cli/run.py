"""The commands that run memflow: `up` (everything on this machine), `serve` (the HTTP API, /mcp, the inspector),
`mcp` (stdio), `worker` and `query-worker` (stages), `scheduler` (the maintenance schedule)."""

from __future__ import annotations

import os
import signal
import socket
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import BaseScheduler
from apscheduler.schedulers.blocking import BlockingScheduler

from memflow.scheduler.app import build_scheduler, next_fire_times
from memflow.shared.errors import MemflowError
from memflow.shared.redisdb.connections import queue_url, require_url
from memflow.shared.redisdb.keys import STAGES
from memflow.shared.settings import Settings, get_settings, to_env
from memflow.workers.cli.common import fail, load_settings
from memflow.workers.process import QUERY, own_redis, run_stages, say_durability
from memflow.workers.system import Part


def worker(stages: Annotated[list[str], typer.Argument(help=f"Any of {', '.join(STAGES)}, {QUERY}.")]) -> None:
    """Run stages in this process until SIGTERM/SIGINT."""
    unknown = set(stages) - set(STAGES) - {QUERY}
    if unknown:
        raise typer.BadParameter(f"unknown stage(s): {', '.join(sorted(unknown))}")
    run_stages(load_settings(), stages)


def query_worker() -> None:
    """Run the RQ query worker (search, pack, forget, inspect, feedback)."""
    run_stages(load_settings(), [QUERY])


def up(serve: Annotated[bool, typer.Option("--serve", help="Also serve the HTTP API, /mcp and the inspector "
                                           "(as `memflow serve`, on MEMFLOW_HTTP_HOST:MEMFLOW_HTTP_PORT).")] = False,
       no_auth: Annotated[bool, typer.Option("--no-auth", help="With --serve: no API keys (local use only).")] = False,
       ) -> None:
    """Run the whole system on this machine: Redis (started if MEMFLOW_REDIS_URL is unset), every stage,
    the query worker, the scheduler (and with --serve the HTTP server). The stages that hold the store share
    this process (an Edge shard has one owner); the scheduler and the HTTP server run in threads of it."""
    if no_auth and serve:
        _warn_no_auth(get_settings().http.host)
    with own_redis(load_settings()) as settings:
        jobs = _build_scheduler(settings, BackgroundScheduler)
        typer.echo(f"memflow up: redis {settings.redis.url}, prefix {settings.redis.stream_prefix}, "
                   f"store {settings.store.qdrant_url or settings.store.data_dir}"
                   + (f", http://{settings.http.host}:{settings.http.port}" if serve else ""))
        _print_schedule(settings, jobs)
        try:
            jobs.start()
            # trigger and extract in child processes of their own, supervised like the threads.
            run_stages(settings, ["resolve", "upsert", QUERY], children=[("trigger",), ("extract",)],
                       also=[_http_part(settings, auth=not no_auth)] if serve else [])
        finally:
            if jobs.running:
                jobs.shutdown()


def serve(host: Annotated[str | None, typer.Option(help="Default MEMFLOW_HTTP_HOST (127.0.0.1).")] = None,
          port: Annotated[int | None, typer.Option(min=1, max=65535, help="Default MEMFLOW_HTTP_PORT (8765).")]
          = None,
          workers: Annotated[int, typer.Option(min=1, help="Server processes sharing the port: one uses one "
                                               "core (see `memflow bench http`).")] = 1,
          no_auth: Annotated[bool, typer.Option("--no-auth", help="Serve every subject to anyone who can "
                                                "connect. For local use only.")] = False) -> None:
    """The HTTP API, the MCP endpoint (/mcp) and the inspector page (/), over the running system."""
    import uvicorn

    from memflow.workers.api import AUTH_VARIABLE, create_app
    settings = load_settings()
    host, port = host or settings.http.host, settings.http.port if port is None else port
    settings = settings.replace(http_host=host)  # the names it answers to include the address it is bound to
    _refuse_taken(host, port)
    if no_auth:
        _warn_no_auth(host)
    typer.echo(f"memflow serve: http://{host}:{port} (OpenAPI at /openapi.json), redis {require_url(settings)}"
               + (f", {workers} processes" if workers > 1 else ""))
    say_durability(settings)
    common: dict[str, Any] = {"host": host, "port": port, "access_log": False, "log_level": settings.log_level.lower()}
    if workers == 1:
        uvicorn.run(create_app(settings, auth=not no_auth), **common)
        return
    # Each process builds its own app from the environment: the settings resolved here, and the auth switch.
    os.environ.update({**to_env(settings.replace(redis_url=require_url(settings), redis_queue_url=queue_url(settings))),
                       AUTH_VARIABLE: "off" if no_auth else "on"})
    uvicorn.run("memflow.workers.api:app_from_environment", factory=True, workers=workers, **common)


def _refuse_taken(host: str, port: int) -> None:
    """A port another server holds, said in one line (exit 1) before the app starts: uvicorn would log its startup,
    "[Errno 98] … address already in use", its shutdown, and exit 3, a code `memflow --help` does not know. The
    probe binds as uvicorn does (SO_REUSEADDR), so a port in TIME_WAIT is not taken for a held one."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc} (is --host or MEMFLOW_HTTP_HOST right?)")
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            fail(f"cannot listen on {host}:{port}: {(exc.strerror or str(exc)).lower()} (another `memflow serve` or "
                 "`memflow up --serve`? another port: --port or MEMFLOW_HTTP_PORT)")


def _http_part(settings: Settings, *, auth: bool) -> Part:
    from memflow.workers.api import http_part  # FastAPI is loaded by the commands that serve only
    return http_part(settings, auth=auth)


def mcp_stdio(subject: Annotated[str | None, typer.Option(envvar="MEMFLOW_MCP_SUBJECT", help=(
        "The subject the client speaks for; default: the one subject of the MEMFLOW_API_KEY key."))] = None) -> None:
    """The MCP server over stdio, for desktop clients (Claude Desktop, Cursor), over the running system."""
    from memflow.workers.mcp import run_stdio

    run_stdio(load_settings(), subject)  # stdout is the protocol's: nothing else is printed there


def _warn_no_auth(host: str) -> None:
    exposed = host not in ("127.0.0.1", "localhost", "::1")
    typer.secho("\n".join([
        "!" * 78,
        "!! --no-auth: NO API KEYS. Anyone who can connect reads, writes and forgets EVERY subject.",
        f"!! Listening on {host}" + (": THIS ADDRESS IS REACHABLE FROM OTHER MACHINES." if exposed else
                                     " (this machine only). Use keys for anything else."),
        "!" * 78]), err=True, fg=typer.colors.RED, bold=True)


def run_scheduler() -> None:
    """Run the maintenance schedule (decay, consolidate, review) until SIGTERM/SIGINT. It only enqueues
    jobs on the jobs queue; a query worker runs them."""
    settings = load_settings()
    jobs = _build_scheduler(settings, BlockingScheduler)
    # SIGTERM stops it the way Ctrl-C does: the exception leaves the scheduler's loop (releasing its
    # locks on the way), and the shutdown below runs outside it.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _interrupt)
    try:
        _print_schedule(settings, jobs)
        jobs.start()
    except KeyboardInterrupt:
        pass
    finally:
        if jobs.running:
            jobs.shutdown()
    typer.echo("memflow scheduler: stopped")


def _build_scheduler(settings: Settings, kind: type[BaseScheduler]) -> BaseScheduler:
    try:
        return build_scheduler(settings, kind)
    except MemflowError as exc:
        raise typer.BadParameter(str(exc)) from exc


def _print_schedule(settings: Settings, jobs: BaseScheduler) -> None:
    typer.echo(f"scheduler: timezone {settings.scheduler.timezone}, enqueues on "
               f"{settings.keys.jobs_queue}")
    for job_id, trigger, next_time in next_fire_times(jobs, datetime.now(UTC)):
        typer.echo(f"  {job_id:<17} {trigger:<30} next {next_time.isoformat() if next_time else 'never'}")


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
