"""The service when its state goes bad, or a query is slow: a state directory deleted,
replaced or damaged under a running service answers 503 with a JSON error (never a 500,
never a crash) and /healthz says so; model work runs off the event loop, so /healthz
answers while a query computes; `serve --wait` waits for the directory to appear, and
`serve --token-file` guards the endpoints."""
import asyncio
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

import httpx2
import pytest
from fastapi.testclient import TestClient

from streamlearn.config import Config, ServiceConfig
from streamlearn.learner import Learner
from streamlearn.service import INLINE_TOKENS, Settings, create_app
from streamlearn.state import open_store
from test_service import free_port, make_state, metric_values
from test_snapshot import SMALL, commit, stream

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Root page of every named LMDB database of a state directory, read in a process of its
# own (LMDB forbids opening one environment twice in a process). The main database maps
# each name to its MDB_db record, whose last field is the root page number.
ROOTS = r"""
import json, lmdb, struct, sys
env = lmdb.open(sys.argv[1], readonly=True, lock=False)
with env.begin() as txn:
    roots = {k.decode(): struct.unpack("<IHHQQQQQ", v)[7] for k, v in txn.cursor() if len(v) == 48}
print(json.dumps({"psize": env.stat()["psize"], "roots": roots}))
"""


def damage(state: str, prefix: str) -> list[str]:
    """Zero the root page of every database whose name starts with ``prefix``, as a bad
    disk or a stray write would: LMDB then refuses to read it (MDB_CORRUPTED)."""
    out = subprocess.run([sys.executable, "-c", ROOTS, state], capture_output=True, text=True, check=True)
    info = json.loads(out.stdout)
    hit = sorted(name for name in info["roots"] if name.startswith(prefix))
    with open(os.path.join(state, "data.mdb"), "r+b") as f:
        for name in hit:
            f.seek(info["roots"][name] * info["psize"])
            f.write(bytes(info["psize"]))
    assert hit, f"no database starts with {prefix!r}: {sorted(info['roots'])}"
    return hit


def assert_unavailable(response, *words: str) -> None:
    assert response.status_code == 503, response.text
    body = response.json()
    assert body["error"] == "snapshot-unavailable"
    for word in words:
        assert word in body["detail"], body["detail"]


@pytest.fixture
def served(tmp_path):
    state = make_state(tmp_path / "state", "classify", 2)
    client = TestClient(create_app(Settings(state=state)))
    yield state, client
    client.app.state.snapshot.close()


# ---------------------------------------------------------------------------- the state goes bad

def test_a_deleted_state_directory_is_503_and_healthz_says_so(served):
    state, client = served
    assert client.post("/v1/predict", json={"text": "w1 w2"}).status_code == 200
    assert client.get("/healthz").json()["status"] == "ok"
    shutil.rmtree(state)  # the mapped file lives on: today's answers would come from it forever
    for response in (client.post("/v1/predict", json={"text": "w1 w2"}), client.get("/v1/snapshot")):
        assert_unavailable(response, "deleted", state, "restart streamlearn serve")
    health = client.get("/healthz")
    assert_unavailable(health, "deleted")
    assert health.json()["status"] == "unavailable" and health.json()["snapshot_step"] == 2
    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    assert metric_values(metrics.text)[("streamlearn_snapshot_available", ())] == 0


def test_a_state_directory_moved_away_and_back_is_healthy_again_without_a_query(served):
    """Was: /healthz kept the query's 'was deleted' (503) until the next query succeeded,
    and a deployment that routes traffic by /healthz sends none."""
    state, client = served
    os.rename(state, state + ".away")
    assert_unavailable(client.post("/v1/predict", json={"text": "w1 w2"}), "deleted")
    os.rename(state + ".away", state)
    assert client.get("/healthz").status_code == 200
    assert metric_values(client.get("/metrics").text)[("streamlearn_snapshot_available", ())] == 1


def test_a_replaced_state_directory_is_503(served):
    state, client = served
    other = make_state(pathlib.Path(state).parent / "other", "classify", 1)
    shutil.rmtree(state)
    os.rename(other, state)  # another store at the same path, as a restore from a backup makes
    assert_unavailable(client.post("/v1/predict", json={"text": "w1"}), "replaced", "restart streamlearn serve")
    assert client.get("/healthz").status_code == 503


