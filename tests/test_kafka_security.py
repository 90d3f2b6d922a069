"""The [kafka] section reaches every client we build, against real TLS and a real SASL broker.

TLS: Tansu 0.6.0 does not serve TLS itself (its ``--cert`` and ``--key`` options exclude each
other), so a TLS-terminating front (Python's ssl, requiring a client certificate: mutual
TLS) listens on the port the broker advertises and forwards to its plain listener, the way
a TLS proxy or load balancer fronts a cluster. Certificates come from the openssl CLI.

SASL: Tansu with ``--authentication`` runs the SCRAM exchange, but with memory storage no
user can be created (creating one needs a logged-in client), so the tests prove that our
SCRAM options reach the broker (it answers ``unknown-user`` to our user name) and that the
rejection surfaces as a clear error, not a hang.
"""
from __future__ import annotations

import json
import logging
import shutil
import socket
import ssl
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from kafka.errors import KafkaError

from conftest import GROUP_TIMEOUTS

from streamlearn.broker import BrokerError, EmbeddedBroker, create_topic, produce_rows, topic_partitions
from streamlearn.cli import WIRE_LOGGERS, main
from streamlearn.config import REDACTED, Config, load_config
from streamlearn.consumers import RunOptions, Worker
from streamlearn.consumers.connect import StartUp, dlq_partitions, new_consumer, new_producer
from streamlearn.exceptions import ConfigError
from streamlearn.replay import KafkaRange, KafkaSource, ReplaySourceError

from test_replay import TINY, words_stream

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI for certificates")

KEY_PASSWORD = "key-pass-" + uuid.uuid4().hex[:8]
SASL_PASSWORD = "sasl-pass-" + uuid.uuid4().hex[:8]


# ---------------------------------------------------------------------------- certificates

def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _signed_cert(d: Path, name: str, subject: str, ext: str, key_args: tuple[str, ...] = ()) -> None:
    """An EC key ``name.key`` and a certificate ``name.pem`` signed by ``ca``."""
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", *key_args,
             "-out", f"{name}.key", cwd=d)
    passin = ("-passin", f"pass:{KEY_PASSWORD}") if key_args else ()
    _openssl("req", "-new", "-key", f"{name}.key", *passin, "-subj", subject, "-out", f"{name}.csr", cwd=d)
    (d / f"{name}.ext").write_text(ext)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """ca.pem; server.pem/.key for 127.0.0.1; client.pem and client.key (encrypted with KEY_PASSWORD)."""
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=streamlearn test CA", cwd=d)
    _signed_cert(d, "server", "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _signed_cert(d, "client", "/CN=streamlearn-client", "extendedKeyUsage=clientAuth\n",
                 ("-aes256", "-pass", f"pass:{KEY_PASSWORD}"))
    return d


# ---------------------------------------------------------------------------- a TLS front

def serve_each_connection(listener: socket.socket, serve) -> None:
    """Accept on ``listener`` in a daemon thread until it is closed, each connection served
    by ``serve(conn)`` in a thread of its own."""
    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()


class TlsFront:
    """Accepts mutual-TLS connections on a free port and pipes each to ``upstream``."""

    def __init__(self, pki: Path):
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki / "ca.pem"))
        self.context.load_cert_chain(str(pki / "server.pem"), str(pki / "server.key"))
        self.context.verify_mode = ssl.CERT_REQUIRED
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.upstream: tuple[str, int] | None = None
        self.handshake_failures = 0
        serve_each_connection(self.listener, self._serve)

    def _serve(self, raw: socket.socket) -> None:
        raw.settimeout(5)
        try:
            tls = self.context.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError):
            self.handshake_failures += 1
            raw.close()
            return
        tls.settimeout(None)
        try:
            plain = socket.create_connection(self.upstream)
        except OSError:
            tls.close()
            return
        threading.Thread(target=_pipe, args=(plain, tls), daemon=True).start()
        _pipe(tls, plain)

    def close(self) -> None:
        self.listener.close()  # its accept thread ends


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.close()
            except OSError:
                pass


@pytest.fixture(scope="module")
def tls_broker(pki):
    """``127.0.0.1:PORT`` of a broker reachable only over mutual TLS."""
    front = TlsFront(pki)
    broker = EmbeddedBroker(advertised=f"127.0.0.1:{front.port}").start()
    front.upstream = ("127.0.0.1", broker.port)
    try:
        yield f"127.0.0.1:{front.port}"
    finally:
        front.close()
        broker.stop()


