"""The `memflow` command line on bad input (issue 41): one line saying what is wrong, never a traceback (on the
terminal or in the query worker's log), and the exit code of its kind: 0 success, 1 error, 2 usage."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from memflow.shared.settings import Settings
from tests.conftest import System

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str


def memflow(system: System, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> Ran:
    """`memflow ARGS` as a user runs it (its `main`, with its error handling), against this system."""
    from memflow.shared.settings import get_settings
    from memflow.workers.cli import main

    monkeypatch.setenv("MEMFLOW_REDIS_URL", system.ctx.settings.redis.url)
    monkeypatch.setenv("MEMFLOW_STREAM_PREFIX", system.ctx.settings.redis.stream_prefix)
    monkeypatch.setattr(sys, "argv", ["memflow", *args])
    get_settings.cache_clear()
    capsys.readouterr()
    try:
        with pytest.raises(SystemExit) as ended:
            main()
    finally:
        get_settings.cache_clear()
    said = capsys.readouterr()
    code = ended.value.code
    return Ran(code if isinstance(code, int) else (0 if code is None else 1), said.out, said.err)


def refused(ran: Ran, code: int, *words: str) -> None:
    """Refused with exit `code`, saying `words`, and no traceback."""
    assert ran.code == code, ran
    assert "Traceback" not in ran.err + ran.out and 'File "' not in ran.err + ran.out, ran.err
    for word in words:
        assert word in ran.err, ran.err


def remember(system: System, subject: str, *texts: str) -> None:
    for text in texts:
        system.client.write(subject, text, ts=T0)
    assert system.client.wait_idle(timeout_s=60)


def ids_of(system: System, subject: str) -> list[str]:
    return [m.id for m in system.client.inspect(subject).memories]


def no_error_logged(caplog: pytest.LogCaptureFixture) -> None:
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not errors, [r.getMessage() for r in errors]


def test_an_unknown_id_is_one_line_and_exit_1(system: System, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str],
                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    for unknown in ("00000000-0000-4000-8000-000000000000", "abcdef12"):
        refused(memflow(system, monkeypatch, capsys, "history", unknown), 1, "no memory")
    refused(memflow(system, monkeypatch, capsys, "history", "zzz"), 2, "not a memory id")  # no id at all: usage
    no_error_logged(caplog)


def test_rollback_beyond_the_last_version_is_one_line_and_no_error_in_the_log(
        system: System, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    remember(system, "rolf", "Remember: my locker code word is heron.")
    caplog.set_level(logging.INFO)
    memory = ids_of(system, "rolf")[0]
    refused(memflow(system, monkeypatch, capsys, "rollback", memory, "--to", "7"), 1, "version 7")
    no_error_logged(caplog)


def test_an_import_whose_ids_were_rewritten_is_one_line(system: System, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str],
                                                         caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    remember(system, "ivy", "I like tea.", "I live in Oslo.")
    exported = memflow(system, monkeypatch, capsys, "export", "ivy")
    assert exported.code == 0, exported
    lines = [orjson.loads(line) for line in exported.out.splitlines()]
    for n, line in enumerate(lines):
        if line.get("kind") == "memory":  # another id, as a hand-edited file has
            line["memory"]["id"] = f"memory-{n}"
    rewritten = tmp_path / "rewritten.jsonl"
    rewritten.write_bytes(b"\n".join(orjson.dumps(line) for line in lines) + b"\n")
    caplog.set_level(logging.INFO)
    # Refused as the file is read (exit 2: wrong on its face), naming the line and the field; never the store's error.
    refused(memflow(system, monkeypatch, capsys, "import", str(rewritten)), 2, "memory.id", "nothing was imported")
    no_error_logged(caplog)


def test_a_command_with_nothing_to_act_on_refuses(system: System, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    refused(memflow(system, monkeypatch, capsys, "forget", "alice"), 2, "--contains")
    refused(memflow(system, monkeypatch, capsys, "forget", "alice", "--verify"), 2, "--contains")


def test_an_unknown_subject_says_so(system: System, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    remember(system, "known", "I like tea.")
    refused(memflow(system, monkeypatch, capsys, "inspect", "nobody"), 1, "nobody")
    refused(memflow(system, monkeypatch, capsys, "inspect", "nobody", "--json"), 1, "nobody")
    refused(memflow(system, monkeypatch, capsys, "export", "known", "nobody"), 1, "nobody")
    refused(memflow(system, monkeypatch, capsys, "jobs", "run", "decay", "--subject", "nobody"), 1, "nobody")
    assert memflow(system, monkeypatch, capsys, "inspect", "known").code == 0
    assert memflow(system, monkeypatch, capsys, "jobs", "run", "decay", "--subject", "known").code == 0


def test_exit_codes_are_two_for_a_bad_command_line(system: System, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    refused(memflow(system, monkeypatch, capsys, "search", "alice", ""), 2, "query")
    refused(memflow(system, monkeypatch, capsys, "search", "alice", "tea", "--k", "0"), 2, "--k")
    refused(memflow(system, monkeypatch, capsys, "search", "alice", "tea", "--now", "yesterday"), 2, "yesterday")
    refused(memflow(system, monkeypatch, capsys, "publish", "alice", "hi", "--ts", "yesterday"), 2, "ts")
    refused(memflow(system, monkeypatch, capsys, "inspect", "alice", "--now", "yesterday"), 2, "yesterday")
    refused(memflow(system, monkeypatch, capsys, "inspect", "not a subject!"), 2, "subject")
    refused(memflow(system, monkeypatch, capsys, "rollback", "abcdef12"), 2, "--to")
    refused(memflow(system, monkeypatch, capsys, "jobs", "run", "nojob"), 2, "nojob")


def test_an_id_prefix_inspect_shows_is_taken_wherever_an_id_is(system: System, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    remember(system, "pia", "I live in Oslo.", "Actually I live in Bergen now.", "I like tea.")
    shown = memflow(system, monkeypatch, capsys, "inspect", "pia").out
    bergen = next(line.split()[0] for line in shown.splitlines() if "Bergen" in line)
    assert len(bergen) == 8
    ran = memflow(system, monkeypatch, capsys, "history", bergen)
    assert ran.code == 0 and "Bergen" in ran.out and "Oslo" in ran.out, ran
    ran = memflow(system, monkeypatch, capsys, "rollback", bergen, "--to", "1", "--subject", "pia")
    assert ran.code == 0 and "restored version 1" in ran.out, ran
    tea = next(m.id for m in system.client.inspect("pia").memories if "tea" in m.content)
    ran = memflow(system, monkeypatch, capsys, "forget", "pia", tea[:8])
    assert ran.code == 0 and "forgot 1 memory" in ran.out, ran
    assert tea not in ids_of(system, "pia")


def test_a_prefix_never_crosses_subjects(system: System, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    remember(system, "quinn", "I like tea.")
    remember(system, "rae", "I like coffee.")
    theirs = ids_of(system, "rae")[0][:8]
    refused(memflow(system, monkeypatch, capsys, "history", theirs, "--subject", "quinn"), 1, "no memory")
    refused(memflow(system, monkeypatch, capsys, "forget", "quinn", theirs), 1, "no memory")
    assert ids_of(system, "rae")[0].startswith(theirs)


def test_an_ambiguous_prefix_is_refused_naming_the_candidates() -> None:
    from memflow.pipeline.prefixes import Ambiguous, expand

    ids = ["abcd1234-0000-4000-8000-000000000000", "abcd9999-0000-4000-8000-000000000000",
           "ffff0000-0000-4000-8000-000000000000"]
    assert expand("ABCD1234", ids) == [ids[0]]
    assert expand("ffff", ids) == [ids[2]]
    assert expand("eeee", ids) == []
    with pytest.raises(Ambiguous) as both:
        expand("abcd", ids)
    assert both.value.candidates == ids[:2]


def test_a_prefix_is_the_start_of_an_id_as_people_copy_one() -> None:
    from memflow.pipeline.prefixes import is_full_id, is_prefix

    assert all(is_prefix(p) for p in ("8fc3", "8FC354C3", "8fc354c3-f9", "8fc354c3-f9df"))
    for bad in ("abc", "8fc354c3f9df", "8fc354c3-f9df-571d-aa52-d8dd7b4db4a", "zzzz", "../8fc354c3", "8fc354c3-"):
        assert not is_prefix(bad) and not is_full_id(bad), bad
    assert is_full_id("8fc354c3-f9df-571d-aa52-d8dd7b4db4a7") and not is_prefix("8fc354c3-f9df-571d-aa52-d8dd7b4db4a7")


def test_keys_create_warns_first_and_prints_the_key_last(settings: Settings) -> None:
    """As a terminal shows them, stdout and stderr in one stream: the warning, then the key alone at the end."""
    # Only this test's settings: a stray MEMFLOW_* variable in the runner's environment earns its own warning line.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMFLOW_")}
    env |= {"MEMFLOW_REDIS_URL": settings.redis.url or "", "MEMFLOW_STREAM_PREFIX": settings.redis.stream_prefix}
    ran = subprocess.run([sys.executable, "-m", "memflow.workers.cli", "keys", "create", "--name", "bot",
                          "--subjects", "a"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=True)
    lines = ran.stdout.decode().strip().splitlines()
    assert "cannot be shown again" in lines[0] and lines[-1].startswith("mf_"), lines
    assert not lines[0].endswith(":"), lines  # a colon would point at the next line, which on a terminal may not be it


def test_every_other_command_refuses_a_bad_input_in_one_line(system: System, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """What a sweep of every command with a bad input against `memflow up` found besides the issue's cases."""
    refused(memflow(system, monkeypatch, capsys, "traces", "tail", "--count", "-1"), 2, "--count")
    refused(memflow(system, monkeypatch, capsys, "serve", "--port", "99999"), 2, "--port")
    refused(memflow(system, monkeypatch, capsys, "partitions", "set", "0"), 2, "COUNT")
    # An id not there is the system's answer (1), not usage (2). (replay and drop say "0": a second replay is done.)
    refused(memflow(system, monkeypatch, capsys, "dlq", "show", "extract", "1-0"), 1, "no dead letter 1-0")
    refused(memflow(system, monkeypatch, capsys, "publish", "alice", "hi", "--ts", "2026-01-01T00:00:00"), 2,
            "timezone")
    assert "Value error" not in memflow(system, monkeypatch, capsys, "publish", "alice", "hi", "--ts",
                                        "2026-01-01T00:00:00").err


