"""An export imported as another subject (issue 41 item 2: `memflow import --as NEW`, `POST /v1/import?as_subject=`,
`MemoryClient.import_(lines, as_subject=)`): every memory lands under the new subject with ids of its own, its
provenance kept (events, sessions, versions, history) and a revision naming the subject and id it had; the file's
subject is untouched; the same file imported again changes nothing; a file of several subjects is refused.
The real pipeline and a live `memflow serve` (tests/test_api.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from memflow.pipeline.models import Memory
from memflow.shared.errors import InvalidInput
from memflow.shared.inference.embedder import Embedder
from memflow.shared.redisdb.server import RedisServer
from memflow.shared.storage.store import MemoryFilter
from tests.conftest import System, run_cli
from tests.test_api import Served, serving, subject

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
OWN = {"last_op", "last_count"}


@pytest.fixture(scope="module")
def served(redis_server: RedisServer, embedder: Embedder, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from serving(redis_server, embedder, tmp_path_factory.mktemp("import-as"))


def said(system: System, subj: str, texts: list[str]) -> list[bytes]:
    """`texts` written for `subj` (a correction among them makes a second version), then its export."""
    for i, text in enumerate(texts):
        system.client.write(subj, text, ts=T0 + timedelta(hours=i), event_id=f"{subj}-w{i}", session_id=f"s{i}")
    assert system.client.wait_idle(60)
    return list(system.client.export([subj]))


def points(system: System, subj: str) -> dict[str, Memory]:
    return {m.id: m for m in system.ctx.store.get(MemoryFilter(subj))}


def moved_as(source: dict[str, Memory], target: dict[str, Memory], to: str) -> None:
    """Each of `target` is one of `source` moved to `to`: new id, the same words and provenance, references among
    themselves, and a last revision naming the subject and id it had."""
    assert len(target) == len(source) and not set(target) & set(source), (list(source), list(target))
    by_origin = {m.revisions[-1].before["id"]: m for m in target.values()}
    assert set(by_origin) == set(source)
    renamed = {old: new.id for old, new in by_origin.items()}
    for old, new in by_origin.items():
        was = source[old]
        assert new.revisions[-1].before == {"subject": was.subject, "id": old, "uri": was.uri}
        assert f"from {was.subject}'s memory {old}" in new.revisions[-1].why
        assert new.revisions[:-1] == was.revisions and new.rev == was.rev + 1
        assert new.subject == to and new.uri == was.uri.replace(f"mem://{was.subject}/", f"mem://{to}/")
        kept = {"content", "key", "mtype", "version", "source_event_ids", "session_ids", "evidence", "status",
                "created_at", "source", "about"}
        assert new.model_dump(include=kept) == was.model_dump(include=kept)
        assert new.supersedes == (renamed[was.supersedes] if was.supersedes else None)
        assert new.superseded_by == (renamed[was.superseded_by] if was.superseded_by else None)


def test_the_sdk_imports_an_export_as_another_subject_with_new_ids_and_its_provenance(system: System) -> None:
    ana, bea = subject(), subject()
    lines = said(system, ana, ["I live in Berlin.", "Correction: I live in Munich, not Berlin.", "I like green tea."])
    before = {i: m.model_dump(exclude=OWN) for i, m in points(system, ana).items()}
    report = system.client.import_(lines, as_subject=bea)
    assert [(s.subject, s.written) for s in report.subjects] == [(bea, len(before))]
    assert system.client.wait_idle(60)
    moved_as(points(system, ana), points(system, bea), bea)
    assert {i: m.model_dump(exclude=OWN) for i, m in points(system, ana).items()} == before  # the file's untouched
    assert any(m.supersedes for m in points(system, bea).values())  # versions travelled, linked among themselves
    found = system.client.search(bea, "where do I live?", now=T0 + timedelta(days=1))
    assert found.hits and "Munich" in found.hits[0].content and found.hits[0].id in points(system, bea)
    one = next(iter(points(system, bea)))
    assert f"imported as {bea} from {ana}" in system.client.history(one, subject=bea).model_dump_json()  # shown
    again = system.client.import_(lines, as_subject=bea).subjects[0]  # idempotent: named alike each time
    assert (again.written, again.already) == (0, len(before))
    assert len(points(system, bea)) == len(before)


def test_a_file_of_several_subjects_is_refused_as_another_subject_and_nothing_written(system: System) -> None:
    ana, cy, bea = subject(), subject(), subject()
    said(system, ana, ["I like green tea."])
    said(system, cy, ["I like coffee."])
    with pytest.raises(InvalidInput) as refused:
        system.client.import_(list(system.client.export([ana, cy])), as_subject=bea)
    assert refused.value.field == "as_subject" and "holds 2 subjects" in refused.value.reason, refused.value
    with pytest.raises(InvalidInput) as bad:
        system.client.import_(list(system.client.export([ana])), as_subject="no such id")
    assert bad.value.field == "as_subject"
    assert points(system, bea) == {}


def test_the_command_line_imports_as_another_subject(system: System, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from memflow.workers.cli import app
    ana, bea, cy = subject(), subject(), subject()
    file = tmp_path / "ana.jsonl"
    file.write_bytes(b"".join(said(system, ana, ["I like green tea.", "I live in Oslo."])))
    shown = run_cli(system, monkeypatch, "import", str(file), "--as", bea)
    assert f"{bea}: 2 in the file — 2 written" in shown, shown
    moved_as(points(system, ana), points(system, bea), bea)
    both = tmp_path / "both.jsonl"
    said(system, cy, ["I like coffee."])
    both.write_bytes(b"".join(system.client.export([ana, cy])))
    result = CliRunner().invoke(app, ["import", str(both), "--as", bea])
    assert result.exit_code == 2, result.output
    assert "--as: the file holds 2 subjects" in result.output and "nothing was imported" in result.output
    assert "Traceback" not in result.output


def post(served: Served, key: str, lines: list[bytes], **params: str) -> tuple[int, dict[str, object]]:
    with served.http(key) as http:
        reply = http.post("/v1/import", content=b"".join(lines), params=params,
                          headers={"content-type": "application/x-ndjson"})
    return reply.status_code, reply.json()


def test_http_imports_as_a_subject_the_key_may_write(served: Served) -> None:
    ana, bea, cy = subject(), subject(), subject()
    with served.http(served.admin) as http:
        for i, text in enumerate(["I like green tea.", "I live in Oslo."]):
            assert http.post("/v1/memories", json={"subject": ana, "content": text,
                                                   "event_id": f"{ana}-{i}"}).status_code == 202
    assert served.system.client.wait_idle(60)
    lines = list(served.system.client.export([ana]))
    # A key of the new subject alone imports it: reading the file is no question of the key's.
    status, body = post(served, served.key(bea), lines, as_subject=bea)
    assert status == 200, body
    assert [(s["subject"], s["written"]) for s in body["subjects"]] == [(bea, 2)]  # type: ignore[index]
    moved_as(points(served.system, ana), points(served.system, bea), bea)
    status, body = post(served, served.key(bea), lines, as_subject=cy)  # a subject the key may not write
    assert status == 403 and error_of_body(body)["field"] == "as_subject", body
    both = lines[:-1] + [json.dumps({"kind": "end", "memories": len(lines) - 2}).encode() + b"\n"]
    several = [json.dumps(json.loads(both[0]) | {"subjects": [ana, cy]}).encode() + b"\n", *both[1:]]
    status, body = post(served, served.key(bea), several, as_subject=bea)
    assert status == 422 and error_of_body(body)["field"] == "as_subject", body
    assert "holds 2 subjects" in str(error_of_body(body)["message"])
    assert points(served.system, cy) == {}


def error_of_body(body: dict[str, object]) -> dict[str, object]:
    assert set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error, dict)
    return error