@pytest.mark.broker  # a broker of its own, advertising its plaintext port
def test_a_tls_bootstrap_that_advertises_a_plaintext_port_fails_in_time(pki, tls_config):
    """A TLS front before a broker that advertises its own plaintext port (a TLS load
    balancer before brokers whose advertised listeners name their plain ports). Was: produce,
    replay and a worker hung for good in kafka-python's TLS handshake with the advertised
    port, deaf to --timeout, --connect-timeout and a first SIGTERM."""
    front = TlsFront(pki)
    broker = EmbeddedBroker().start()  # advertises its own plaintext listener
    front.upstream = ("127.0.0.1", broker.port)
    bootstrap = f"127.0.0.1:{front.port}"
    try:
        for call in (lambda: create_topic(bootstrap, "t", timeout_s=1, security=tls_config.kafka),
                     lambda: topic_partitions(bootstrap, "t", timeout_s=1, security=tls_config.kafka)):
            started = time.monotonic()
            with pytest.raises(BrokerError, match="did not finish within .* advertised listeners"):
                call()
            assert time.monotonic() - started < 10
    finally:
        front.close()
        broker.stop()


def tls_overrides(pki: Path) -> list[str]:
    return ["kafka.security_protocol=SSL", f"kafka.ssl_cafile={pki / 'ca.pem'}",
            f"kafka.ssl_certfile={pki / 'client.pem'}", f"kafka.ssl_keyfile={pki / 'client.key'}",
            "kafka.client_id=streamlearn-test"]


@pytest.fixture
def tls_config(pki, monkeypatch) -> Config:
    """The TLS settings, the key's passphrase from the environment (as in production)."""
    monkeypatch.setenv("STREAMLEARN__KAFKA__SSL_PASSWORD", KEY_PASSWORD)
    return load_config(overrides=tls_overrides(pki))


# ---------------------------------------------------------------------------- TLS end to end

def test_produce_and_replay_cli_over_mutual_tls_never_write_the_password(pki, tls_broker, tmp_path, monkeypatch,
                                                                        capsys):
    monkeypatch.setenv("STREAMLEARN__KAFKA__SSL_PASSWORD", KEY_PASSWORD)
    settings = tmp_path / "kafka.toml"
    settings.write_text("[kafka]\n" + "".join(f'{o.split("=", 1)[0].split(".")[1]} = "{o.split("=", 1)[1]}"\n'
                                              for o in tls_overrides(pki)))
    data = tmp_path / "stream.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in words_stream(48)))
    topic = f"tls-{uuid.uuid4().hex[:8]}"
    common = ["--topic", topic, "--bootstrap", tls_broker, "--config", str(settings)]
    assert main(["produce", str(data), *common, "--partitions", "2"]) == 0
    assert "produced 48 records" in capsys.readouterr().out

    report, saved = tmp_path / "r.json", tmp_path / "saved"
    tiny = [arg for item in TINY for arg in ("--set", item)]
    assert main(["replay", *common, "--report", str(report), "--save", str(saved), "--no-progress", *tiny]) == 0
    written = json.loads(report.read_text())
    assert written["records"] == 48 and written["source"]["security_protocol"] == "SSL"
    assert written["config"]["model"]["kafka"]["ssl_password"] == REDACTED
    assert main(["replay", *common, "--state", str(saved), "--mode", "frozen", "--no-progress"]) == 0  # [kafka] only
    model_too = tmp_path / "model.toml"
    model_too.write_text(settings.read_text() + "[model]\nlayers = 1\n")
    assert main(["replay", *common[:4], "--config", str(model_too), "--state", str(saved), "--no-progress"]) == 2
    assert main(["inspect", "--state", str(saved)]) == 0
    shown = capsys.readouterr().out
    for path in [report, *saved.rglob("*")]:
        if path.is_file():
            assert KEY_PASSWORD.encode() not in path.read_bytes(), f"the key's passphrase is in {path}"
    assert KEY_PASSWORD not in shown


