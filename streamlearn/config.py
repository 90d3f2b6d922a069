"""Configuration: one frozen dataclass per component, composed into :class:`Config`.

A config is loaded from a TOML file whose tables are the sections below, then
overridden with dotted keys (``model.layers=2``). Unknown sections or keys are rejected
with the list of valid names, so a typo never silently falls back to a default.

>>> cfg = load_config(overrides=["model.layers=2", "embedding.scheme=bloom"])
>>> cfg.model.layers, cfg.embedding.scheme
(2, 'bloom')

Environment variables are read here and nowhere else (:func:`env_overrides`).
"""
from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Mapping

from .exceptions import ConfigError
from .tasks import REGISTRY as TASK_REGISTRY

SCHEMES = (
    "hash", "bloom", "hashformer-pool", "hashformer-add", "hashformer-proj",
    "tfree", "hashing-trick", "plain",
)
TASKS = tuple(TASK_REGISTRY)  # streamlearn.tasks: one module per task
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI")
SECRET_KEYS = frozenset({"kafka.ssl_password", "kafka.sasl_plain_password"})
REDACTED = "<redacted>"


@dataclass(frozen=True)
class HashingConfig:
    """Tokenization and the seeds of every hash function (all derived from ``seed``)."""

    seed: int = 0
    tokenizer: str = "words"  # "words": regex words of `text`; "ids": tokens as given
    lowercase: bool = True
    ngrams: int = 1  # word n-grams up to this n are added as extra tokens
    max_tokens: int = 128  # longer token lists are truncated (counted, not an error)


@dataclass(frozen=True)
class EmbeddingConfig:
    """Sizes named as in the papers: K importance rows (D1's range), B shared
    component vectors, k hashes per token (hash embeddings), m hashes per id (Bloom,
    T-Free), d the component width.
    """

    scheme: str = "hash"
    d: int = 64
    K: int = 1_000_000
    B: int = 100_000
    k: int = 2
    m: int = 2
    append_p: bool = False  # concatenate the importance vector p (width d + k)
    combine: str = "sum"  # "sum" or "concat" of the k weighted components
    init: str = "mean"  # "mean": P ~ N(1/k, 0.0005) (measured better); "paper": P ~ N(0, 0.0005); docs/model.md
    hashformer_hash: str = "md5"  # "md5" (random) or "lsh" (character n-grams)
    hashformer_bits: int = 128  # T
    hashformer_pool_bits: int = 10  # k of HashFormers' Pool codewords
    tfree_rows: int = 32_768  # v
    plain_vocab: int = 100_000  # bounded dictionary size of the `plain` reference


@dataclass(frozen=True)
class ModelConfig:
    """The hashed transformer. ``layers=0`` is a bag of embeddings (fastText-like)."""

    layers: int = 0  # 0: a bag (fastText); best online on text and next-item, see docs/choosing-a-configuration.md
    d_model: int = 64
    heads: int = 4
    ffn: int = 256
    dropout: float = 0.0
    positions: bool = False  # Superbloom treats its input as a set
    max_labels: int = 1024  # classification label table capacity
    out_B: int = 50_000  # hashed output space per hash (Superbloom / next-item)
    out_m: int = 2
    tie_output: bool = True  # tie hashed output weights to the input table when spaces coincide
    output: str = "auto"  # mlm/next-item head: "hashed" (Superbloom), "tfree", "auto" (tfree for scheme tfree)


@dataclass(frozen=True)
class OptimConfig:
    sparse: str = "adagrad"  # row-wise optimizer for embedding tables: "adagrad" or "lazy-adam"
    sparse_lr: float = 0.2  # online text and next-item: best of 0.05..0.5 (docs/choosing-a-configuration.md)
    dense_lr: float = 2e-3  # also right for layers >= 1 (0.01 suits depth 0 only)
    weight_decay: float = 0.0


