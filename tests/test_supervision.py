"""The system runner on a real Redis: a part that dies is noticed, logged and restarted, one that keeps
dying ends the process non-zero; a connection to a server that stopped answering raises, never hangs."""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import redis

from memflow.shared.inference.embedder import Embedder
from memflow.shared.redisdb.connections import stage_socket_timeout_s
from memflow.shared.settings import Settings
from memflow.shared.streaming.consumer import StreamConsumer
from memflow.workers.embedded import embedded
from memflow.workers.runtime import Context
from memflow.workers.system import QUERY, Part, PartDied, RestartPolicy, Runner, run
from tests.conftest import System, wait_for

QUICK = RestartPolicy(max_restarts=2, stable_s=60.0, base_s=0.01, max_s=0.05)


@pytest.fixture
def signals_restored() -> Iterator[None]:
    """`run` installs SIGTERM/SIGINT handlers, as `memflow worker` does; pytest's come back after."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def extract_dies(monkeypatch: pytest.MonkeyPatch, times: int) -> list[str]:
    """Make the extract stage's thread die `times` times, outside the consumer loop (a bug there)."""
    deaths: list[str] = []
    real_run = StreamConsumer.run

    def dying(self: StreamConsumer, stop: threading.Event) -> None:  # type: ignore[type-arg]
        if self.stage == "extract" and len(deaths) < times:
            deaths.append(self.name)
            raise RuntimeError("a bug outside the consumer loop")
        real_run(self, stop)

    monkeypatch.setattr(StreamConsumer, "run", dying)
    return deaths