def test_worker_clients_over_mutual_tls(tls_broker, tls_config):
    cfg = tls_config.override(f"worker.bootstrap={tls_broker}", f"worker.group=g-{uuid.uuid4().hex[:8]}",
                              *(f"worker.{k}={v}" for k, v in GROUP_TIMEOUTS.items()))
    topic = f"tls-{uuid.uuid4().hex[:8]}"
    assert create_topic(tls_broker, topic, 2, security=cfg.kafka) == 2
    produce_rows(tls_broker, topic, [(None, r, None) for r in words_stream(10)], security=cfg.kafka)
    assert dlq_partitions(cfg.worker, topic, topic + ".dlq", cfg.kafka) == 2

    producer = new_producer(cfg.worker, cfg.kafka)
    try:
        assert producer.config["security_protocol"] == "SSL" and producer.config["client_id"] == "streamlearn-test"
        producer.send(topic + ".dlq", b"dead letter", partition=1).get(timeout=10)
    finally:
        producer.close()
    consumer = new_consumer(cfg.worker, cfg.kafka)
    try:
        consumer.subscribe([topic])
        got, deadline = [], time.monotonic() + 20
        while len(got) < 10 and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=200).values():
                got.extend(batch)
    finally:
        consumer.close()
    assert len(got) == 10
    assert KafkaSource(tls_broker, KafkaRange(topic + ".dlq"), security=cfg.kafka).estimate() == 1


def test_a_worker_trains_over_mutual_tls_and_dead_letters_there(tls_broker, tls_config, tmp_path):
    """The worker's consumer, dead-letter producer and topic admin all take the [kafka]
    section: records are learned, a bad one reaches the dead-letter topic, and the key's
    passphrase is nowhere in the state it writes."""
    cfg = tls_config.override(*TINY, f"worker.bootstrap={tls_broker}", f"worker.group=g-{uuid.uuid4().hex[:8]}",
                              *(f"worker.{k}={v}" for k, v in GROUP_TIMEOUTS.items()))
    topic = f"tls-{uuid.uuid4().hex[:8]}"
    create_topic(tls_broker, topic, 2, security=cfg.kafka)
    produce_rows(tls_broker, topic, [(None, r, None) for r in words_stream(60)], security=cfg.kafka)
    producer = new_producer(cfg.worker, cfg.kafka)
    try:
        producer.send(topic, b"\xc1 not msgpack", partition=0).get(timeout=10)
    finally:
        producer.close()
    summary = Worker(cfg, RunOptions(topic, str(tmp_path / "state"), max_records=61)).run()
    assert (summary.records, summary.learned, summary.dead_letters, summary.saved) == (61, 60, 1, True)
    assert KafkaSource(tls_broker, KafkaRange(topic + ".dlq"), security=cfg.kafka).estimate() == 1
    for path in (tmp_path / "state").rglob("*"):
        if path.is_file():
            assert KEY_PASSWORD.encode() not in path.read_bytes(), f"the key's passphrase is in {path}"


def test_a_client_without_the_tls_options_fails_clearly(pki, tls_broker, tls_config):
    topic = f"tls-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    with pytest.raises(BrokerError, match=r"security_protocol='PLAINTEXT'"):
        topic_partitions(tls_broker, topic, timeout_s=1)
    with pytest.raises(ReplaySourceError, match="cannot reach a Kafka broker"):
        KafkaSource(tls_broker, KafkaRange(topic), timeout_s=1)
    no_client_cert = load_config(overrides=["kafka.security_protocol=SSL", f"kafka.ssl_cafile={pki / 'ca.pem'}"])
    with pytest.raises(BrokerError, match=r"security_protocol='SSL'"):
        create_topic(tls_broker, topic, security=no_client_cert.kafka, timeout_s=1)
    wrong_ca = tls_config.override(f"kafka.ssl_cafile={pki / 'client.pem'}")  # not the CA that signed the broker
    with pytest.raises(BrokerError, match="cannot reach"):
        create_topic(tls_broker, topic, security=wrong_ca.kafka, timeout_s=1)
    assert time.monotonic() - started < 20


# ---------------------------------------------------------------------------- SASL

@pytest.fixture(scope="module")
def sasl_broker():
    broker = EmbeddedBroker(authentication=True).start()
    try:
        yield broker
    finally:
        broker.stop()


