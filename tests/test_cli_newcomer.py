"""The newcomer's path of issue 41, repeated in a fresh clone: what it still met at the command line and in the
MCP example, each a test that failed first. One line, the exit code of its kind (docs/cli.md#exit-codes), the
refusal in plain words (pipeline/wording.py), never a traceback."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from memflow.workers.cli.common import USAGE
from tests import test_api
from tests.conftest import System, run_cli
from tests.test_api import Served

served = test_api.served  # the fixture: a system and `memflow serve` for this module

ROOT = Path(__file__).resolve().parent.parent
# Nothing listens there: a command that reached Redis before refusing would say it cannot.
NO_REDIS = "redis://127.0.0.1:1/0"


def memflow(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """`memflow ARGS` as a user runs it, in a process of its own, with no running system to find."""
    env = {**os.environ, "MEMFLOW_REDIS_URL": NO_REDIS, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "memflow.workers.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout_s, check=False)


def no_traceback(done: subprocess.CompletedProcess[str]) -> None:
    said = done.stdout + done.stderr
    assert "Traceback" not in said and 'File "' not in said, said


@pytest.mark.parametrize(("args", "words"), [
    (("search", "alice", "x", "--k", "0"), "'--k': must be at least 1"),
    (("search", "alice", "x", "--k", "201"), "'--k': must be at most 200"),
    (("traces", "tail", "--count", "abc"), "'--count': must be a whole number"),
    (("partitions", "set", "0"), "'COUNT': must be at least 1"),
    (("status", "--sample", "soon"), "'--sample': must be a number"),
])
def test_a_number_out_of_range_is_refused_in_plain_words(args: tuple[str, ...], words: str) -> None:
    """typer 0.29 reads numbers with pydantic and says "Input should be greater than or equal to 1": the words the
    HTTP API already replaced (`k` must be at least 1) said the same way here."""
    done = memflow(*args)
    assert done.returncode == USAGE, done
    assert words in done.stderr, done.stderr
    assert "Input should" not in done.stderr and "unable to parse" not in done.stderr, done.stderr
    no_traceback(done)


@pytest.mark.parametrize(("args", "words"), [
    (("rollback", "deadbeef", "--to", "0"), "'--to': must be at least 1"),
    (("dlq", "list", "extract", "--subject", "a b"), "'--subject'"),
    (("dlq", "drop", "extract", "--subject", "a b"), "'--subject'"),
    (("status", "--subject", "a b"), "'--subject'"),
    (("search", "alice", "x", "--now", "yesterday"), "'--now': not an ISO time"),
    (("inspect", "alice", "--now", "yesterday"), "'--now': not an ISO time"),
    (("jobs", "run", "decay", "--now", "yesterday"), "'--now': not an ISO time"),
])
def test_a_value_wrong_on_its_face_is_usage_naming_its_option(args: tuple[str, ...], words: str) -> None:
    """Seen as a newcomer: `rollback --to 0` answered "no version 0" (exit 1, after asking the worker), a subject
    filter no subject can match (`--subject 'a b'`) listed nothing and exited 0, and a bad `--now` said "Invalid
    value: not an ISO time" without naming the option. Each is usage, said before Redis is asked."""
    done = memflow(*args)
    assert done.returncode == USAGE, done
    assert words in done.stderr, done.stderr
    if "'--subject'" in words:
        assert "1 to 128 letters" in done.stderr, done.stderr
    no_traceback(done)


def test_exporting_a_malformed_subject_is_usage_not_an_unknown_subject() -> None:
    """`memflow export 'a b'` said "no memories of 'a b' in this store" (exit 1), as of a subject that could exist:
    no subject is ever named so, as `search`, `inspect` and `publish` already say (exit 2), before asking Redis."""
    done = memflow("export", "alice", "a b")
    assert done.returncode == USAGE, done
    assert "'a b'" in done.stderr and "1 to 128 letters" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    no_traceback(done)