def test_a_stage_thread_that_dies_beside_the_query_worker_is_logged_and_restarted(
        settings: Settings, embedder: Embedder, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Risk 5: with the query worker running, a stage thread that died was never noticed."""
    deaths = extract_dies(monkeypatch, times=1)
    with embedded(settings, light_in_process=True, embedder=embedder) as system:
        wait_for(lambda: deaths, what="the extract thread to die")
        system.client.publish({"event_id": "sv-1", "subject": "sol", "session_id": "s1", "kind": "message",
                               "role": "user", "text": "Remember: the spare key is under the blue pot.",
                               "ts": datetime(2026, 3, 2, 9, 0, tzinfo=UTC)})
        wait_for(lambda: system.client.inspect("sol").memories, timeout_s=60,
                 what="the event to pass the restarted extract stage and the query worker to answer")
    died = [r for r in caplog.records if r.exc_info and "extract" in r.getMessage()]
    assert died and died[0].exc_info[0] is RuntimeError  # with its traceback


def test_a_stage_that_keeps_dying_ends_the_worker_process_non_zero(
        settings: Settings, embedder: Embedder, monkeypatch: pytest.MonkeyPatch, signals_restored: None) -> None:
    """`memflow worker extract query`: the query worker answering must not hide a stage that is gone."""
    extract_dies(monkeypatch, times=1_000)
    # Another test's system may still be stopping in the background under load: only this run's threads count.
    before = set(threading.enumerate())
    ctx = Context.from_settings(settings, embedder=embedder)
    try:
        with pytest.raises(SystemExit) as ended:
            run(ctx, ["extract", QUERY], policy=QUICK)
    finally:
        ctx.close()
    assert ended.value.code not in (0, None)
    assert "extract" in str(ended.value.code)
    # Every part of this run ends (none left behind), if later than the runner's 30 s join under a loaded suite.
    wait_for(lambda: not [t for t in set(threading.enumerate()) - before if t.name.startswith("memflow-")
                          and t.is_alive()], timeout_s=60, what="every part of the run to have ended")


def test_a_part_that_returns_while_the_process_runs_counts_as_dead() -> None:
    """RQ's worker returns from work() when it quits on an error of its own: that is a death too."""
    starts: list[str] = []

    def quits(stop: threading.Event) -> None:
        starts.append("quits")

    runner = Runner([Part("quits", quits), Part("steady", lambda stop: stop.wait())], policy=QUICK)
    runner.start()
    try:
        with pytest.raises(PartDied, match="quits"):
            runner.supervise(poll_s=0.005)
    finally:
        runner.shutdown(join_s=5)
    assert len(starts) == 1 + QUICK.max_restarts
    assert runner.stop.is_set()
    assert not any(thread.is_alive() for thread in runner.threads)


def test_in_the_background_a_part_that_keeps_dying_stops_everything_and_raises_at_the_end() -> None:
    """The embedded mode: the caller's thread is the caller's, so the failure is raised when its block ends."""
    runner = Runner([Part("broken", lambda stop: 1 / 0), Part("steady", lambda stop: stop.wait())], policy=QUICK)
    runner.start()
    runner.supervise_in_background()
    wait_for(runner.stop.is_set, what="the runner to give up")
    runner.shutdown(join_s=5)
    assert not any(thread.is_alive() for thread in runner.threads)
    with pytest.raises(PartDied, match="broken died 3 times"):
        runner.raise_if_failed()


def test_a_part_that_does_not_stop_in_time_is_logged_with_where_it_waits(caplog: pytest.LogCaptureFixture) -> None:
    """A stop is seen within about a second; a part still running when the runner stops waiting for it is a
    defect, logged with its stack (in a long suite some stops took 15 s or more: this is what finds them)."""
    released = threading.Event()

    def deaf_to_stop(stop: threading.Event) -> None:
        released.wait(30)

    runner = Runner([Part("deaf", deaf_to_stop), Part("steady", lambda stop: stop.wait())], policy=QUICK)
    runner.start()
    try:
        runner.shutdown(join_s=0.2)
    finally:
        released.set()
    [stuck] = [r for r in caplog.records if "still running" in r.getMessage()]
    assert stuck.levelname == "ERROR" and "memflow-deaf" in stuck.getMessage()
    assert "deaf_to_stop" in stuck.getMessage() and "released.wait(30)" in stuck.getMessage()


def test_a_part_that_stays_up_long_enough_starts_its_restart_count_afresh() -> None:
    clock = [0.0]
    policy = RestartPolicy(max_restarts=1, stable_s=10.0, base_s=0.0, max_s=0.0)
    died = threading.Event()

    def dies(stop: threading.Event) -> None:
        died.set()

    runner = Runner([Part("flaky", dies)], policy=policy, clock=lambda: clock[0])
    runner.start()
    for _ in range(3):  # each death comes 20 s after its start: a passing outage, not a crash loop
        wait_for(lambda: died.is_set() and not runner.threads[0].is_alive(), what="the part to end")
        died.clear()
        clock[0] += 20.0
        runner.check()  # noted, restart due now
        runner.check()  # restarted
    runner.shutdown(join_s=5)
    assert runner.failure is None


# -- connections (risk 7) -------------------------------------------------------------------


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A TCP server that accepts connections and never answers: a wedged server, a half-open connection."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:  # closed at teardown
                return

    threading.Thread(target=accept, daemon=True).start()
    yield f"redis://127.0.0.1:{server.getsockname()[1]}/0"
    server.close()
    for conn in held:
        conn.close()


def test_a_stage_connection_to_a_silent_server_raises_instead_of_blocking(
        settings: Settings, silent_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Risk 7: with no socket timeout, a blocking read on a connection nobody answers waits forever."""
    monkeypatch.setattr("memflow.shared.redisdb.connections.READ_MARGIN_S", 0.2, raising=False)
    silent = settings.replace(redis_url=silent_url)
    raised: list[BaseException] = []

    def read() -> None:
        try:
            client = Context.from_settings(silent).client
            client.xreadgroup("extract", "c", {"events": ">"}, count=1, block=settings.consumer.block_ms)
        except redis.RedisError as exc:
            raised.append(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive(), "a read on a server that never answers is still blocked"
    assert [type(e) for e in raised] == [redis.TimeoutError]


def test_the_stage_connection_outlasts_every_blocking_read_and_rq_leaves_it_so(system: System,
                                                                               settings: Settings) -> None:
    kwargs = system.ctx.client.connection_pool.connection_kwargs
    # The query worker is running on this pool: RQ raises a timeout shorter than its dequeue needs.
    assert kwargs["socket_timeout"] == stage_socket_timeout_s(settings.consumer.block_ms) > settings.consumer.block_ms / 1000
    assert kwargs["socket_keepalive"] and kwargs["health_check_interval"] > 0
    assert system.client.inspect("nobody").memories == []  # RQ dequeues with it