@dataclass(frozen=True)
class LearnerConfig:
    task: str = "classify"
    batch_size: int = 16  # 32: ~1.5x the records/s, slightly lower online accuracy on text
    device: str = "auto"  # "auto" picks CUDA when available, else CPU
    mask_prob: float = 0.15  # mlm
    history: int = 10  # next-item: a key's last n items
    beam: int = 50  # top-k decoding beam width
    shuffle_random: float = 0.0  # weight of HashFormers' Shuffle+Random loss (0 = off; needs model.positions)
    nb_weight: float = 0.2  # classify: weight of the hashed Naive Bayes score added to the label logits (0 = off; 0.2: AG News >= NB)
    nb_alpha: float = 0.3  # classify: Naive Bayes additive smoothing of the (token, label) counts
    nb_cells: int = 1_048_576  # classify: hashed (token, label) count cells of the Naive Bayes part (4 bytes each)
    seed: int = 0


@dataclass(frozen=True)
class StoreConfig:
    backend: str = "lmdb"  # "lmdb" or "memory"
    shards: int = 8
    map_size_gb: float = 4.0
    grow_map: bool = True  # a full map grows (doubling) instead of failing
    sync: bool = True  # sync=False: a crash can lose the last commit (never mix two)


@dataclass(frozen=True)
class WorkerConfig:
    """The Kafka consumer worker (see docs/operations.md)."""

    bootstrap: str = "127.0.0.1:9092"
    group: str = "streamlearn"
    checkpoint_every: int = 20_000  # records (a crash re-reads at most this many; ~2-3 s of a depth-0 worker here)
    checkpoint_seconds: float = 30.0
    max_record_bytes: int = 1_000_000
    dlq_suffix: str = ".dlq"
    dlq_max_bytes: int = 16_777_216  # larger bad messages are dead-lettered cut to this size
    poll_timeout_ms: int = 200
    queue_batches: int = 16  # prepared batches buffered between the fetch thread and training
    torch_threads: int = 0  # intra-op threads of the training loop; 0: CPUs - 1 (the fetch thread needs one)
    eval_every: int = 10  # prequential accuracy on every n-th batch (0: off); one extra forward each
    log_seconds: float = 5.0  # status line interval
    retry_max_s: float = 5.0  # cap of the exponential backoff while the broker is unreachable
    session_timeout_ms: int = 10_000  # group membership: a killed worker's partitions move after this
    heartbeat_interval_ms: int = 3_000
    max_poll_interval_ms: int = 300_000
    audit: bool = False  # store the offset ranges each checkpoint applied (kv "audit"; tests)
    sync: str = "average"  # several workers: "average" replicas at each checkpoint, or "allreduce" gradients per step


