"""The HTTP service: answers equal the snapshot's and carry snapshot_step; limits and
task mismatches are JSON 4xx; fuzzed bodies never get a 5xx; metrics; start errors;
the CLI with several workers."""
import asyncio
import json
import pickle
import random
import signal
import socket
import subprocess
import sys
import time

import httpx2
import pytest
import torch
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings, strategies as st
from prometheus_client.parser import text_string_to_metric_families

from streamlearn.config import Config, ServiceConfig
from streamlearn.learner import Learner
from streamlearn.exceptions import RecordError
from streamlearn.service import Settings, _Coalescer, _QueryThread, create_app
from streamlearn.snapshot import Answer, NoCheckpointError
from streamlearn.state import NotAStoreError, open_store
from test_snapshot import SMALL, commit, stream

LIMITS = ServiceConfig(max_tokens=8, max_batch=4)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_state(path, task: str, checkpoints: int = 1) -> str:
    learner = Learner(Config().override(*SMALL, f"learner.task={task}"))
    rng = random.Random(0)
    with open_store(path) as store:
        for step in range(1, checkpoints + 1):
            learner.learn_many(stream(task, 32, rng))
            commit(store, learner, step)
    return str(path)


@pytest.fixture(scope="module")
def states(tmp_path_factory):
    return {task: make_state(tmp_path_factory.mktemp(task), task, 2)
            for task in ("classify", "mlm", "next-item", "next-token")}


@pytest.fixture(scope="module")
def clients(states):
    apps = {task: create_app(Settings(state=path, service=LIMITS)) for task, path in states.items()}
    yield {task: TestClient(app) for task, app in apps.items()}
    for app in apps.values():
        app.state.snapshot.close()


# ---------------------------------------------------------------------------- answers