def test_sasl_options_reach_every_client_and_a_rejection_is_an_error(sasl_broker, caplog, monkeypatch):
    """Each client we build logs in with our SCRAM user (the broker answers that it does not
    know it); the rejection is an error after the bootstrap timeout, and the password is in
    no log line, though kafka-python logs the admin client's whole configuration."""
    monkeypatch.setenv("STREAMLEARN__KAFKA__SASL_PLAIN_PASSWORD", SASL_PASSWORD)
    cfg = load_config(overrides=[f"worker.bootstrap={sasl_broker.bootstrap}", "kafka.security_protocol=SASL_PLAINTEXT",
                                 "kafka.sasl_mechanism=SCRAM-SHA-512", "kafka.sasl_plain_username=streamlearn-user"])
    caplog.set_level(logging.DEBUG, logger="kafka")
    # 3 s, not 1: under a full suite's load the broker once took over a second to answer the
    # first SaslHandshake (the admin client's), and the client gave up before SCRAM's first message
    clients = {
        "admin": (BrokerError, lambda: create_topic(sasl_broker.bootstrap, "t", security=cfg.kafka, timeout_s=3)),
        "replay": (ReplaySourceError, lambda: KafkaSource(sasl_broker.bootstrap, KafkaRange("t"), timeout_s=3,
                                                          security=cfg.kafka)),
        "worker consumer": (KafkaError, lambda: new_consumer(cfg.worker, cfg.kafka)),
        "dead-letter producer": (KafkaError, lambda: new_producer(cfg.worker, cfg.kafka)),
    }
    for name, (error, build) in clients.items():
        caplog.clear()
        with pytest.raises(error, match="SASL_PLAINTEXT|Unable to bootstrap"):
            build()
        log = caplog.text
        assert "mechanism='SCRAM-SHA-512'" in log and "n=streamlearn-user" in log, name  # SCRAM on the wire
        assert "e=unknown-user" in log, name  # the broker's answer
        assert SASL_PASSWORD not in log, name
    caplog.clear()
    with pytest.raises(BrokerError, match=r"security_protocol='PLAINTEXT'"):
        create_topic(sasl_broker.bootstrap, "t", timeout_s=1)
    assert "SaslHandshake" not in caplog.text and "NotAuthenticated" in sasl_broker.log_tail()


def test_admin_client_configuration_log_is_redacted(sasl_broker, caplog, monkeypatch):
    monkeypatch.setenv("STREAMLEARN__KAFKA__SASL_PLAIN_PASSWORD", SASL_PASSWORD)
    cfg = load_config(overrides=["kafka.security_protocol=SASL_PLAINTEXT", "kafka.sasl_mechanism=PLAIN",
                                 "kafka.sasl_plain_username=u"])
    caplog.set_level(logging.DEBUG, logger="kafka.admin.client")
    with pytest.raises(BrokerError):
        create_topic(sasl_broker.bootstrap, "t", security=cfg.kafka, timeout_s=0.5)
    started = [r.getMessage() for r in caplog.records if "Starting KafkaAdminClient" in r.getMessage()]
    assert started and f"'sasl_plain_password': '{REDACTED}'" in started[0] and SASL_PASSWORD not in caplog.text


# ---------------------------------------------------------------------------- SASL PLAIN under -v