def test_serving_on_a_port_in_use_is_one_line_and_exit_1() -> None:
    """A second `memflow serve` (or one beside `memflow up --serve`) got uvicorn's startup and shutdown log around
    "[Errno 98] … address already in use" and exit 3, a code `memflow --help` does not know."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = memflow("serve", "--port", str(port))
    assert done.returncode == 1, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"127.0.0.1:{port}" in lines[0] and "in use" in lines[0] and "--port" in lines[0], lines
    no_traceback(done)


def test_the_mcp_example_without_a_key_says_which_variable_to_set() -> None:
    """It printed `mcp_client: 'MEMFLOW_KEY'` (a KeyError's text): the newcomer is told what to set."""
    env = {k: v for k, v in os.environ.items() if k not in ("MEMFLOW_KEY", "MEMFLOW_URL")}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "mcp_client.py")], capture_output=True,
                          text=True, env=env, timeout=60, check=False)
    assert done.returncode == 1, done
    assert done.stderr.strip().splitlines() == [
        "mcp_client: set MEMFLOW_URL (such as http://127.0.0.1:8765) and MEMFLOW_KEY (`memflow keys create`)"], done


def test_the_mcp_example_with_a_wrong_key_prints_the_servers_words(served: Served) -> None:
    """A wrong key is refused at the door (401, the API's JSON error), which the MCP SDK hands its caller as "Server
    returned an error response": the example printed that, never the server's "unknown or revoked API key"."""
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "mcp_client.py")],
                          env={**os.environ, "MEMFLOW_URL": served.url, "MEMFLOW_KEY": "mf_deadbeef_wrong"},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr.strip().splitlines() == ["mcp_client: 401 unauthorized: unknown or revoked API key"], done


def test_an_import_that_is_not_json_names_its_line_once(tmp_path: Path) -> None:
    """It said "line 1: line: not JSON: …": the field of a line that is not JSON at all is the line itself, already
    named by its number."""
    garbage = tmp_path / "notes.txt"
    garbage.write_text("hello\n")
    done = memflow("import", str(garbage))
    assert done.returncode == USAGE, done
    assert f"memflow: {garbage}: line 1: not JSON" in done.stderr, done.stderr
    no_traceback(done)


def test_publish_names_the_event_id_that_fate_asks_for(system: System, monkeypatch: pytest.MonkeyPatch) -> None:
    """`memflow publish` printed the stream entry id alone ("1796551981659-0"): with no --event-id, the newcomer had
    no way to ask `memflow fate SUBJECT EVENT_ID` what became of it."""
    said = run_cli(system, monkeypatch, "publish", "alice", "I prefer green tea over coffee.")
    found = re.search(r"published event ([0-9a-f-]{36})", said)
    assert found is not None, said
    assert f"memflow fate alice {found.group(1)}" in said, said
    assert system.client.wait_idle(timeout_s=60)
    assert system.client.event_fate("alice", found.group(1)).state in ("accepted", "stored")


def test_showing_an_empty_dead_letter_queue_says_so(system: System, monkeypatch: pytest.MonkeyPatch) -> None:
    """`memflow dlq show extract` with nothing dead-lettered printed nothing at all and exited 0."""
    said = run_cli(system, monkeypatch, "dlq", "show", "extract")
    assert "no dead letters of extract" in said, said
    assert "that match" in run_cli(system, monkeypatch, "dlq", "show", "extract", "--error", "timeout")


def test_the_http_history_takes_the_id_start_inspect_shows(served: Served) -> None:
    """`memflow history 8fc354c3` worked, `GET /v1/memories/8fc354c3/history` was 422 "is not a memory id": the
    8 characters the inspector and `inspect` show are taken at this door too, found among the key's subjects only."""
    subject, other = f"nb-{uuid.uuid4().hex[:6]}", f"nb-{uuid.uuid4().hex[:6]}"
    for who in (subject, other):
        served.system.client.write(who, "I live in Lyon.")
    assert served.system.client.wait_idle(timeout_s=60)
    mine, theirs = (served.system.client.inspect(who).memories[0].id for who in (subject, other))
    with served.http(served.key(subject)) as http:
        found = http.get(f"/v1/memories/{mine[:8]}/history")
        assert found.status_code == 200, found.text
        assert mine in {v["id"] for v in found.json()["versions"]}, found.json()
        assert http.get(f"/v1/memories/{theirs[:8]}/history").status_code == 404  # never another subject's
        refused = http.get("/v1/memories/zz/history")
        assert refused.status_code == 422 and "not a memory id" in refused.json()["error"]["message"], refused.text