@dataclass(frozen=True)
class KafkaConfig:
    """How every Kafka client we build connects: TLS and SASL, as kafka-python names them
    (docs/operations.md, "Running against a real Kafka cluster"). ``""`` means unset.

    Each key is checked alone when the config is built; the combination (credentials for
    the mechanism, files that exist) when a client is built (:meth:`client_options`), so a
    password may come from the environment after the file. Passwords never reach a repr,
    a report, a checkpoint or a log: :meth:`Config.to_dict` redacts them.
    """

    security_protocol: str = "PLAINTEXT"  # one of SECURITY_PROTOCOLS
    ssl_cafile: str = ""  # PEM CA bundle that signed the brokers' certificates ("": system CAs)
    ssl_certfile: str = ""  # PEM client certificate (mutual TLS)
    ssl_keyfile: str = ""  # PEM client key (mutual TLS)
    ssl_password: str = field(default="", repr=False)  # secret: the client key's passphrase
    ssl_check_hostname: bool = True
    ssl_crlfile: str = ""  # PEM certificate revocation list
    sasl_mechanism: str = ""  # one of SASL_MECHANISMS; needed by SASL_* protocols
    sasl_plain_username: str = ""  # PLAIN and SCRAM-*
    sasl_plain_password: str = field(default="", repr=False)  # secret: PLAIN and SCRAM-*
    sasl_kerberos_service_name: str = "kafka"  # GSSAPI
    client_id: str = ""  # "": kafka-python's default

    def __post_init__(self) -> None:
        if self.security_protocol not in SECURITY_PROTOCOLS:
            raise ConfigError(f"kafka.security_protocol={self.security_protocol!r}; choose one of {SECURITY_PROTOCOLS}")
        if self.sasl_mechanism and self.sasl_mechanism not in SASL_MECHANISMS:
            raise ConfigError(f"kafka.sasl_mechanism={self.sasl_mechanism!r}; choose one of {SASL_MECHANISMS} "
                              "(OAUTHBEARER needs a token provider object and cannot be configured here)")

    @property
    def uses_ssl(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for kafka-python's KafkaConsumer / KafkaProducer /
        KafkaAdminClient: ``security_protocol`` and the set options of its kind (TLS
        options only for SSL protocols, SASL options only for SASL ones). Raises
        :class:`ConfigError` for a combination that cannot connect."""
        self._check_combination()
        out: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.client_id:
            out["client_id"] = self.client_id
        if self.uses_ssl:
            out["ssl_check_hostname"] = self.ssl_check_hostname
            out.update(self._set("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password", "ssl_crlfile"))
        if self.uses_sasl:
            out["sasl_mechanism"] = self.sasl_mechanism
            if self.sasl_mechanism == "GSSAPI":
                out["sasl_kerberos_service_name"] = self.sasl_kerberos_service_name
            else:
                out.update(self._set("sasl_plain_username", "sasl_plain_password"))
        return out

    def _set(self, *keys: str) -> dict[str, Any]:
        return {key: getattr(self, key) for key in keys if getattr(self, key)}

    def _check_combination(self) -> None:
        ssl_set = [k for k in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password", "ssl_crlfile")
                   if getattr(self, k)]
        if ssl_set and not self.uses_ssl:
            raise ConfigError(f"kafka.{ssl_set[0]} is set but kafka.security_protocol={self.security_protocol!r} "
                              "does not use TLS: set kafka.security_protocol to SSL or SASL_SSL")
        if self.sasl_mechanism and not self.uses_sasl:
            raise ConfigError(f"kafka.sasl_mechanism is set but kafka.security_protocol={self.security_protocol!r} "
                              "does not use SASL: set kafka.security_protocol to SASL_SSL or SASL_PLAINTEXT")
        if self.uses_sasl:
            self._check_sasl()
        if self.uses_ssl:
            self._check_files()

    def _check_sasl(self) -> None:
        if not self.sasl_mechanism:
            raise ConfigError(f"kafka.security_protocol={self.security_protocol!r} needs kafka.sasl_mechanism, "
                              f"one of {SASL_MECHANISMS}")
        if self.sasl_mechanism == "GSSAPI":
            import importlib.util
            if importlib.util.find_spec("gssapi") is None:
                raise ConfigError("kafka.sasl_mechanism='GSSAPI' needs the gssapi package: `pip install gssapi`")
            return
        missing = [k for k in ("sasl_plain_username", "sasl_plain_password") if not getattr(self, k)]
        if missing:
            raise ConfigError(f"kafka.sasl_mechanism={self.sasl_mechanism!r} needs kafka.{missing[0]} (the password "
                              "best from the environment: STREAMLEARN__KAFKA__SASL_PLAIN_PASSWORD)")

    def _check_files(self) -> None:
        for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_crlfile"):
            path = getattr(self, key)
            if path and not Path(path).is_file():
                raise ConfigError(f"kafka.{key}={path!r} is not a file: give the path of the PEM file")
        if self.ssl_keyfile and not self.ssl_certfile:
            raise ConfigError("kafka.ssl_keyfile is set without kafka.ssl_certfile: mutual TLS needs both")


@dataclass(frozen=True)
class ServiceConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    max_tokens: int = 512
    max_batch: int = 256
    max_request_tokens: int = 32_768  # all queries of one request together (413 beyond): max_batch x hashing.max_tokens
    max_body_bytes: int = 2**20  # one request body (413 beyond)


@dataclass(frozen=True)
class Config:
    hashing: HashingConfig = field(default_factory=HashingConfig)
    embedding: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    service: ServiceConfig = field(default_factory=ServiceConfig)

    def __post_init__(self) -> None:
        if self.embedding.scheme not in SCHEMES:
            raise ConfigError(f"embedding.scheme={self.embedding.scheme!r}; choose one of {SCHEMES}")
        if self.learner.task not in TASKS:
            raise ConfigError(f"learner.task={self.learner.task!r}; choose one of {TASKS}")

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Every section as a dict, secrets (:data:`SECRET_KEYS`) replaced by
        :data:`REDACTED`: this is what reports, checkpoints and snapshots store."""
        data = dataclasses.asdict(self)
        for dotted in SECRET_KEYS:
            section, key = dotted.split(".")
            if data[section][key]:
                data[section][key] = REDACTED
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Mapping[str, Any]]) -> "Config":
        sections = {f.name: f.type for f in fields(cls)}
        unknown = set(data) - set(sections)
        if unknown:
            raise ConfigError(f"unknown config section(s) {sorted(unknown)}; valid: {sorted(sections)}")
        built = {}
        for f in fields(cls):
            section_cls = f.default_factory  # type: ignore[misc]
            built[f.name] = _build_section(f.name, section_cls, data.get(f.name, {}))
        return cls(**built)

    def override(self, *assignments: str) -> "Config":
        """Return a copy with dotted ``section.key=value`` assignments applied."""
        data = dataclasses.asdict(self)  # not to_dict(): the secrets must survive
        for item in assignments:
            section, key, raw = _split_assignment(item)
            if section not in data:
                raise ConfigError(f"unknown config section {section!r} in {_unvalued(item)!r}; valid: {sorted(data)}")
            if key not in data[section]:
                raise ConfigError(
                    f"unknown key {section}.{key} in {_unvalued(item)!r}; valid: {sorted(data[section])}"
                )
            data[section][key] = _coerce(raw, data[section][key], f"{section}.{key}")
        return Config.from_dict(data)


