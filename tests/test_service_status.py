"""Every status the service answers is the one docs/serving.md documents: each row of its
error table is produced by a real request, and no request here gets an undocumented one;
blank queries, non-UTF-8 and non-JSON bodies, the per-request token limit and the bearer
token, each against the real service."""
import pickle
import random
import re
import shutil
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from streamlearn.config import Config, ServiceConfig
from streamlearn.exceptions import ConfigError
from streamlearn.learner import Learner
from streamlearn.service import Settings, create_app
from streamlearn.service_auth import TOKEN_ENV, BearerToken, load_token
from streamlearn.state import open_store
from test_service import make_state, metric_values
from test_snapshot import SMALL, commit, stream

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DOC = Path(__file__).resolve().parent.parent / "docs" / "serving.md"
TOKEN = "s3cret-Token_0123456789"
LIMITS = ServiceConfig(max_tokens=8, max_batch=4, max_request_tokens=12, max_body_bytes=2000)


def documented_statuses() -> set[tuple[int, str]]:
    """(status, error) of every row of serving.md's error table."""
    rows = re.findall(r"^\| (\d{3}) \| `([a-z-]+)` \|", DOC.read_text(encoding="utf-8"), re.M)
    assert len(rows) >= 10, "the error table of docs/serving.md was not found"
    return {(int(status), code) for status, code in rows}


def diverged_state(path: Path) -> str:
    """An mlm model whose weights went NaN: the decoder refuses its scores."""
    learner = Learner(Config().override(*SMALL, "learner.task=mlm"))
    learner.learn_many(stream("mlm", 16, random.Random(3)))
    with torch.no_grad():
        for weight in learner.model.parameters():
            weight.fill_(float("nan"))
    with open_store(path) as store:
        commit(store, learner, 1)
    return str(path)


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    def app(state: str, **settings) -> TestClient:
        return TestClient(create_app(Settings(state=state, service=LIMITS, **settings)))

    root = tmp_path_factory.mktemp("services")
    classify = make_state(root / "classify", "classify", 1)
    clients = {
        "classify": app(classify),
        "guarded": app(classify, token=BearerToken(TOKEN)),
        "diverged": app(diverged_state(root / "diverged")),
        "gone": app(make_state(root / "gone", "classify", 1)),
    }
    shutil.rmtree(root / "gone")
    yield clients
    for client in clients.values():
        client.app.state.snapshot.close()


def post(body, content_type: str = "application/json", path: str = "/v1/predict"):
    if isinstance(body, bytes):
        return lambda client: client.post(path, content=body, headers={"content-type": content_type})
    return lambda client: client.post(path, json=body)


CASES = {  # name: (service, request, (status, error) as documented)
    "not JSON": ("classify", post(b'{"text": "w1"'), (400, "bad-request")),
    "form body that is not JSON": ("classify", post(b"text=w1", "application/x-www-form-urlencoded"),
                                   (400, "bad-request")),
    "UTF-16 JSON with a BOM": ("classify", post('{"text": "w1"}'.encode("utf-16")), (400, "bad-request")),
    "UTF-16 JSON without a BOM": ("classify", post('{"text": "w1"}'.encode("utf-16-le")), (400, "bad-request")),
    "Latin-1 text": ("classify", post('{"text": "caf\xe9"}'.encode("latin-1")), (400, "bad-request")),
    "empty body": ("classify", post(b""), (400, "bad-request")),
    "no token": ("guarded", post({"text": "w1"}), (401, "unauthorized")),
    "unknown path": ("classify", lambda c: c.get("/v1/nothing"), (404, "not-found")),
    "wrong method": ("classify", lambda c: c.get("/v1/predict"), (405, "method-not-allowed")),
    "top-k of a classifier": ("classify", post({"text": "w1"}, path="/v1/topk"), (409, "wrong-task")),
    "body over max_body_bytes": ("classify", post({"text": "w1 " * 700}), (413, "body-too-large")),
    "tokens over max_request_tokens": ("classify", post({"records": [{"tokens": ["w1"] * 4}] * 4}),
                                       (413, "request-too-large")),
    "words over max_request_tokens": ("classify", post({"records": [{"text": "w1 w2 w3 w4"}] * 4}),
                                      (413, "request-too-large")),
    "empty text": ("classify", post({"text": ""}), (422, "invalid-request")),
    "whitespace text": ("classify", post({"text": " \t\n "}), (422, "invalid-request")),
    "empty token list": ("classify", post({"tokens": []}), (422, "invalid-request")),
    "empty token list in a batch": ("classify", post({"records": [{"text": "w1"}, {"tokens": []}]}),
                                    (422, "invalid-request")),
    "an mlm query by key": ("diverged", post({"key": "u1"}, path="/v1/topk"), (422, "bad-record")),
    "scores of a diverged model": ("diverged", post({"tokens": ["w1", "[MASK]"]}, path="/v1/topk"),
                                   (422, "bad-query")),
    "state directory deleted": ("gone", post({"text": "w1"}), (503, "snapshot-unavailable")),
}


@pytest.mark.parametrize("name", CASES)
def test_each_case_gets_its_documented_status(services, name):
    service, request, want = CASES[name]
    response = request(services[service])
    assert (response.status_code, response.json().get("error")) == want, response.text
    assert want in documented_statuses()
    assert response.json()["detail"]


def test_the_error_table_lists_exactly_the_statuses_answered():
    assert {want for _, _, want in CASES.values()} == documented_statuses()