def test_the_worker_finds_a_prefix_in_its_subject_only_and_names_every_candidate(tmp_path: Path) -> None:
    """On a real Edge shard, ids chosen to share their start (random ones would not, in a test's few memories)."""
    from memflow.shared.errors import InvalidInput, NotFound
    from memflow.shared.storage.edge_store import EdgeStore
    from memflow.workers import ops
    from tests.test_store import DIM, axis, memory

    store = EdgeStore(tmp_path / "shard", DIM)
    store.ensure()
    first, second = "abcd1234-0000-4000-8000-000000000001", "abcd9999-0000-4000-8000-000000000002"
    theirs = "beef0000-0000-4000-8000-000000000003"
    try:
        named = [memory("amy").model_copy(update={"id": first}),
                 memory("amy", key="k2").model_copy(update={"id": second}),
                 memory("bo").model_copy(update={"id": theirs})]
        store.put(named, [axis(0), axis(1), axis(2)])
        assert ops.locate(store, "ABCD1234", "amy").id == first
        assert ops.resolve_ids(store, "amy", ["abcd9", first]) == [second, first]
        with pytest.raises(InvalidInput) as both:
            ops.locate(store, "abcd", "amy")
        assert first in str(both.value) and second in str(both.value)
        with pytest.raises(NotFound):  # bo's, asked as amy's
            ops.locate(store, "beef0000", "amy")
        assert ops.locate(store, "beef", None).id == theirs  # the operator's command, over every subject
    finally:
        store.close()


def test_replay_or_drop_of_every_dead_letter_says_all(system: System, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Naming nothing is a usage error, never "all" by default: a mistyped filter would have replayed the lot."""
    for verb, done in (("replay", "replayed 0"), ("drop", "dropped 0")):
        refused(memflow(system, monkeypatch, capsys, "dlq", verb, "trigger"), 2, "--all")
        ran = memflow(system, monkeypatch, capsys, "dlq", verb, "trigger", "--all")
        assert ran.code == 0 and done in ran.out, ran
