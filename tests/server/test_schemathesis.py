"""Schemathesis against the server's own OpenAPI schema: no generated request gets a 5xx."""

import httpx
import pytest
import schemathesis
import schemathesis.specs.openapi.schemas  # noqa: F401  imported (and assert-rewritten) at collection: see below
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from oscarkv.config import ServerConfig
from tests.server.conftest import MODEL, start


# Python 3.11 before 3.11.8 keeps one AST recursion counter per interpreter (CPython gh-106905):
# an ast.parse nested inside another, as when the garbage collector logs a traceback while pytest
# rewrites a lazily imported module, fails with "AST constructor recursion depth mismatch".
# Importing schemathesis's schema module up front keeps its rewrite out of the test run.


@pytest.fixture(scope="module")
def api_schema(model, tok):
    # default_max_tokens small: generated requests that leave max_tokens out stay cheap
    with start(model, tok, ServerConfig(served_model_name=MODEL, default_max_tokens=4)) as s:
        yield schemathesis.openapi.from_url(s.url + "/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_no_server_errors(case):
    if isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
        case.body["model"] = MODEL  # the one value a generator cannot guess: reach the generation path
    response = case.call(timeout=60)
    case.validate_response(response, checks=[not_a_server_error])
    health = httpx.get(case.operation.schema.get_base_url().rstrip("/") + "/health", timeout=10)
    assert health.status_code == 200, f"the engine stopped after {case.body!r}"
