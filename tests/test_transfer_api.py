"""Export and import over HTTP (`GET /v1/subjects/{s}/export`, `POST /v1/import`), as an attacker holding one
valid key would try them: another tenant's subjects, another tenant's memory ids, a read-only key, a body over
the cap, a broken line. The `served` server of tests/test_api.py (a real uvicorn process)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from memflow.shared.inference.embedder import Embedder
from memflow.shared.redisdb.server import RedisServer
from memflow.shared.storage.store import MemoryFilter
from tests.conftest import System
from tests.test_api import Served, error_of, remembered, serving, subject


@pytest.fixture(scope="module")
def served(redis_server: RedisServer, embedder: Embedder, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One system and one `memflow serve` process for the module, with an admin key (as tests/test_api.py)."""
    yield from serving(redis_server, embedder, tmp_path_factory.mktemp("transfer-api"))


def exported(served: Served, key: str, subj: str, **params: Any) -> list[bytes]:
    with served.http(key) as http:
        reply = http.get(f"/v1/subjects/{subj}/export", params=params)
        assert reply.status_code == 200, reply.text
        assert reply.headers["content-type"].startswith("application/x-ndjson")
        return reply.content.splitlines(keepends=True)


def posted(served: Served, key: str, lines: list[bytes]) -> Any:
    with served.http(key) as http:
        return http.post("/v1/import", content=b"".join(lines), headers={"content-type": "application/x-ndjson"})


def payloads(lines: list[bytes]) -> list[dict[str, Any]]:
    """The records of an export without the bookkeeping of the store they were written in."""
    assert json.loads(lines[-1]) == {"kind": "end", "memories": len(lines) - 2}
    found = [json.loads(line) for line in lines[1:-1]]
    for record in found:
        record["memory"].pop("last_op")
    return found


def test_an_export_from_another_deployment_is_imported_and_exported_again_the_same(served: Served,
                                                                                  system: System) -> None:
    subj = subject()
    system.client.write(subj, "I live in Berlin.", event_id=f"{subj}-1")
    system.client.write(subj, "Correction: I live in Munich, not Berlin.", event_id=f"{subj}-2")
    assert system.client.wait_idle(60)
    lines = list(system.client.export([subj], with_vectors=True))
    key = served.key(subj)
    reply = posted(served, key, lines)
    assert reply.status_code == 200, reply.text
    done = reply.json()["subjects"][0]
    assert done["written"] == done["memories"] == len(lines) - 2 and done["reembedded"] == 0
    ours, theirs = payloads(exported(served, key, subj)), [{**r, "vector": None} for r in payloads(lines)]
    assert unnamed(ours) == unnamed(theirs)  # the same memories, named by this deployment (pipeline/ids.py)
    assert not {r["memory"]["id"] for r in ours} & {r["memory"]["id"] for r in theirs}
    again = posted(served, key, lines).json()["subjects"][0]
    assert (again["written"], again["already"]) == (0, done["memories"])


def test_a_key_exports_and_imports_only_its_subjects(served: Served) -> None:
    mine, theirs = subject(), subject()
    remembered(served, theirs, "My bank is Acme Bank.")
    key = served.key(mine)
    with served.http(key) as http:
        assert http.get(f"/v1/subjects/{theirs}/export").status_code == 403
    lines = exported(served, served.admin, theirs)
    reply = posted(served, key, lines)
    assert reply.status_code == 403 and error_of(reply)["field"] == "memory.subject"
    read_only = served.key(theirs, read_only=True)
    assert posted(served, read_only, lines).status_code == 403


def unnamed(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records with every memory id (their own, and those they point at) replaced by what the memory is."""
    names = {r["memory"]["id"]: f'{r["memory"]["key"]}|v{r["memory"]["version"]}|{r["memory"]["content"]}'
             for r in records}

    def renamed(value: Any) -> Any:
        if isinstance(value, str):
            return names.get(value, value)
        if isinstance(value, dict):
            return {k: renamed(v) for k, v in value.items()}
        return [renamed(v) for v in value] if isinstance(value, list) else value
    return [renamed(r) for r in records]


def planting(lines: list[bytes], theirs: str, mine: str, memory_id: str) -> list[bytes]:
    """The first record of `theirs`'s export as one of `mine`'s, under `memory_id`, with the attacker's words."""
    head = json.loads(lines[0]) | {"subjects": [mine]}
    record = json.loads(lines[1])
    record["memory"] |= {"id": memory_id, "subject": mine, "uri": record["memory"]["uri"].replace(theirs, mine),
                         "content": "attacker's words"}
    return [json.dumps(head).encode() + b"\n", json.dumps(record).encode() + b"\n", b'{"kind":"end","memories":1}']


def test_another_subjects_memory_id_imported_under_ones_own_is_renamed_and_says_nothing_of_it(
        served: Served) -> None:
    """Issue 38: an import keeps an id only where this store would give it to that record in that subject. Another
    subject's id (held now, or a guess) is minted anew in the importer's subject: the other subject's memory is
    untouched, a delete of that id under the importer's subject reaches nothing of theirs, and the answer is the
    same whether the id is held elsewhere or not (no oracle)."""
    mine, guesser, theirs = subject(), subject(), subject()
    remembered(served, theirs, "My bank is Acme Bank.")
    before = served.system.ctx.store.get(MemoryFilter(theirs))
    lines = exported(served, served.admin, theirs)
    held = json.loads(lines[1])["memory"]["id"]
    replies = [posted(served, served.key(s), planting(lines, theirs, s, i))
               for s, i in ((mine, held), (guesser, "0b5f4f5e-8a3b-4c1d-9e2f-3a4b5c6d7e8f"))]
    assert [r.status_code for r in replies] == [200, 200], [r.text for r in replies]
    answers = [{k: v for k, v in r.json()["subjects"][0].items() if k != "subject"} for r in replies]
    assert answers[0] == answers[1] and answers[0]["written"] == 1
    [planted] = served.system.ctx.store.get(MemoryFilter(mine))
    assert planted.id != held and planted.content == "attacker's words"
    with served.http(served.key(mine)) as http:
        assert http.delete(f"/v1/subjects/{mine}/memories", params={"ids": held}).status_code in (200, 404)
    assert served.system.ctx.store.get(MemoryFilter(theirs)) == before


def test_a_broken_line_is_refused_naming_it_and_nothing_is_written(served: Served) -> None:
    subj = subject()
    remembered(served, subj, "I like green tea.", "I live in Oslo.")
    lines = exported(served, served.admin, subj)
    broken = [*lines[:2], lines[2].replace(b'"created_at":', b'"created_at":"yesterday","was":')]
    reply = posted(served, served.admin, broken)
    assert reply.status_code == 422, reply.text
    error = error_of(reply)
    assert error["field"] == "memory.created_at" and error["message"].startswith("line 3: memory.created_at")
    assert posted(served, served.admin, [b'{"kind": "memory"}\n']).status_code == 422


def test_an_import_over_the_cap_is_refused_413(served: Served) -> None:
    cap = served.settings.http.max_import_bytes
    reply = posted(served, served.admin, [b" " * (cap + 1)])
    assert reply.status_code == 413 and error_of(reply)["field"] == "body"


def test_the_routes_and_their_lines_are_in_the_openapi_document(served: Served) -> None:
    with served.http(None) as http:
        document = http.get("/openapi.json").json()
    assert {"ExportHeader", "ExportRecord", "ExportEnd", "ImportReport", "Imported"} <= set(
        document["components"]["schemas"])
    assert "post" in document["paths"]["/v1/import"]
    assert "get" in document["paths"]["/v1/subjects/{subject}/export"]