@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded", "application/json", "text/plain"])
def test_json_body_is_read_whatever_curl_declares(clients, content_type):
    """`curl -d '{...}'` declares a form body; every body here is JSON, so it is read as one
    whatever its declared type, and a body that is not JSON is a 400 whatever it claims."""
    headers = {"content-type": content_type} if content_type else {}
    answer = clients["classify"].post("/v1/predict", content=b'{"text": "w1 w2"}', headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.json()["label"] is not None
    other = clients["classify"].post("/v1/predict", content=b"text=w1", headers=headers)
    assert other.status_code == 400 and other.json()["error"] == "bad-request"


def test_predict_single_and_batch_match_the_snapshot(clients):
    client = clients["classify"]
    snap = client.app.state.snapshot
    one = client.post("/v1/predict", json={"text": "w1 w2"}).json()
    want = snap.predict_proba([{"text": "w1 w2"}]).values[0]
    assert one["snapshot_step"] == 2 and one["label"] == max(want, key=want.get)
    assert one["probs"] == pytest.approx(want, abs=1e-6)
    batch = client.post("/v1/predict", json={"records": [{"tokens": ["w3", 4]}, {"text": "w5"}]}).json()
    assert batch["snapshot_step"] == 2 and len(batch["results"]) == 2
    assert batch["results"][0]["probs"] == pytest.approx(snap.predict_proba([{"tokens": ["w3", 4]}]).values[0])
    assert set(batch) == {"snapshot_step", "results"}


def test_topk_fills_a_mask_and_continues_a_stored_history(clients):
    mlm = clients["mlm"].post("/v1/topk", json={"tokens": ["w1", "[MASK]", "w2"], "k": 3}).json()
    want = clients["mlm"].app.state.snapshot.topk([{"tokens": ["w1", "[MASK]", "w2"]}], k=3).values[0]
    assert mlm["tokens"] == want.tokens and mlm["exact"] == want.exact and mlm["snapshot_step"] == 2
    assert mlm["scores"] == pytest.approx(want.scores.tolist())
    nxt = clients["next-item"].post("/v1/topk", json={"records": [{"key": "u1"}, {"tokens": ["w1"]}], "k": 2})
    body = nxt.json()
    assert nxt.status_code == 200 and [len(r["tokens"]) for r in body["results"]] == [2, 2]
    want = clients["next-item"].app.state.snapshot.topk([{"key": "u1"}], k=2).values[0]
    assert body["results"][0]["tokens"] == want.tokens


def test_topk_continues_a_prefix_and_an_empty_one_asks_for_a_first_token(clients):
    """next-token over HTTP answers as the snapshot does; ``"tokens": []`` (top-k only) is
    the empty prefix, a keyboard's suggestions before anything is typed, and an empty
    next-item history is a new key's."""
    client = clients["next-token"]
    snap = client.app.state.snapshot
    queries = [{"text": "w1 w2"}, {"tokens": []}]
    body = client.post("/v1/topk", json={"records": queries, "k": 3}).json()
    for got, want in zip(body["results"], snap.topk(queries, k=3).values):
        assert got["tokens"] == want.tokens and got["scores"] == pytest.approx(want.scores.tolist())
    assert len(body["results"][1]["tokens"]) == 3
    assert body["results"][0]["tokens"] != body["results"][1]["tokens"]  # the prefix is read
    empty = clients["next-item"].post("/v1/topk", json={"tokens": [], "k": 2})
    assert empty.status_code == 200 and len(empty.json()["tokens"]) == 2


@pytest.mark.parametrize("task", ["next-item", "next-token", "mlm"])
def test_topk_leaves_out_what_a_query_excludes_and_still_lists_k(clients, task):
    """``exclude`` (e.g. the items a user already had) takes answers out of a list, which
    is then the next best ones, k long: by key and by tokens, alone and in a batch, over
    HTTP as in Python; a bad list is a 422 that names it."""
    client = clients[task]
    query = {"key": "u1"} if task == "next-item" else {"tokens": ["w1", "[MASK]"]} if task == "mlm" else {"text": "w1 w2"}
    full = client.post("/v1/topk", json={**query, "k": 6}).json()["tokens"]
    got = client.post("/v1/topk", json={**query, "k": 4, "exclude": full[:2] + ["never-seen"]}).json()
    assert got["tokens"] == full[2:6]
    batch = client.post("/v1/topk", json={"records": [{**query, "exclude": full[:1]}, query], "k": 2}).json()
    assert [r["tokens"] for r in batch["results"]] == [full[1:3], full[:2]]
    snap = client.app.state.snapshot
    assert snap.topk([{**query, "exclude": full[:2]}], k=4).values[0].tokens == full[2:6]
    for bad in ("w1", [True], [["w1"]], [{"a": 1}]):
        r = client.post("/v1/topk", json={**query, "exclude": bad})
        assert r.status_code == 422 and "exclude" in r.text, r.text
    r = client.post("/v1/topk", json={"records": [query], "exclude": ["w1"]})
    assert r.status_code == 422 and "inside each of records" in r.text


def test_learner_topk_many_reads_a_records_exclude_list():
    learner = Learner(Config().override(*SMALL, "learner.task=next-item"))
    learner.learn_many(stream("next-item", 64, random.Random(1)))
    full = learner.topk_many([{"key": "u1"}], k=5)[0].tokens
    assert learner.topk_many([{"key": "u1", "exclude": full[:3]}], k=2)[0].tokens == full[3:5]
    ids = [learner.index.ids(full[:1])]
    assert learner.topk_many([{"key": "u1", "exclude": [full[1]]}], k=2, exclude=ids)[0].tokens == full[2:4]
    with pytest.raises(RecordError, match="exclude must be a list"):
        learner.topk_many([{"key": "u1", "exclude": "w1"}], k=2)


def test_embed_gives_a_vector_per_token(clients):
    body = clients["classify"].post("/v1/embed", json={"tokens": ["w1", 2, "new"]}).json()
    assert body["tokens"] == ["w1", "2", "new"] and body["dim"] == 16
    assert len(body["vectors"]) == 3 and {len(v) for v in body["vectors"]} == {16}


def test_task_mismatch_is_409_and_says_what_to_use(clients):
    r = clients["classify"].post("/v1/topk", json={"text": "w1"})
    assert r.status_code == 409 and r.json()["error"] == "wrong-task" and "/v1/predict" in r.json()["detail"]
    r = clients["mlm"].post("/v1/predict", json={"text": "w1"})
    assert r.status_code == 409 and "/v1/topk" in r.json()["detail"]
    assert r.json()["detail"].startswith("POST /v1/predict answers labels")  # was: "predict_proba needs ..."
    # whatever the body: a next-item query ({"key"}) sent to /v1/predict was a 422 about the schema
    for body in ({"key": "u1"}, {}, {"records": [{"key": "u1"}]}):
        r = clients["next-item"].post("/v1/predict", json=body)
        assert r.status_code == 409 and r.json()["error"] == "wrong-task" and "/v1/topk" in r.json()["detail"]
    assert clients["classify"].post("/v1/predict", json={"key": "u1"}).status_code == 422  # classify: the schema's


def test_a_query_the_library_rejects_is_a_422_saying_why(clients):
    r = clients["mlm"].post("/v1/topk", json={"key": "u1"})  # an mlm query needs text or tokens
    assert r.status_code == 422 and r.json()["error"] == "bad-record"
    assert r.json()["detail"].startswith("missing-field:") and "text" in r.json()["detail"]


def test_snapshot_and_healthz_carry_the_step(clients):
    body = clients["classify"].get("/v1/snapshot").json()
    assert body["snapshot_step"] == body["manifest"]["step"] == 2 and body["task"] == "classify"
    assert body["manifest"]["commits"] == 2 and "E" in body["manifest"]["tables"]
    health = clients["classify"].get("/healthz").json()
    assert health["status"] == "ok" and health["snapshot_step"] == 2 and health["freshness_seconds"] >= 0


def test_answers_move_to_new_checkpoints_without_a_restart(tmp_path):
    learner = Learner(Config().override(*SMALL))
    learner.learn_many(stream("classify", 16, random.Random(1)))
    with open_store(tmp_path) as store:  # the writer opens first: one environment per process
        commit(store, learner, 10)
        client = TestClient(create_app(Settings(state=str(tmp_path))))
        assert client.post("/v1/predict", json={"text": "w1"}).json()["snapshot_step"] == 10
        learner.learn_many(stream("classify", 16, random.Random(2)))
        commit(store, learner, 11)
        assert client.post("/v1/predict", json={"text": "w1"}).json()["snapshot_step"] == 11
        client.app.state.snapshot.close()


def test_concurrent_requests_share_one_snapshot_call(states):
    app = create_app(Settings(state=states["classify"]))
    snap, calls = app.state.snapshot, []
    alone = [snap.predict_proba([{"text": f"w{i} w{i + 1}"}]).values[0] for i in range(12)]
    original = snap.predict_proba
    snap.predict_proba = lambda records: calls.append(len(records)) or original(records)

    async def burst():
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://test") as client:
            return await asyncio.gather(*(client.post("/v1/predict", json={"text": f"w{i} w{i + 1}"})
                                          for i in range(12)))

    bodies = [r.json() for r in asyncio.run(burst())]
    assert sum(calls) == 12 and len(calls) < 12  # grouped, every record answered once
    for body, want in zip(bodies, alone):
        assert body["snapshot_step"] == 2 and body["probs"] == pytest.approx(want, abs=1e-6)
    snap.close()


def test_a_failing_request_in_a_group_fails_alone():
    def call(records):
        if any(r.get("bad") for r in records):
            raise RecordError("bad-value: this one")
        return Answer(5, None, [r["n"] * 10 for r in records])

    async def group():
        coalescer = _Coalescer(_QueryThread(), lambda call, records: call(records), lambda: False, max_records=64)
        requests = [[{"n": 1}], [{"n": 2}, {"n": 3}], [{"bad": True}], [{"n": 4}]]
        return await asyncio.gather(*(coalescer.run(("k",), call, r) for r in requests), return_exceptions=True)

    first, second, third, fourth = asyncio.run(group())
    assert first.values == [10] and second.values == [20, 30] and fourth.values == [40]
    assert isinstance(third, RecordError) and first.step == 5


def test_a_diverged_model_answers_nulls_not_500(tmp_path):
    learner = Learner(Config().override(*SMALL))
    learner.learn_many(stream("classify", 16, random.Random(3)))
    with torch.no_grad():
        learner.model.head.weight.fill_(float("nan"))  # what a NaN loss leaves behind
    with open_store(tmp_path) as store:
        commit(store, learner, 1)
    client = TestClient(create_app(Settings(state=str(tmp_path))))
    r = client.post("/v1/predict", json={"text": "w1"})
    assert r.status_code == 200 and set(r.json()["probs"].values()) == {None}
    r = client.post("/v1/embed", json={"text": "w1"})
    assert r.status_code == 200
    client.app.state.snapshot.close()


# ---------------------------------------------------------------------------- limits and errors

@pytest.mark.parametrize("path,body", [
    ("/v1/predict", {"tokens": [f"t{i}" for i in range(9)]}),  # max_tokens = 8
    ("/v1/predict", {"records": [{"text": "a"}] * 5}),  # max_batch = 4
    ("/v1/predict", {"records": []}),
    ("/v1/predict", {"text": "a" * (8 * 64 + 1)}),
    ("/v1/predict", {"text": "a", "tokens": ["a"]}),
    ("/v1/predict", {}),
    ("/v1/predict", {"text": "a", "label": "spam"}),
    ("/v1/predict", {"tokens": [True]}),
    ("/v1/predict", {"tokens": [1.5]}),
    ("/v1/predict", {"tokens": "a b"}),
    ("/v1/predict", {"tokens": [2**64]}),
    ("/v1/predict", [1, 2]),
    ("/v1/topk", {"text": "a", "k": 0}),
    ("/v1/topk", {"text": "a", "k": 1001}),
    ("/v1/topk", {"text": "a", "beam": "wide"}),
    ("/v1/embed", {"records": [{"key": "u1"}]}),
])
def test_invalid_requests_are_422_json(clients, path, body):
    r = clients["classify"].post(path, json=body)
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "invalid-request" and r.json()["detail"]


def test_limits_are_in_the_openapi_document(clients):
    schemas = clients["classify"].get("/openapi.json").json()["components"]["schemas"]
    tokens = schemas["QueryRequest"]["properties"]["tokens"]["anyOf"][0]
    records = schemas["QueryRequest"]["properties"]["records"]["anyOf"][0]
    assert tokens["maxItems"] == 8 and records["maxItems"] == 4
    paths = clients["classify"].get("/openapi.json").json()["paths"]
    for path in ("/v1/predict", "/v1/topk", "/v1/embed", "/v1/explain"):  # was: 200 and 422 only
        assert {"400", "401", "409", "413", "422", "503"} <= set(paths[path]["post"]["responses"]), path


def test_malformed_and_oversized_bodies_are_4xx_json(states):
    client = TestClient(create_app(Settings(state=states["classify"], service=ServiceConfig(max_body_bytes=1000))))
    for content in (b"{", b"\xff\xfe", b"null", b""):
        r = client.post("/v1/predict", content=content, headers={"content-type": "application/json"})
        assert 400 <= r.status_code < 500 and "error" in r.json()
    big = json.dumps({"text": "a " * 600}).encode()
    r = client.post("/v1/predict", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"] == "body-too-large"
    chunked = client.post("/v1/predict", content=iter([big[:500], big[500:]]),
                          headers={"content-type": "application/json"})  # no Content-Length
    assert chunked.status_code == 413 and chunked.json()["error"] == "body-too-large"
    assert client.get("/v1/nothing").status_code == 404 and client.get("/v1/nothing").json()["error"] == "not-found"
    assert client.get("/v1/predict").status_code == 405
    client.app.state.snapshot.close()


def test_start_fails_clearly_on_a_missing_or_foreign_directory(tmp_path):
    with pytest.raises(NotAStoreError, match="does not exist"):
        create_app(Settings(state=str(tmp_path / "missing")))
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "data.txt").write_text("x")
    with pytest.raises(NotAStoreError):
        create_app(Settings(state=str(tmp_path / "junk")))
    open_store(tmp_path / "empty").close()
    with pytest.raises(NoCheckpointError):
        create_app(Settings(state=str(tmp_path / "empty")))
    from streamlearn.broker import free_port

    # a port of its own: the default 8000 may be a service the developer runs beside the tests
    run = subprocess.run([sys.executable, "-m", "streamlearn.cli", "serve", "--state", str(tmp_path / "missing"),
                          "--port", str(free_port())], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"streamlearn serve: error: state directory {tmp_path / 'missing'} does not exist; "
        f"a worker creates it (--state {tmp_path / 'missing'})"]


# ---------------------------------------------------------------------------- metrics

def metric_values(text: str) -> dict:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics_export_latency_step_and_freshness(states):
    client = TestClient(create_app(Settings(state=states["classify"])))
    for _ in range(3):
        client.post("/v1/predict", json={"text": "w1"})
    client.post("/v1/predict", json={})
    values = metric_values(client.get("/metrics").text)
    assert values[("streamlearn_request_seconds_count", (("endpoint", "/v1/predict"),))] == 4
    assert values[("streamlearn_requests_total", (("code", "422"), ("endpoint", "/v1/predict")))] == 1
    assert values[("streamlearn_snapshot_step", ())] == 2
    assert 0 <= values[("streamlearn_snapshot_freshness_seconds", ())] < 600
    client.app.state.snapshot.close()


# ---------------------------------------------------------------------------- fuzzing

KEYS = st.sampled_from(["text", "tokens", "records", "key", "k", "beam", "label", ""]) | st.text(max_size=5)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20) | st.just("[MASK]"),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(KEYS, inner, max_size=5),
    max_leaves=25,
)
TOKEN = st.text(max_size=8) | st.just("[MASK]") | st.integers(min_value=-(2**64), max_value=2**64)
INPUT = (st.builds(lambda t: {"text": t}, st.text(max_size=40) | st.just("w1 [MASK] w2"))
         | st.builds(lambda t: {"tokens": t}, st.lists(TOKEN, max_size=10))
         | st.builds(lambda k: {"key": k}, TOKEN))