@pytest.mark.parametrize("path", ["/v1/predict", "/v1/topk", "/v1/embed"])
@pytest.mark.parametrize("query", [{"text": ""}, {"text": "   "}, {"tokens": []}])
def test_a_query_without_input_is_422_on_every_endpoint(services, path, query):
    """...except top-k's explicit empty token list: an empty prefix or history, which
    a classifier cannot answer (409) and next-token answers with a first token
    (tests/test_service.py)."""
    response = services["classify"].post(path, json=query)
    if path == "/v1/topk" and "tokens" in query:
        assert response.status_code == 409 and response.json()["error"] == "wrong-task", response.text
        return
    assert response.status_code == 422 and response.json()["error"] == "invalid-request", response.text
    assert response.json()["detail"][0]["loc"][-1] in ("text", "tokens")
    if "text" in query:
        assert '"tokens": []' in response.json()["detail"][0]["msg"]  # says how to ask top-k for no context


def test_the_request_token_limit_is_inclusive_and_counts_text_words_and_keys(services):
    client = services["classify"]  # max_request_tokens = 12
    at_limit = {"records": [{"text": "w1 w2\tw3\n"}, {"tokens": ["w4", 5, "w6"]}, {"text": "w7 w8 w9 w10 w11 w12"}]}
    assert client.post("/v1/predict", json=at_limit).status_code == 200
    over = {"records": [*at_limit["records"], {"text": "w13"}]}
    response = client.post("/v1/predict", json=over)
    assert response.status_code == 413 and "13 tokens" in response.json()["detail"]
    assert "service.max_request_tokens=12" in response.json()["detail"]


def test_a_body_that_is_not_utf8_says_so(services):
    response = services["classify"].post("/v1/predict", content='{"text": "w1"}'.encode("utf-16"))
    assert "not UTF-8" in response.json()["detail"] and "UTF-16" in response.json()["detail"]


# ---------------------------------------------------------------------------- bearer token

@pytest.mark.parametrize("authorization", [None, "", "Bearer", f"Basic {TOKEN}", "Bearer wrong-token-0123456789",
                                           f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}"])
def test_a_missing_or_wrong_token_is_401_on_every_endpoint_but_healthz(services, authorization):
    client = services["guarded"]
    headers = {} if authorization is None else {"authorization": authorization}
    for response in (client.post("/v1/predict", json={"text": "w1"}, headers=headers),
                     client.post("/v1/embed", json={"text": "w1"}, headers=headers),
                     client.get("/v1/snapshot", headers=headers), client.get("/metrics", headers=headers),
                     client.get("/openapi.json", headers=headers), client.get("/v1/nothing", headers=headers)):
        assert response.status_code == 401, response.text
        assert response.json()["error"] == "unauthorized" and "Authorization: Bearer" in response.json()["detail"]
        assert response.headers["www-authenticate"].startswith('Bearer realm="streamlearn"')
    assert client.get("/healthz", headers=headers).status_code == 200


def test_the_right_token_under_another_scheme_is_told_the_scheme_and_never_echoed(services):
    """Was: 'the bearer token is not this service's' (error="invalid_token") for the right
    token sent as Basic, or bare."""
    client = services["guarded"]
    for authorization, scheme in [(f"Basic {TOKEN}", "'Basic'"), (TOKEN, "'none'")]:
        response = client.post("/v1/predict", json={"text": "w1"}, headers={"authorization": authorization})
        detail = response.json()["detail"]
        assert response.status_code == 401 and f"scheme is {scheme}, not Bearer" in detail and TOKEN not in detail
        assert 'error="invalid_request"' in response.headers["www-authenticate"]


def test_the_right_token_is_let_through(services):
    client = services["guarded"]
    for scheme in ("Bearer", "bearer"):
        headers = {"authorization": f"{scheme} {TOKEN}"}
        assert client.post("/v1/predict", json={"text": "w1"}, headers=headers).status_code == 200
        assert client.get("/v1/snapshot", headers=headers).status_code == 200
    values = metric_values(client.get("/metrics", headers={"authorization": f"Bearer {TOKEN}"}).text)
    assert values[("streamlearn_requests_total", (("code", "200"), ("endpoint", "/v1/predict")))] == 2


def test_the_token_comes_from_a_file_or_the_environment_never_both(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    from_file = load_token(str(path), {})
    assert from_file.accepts(f"Bearer {TOKEN}".encode()) and not from_file.accepts(b"Bearer other-token-0123456789")
    assert load_token(None, {TOKEN_ENV: TOKEN}).accepts(f"Bearer {TOKEN}".encode())
    assert load_token(None, {}) is None
    assert TOKEN not in repr(from_file) and TOKEN not in repr(Settings(state="x", token=from_file))
    assert pickle.loads(pickle.dumps(from_file)).accepts(f"Bearer {TOKEN}".encode())  # serve --workers N
    with pytest.raises(ConfigError, match="keep one"):
        load_token(str(path), {TOKEN_ENV: TOKEN})
    path.write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        load_token(str(path), {})
    path.write_text(f"{TOKEN}\n{TOKEN}\n")  # was: 'must be at least 16 characters ..., got 67 characters'
    with pytest.raises(ConfigError, match="holds more than one line"):
        load_token(str(path), {})
    with pytest.raises(ConfigError, match="cannot read the token file"):
        load_token(str(tmp_path / "missing"), {})
    for weak in ("short", "has a space in it 0123", "ünïcödé-token-0123456789"):
        with pytest.raises(ConfigError, match="at least 16 characters"):
            BearerToken(weak)


def test_head_probes_healthz_and_the_page(services):
    """Was: 405 for HEAD, with which load balancers and uptime checkers probe."""
    client = services["classify"]
    for path in ("/healthz", "/"):
        response = client.head(path)
        assert response.status_code == 200 and response.content == b"", path
