"""The dashboard's page and data, without a browser (tests/test_dashboard_browser.py drives
the page in Chromium): the page comes from the package alone, and /v1/dashboard reads the
live history and the model card from the state."""
import re
from importlib import resources

import pytest
from fastapi.testclient import TestClient

from streamlearn.config import Config
from streamlearn.dashboard import CARD_KEYS
from streamlearn.learner import Learner
from streamlearn.service import Settings, create_app
from streamlearn.state import open_store
from test_snapshot import SMALL, commit

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WEB = resources.files("streamlearn").joinpath("web")


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    path = tmp_path_factory.mktemp("dash") / "state"
    lrn = Learner(Config().override(*SMALL, "learner.nb_alpha=0.5"))
    lrn.learn_many([{"text": "free prize", "label": "spam"}, {"text": "at noon", "label": "ham"}])
    with open_store(path) as store:
        commit(store, lrn, 1)
    app = create_app(Settings(state=str(path)))
    with TestClient(app) as c:
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
    assert list(card["config"]) == [k for k in CARD_KEYS if k in card["config"]]
    assert card["config"]["embedding.K"] == 2000 and card["changed"]["learner.nb_alpha"] == 0.5 \
        and "embedding.K" not in card["changed"]
    tables = {t["name"]: t for t in card["tables"]}
    assert tables["E"]["rows"] == 256 and tables["E"]["bytes"] == 256 * 16 * 4
    assert 0 < tables["P"]["stored"] < tables["P"]["rows"]  # a few tokens: a sliver of P is filled


def test_nothing_new_is_a_small_answer(client):
    first = client.get("/v1/dashboard").json()
    again = client.get("/v1/dashboard", params={"since": first["commits"]}).json()
    assert again["unchanged"] is True and "points" not in again and again["commits"] == first["commits"]
    assert client.get("/v1/dashboard", params={"since": first["commits"] - 1}).json()["unchanged"] is False