OPTIONS = st.fixed_dictionaries({}, optional={"k": st.integers(-2, 1200), "beam": st.none() | st.integers(-1, 20_000)})
REQUEST = st.builds(lambda q, o: {**q, **o}, INPUT | st.lists(INPUT, min_size=1, max_size=6).map(
    lambda r: {"records": r}), OPTIONS)  # mostly well formed: reaches the model with odd tokens
BODIES = (JSON | REQUEST).map(lambda v: json.dumps(v).encode()) | st.binary(max_size=64)
PATHS = st.sampled_from(["/v1/predict", "/v1/topk", "/v1/embed"])
TASKS = st.sampled_from(["classify", "mlm", "next-item"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(task=TASKS, path=PATHS, body=BODIES)
def test_fuzzed_bodies_never_get_a_5xx(clients, task, path, body):
    r = clients[task].post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code < 500, (r.status_code, r.text)
    assert "snapshot_step" in r.json() if r.status_code == 200 else "error" in r.json()


@pytest.mark.parametrize("task", ["classify", "mlm", "next-item"])
def test_schemathesis_finds_no_server_error(clients, task):
    schemathesis = pytest.importorskip("schemathesis")  # in the dev extra
    schema = schemathesis.openapi.from_asgi("/openapi.json", clients[task].app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {(op.method, op.path) for op in operations} >= {("post", "/v1/predict"), ("post", "/v1/topk")}
    for operation in operations:
        @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def call(case):
            response = case.call()
            assert response.status_code < 500, (case.body, response.text)

        call()


# ---------------------------------------------------------------------------- the CLI

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_cli_on_a_port_in_use_says_so_in_one_line_before_claiming_to_serve(states, workers):
    """Was: INFO "serving ... on http://127.0.0.1:PORT", then uvicorn's [Errno 98] and exit 3."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        run = subprocess.run([sys.executable, "-m", "streamlearn.cli", "serve", "--state", states["classify"],
                              "--port", str(port), "--workers", workers], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert "serving" not in run.stderr
    assert run.stderr.strip().splitlines()[-1] == (
        f"streamlearn serve: error: cannot listen on 127.0.0.1:{port}: Address already in use: choose another "
        "--port (or --host), or stop what holds it")


def test_cli_with_workers_refuses_a_bad_device_in_one_line(states):
    """Was: each server process died with a ConfigError traceback and was restarted without end."""
    run = subprocess.run([sys.executable, "-m", "streamlearn.cli", "serve", "--state", states["classify"],
                          "--port", "0", "--workers", "2", "--device", "nonsense"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.strip().splitlines()[-1] == ("streamlearn serve: error: learner.device='nonsense' is not a "
                                                    "device: use auto, cpu or cuda[:N]")


def test_a_server_process_that_cannot_start_says_why_and_exits_as_a_startup_failure(tmp_path, capsys):
    """uvicorn's supervisor stops on its STARTUP_FAILURE status (3); any other exit is
    restarted, so a process that can never start must exit 3, in one line."""
    from uvicorn.config import STARTUP_FAILURE

    from streamlearn.cli.serve import AppFactory

    factory = pickle.loads(pickle.dumps(AppFactory(Settings(state=str(tmp_path / "gone")), child=True)))
    with pytest.raises(SystemExit) as exited:
        factory()
    assert exited.value.code == STARTUP_FAILURE
    assert capsys.readouterr().err.strip().splitlines() == [
        f"streamlearn serve: error: state directory {tmp_path / 'gone'} does not exist; a worker creates it "
        f"(--state {tmp_path / 'gone'})"]
    with pytest.raises(NotAStoreError):  # in the one-process server the error is the command's own
        AppFactory(Settings(state=str(tmp_path / "gone")))()


def test_cli_serves_with_two_workers_and_merges_their_metrics(states):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "streamlearn.cli", "serve", "--state", states["classify"],
                             "--port", str(port), "--workers", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx2.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx2.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "serve did not start"
            time.sleep(0.3)
        with httpx2.Client(base_url=base, timeout=10) as client:
            for _ in range(20):  # new connections: the kernel spreads them over the workers
                with httpx2.Client(base_url=base, timeout=10) as one:
                    assert one.post("/v1/predict", json={"text": "w1"}).json()["snapshot_step"] == 2
            # A request is observed after its response is sent: the last one may land a moment
            # after the client has its answer, in the other worker.
            count = ("streamlearn_request_seconds_count", (("endpoint", "/v1/predict"),))
            for _ in range(50):
                values = metric_values(client.get("/metrics").text)
                if values.get(count) == 20:
                    break
                time.sleep(0.1)
        assert values[count] == 20
        assert values[("streamlearn_snapshot_step", ())] == 2
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_serve_refuses_a_set_of_a_key_it_does_not_read(states, capsys):
    """Was: `serve --set learner.beam=3` started and answered with the stored beam."""
    from streamlearn.cli import main

    assert main(["serve", "--state", states["classify"], "--port", "0", "--set", "learner.beam=3"]) == 2
    assert "serve --set learner.beam: serve reads only [service] keys" in capsys.readouterr().err


@pytest.mark.parametrize("wait", ["nan", "inf", "-5"])
def test_serve_refuses_a_wait_that_is_not_a_number_of_seconds(states, capsys, wait):
    """Was: nan and inf waited for ever ('waiting up to nan s'), -5 was taken as 0."""
    from streamlearn.cli import main

    assert main(["serve", "--state", states["classify"], "--port", "0", "--wait", wait]) == 2
    assert "--wait must be a number of seconds >= 0" in capsys.readouterr().err


def test_serving_beyond_this_machine_without_a_token_is_warned(caplog):
    """Was: `serve --host 0.0.0.0` with no token started without a word."""
    import logging

    from streamlearn.cli.serve import auth_note
    from streamlearn.config import ServiceConfig
    from streamlearn.service import Settings

    with caplog.at_level(logging.WARNING, logger="streamlearn.cli.serve"):
        assert auth_note(Settings(state="s", service=ServiceConfig(host="127.0.0.1"))) == " (no authentication)"
        assert not caplog.records
        auth_note(Settings(state="s", service=ServiceConfig(host="0.0.0.0")))
    assert "serving on 0.0.0.0 without a token" in caplog.text