def test_a_state_file_cut_short_is_503_not_a_crash(served):
    state, client = served
    assert client.post("/v1/predict", json={"text": "w1 w2"}).status_code == 200
    data = os.path.join(state, "data.mdb")
    os.truncate(data, os.path.getsize(data) // 2)  # a read of the mapped pages past the end would be SIGBUS
    assert_unavailable(client.post("/v1/predict", json={"tokens": ["never-read-before"]}), "cut short")
    assert_unavailable(client.get("/healthz"), "cut short")
    assert metric_values(client.get("/metrics").text)[("streamlearn_snapshot_available", ())] == 0


def test_rows_the_store_cannot_read_are_503_and_healthz_says_so(served):
    state, client = served
    assert client.get("/healthz").status_code == 200
    damage(state, "rows:E:")
    # Rows read at this checkpoint are in memory: a query on them still answers.
    unseen = client.post("/v1/predict", json={"tokens": ["never-read-before"]})
    assert_unavailable(unseen, "damaged", "MDB_CORRUPTED", "restore the directory")
    # The manifest still reads, yet the replica cannot answer: /healthz keeps the failure.
    assert_unavailable(client.get("/healthz"), "damaged")
    assert metric_values(client.get("/metrics").text)[("streamlearn_snapshot_available", ())] == 0


def test_a_checkpoint_the_store_cannot_read_is_503_when_advancing(tmp_path):
    learner = Learner(Config().override(*SMALL))
    learner.learn_many(stream("classify", 16, random.Random(1)))
    with open_store(tmp_path) as store:  # the writer opens first: one environment per process
        commit(store, learner, 1)
        client = TestClient(create_app(Settings(state=str(tmp_path))))
        assert client.post("/v1/predict", json={"text": "w1"}).json()["snapshot_step"] == 1
        learner.learn_many(stream("classify", 16, random.Random(2)))
        commit(store, learner, 2)
        damage(str(tmp_path), "blobs")  # the new checkpoint's dense weights and metadata
        assert_unavailable(client.post("/v1/predict", json={"text": "w1"}), "damaged", str(tmp_path))
        assert_unavailable(client.get("/healthz"), "damaged")
        client.app.state.snapshot.close()


# ---------------------------------------------------------------------------- off the event loop

@pytest.mark.parametrize("task,path,body", [
    ("classify", "/v1/predict", {"records": [{"tokens": [f"w{i}" for i in range(100)]}] * (INLINE_TOKENS // 100 + 1)}),
    ("classify", "/v1/embed", {"tokens": ["w1"] * (INLINE_TOKENS + 1)}),
    ("mlm", "/v1/topk", {"tokens": ["w1", "[MASK]"]}),  # decoding: never small
])
def test_healthz_answers_while_a_large_query_computes(tmp_path, task, path, body):
    """A query over INLINE_TOKENS, or any top-k query, runs on the query thread; it is
    held there until /healthz has answered: with queries on the event loop, /healthz
    could only answer after it (and the hold times out)."""
    limits = ServiceConfig(max_tokens=INLINE_TOKENS + 1, max_request_tokens=10 * INLINE_TOKENS)
    app = create_app(Settings(state=make_state(tmp_path, task, 1), service=limits))
    snapshot, verb = app.state.snapshot, path.rsplit("/", 1)[1]
    name = {"predict": "predict_proba", "embed": "embed", "topk": "topk"}[verb]
    started, release = threading.Event(), threading.Event()
    call = getattr(snapshot, name)

    def held(records, **options):
        started.set()
        release.wait(timeout=30)
        return call(records, **options)

    setattr(snapshot, name, held)

    async def scenario():
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://test") as http:
            slow = asyncio.create_task(http.post(path, json=body))
            assert await asyncio.to_thread(started.wait, 30)
            health = await http.get("/healthz")
            pending = not slow.done()
            release.set()
            return health, pending, await slow

    health, pending, slow = asyncio.run(scenario())
    snapshot.close()
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert pending, "/healthz answered only after the query"
    assert slow.status_code == 200 and slow.json()["snapshot_step"] == 1


# ---------------------------------------------------------------------------- serve --wait

def test_serve_waits_for_the_state_directory_to_appear_and_takes_its_token_from_a_file(tmp_path):
    state, port, token = tmp_path / "state", free_port(), "file-Token_0123456789abcdef"
    (tmp_path / "token").write_text(token + "\n")
    (tmp_path / "token").chmod(0o600)
    env = {k: v for k, v in os.environ.items() if k != "STREAMLEARN_SERVE_TOKEN"}
    proc = subprocess.Popen([sys.executable, "-m", "streamlearn.cli", "serve", "--state", str(state),
                             "--port", str(port), "--wait", "120", "--token-file", str(tmp_path / "token")],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    try:
        for line in proc.stderr:  # the directory does not exist yet: serve says it waits
            if "waiting up to 120 s" in line:
                assert str(state) in line
                break
        else:
            pytest.fail(f"serve exited ({proc.wait()}) instead of waiting for {state}")
        threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
        make_state(state, "classify", 1)  # what a worker started alongside would do
        deadline = time.monotonic() + 90
        while True:
            try:
                health = httpx2.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except httpx2.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, "serve did not start"
                time.sleep(0.3)
        assert health.status_code == 200 and health.json()["snapshot_step"] == 1
        url = f"http://127.0.0.1:{port}/v1/predict"
        assert httpx2.post(url, json={"text": "w1"}, timeout=10).status_code == 401
        answer = httpx2.post(url, json={"text": "w1"}, headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert answer.status_code == 200 and answer.json()["snapshot_step"] == 1
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
