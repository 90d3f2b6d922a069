"""The dashboard as a person uses it: headless Chromium (Playwright) on the page of a real
`streamlearn serve`, while a real `streamlearn worker` learns the bundled SMS collection
from the embedded broker. The service runs with a token: the page asks for it first. Then it
loads without console errors, its charts move as the worker checkpoints, and the try-it
box shows the query's tokens coloured by contribution.

Needs Debian's chromium (``apt-get install -y chromium``; ``.ci/run`` installs it) and
the playwright package (the [dev] extra); skipped, saying which is missing, without them.
``STREAMLEARN_SCREENSHOTS=docs/img`` writes the screenshots the docs and README show
(otherwise they go to the test's temporary directory).
"""
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from streamlearn.broker import free_port, produce_rows
from streamlearn.datasets import DatasetReader, bundled_path

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # the [dev] extra installs it
    sync_playwright = None

pytestmark = [
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK),
                       reason="needs Debian's chromium at /usr/bin/chromium: apt-get install -y chromium "
                              "(.ci/run installs it)"),
    pytest.mark.skipif(sync_playwright is None, reason="needs playwright: pip install -e '.[dev]'"),
]

SPAM = "WINNER!! You have won a free prize, call now to claim your cash reward"
TOKEN = "browser-Token_0123456789abcdef"  # serve runs with --token-file: the page logs in first


def cli(*args: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "streamlearn.cli", *args], stdout=log.open("w"),
                            stderr=subprocess.STDOUT)


class Trickle(threading.Thread):
    """Writes the SMS collection a chunk at a time (with a few undecodable messages), so
    the worker keeps learning while the page is watched."""

    def __init__(self, bootstrap: str, topic: str):
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.stop = bootstrap, topic, threading.Event()
        self.rows = list(DatasetReader(bundled_path("SMSSpamCollection")))

    def run(self) -> None:
        from kafka import KafkaProducer

        raw = KafkaProducer(bootstrap_servers=self.bootstrap)
        try:
            for start in range(0, len(self.rows), 40):
                if self.stop.is_set():
                    return
                produce_rows(self.bootstrap, self.topic, self.rows[start:start + 40])
                if start % 800 == 0:
                    raw.send(self.topic, b"\xff\x00 not a record")
                    raw.flush()
                time.sleep(0.25)
        finally:
            raw.close()