def _build_section(name: str, section_cls: type, values: Mapping[str, Any]) -> Any:
    if not isinstance(values, Mapping):
        raise ConfigError(f"config section [{name}] must be a table, got {type(values).__name__}")
    valid = {f.name: f for f in fields(section_cls)}
    unknown = set(values) - set(valid)
    if unknown:
        raise ConfigError(f"unknown key(s) {sorted(unknown)} in [{name}]; valid: {sorted(valid)}")
    defaults = section_cls()
    checked = {
        key: _check_type(value, getattr(defaults, key), f"{name}.{key}") for key, value in values.items()
    }
    return section_cls(**checked)


def _check_type(value: Any, default: Any, where: str) -> Any:
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if type(value) is not type(default):
        shown = REDACTED if where in SECRET_KEYS else repr(value)
        raise ConfigError(f"{where} must be {type(default).__name__}, got {shown}")
    return value


def _split_assignment(item: str) -> tuple[str, str, str]:
    path, sep, raw = item.partition("=")
    section, dot, key = path.strip().partition(".")
    if not sep or not dot or not key:
        raise ConfigError(f"override {_unvalued(item)!r} must look like section.key=value (e.g. model.layers=2)")
    return section, key, raw.strip()


def _unvalued(item: str) -> str:
    """An override as shown in errors: without its value, which may be a password."""
    path, sep, _ = item.partition("=")
    return f"{path}=..." if sep else path


def _coerce(raw: str, default: Any, where: str) -> Any:
    try:
        if isinstance(default, bool):
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1")
        if isinstance(default, int):
            number = float(raw)  # accepts 1e6 and 1_000_000
            if not number.is_integer():
                raise ValueError(raw)
            return int(number)
        if isinstance(default, float):
            return float(raw)
    except ValueError as exc:
        raise ConfigError(f"{where}={raw!r} is not a valid {type(default).__name__}") from exc
    return raw


def env_overrides(environ: Mapping[str, str] | None = None) -> list[str]:
    """Dotted overrides from ``STREAMLEARN__SECTION__KEY=value`` variables.

    This is the only place the library reads the environment for settings.
    """
    environ = os.environ if environ is None else environ
    # Variable names are upper case by convention, keys mostly lower case; the paper's
    # K and B are both, and K differs from k, so an exact key match wins over lowering.
    known = Config().to_dict()
    out = []
    for name, value in sorted(environ.items()):
        if name.startswith("STREAMLEARN__") and name.count("__") == 2:
            _, section, key = name.split("__")
            section = section.lower()
            if key not in known.get(section, {}):
                key = key.lower()
            out.append(f"{section}.{key}={value}")
    return out


def load_config(path: str | Path | None = None, overrides: Iterable[str] = (), use_env: bool = True) -> Config:
    """Defaults, then the TOML file at ``path``, then environment, then ``overrides``."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ConfigError(f"config file {path} does not exist") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    cfg = Config.from_dict(data)
    env = env_overrides() if use_env else []
    return cfg.override(*env, *overrides)
