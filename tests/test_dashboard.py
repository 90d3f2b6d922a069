"""The dashboard's page and data, without a browser (tests/test_dashboard_browser.py drives
the page in Chromium): the page comes from the package alone, and /v1/dashboard reads the
live history and the model card from the state."""
import re
import shutil
from importlib import resources

import pytest
from fastapi.testclient import TestClient

from streamlearn.config import Config
from streamlearn.dashboard import card_keys, model_card
from streamlearn.learner import Learner
from streamlearn.service import Settings, create_app
from streamlearn.service_auth import SESSION_COOKIE, BearerToken
from streamlearn.state import open_store
from test_snapshot import SMALL, commit

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WEB = resources.files("streamlearn").joinpath("web")


@pytest.fixture(scope="module")
def state(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("dash") / "state"
    lrn = Learner(Config().override(*SMALL, "learner.nb_alpha=0.5"))
    lrn.learn_many([{"text": "free prize", "label": "spam"}, {"text": "at noon", "label": "ham"}] * 4)
    with open_store(path) as store:
        commit(store, lrn, 1)
    return str(path)


@pytest.fixture(scope="module")
def client(state):
    with TestClient(create_app(Settings(state=state))) as c:
        yield c


def test_the_page_and_its_assets_come_from_the_package(client):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    refs = re.findall(r'(?:src|href)="([^"]*)"', page.text)
    assert "/ui/dashboard.js" in refs and "/ui/dashboard.css" in refs
    assert all(r.startswith(("/", "data:")) for r in refs), refs  # nothing from another host
    for name, kind in (("dashboard.js", "text/javascript"), ("dashboard.css", "text/css")):
        asset = client.get(f"/ui/{name}")
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind)
    assert client.get("/ui/../dashboard.py").status_code == 404
    assert client.get("/ui/index.html").status_code == 404


def test_no_asset_reaches_for_the_network():
    """No CDN, no font service: the only absolute URL is the SVG namespace, a name that is
    never fetched."""
    for name in ("index.html", "dashboard.js", "dashboard.css"):
        text = WEB.joinpath(name).read_text(encoding="utf-8")
        urls = set(re.findall(r"[a-z]+://[^\s\"')]+", text)) - {"http://www.w3.org/2000/svg"}
        assert not urls, f"{name} names {urls}"
        assert "@import" not in text and "url(" not in text


def test_a_state_without_live_figures_still_has_its_card(client):
    body = client.get("/v1/dashboard").json()
    assert body["points"] == [] and body["snapshot_step"] == 1 and body["freshness_seconds"] >= 0
    card = body["card"]
    assert card["task"] == "classify" and card["labels"] == ["spam", "ham"] and card["labels_seen"] == 2
    assert list(card["config"]) == [k for k in card_keys("classify") if k in card["config"]]
    assert card["config"]["learner.nb_weight"] > 0  # a key only classify reads is on its card
    assert card["config"]["embedding.K"] == 2000 and card["changed"]["learner.nb_alpha"] == 0.5 \
        and "embedding.K" not in card["changed"]
    tables = {t["name"]: t for t in card["tables"]}
    assert tables["E"]["rows"] == 256 and tables["E"]["bytes"] == 256 * 16 * 4
    assert 0 < tables["P"]["stored"] < tables["P"]["rows"]  # a few tokens: a sliver of P is filled


def test_a_token_tasks_card_shows_what_its_defaults_set_and_not_classifys_keys():
    keys = card_keys("next-token")
    assert {"model.output", "model.counts", "model.negatives", "model.positions"} <= set(keys)
    assert "learner.nb_weight" not in keys and len(keys) == len(set(keys))


def test_an_old_states_card_shows_the_keys_it_is_older_than_as_it_runs_them():
    """A state stored before a model key existed runs with the value that behaves as before
    (checkpoint.ABSENT_KEYS); its card showed nothing for the key (was: count_fit and
    recent_pairs missing from a next-token card, so it read as today's model)."""
    from types import SimpleNamespace

    stored = Config().override("learner.task=next-token").to_dict()
    for section, name in (("model", "count_fit"), ("model", "recent_pairs"), ("learner", "nb_skip_unseen")):
        del stored[section][name]
    card = model_card(SimpleNamespace(config=stored, tables={}), {}, [])
    assert card["config"]["model.recent_pairs"] == 0
    assert card["changed"]["model.count_fit"] == "joint"
    assert "model.count_fit" not in stored["model"]  # the stored dict is left as it is


