"""The OpenAPI document holds: schemathesis generates requests from it for every route, and checks every
answer against it — no server error, no status, content type or body the document does not declare.

Not checked: that every request the document allows is accepted. Some rules are not in it (a time
within the years 1900-2999, the text limit in bytes, how deep `meta` nests): those requests are
refused with `invalid_input` naming the field, which the status check holds to the declared 422."""

from __future__ import annotations

import json
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import checks

from tests.test_api import Served, served  # noqa: F401  (the module's system and `memflow serve`)


@schemathesis.serializer("application/x-ndjson")
def _json_lines(ctx: Any, value: Any) -> bytes:
    """`POST /v1/import` reads JSON Lines (docs/export-format.md): a generated line is one JSON value."""
    return json.dumps(value).encode() + b"\n"


def test_every_answer_is_one_the_document_declares(served: Served) -> None:  # noqa: F811
    schema = schemathesis.openapi.from_url(f"{served.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 12
    for operation in operations:
        @given(case=operation.as_strategy())
        @settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def answers_as_declared(case: Any) -> None:
            case.call_and_validate(headers={"Authorization": f"Bearer {served.admin}"},
                                   excluded_checks=[checks.positive_data_acceptance])
        answers_as_declared()