class PlainLoginBroker:
    """A listener that speaks just enough Kafka to ask for a SASL PLAIN login and refuse it
    (Tansu offers SCRAM only): ApiVersions, SaslHandshake, SaslAuthenticate. It keeps the
    login bytes it received, so a test knows the password really went over the wire."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.logins: list[bytes] = []
        serve_each_connection(self.server, self._serve)

    def _serve(self, conn: socket.socket) -> None:
        import struct

        from kafka.protocol.metadata.api_versions import ApiVersionsResponse
        from kafka.protocol.sasl import SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeResponse

        def read(n: int) -> bytes:
            buf = b""
            while len(buf) < n:
                chunk = conn.recv(n - len(buf))
                if not chunk:
                    raise EOFError
                buf += chunk
            return buf

        try:
            while True:
                body = read(struct.unpack(">i", read(4))[0])
                key, version, correlation = struct.unpack(">hhi", body[:8])
                if key == 18:
                    versions = [ApiVersionsResponse.ApiVersion(api_key=k, min_version=0, max_version=m)
                                for k, m in ((18, 3), (17, 1), (36, 2), (3, 12))]
                    resp = ApiVersionsResponse(error_code=0, api_keys=versions, throttle_time_ms=0,
                                               version=min(version, 3))
                elif key == 17:
                    resp = SaslHandshakeResponse(error_code=0, mechanisms=["PLAIN"], version=version)
                elif key == 36:
                    self.logins.append(SaslAuthenticateRequest.decode(body, version=version, header=True).auth_bytes)
                    resp = SaslAuthenticateResponse(error_code=58, error_message="bad login", auth_bytes=b"",
                                                    session_lifetime_ms=0, version=version)
                else:
                    return
                resp.with_header(correlation_id=correlation)
                conn.sendall(resp.encode(header=True, framed=True))
        except (EOFError, OSError):
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.server.close()


def test_a_plain_login_password_never_shows_under_verbose(tmp_path, caplog, monkeypatch):
    """Was: `streamlearn -v produce` over SASL PLAIN wrote the password in 18 debug lines
    (kafka-python's request dumps and the raw bytes sent)."""
    broker = PlainLoginBroker()
    data = tmp_path / "x.jsonl"
    data.write_text(json.dumps({"text": "a", "label": "b"}) + "\n")
    monkeypatch.setenv("STREAMLEARN__KAFKA__SASL_PLAIN_PASSWORD", SASL_PASSWORD)
    caplog.set_level(logging.DEBUG)
    try:
        code = main(["-v", "produce", str(data), "--topic", "t", "--bootstrap", broker.address, "--timeout", "3",
                     "--set", "kafka.security_protocol=SASL_PLAINTEXT", "--set", "kafka.sasl_mechanism=PLAIN",
                     "--set", "kafka.sasl_plain_username=qa"])
    finally:
        broker.close()
        for wire in WIRE_LOGGERS:  # as main() left them without -v: other tests read kafka's debug lines
            logging.getLogger(wire).setLevel(logging.NOTSET)
    assert code == 2
    assert any(SASL_PASSWORD.encode() in login for login in broker.logins)  # the login did happen
    assert "kafka." in caplog.text and SASL_PASSWORD not in caplog.text


# ---------------------------------------------------------------------------- bad config, redaction

@pytest.mark.parametrize("overrides, message", [
    (["kafka.security_protocol=TLS"], "must be one of"),
    (["kafka.security_protocol=SASL_SSL", "kafka.sasl_mechanism=OAUTHBEARER"], "token provider"),
    (["kafka.security_protocol=SASL_SSL"], "needs kafka.sasl_mechanism"),
    (["kafka.security_protocol=SASL_SSL", "kafka.sasl_mechanism=SCRAM-SHA-512", "kafka.sasl_plain_username=u"],
     "needs kafka.sasl_plain_password"),
    (["kafka.security_protocol=SSL", "kafka.ssl_cafile=/no/such/ca.pem"], "is not a file"),
    (["kafka.ssl_cafile=/etc/hostname"], "set kafka.security_protocol to SSL"),
    (["kafka.sasl_mechanism=PLAIN"], "does not use SASL"),
    # was: accepted and ignored, and the connection then failed without naming the protocol
    (["kafka.sasl_plain_username=u", "kafka.sasl_plain_password=p"], "kafka.sasl_plain_username is set but"),
    (["kafka.security_protocol=SSL", "kafka.sasl_plain_password=p"], "does not use SASL"),
])
def test_bad_security_config_is_a_config_error(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=overrides, use_env=False).kafka.client_options()


def test_bad_security_config_stops_the_clis_and_is_never_retried(tls_broker, tmp_path, capsys):
    data = tmp_path / "x.jsonl"
    data.write_text(json.dumps({"text": "a", "label": "b"}) + "\n")
    bad = ["--set", "kafka.security_protocol=SSL", "--set", "kafka.ssl_cafile=/no/such/ca.pem"]
    assert main(["produce", str(data), "--topic", "t", "--bootstrap", tls_broker, *bad]) == 2
    assert main(["replay", "--topic", "t", "--bootstrap", tls_broker, "--no-progress", *bad]) == 2
    assert main(["worker", "--topic", "t", "--state", str(tmp_path / "s"), "--bootstrap", tls_broker, *bad]) == 2
    assert capsys.readouterr().err.count("kafka.ssl_cafile='/no/such/ca.pem' is not a file") == 3
    cfg = load_config(overrides=[f"worker.bootstrap={tls_broker}", *bad[1::2]], use_env=False)
    with pytest.raises(ConfigError):  # raised at once, not retried with backoff until stopped
        StartUp(cfg.worker, threading.Event()).step("connecting", lambda: new_consumer(cfg.worker, cfg.kafka))


def test_tls_files_that_do_not_load_are_config_errors_naming_the_key(pki, tmp_path):
    """Was: 'cannot reach a Kafka broker' after --timeout (a worker retried it for the whole
    --connect-timeout); the cause showed only under -v, as kafka-python's '[SSL] PEM lib'."""
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    mutual = ["kafka.security_protocol=SSL", f"kafka.ssl_cafile={pki / 'ca.pem'}",
              f"kafka.ssl_certfile={pki / 'client.pem'}", f"kafka.ssl_keyfile={pki / 'client.key'}"]
    wrong = "wrong-" + uuid.uuid4().hex[:8]
    for overrides, message in [([*mutual, f"kafka.ssl_password={wrong}"], "kafka.ssl_certfile=.* cannot be loaded"),
                               ([*mutual[:1], f"kafka.ssl_cafile={garbage}"], "kafka.ssl_cafile=.* holds no PEM")]:
        with pytest.raises(ConfigError, match=message) as refused:
            load_config(overrides=overrides, use_env=False).kafka.client_options()
        assert wrong not in str(refused.value)  # the passphrase is not shown
    load_config(overrides=[*mutual, f"kafka.ssl_password={KEY_PASSWORD}"], use_env=False).kafka.client_options()
    with pytest.raises(ConfigError, match="cannot be loaded"):  # an encrypted key, no passphrase: no prompt
        load_config(overrides=mutual, use_env=False).kafka.client_options()


def test_a_password_keeps_the_spaces_around_it(monkeypatch):
    """Was: a --set or environment password was stripped (a TOML one was not)."""
    monkeypatch.setenv("STREAMLEARN__KAFKA__SASL_PLAIN_PASSWORD", "  p@ss word  \n")  # a secret file's newline
    cfg = load_config(overrides=["kafka.ssl_password= key pass "])
    assert cfg.kafka.sasl_plain_password == "  p@ss word  " and cfg.kafka.ssl_password == " key pass "
    assert load_config(overrides=["kafka.client_id= id "], use_env=False).kafka.client_id == "id"


def test_passwords_never_show(monkeypatch):
    monkeypatch.setenv("STREAMLEARN__KAFKA__SASL_PLAIN_PASSWORD", SASL_PASSWORD)
    monkeypatch.setenv("STREAMLEARN__KAFKA__SSL_PASSWORD", KEY_PASSWORD)
    cfg = load_config(overrides=["kafka.security_protocol=SASL_SSL"])
    assert cfg.kafka.sasl_plain_password == SASL_PASSWORD and cfg.kafka.ssl_password == KEY_PASSWORD
    assert cfg.override("model.layers=1").kafka.sasl_plain_password == SASL_PASSWORD  # overrides keep them
    for shown in (repr(cfg), str(cfg.kafka), cfg.to_json()):
        assert SASL_PASSWORD not in shown and KEY_PASSWORD not in shown
    assert cfg.to_dict()["kafka"]["sasl_plain_password"] == REDACTED
    assert Config().to_dict()["kafka"]["sasl_plain_password"] == ""  # unset stays visibly unset
    with pytest.raises(ConfigError) as typo:
        cfg.override(f"kafka.sasl_plain_pasword={SASL_PASSWORD}")
    with pytest.raises(ConfigError) as wrong_type:
        Config.from_dict({"kafka": {"ssl_password": 12345678}})
    assert SASL_PASSWORD not in str(typo.value) and "12345678" not in str(wrong_type.value)
    for malformed in (f"kafka.sasl_plain_password:{SASL_PASSWORD}", f"kafka.ssl_password {KEY_PASSWORD}"):
        with pytest.raises(ConfigError, match="must look like section.key=value") as no_equals:
            cfg.override(malformed)  # was: the whole item, password included, in the message
        assert SASL_PASSWORD not in str(no_equals.value) and KEY_PASSWORD not in str(no_equals.value)