def test_nothing_new_is_a_small_answer(client):
    first = client.get("/v1/dashboard").json()
    again = client.get("/v1/dashboard", params={"since": first["commits"]}).json()
    assert again["unchanged"] is True and "points" not in again and again["commits"] == first["commits"]
    assert client.get("/v1/dashboard", params={"since": first["commits"] - 1}).json()["unchanged"] is False


# ---------------------------------------------------------------------------- the service token

TOKEN = "dash-Token_0123456789abcdef"


@pytest.fixture(scope="module")
def guarded(state):
    with TestClient(create_app(Settings(state=state, token=BearerToken(TOKEN)))) as c:
        yield c


def test_with_a_token_a_browser_gets_the_login_page_and_a_script_a_json_401(guarded):
    page = guarded.get("/", headers={"accept": "text/html,application/xhtml+xml"})
    assert page.status_code == 401 and page.headers["content-type"].startswith("text/html")
    assert page.headers["www-authenticate"] == 'Bearer realm="streamlearn"'  # as every 401 (was: none)
    assert 'id="login"' in page.text and "fetch(\"/login\"" in page.text
    for path in ("/", "/ui/dashboard.js", "/v1/dashboard"):
        r = guarded.get(path)
        assert r.status_code == 401 and r.json()["error"] == "unauthorized", path
    r = guarded.post("/v1/explain", json={"text": "free prize"})
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    assert guarded.get("/healthz").status_code == 200
    bearer = {"authorization": f"Bearer {TOKEN}"}
    assert guarded.get("/", headers=bearer).status_code == 200
    assert guarded.get("/v1/dashboard", headers=bearer).json()["snapshot_step"] == 1
    assert guarded.post("/v1/explain", json={"text": "free prize"}, headers=bearer).json()["output"] == "spam"
    assert guarded.get("/", headers={"authorization": "Bearer wrong-token-0123456789"}).status_code == 401


def test_logging_in_gives_a_session_cookie_that_opens_the_page_its_data_and_explain(guarded):
    wrong = guarded.post("/login", json={"token": "not-the-token-0123456789"})
    assert wrong.status_code == 401 and wrong.json()["error"] == "unauthorized" and not wrong.cookies
    form = guarded.post("/login", content=b"token=x")  # JSON only, like every body
    assert form.status_code == 400 and '{"token": "..."}' in form.json()["detail"]  # was: {"text": "..."}
    ok = guarded.post("/login", json={"token": TOKEN})
    cookie = ok.headers["set-cookie"]
    assert ok.status_code == 200 and SESSION_COOKIE in cookie
    assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower() and TOKEN not in cookie
    session = {SESSION_COOKIE: ok.cookies[SESSION_COOKIE]}
    client = TestClient(guarded.app, cookies=session)
    assert client.get("/").status_code == 200 and client.get("/ui/dashboard.js").status_code == 200
    assert client.get("/v1/dashboard").status_code == 200
    assert client.post("/v1/explain", json={"text": "free prize"}).status_code == 200
    assert client.post("/v1/predict", json={"text": "free prize"}).status_code == 200  # the same door as the API
    forged = TestClient(guarded.app, cookies={SESSION_COOKIE: "0" * 64})
    assert forged.get("/v1/dashboard").status_code == 401


def test_without_a_token_there_is_no_login(client):
    assert client.post("/login", json={"token": TOKEN}).status_code == 404


def test_a_deleted_state_directory_is_a_503_for_the_page_data_too(tmp_path):
    path = tmp_path / "state"
    lrn = Learner(Config().override(*SMALL))
    lrn.learn_many([{"text": "a b", "label": "x"}])
    with open_store(path) as store:
        commit(store, lrn, 1)
    with TestClient(create_app(Settings(state=str(path)))) as c:
        assert c.get("/v1/dashboard").status_code == 200
        shutil.rmtree(path)
        r = c.get("/v1/dashboard")
        assert r.status_code == 503 and r.json()["error"] == "snapshot-unavailable" and "deleted" in r.json()["detail"]