def wait_until(check, timeout_s: float, what: str, every_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
            return json.load(r)["status"] == "ok"
    except OSError:
        return False


@pytest.fixture
def running(broker, make_topic, tmp_path):
    """A worker learning a trickling topic and a service on its state: the page's URL and
    the trickle (stop it to leave the worker idle)."""
    topic, state, port = make_topic(2), tmp_path / "state", free_port()
    trickle = Trickle(broker, topic)
    trickle.start()
    worker = cli("worker", "--topic", topic, "--state", str(state), "--bootstrap", broker,
                 "--set", "worker.checkpoint_seconds=1", "--set", "worker.eval_every=1",
                 log=tmp_path / "worker.log")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    serve = cli("serve", "--state", str(state), "--port", str(port), "--wait", "90", "--token-file", str(token_file),
                log=tmp_path / "serve.log")
    try:
        wait_until(lambda: healthy(port) or serve.poll() is not None, 120, "serve to answer /healthz")
        assert serve.poll() is None, (tmp_path / "serve.log").read_text()
        yield f"http://127.0.0.1:{port}/", trickle
    finally:
        trickle.stop.set()
        for proc in (serve, worker):
            proc.terminate()
        for proc in (serve, worker):
            proc.wait(30)
        trickle.join(10)


def screenshots_dir(tmp_path: Path) -> Path:
    where = os.environ.get("STREAMLEARN_SCREENSHOTS")
    return Path(where) if where else tmp_path


def chart(page, name: str) -> dict:
    return page.eval_on_selector(f"#chart-{name}", "e => ({points: +(e.dataset.points || 0), "
                                 "lastX: +(e.dataset.lastX || 0)})")


def legend_overflow(page, name: str) -> list[str]:
    """The legend entries of a chart that end past its right edge (cut off)."""
    return page.eval_on_selector(f"#chart-{name}", "svg => [...svg.querySelectorAll('text.legend')].filter("
                                 "t => t.getBBox().x + t.getBBox().width > svg.clientWidth).map(t => t.textContent)")


def test_the_page_shows_the_worker_learning_and_explains_a_query(running, tmp_path):
    url, trickle = running
    shots = screenshots_dir(tmp_path)
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(url)
            page.fill("#token", "not-the-token-0123456789")  # the login page: a wrong token is refused
            page.click("button[type=submit]")
            page.wait_for_selector("#error:not([hidden])")
            assert "not this service's token" in page.text_content("#error")
            page.fill("#token", TOKEN)
            page.click("button[type=submit]")
            page.wait_for_selector("#chart-quality")
            errors.clear()  # the login page's refusals were 401s, logged as such: the dashboard starts here

            first = wait_until(lambda: chart(page, "quality")["points"] and chart(page, "quality"), 90,
                               "the prequential chart's first points")
            moved = wait_until(lambda: chart(page, "quality")["lastX"] > first["lastX"] and chart(page, "quality"),
                               60, "the chart to move on with the stream")
            assert moved["points"] > first["points"]
            assert chart(page, "rate")["points"] > 0 and chart(page, "ckpt")["points"] > 0
            assert page.text_content("#task") == "task classify"
            assert page.get_attribute("#status", "data-state") == "live"
            assert int(page.text_content("#tile-step .value").replace("k", "")) > 0
            wait_until(lambda: page.locator("#card-tables tbody tr").count() >= 3, 10, "the model card")
            wait_until(lambda: chart(page, "dead")["points"] > 0, 60, "dead letters on their chart")
            if os.environ.get("STREAMLEARN_SCREENSHOTS"):  # pictures for the docs: most of the stream learned
                wait_until(lambda: chart(page, "quality")["lastX"] >= 4000, 90, "4,000 records learned")

            page.fill("#tryit-text", SPAM)
            page.click("#tryit-go")
            page.wait_for_selector("#tryit-tokens .tok", timeout=30_000)
            tokens = page.eval_on_selector_all(
                "#tryit-tokens .tok", "ts => ts.map(t => [t.textContent, +t.dataset.contribution, "
                "getComputedStyle(t).backgroundColor])")
            assert [t for t, _, _ in tokens][:3] == ["winner", "!", "!"]
            coloured = [(t, c, bg) for t, c, bg in tokens if bg not in ("rgba(0, 0, 0, 0)", "transparent")]
            assert len(coloured) == len(tokens)  # every token is coloured by its contribution
            green = {t for t, c, bg in coloured if c > 0 and bg.startswith("rgba(22, 163, 74")}
            assert {"free", "prize"} <= green, tokens
            assert page.text_content("#tryit-answer").startswith("→ spam")
            page.screenshot(path=str(shots / "dashboard.png"), full_page=True)
            page.locator("#tryit").screenshot(path=str(shots / "dashboard-tryit.png"))

            page.fill("#tryit-output", "not-a-label")  # a failed query hides the last answer
            before = len(errors)
            page.click("#tryit-go")
            page.wait_for_selector("#tryit-error:not([hidden])")
            errors[before:] = [e for e in errors[before:] if "status of 422" not in e]  # the browser logs the 422
            assert "not-a-label" in page.text_content("#tryit-error") and page.is_hidden("#tryit-result")

            trickle.stop.set()  # the worker catches up and goes quiet: no checkpoint, no point
            wait_until(lambda: "caught up, or stopped" in page.text_content("#status"), 120, "the page to say so")
            assert page.text_content("#tile-rate .value") == "0"

            # six dead-letter reasons in a chart 300 px wide: every name shows, on as many rows as it takes
            rows = page.evaluate("""() => {
                const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
                svg.id = "chart-narrow"; svg.style.width = "300px"; svg.style.height = "200px";
                document.body.append(svg);
                const names = ["bad-value", "empty-value", "invalid-json", "missing-field", "not-msgpack-or-json",
                               "wrong-type"];
                window.streamlearnDashboard.drawChart(svg, names.map((n, i) => ({name: n, points: [[0, i], [1, i]]})),
                                                      {x: "time"});
                return new Set([...svg.querySelectorAll("text.legend")].map(t => t.getAttribute("y"))).size;
            }""")
            assert rows > 1 and not legend_overflow(page, "narrow")
        finally:
            browser.close()
    assert not errors, errors
