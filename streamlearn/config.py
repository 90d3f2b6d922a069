"""Configuration: one frozen dataclass per component, composed into :class:`Config`.

A config is loaded from a TOML file whose tables are the sections below, then
overridden with dotted keys (``model.layers=2``). Unknown sections or keys are rejected
with the list of valid names, so a typo never silently falls back to a default.

Every key is declared with what it allows (:func:`~streamlearn.config_rules.key`) and
checked when its section is built, rules across sections when :class:`Config` is: a
config that exists is valid, and the code that uses it trusts it. A refusal is one
:class:`~streamlearn.exceptions.ConfigError` line naming the key, the value and what is
allowed, e.g. ``optim.sparse_lr must be > 0, got -0.5``.

>>> cfg = load_config(overrides=["model.layers=2", "embedding.scheme=bloom"])
>>> cfg.model.layers, cfg.embedding.scheme
(2, 'bloom')

Environment variables are read here and nowhere else (:func:`env_overrides`).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Collection, Iterable, Mapping

from .config_rules import (
    REDACTED, Rule, above, at_least, between, check_keys, flag, key, matches, multiple_of, one_of, power_of_two,
)
from .exceptions import ConfigError
from .tasks import REGISTRY as TASK_REGISTRY
from .tasks import task_defaults, task_derived

SCHEMES = (
    "hash", "bloom", "hashformer-pool", "hashformer-add", "hashformer-proj",
    "tfree", "hashing-trick", "plain",
)
TASKS = tuple(TASK_REGISTRY)  # streamlearn.tasks: one module per task
OUTPUTS = ("auto", "hashed", "sampled", "tfree")
COUNT_PARTS = ("none", "kn3", "kn4", "transitions")  # token tasks' count part inside the model (streamlearn.counts)
COUNT_TASKS = ("next-token", "mlm")
SPARSE_OPTIMIZERS = ("adagrad", "lazy-adam")
HASH_INITS = ("mean", "paper")
HASHFORMER_HASHES = ("md5", "xxh3", "lsh")
SYNC_MODES = ("average", "allreduce")
ASSIGNMENTS = ("manual", "group")  # how a worker without --world-size gets its partitions
ON_LOST_OFFSETS = ("stop", "restart-from-start")
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI")
SECRET_KEYS = frozenset({"kafka.ssl_password", "kafka.sasl_plain_password"})

HASH_RANGE = 1 << 32  # hashing projects into [0, size) with size <= 2^32 (hashing._project)
SEED_RANGE = 1 << 64  # seeds are 64-bit: a larger or negative one would alias another
MAX_SHARDS = 256  # LMDB named databases: 3 + shards * tables must fit MAX_DBS (state/schema.py)
NB_ROW = 64  # cells per stored row of the Naive Bayes counts (heads.NaiveBayesHead.ROW)
KAFKA_BYTES = 1 << 30  # fetch and request sizes are Kafka int32s; record + framing must fit
DERIVE = 0  # a size key at 0 is derived from the stream by the worker and replay (streamlearn.sizing)

_HOST_PORT = r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?:[0-9]{1,5}"
_BOOTSTRAP = rf"\s*{_HOST_PORT}\s*(,\s*{_HOST_PORT}\s*)*"
_NO_NUL = r"[^\x00]*"  # paths (the OS refuses only NUL) and SASL PLAIN fields (NUL separates them)
_TEXT = r"[^\x00-\x1f\x7f]*"  # no control characters: shown in broker logs and group listings
_NAME = r"[A-Za-z0-9._-]+"  # Kafka's topic-name characters
_FILE = matches(_NO_NUL, "'' or a file path")  # whether the file exists is checked when a client is built
_SASL_TEXT = matches(_NO_NUL, "text without NUL (SASL PLAIN's separator)")


def _ports_ok(bootstrap: str) -> bool:
    return all(1 <= int(item.rpartition(":")[2]) <= 65535 for item in bootstrap.split(","))


@dataclass(frozen=True)
class HashingConfig:
    """Tokenization and the seeds of every hash function (all derived from ``seed``)."""

    section: ClassVar[str] = "hashing"

    seed: int = key(0, between(0, SEED_RANGE, high_open=True))
    tokenizer: str = key("words", one_of("words", "ids"))  # "words": regex words of `text`; "ids": tokens as given
    lowercase: bool = key(True, flag())
    # words of every script: each Han or kana character a token, combining marks and emoji joiners
    # inside their token (streamlearn.hashing.words); false: the regex \w+|[^\w\s] alone
    scripts: bool = key(True, flag())
    # word n-grams up to this n are added as extra tokens (classify: to the network, not the Naive Bayes part)
    ngrams: int = key(2, at_least(1))
    # the digit shape of each word holding a digit ("07090201529" -> "00000000000") is added as a token
    shapes: bool = key(True, flag())
    max_tokens: int = key(4096, at_least(2))  # longer token lists are truncated (counted, not an error)

    def __post_init__(self) -> None:
        check_keys(self)


@dataclass(frozen=True)
class EmbeddingConfig:
    """Sizes named as in the papers: K importance rows (D1's range), B shared
    component vectors, k hashes per token (hash embeddings), m hashes per id (Bloom,
    T-Free), d the component width.
    """

    section: ClassVar[str] = "embedding"

    scheme: str = key("hash", one_of(*SCHEMES))
    d: int = key(64, at_least(1))
    K: int = key(1_000_000, between(1, HASH_RANGE))
    B: int = key(100_000, between(1, HASH_RANGE))
    k: int = key(2, at_least(1))
    m: int = key(2, at_least(1))
    append_p: bool = key(False, flag())  # concatenate the importance vector p (width d + k)
    combine: str = key("sum", one_of("sum", "concat"))  # "sum" or "concat" of the k weighted components
    # "mean": P ~ N(1/k, 0.0005) (measured better); "paper": P ~ N(0, 0.0005); docs/model.md
    init: str = key("mean", one_of(*HASH_INITS))
    hashformer_hash: str = key("md5", one_of(*HASHFORMER_HASHES))  # "md5", "xxh3" (random) or "lsh" (character n-grams)
    hashformer_bits: int = key(128, between(1, 128))  # T: at most an MD5 digest
    hashformer_pool_bits: int = key(10, between(1, 16))  # k of HashFormers' Pool codewords: a 2^k-row codebook
    tfree_rows: int = key(32_768, between(1, HASH_RANGE))  # v
    plain_vocab: int = key(100_000, at_least(1))  # bounded dictionary size of the `plain` reference

    def __post_init__(self) -> None:
        check_keys(self)


@dataclass(frozen=True)
class ModelConfig:
    """The hashed transformer. ``layers=0`` is a bag of embeddings (fastText-like)."""

    section: ClassVar[str] = "model"

    # 0: a bag (fastText); best online on text and next-item, see docs/choosing-a-configuration.md
    layers: int = key(0, at_least(0))
    d_model: int = key(64, at_least(1))
    heads: int = key(4, at_least(1))
    ffn: int = key(256, at_least(1))
    dropout: float = key(0.0, between(0, 1, high_open=True))
    positions: bool = key(False, flag())  # Superbloom treats its input as a set
    max_labels: int = key(1024, at_least(1))  # classification label table capacity
    # hashed output space per hash (Superbloom / next-item); 0 (next-item's default): derived from the
    # stream's warm-up window when a worker or replay builds a new model (streamlearn.sizing)
    out_B: int = key(50_000, Rule("0 (derived) or in [1, 2^32]", lambda v: 0 <= v <= HASH_RANGE))
    out_m: int = key(2, at_least(1))
    tie_output: bool = key(True, flag())  # tie hashed output weights to the input table when spaces coincide
    # token tasks' head: "hashed" (Superbloom's m softmaxes over buckets), "sampled" (a softmax
    # over tokens, learned with sampled negatives), "tfree", "auto" (tfree for scheme tfree, else hashed)
    output: str = key("auto", one_of(*OUTPUTS))
    negatives: int = key(256, at_least(0))  # "sampled": candidates drawn per step besides the batch's answers
    # next-token, mlm with output "sampled": "kn3" adds a hashed Kneser-Ney trigram count part whose
    # log-probabilities join the scores (model.count_fit; docs/model.md "Count part"); next-token:
    # "kn4" puts a 4-gram order on that trigram (a third table of count_slots slots);
    # next-item with output "hashed": "transitions" counts what followed the last 1 and 2 items
    # and adds their log-probability to the network's logits with a learned weight ("Transition counts")
    counts: str = key("none", one_of(*COUNT_PARTS))
    # slots of the count part's trigram table (16 bytes each; the bigram/unigram table gets half, kn4's
    # 4-gram table as many),
    # or of the transition part's contexts (16 + 4 (out_m + 1) successors bytes each)
    count_slots: int = key(1 << 21, power_of_two(1 << 8, 1 << 30))
    # model.counts=transitions: how the counts join the network: "product" adds their weighted
    # log-probability to the logits, "mixture" (before 2026-11-26; a state stored then keeps it)
    # mixes the two distributions through a gate (docs/model.md "Transition counts")
    count_join: str = key("product", one_of("product", "mixture"))
    # model.counts=kn3: what the network learns from. "separate": its own loss on its own
    # logits, the gates learning the join on its detached states (two experts, as the Naive
    # Bayes part); "joint" (before 2026-11-26; a state stored then keeps it): the loss of the
    # joined scores, so the network learns the counts' residual (docs/model.md "Count part")
    count_fit: str = key("separate", one_of("separate", "joint"))
    # model.counts=transitions: successors kept per context (the most counted, Space-Saving);
    # 32 against 16: MovieLens in user order 1.197x -> 1.215x Markov (docs/choosing-a-configuration.md)
    successors: int = key(32, between(1, 1024))
    # with model.counts: a cache of the stream's last n learned tokens as a second score (0 = off)
    recent: int = key(0, between(0, 1 << 20))
    # next-token's count part (none without model.counts): a cache of the stream's last n learned
    # (previous token, token) pairs mixed into the KN distribution, its weight learned online
    # (0 = off; counts/recent.py)
    recent_pairs: int = key(0, between(0, 1 << 20))
    # next-token: each input position also reads the hashed word n-grams ending at it, n = 2 up
    # to this (summed into its vector through the same embedding tables; 1 = the token alone).
    # Not hashing.ngrams, which adds n-grams to the token list itself (docs/model.md "N-gram inputs")
    input_ngrams: int = key(1, between(1, 4))

    def __post_init__(self) -> None:
        check_keys(self)
        if self.layers > 0 and self.d_model % self.heads:
            raise ConfigError(f"model.d_model={self.d_model} must be divisible by model.heads={self.heads} "
                              "when model.layers > 0: change one of them", "model.d_model")


@dataclass(frozen=True)
class OptimConfig:
    section: ClassVar[str] = "optim"

    sparse: str = key("adagrad", one_of(*SPARSE_OPTIMIZERS))  # row-wise optimizer for embedding tables
    # online text and next-item: best of 0.05..0.5 (docs/choosing-a-configuration.md)
    sparse_lr: float = key(0.2, above(0))
    # a sampled head's own output rows (O, Ob); 0: optim.sparse_lr. Token tasks with a count part
    # want them slower than the input rows (docs/model.md "Count part")
    output_lr: float = key(0.0, at_least(0))
    dense_lr: float = key(2e-3, above(0))  # also right for layers >= 1 (0.01 suits depth 0 only)
    # Adagrad's sum of a row's squared gradients is multiplied by this at each step that touches the
    # row (1: plain Adagrad, whose step on a frequent row shrinks toward 0 on an endless stream).
    # next-token: 0.95 (level or better on four token streams; docs/choosing-a-configuration.md)
    row_decay: float = key(1.0, between(0, 1, low_open=True))
    weight_decay: float = key(0.0, at_least(0))

    def __post_init__(self) -> None:
        check_keys(self)


@dataclass(frozen=True)
class LearnerConfig:
    section: ClassVar[str] = "learner"

    task: str = key("classify", one_of(*TASKS))
    # text: 8 learns sooner than 16 (+0.5 to 1 point on 1,000-record streams) at ~0.6x the records/s
    batch_size: int = key(8, between(1, 2**20))
    # from this step on a step takes 2 x batch_size records (0: never). next-token: 250, after its
    # first 2,000 records: a warm model lost nothing per record at 16 on four streams, at ~1.35x the
    # records/s (docs/choosing-a-configuration.md)
    double_batch_after: int = key(0, at_least(0))
    # "auto" picks CUDA when available, else CPU
    device: str = key("auto", matches(r"auto|cpu|cuda(:[0-9]+)?", "'auto', 'cpu', 'cuda' or 'cuda:N'"))
    # classify at depth 0 on the CPU: the step runs as one compiled function (streamlearn.compiled),
    # 2.0-2.3x learn_many's records/s against torch's ops, and a training text's tokens go straight
    # to their hashes (streamlearn.compiled_text); false: torch's ops and Python's tokenizer, the
    # reference they are tested against
    compiled: bool = key(True, flag())
    mask_prob: float = key(0.15, between(0, 1, low_open=True, high_open=True))  # mlm
    # next-item: a key's last n items. 20 with recency 3, the key token and the place weights
    # against 10 with recency 1 (3 seeds, 7 streams): the taste streams 0.95x -> 1.10x and
    # 1.14x -> 1.26x popularity, MovieLens 1.33x -> 1.36x Markov (docs/choosing-a-configuration.md)
    history: int = key(20, at_least(1))
    # next-item: the last r items also enter as tokens of their own, so the bag knows which came last
    recency: int = key(3, at_least(0))
    # next-item: the record's key (a user, a session) also enters as a token of its own: a
    # user's vector learns the taste a bag of recent items only hints at
    key_token: bool = key(True, flag())
    # next-item: a learned weight per place from the end scales each input token before the
    # bag is pooled, so recent items can count more than old ones (tasks.next_item.PLACES)
    place_weights: bool = key(True, flag())
    beam: int = key(50, at_least(1))  # top-k decoding beam width
    # weight of HashFormers' Shuffle+Random loss (0 = off; needs model.positions)
    shuffle_random: float = key(0.0, at_least(0))
    # classify: weight of the hashed Naive Bayes score added to the label logits of predictions (0 = off)
    nb_weight: float = key(0.1, at_least(0))
    nb_alpha: float = key(0.3, above(0))  # classify: Naive Bayes additive smoothing of the (token, label) counts
    # classify: the Naive Bayes part leaves out of a score the tokens it never counted
    # (false: their smoothed ratios count, as a state stored before 2026-11-27 does)
    nb_skip_unseen: bool = key(True, flag())
    # classify: hashed (token, label) count cells of the Naive Bayes part (4 bytes each)
    nb_cells: int = key(1_048_576, multiple_of(NB_ROW, NB_ROW, HASH_RANGE))
    seed: int = key(0, between(0, SEED_RANGE, high_open=True))
    # records read before learning starts to size a new model's derived keys (model.out_B=0)
    sizing_window: int = key(10_000, at_least(1))

    def __post_init__(self) -> None:
        check_keys(self)


@dataclass(frozen=True)
class StoreConfig:
    section: ClassVar[str] = "store"

    backend: str = key("lmdb", one_of("lmdb", "memory"))
    shards: int = key(8, between(1, MAX_SHARDS))
    map_size_gb: float = key(4.0, above(0))
    grow_map: bool = key(True, flag())  # a full map grows (at least doubling) instead of failing
    sync: bool = key(True, flag())  # sync=False: an OS crash or power loss can lose the last commits and may damage the file

    def __post_init__(self) -> None:
        check_keys(self)


@dataclass(frozen=True)
class WorkerConfig:
    """The Kafka consumer worker (see docs/operations.md)."""

    section: ClassVar[str] = "worker"

    bootstrap: str = key("127.0.0.1:9092", matches(_BOOTSTRAP, "host:port[,host:port...] with ports in [1, 65535]",
                                                   _ports_ok))
    group: str = key("streamlearn", matches(_TEXT.replace("*", "+"), "a non-empty name without control characters"))
    # records (a crash re-reads at most this many; ~2-3 s of a depth-0 worker here)
    checkpoint_every: int = key(20_000, at_least(1))
    checkpoint_seconds: float = key(30.0, above(0))
    max_record_bytes: int = key(1_000_000, between(1, KAFKA_BYTES))
    dlq_suffix: str = key(".dlq", matches(_NAME, "1+ of A-Z a-z 0-9 . _ - (it ends a topic name)"))
    # larger bad messages are dead-lettered cut to this size
    dlq_max_bytes: int = key(16_777_216, between(1024, KAFKA_BYTES))
    poll_timeout_ms: int = key(200, between(1, 30_000))  # longer: --until-idle and a stop wait for it
    queue_batches: int = key(16, at_least(1))  # prepared batches buffered between the fetch thread and training
    # intra-op threads of the training loop; 0: CPUs - 1 (the fetch thread needs one)
    torch_threads: int = key(0, between(0, 1024))
    eval_every: int = key(10, at_least(0))  # the prequential check on every n-th batch (0: off); one extra forward each
    log_seconds: float = key(5.0, above(0))  # status line interval
    retry_max_s: float = key(5.0, above(0))  # cap of the exponential backoff while the broker is unreachable
    # at start-up: stop when the broker or the topic cannot be reached for this long
    connect_timeout_s: float = key(10.0, above(0))
    # without --world-size: "manual" reads every partition itself (no group join), "group" joins worker.group
    assignment: str = key("manual", one_of(*ASSIGNMENTS))
    # a stored offset beyond its partition's end, or a changed partition count: "stop", or
    # "restart-from-start" those partitions (logged as an error)
    on_lost_offsets: str = key("stop", one_of(*ON_LOST_OFFSETS))
    session_timeout_ms: int = key(10_000, at_least(1))  # group membership: a killed worker's partitions move after this
    heartbeat_interval_ms: int = key(3_000, at_least(1))
    max_poll_interval_ms: int = key(300_000, at_least(1))
    audit: bool = key(False, flag())  # store the offset ranges each checkpoint applied (kv "audit"; tests)
    # several workers: "average" replicas at each checkpoint, or "allreduce" gradients per step
    sync: str = key("average", one_of(*SYNC_MODES))

    def __post_init__(self) -> None:
        check_keys(self)
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ConfigError(f"worker.heartbeat_interval_ms={self.heartbeat_interval_ms} must be below "
                              f"worker.session_timeout_ms={self.session_timeout_ms} (a third of it is usual)",
                              "worker.heartbeat_interval_ms")


@dataclass(frozen=True)
class KafkaConfig:
    """How every Kafka client we build connects: TLS and SASL, as kafka-python names them
    (docs/operations.md, "Running against a real Kafka cluster"). ``""`` means unset.

    Each key is checked alone when the config is built; the combination (credentials for
    the mechanism, files that exist) when a client is built (:meth:`client_options`), so a
    password may come from the environment after the file. Passwords never reach a repr,
    a report, a checkpoint or a log: :meth:`Config.to_dict` redacts them.
    """

    section: ClassVar[str] = "kafka"

    security_protocol: str = key("PLAINTEXT", one_of(*SECURITY_PROTOCOLS))
    # PEM CA bundle that signed the brokers' certificates ("": system CAs)
    ssl_cafile: str = key("", _FILE)
    ssl_certfile: str = key("", _FILE)  # PEM client certificate (mutual TLS)
    ssl_keyfile: str = key("", _FILE)  # PEM client key (mutual TLS)
    ssl_password: str = key("", matches(_NO_NUL, "text without NUL"), repr=False)  # secret: the client key's passphrase
    ssl_check_hostname: bool = key(True, flag())
    ssl_crlfile: str = key("", _FILE)  # PEM certificate revocation list
    sasl_mechanism: str = key("", one_of("", *SASL_MECHANISMS, hint="OAUTHBEARER needs a token provider object and "
                                         "cannot be configured here"))  # needed by SASL_* protocols
    sasl_plain_username: str = key("", _SASL_TEXT)  # PLAIN and SCRAM-*
    sasl_plain_password: str = key("", _SASL_TEXT, repr=False)  # secret: PLAIN and SCRAM-*
    sasl_kerberos_service_name: str = key("kafka", matches(_NAME, "1+ of A-Z a-z 0-9 . _ -"))  # GSSAPI
    client_id: str = key("", matches(_TEXT, "text without control characters"))  # "": kafka-python's default

    def __post_init__(self) -> None:
        check_keys(self, SECRET_KEYS)

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
        sasl_set = [k for k in ("sasl_mechanism", "sasl_plain_username", "sasl_plain_password") if getattr(self, k)]
        if sasl_set and not self.uses_sasl:
            raise ConfigError(f"kafka.{sasl_set[0]} is set but kafka.security_protocol={self.security_protocol!r} "
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
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_crlfile"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise ConfigError(f"kafka.{name}={path!r} is not a file: give the path of the PEM file")
        if self.ssl_keyfile and not self.ssl_certfile:
            raise ConfigError("kafka.ssl_keyfile is set without kafka.ssl_certfile: mutual TLS needs both")
        self._check_pem()

    def _check_pem(self) -> None:
        """The files load as TLS will load them. kafka-python reports a file it cannot load
        (a wrong key passphrase, a CA file that holds no certificate) only in a log line of
        its IO thread, after which every connection fails as if no broker answered."""
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        if self.ssl_cafile:
            try:
                context.load_verify_locations(self.ssl_cafile)
            except (OSError, ValueError) as exc:
                raise ConfigError(f"kafka.ssl_cafile={self.ssl_cafile!r} holds no PEM certificate TLS can load "
                                  f"({exc}): give the CA bundle that signed the brokers' certificates") from exc
        if self.ssl_certfile:
            try:
                # a callable, never None: without a passphrase OpenSSL would prompt on the terminal
                context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile or None,
                                        self.ssl_password or (lambda: ""))
            except (OSError, ValueError) as exc:
                raise ConfigError(f"kafka.ssl_certfile={self.ssl_certfile!r} with its key cannot be loaded ({exc}): "
                                  "a wrong kafka.ssl_password, a key that does not match the certificate, or not "
                                  "PEM files") from exc


@dataclass(frozen=True)
class ServiceConfig:
    section: ClassVar[str] = "service"

    host: str = key("127.0.0.1", matches(r"[A-Za-z0-9._:%-]+", "a host name or an IP address"))
    port: int = key(8000, between(0, 65535))  # 0: any free port
    max_tokens: int = key(512, at_least(1))
    max_batch: int = key(256, at_least(1))
    max_request_tokens: int = key(32_768, at_least(1))  # all queries of one request together (413 beyond)
    max_body_bytes: int = key(2**20, at_least(1))  # one request body (413 beyond)

    def __post_init__(self) -> None:
        check_keys(self)


def _nb_cells_needed(max_labels: int) -> int:
    """Naive Bayes cells for the 2 * max_labels + 1 label cells and at least one row of
    (token, label) cells, in whole rows (heads.NaiveBayesHead lays them out)."""
    return -(-(2 * max_labels + 1 + NB_ROW) // NB_ROW) * NB_ROW


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
        """Rules that involve two sections (each section checks its own keys)."""
        lc, m = self.learner, self.model
        if lc.shuffle_random > 0 and not m.positions:
            raise ConfigError(f"learner.shuffle_random={lc.shuffle_random:g} needs token order to detect shuffled "
                              "tokens: set model.positions=true (or learner.shuffle_random=0)", "learner.shuffle_random")
        if m.counts == "transitions" and (lc.task != "next-item" or m.output not in ("auto", "hashed")
                                          or self.embedding.scheme == "tfree"):
            raise ConfigError(f"model.counts='transitions' is a count part of task next-item with the hashed "
                              f"output (now learner.task={lc.task!r}, model.output={m.output!r}, embedding.scheme="
                              f"{self.embedding.scheme!r}): set those, or model.counts='none'", "model.counts")
        if m.counts == "kn4" and lc.task != "next-token":
            raise ConfigError(f"model.counts='kn4' is a count part of task next-token (now learner.task="
                              f"{lc.task!r}; mlm reads two-sided trigrams): set model.counts='kn3' or 'none'",
                              "model.counts")
        if m.counts in ("kn3", "kn4") and (lc.task not in COUNT_TASKS or m.output != "sampled"):
            raise ConfigError(f"model.counts={m.counts!r} is a count part of task next-token or mlm with "
                              f"model.output='sampled' (now learner.task={lc.task!r}, model.output={m.output!r}): "
                              "set those, or model.counts='none'", "model.counts")
        if m.recent and m.counts not in ("kn3", "kn4"):
            raise ConfigError(f"model.recent={m.recent} is a feature of the count part: set model.counts='kn3' "
                              "(or model.recent=0)", "model.recent")
        if m.recent_pairs and lc.task != "next-token":  # with model.counts=none there is no count part to mix into
            raise ConfigError(f"model.recent_pairs={m.recent_pairs} mixes into next-token's count part (now "
                              f"learner.task={lc.task!r}): set model.recent_pairs=0", "model.recent_pairs")
        if m.input_ngrams > 1 and lc.task != "next-token":  # mlm: a masked word's n-grams would give it away
            raise ConfigError(f"model.input_ngrams={m.input_ngrams} is an input of task next-token (now "
                              f"learner.task={lc.task!r}): set model.input_ngrams=1", "model.input_ngrams")
        if self.optim.row_decay < 1 and self.optim.sparse != "adagrad":
            raise ConfigError(f"optim.row_decay={self.optim.row_decay:g} decays Adagrad's sums (now optim.sparse="
                              f"{self.optim.sparse!r}, whose moments decay by their own betas): set "
                              "optim.sparse='adagrad' or optim.row_decay=1", "optim.row_decay")
        if m.out_B == DERIVE and "model.out_B" not in task_derived(lc.task):
            raise ConfigError(f"model.out_B={DERIVE} (derived from the stream) is for the tasks that derive it "
                              f"({', '.join(t for t in TASKS if 'model.out_B' in task_derived(t))}); "
                              f"learner.task={lc.task!r} needs a size: set model.out_B >= 1", "model.out_B")
        least = _nb_cells_needed(m.max_labels)
        if lc.nb_weight > 0 and lc.nb_cells < least:
            raise ConfigError(f"learner.nb_cells={lc.nb_cells} leaves no room for the (token, label) cells after "
                              f"the 2 * model.max_labels + 1 label cells: raise it to at least {least} "
                              f"(default {LearnerConfig.nb_cells}), or set learner.nb_weight=0", "learner.nb_cells")

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Every section as a dict, secrets (:data:`SECRET_KEYS`) replaced by
        :data:`REDACTED`: this is what reports, checkpoints and snapshots store."""
        data = dataclasses.asdict(self)
        for dotted in SECRET_KEYS:
            section, name = dotted.split(".")
            if data[section][name]:
                data[section][name] = REDACTED
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Mapping[str, Any]]) -> "Config":
        """Build from sections of key -> value. A key missing from ``data`` takes its
        task's default if the task has one (``streamlearn.tasks.REGISTRY``), else the
        global default. Every key is checked once, when its section is built, then the
        rules across sections."""
        sections = section_classes()
        unknown = set(data) - set(sections)
        if unknown:
            raise ConfigError(f"unknown config section(s) {sorted(unknown)}; valid: {sorted(sections)}")
        data = _with_task_defaults(data)
        return cls(**{name: _build_section(name, section_cls, data.get(name, {}))
                      for name, section_cls in sections.items()})

    def override(self, *assignments: str) -> "Config":
        """Return a copy with dotted ``section.key=value`` assignments applied. A key
        this config holds at its task's default counts as not set, so an assignment of
        ``learner.task`` brings the new task's defaults for those keys (set a key in the
        same call, or to a value other than the old task's default, to keep it)."""
        return Config.from_dict(_assign(self._set_keys(), assignments))

    def _set_keys(self) -> dict[str, dict[str, Any]]:
        """The keys whose values differ from what this config's task defaults give (and
        the task itself), as sections; secrets survive (not :meth:`to_dict`)."""
        ours = dataclasses.asdict(self)
        base = dataclasses.asdict(Config.from_dict({"learner": {"task": self.learner.task}}))
        out = {section: {k: v for k, v in keys.items() if v != base[section][k]} for section, keys in ours.items()}
        out["learner"]["task"] = self.learner.task
        return out


# ---------------------------------------------------------------------------- restarts

# Which keys may change when a stored model is opened again (a worker restarted on its
# state, `replay --state` with --set). A MODEL key changes what the stored rows, weights
# or counts mean, or their shapes: opening a model with another value would silently
# apply the rows of one function to another (a changed hash seed once took SMS accuracy
# from 0.997 to 0.003 with exit code 0), so it is refused, naming the keys. A RUN key is
# safe to change between runs. Every key is in exactly one set (a test checks).
MODEL_KEYS: frozenset[str] = frozenset({
    "hashing.seed", "hashing.tokenizer", "hashing.lowercase", "hashing.scripts", "hashing.ngrams", "hashing.shapes",
    "hashing.max_tokens",
    "embedding.scheme", "embedding.d", "embedding.K", "embedding.B", "embedding.k", "embedding.m",
    "embedding.append_p", "embedding.combine", "embedding.init", "embedding.hashformer_hash",
    "embedding.hashformer_bits", "embedding.hashformer_pool_bits", "embedding.tfree_rows", "embedding.plain_vocab",
    "model.layers", "model.d_model", "model.heads", "model.ffn", "model.positions", "model.max_labels",
    "model.out_B", "model.out_m", "model.tie_output", "model.output", "model.counts", "model.count_slots",
    "model.recent", "model.recent_pairs", "model.input_ngrams", "model.successors", "model.count_join", "model.count_fit",
    "optim.sparse",
    "learner.task", "learner.recency", "learner.key_token", "learner.place_weights", "learner.shuffle_random",
    "learner.nb_weight", "learner.nb_cells", "learner.nb_skip_unseen",
    "store.shards",
})
RUN_KEYS: frozenset[str] = frozenset({
    "model.dropout", "model.negatives",
    "optim.sparse_lr", "optim.output_lr", "optim.dense_lr", "optim.row_decay", "optim.weight_decay",
    "learner.batch_size", "learner.double_batch_after", "learner.device", "learner.compiled", "learner.mask_prob", "learner.history",
    "learner.beam",
    "learner.nb_alpha", "learner.seed", "learner.sizing_window",
    "store.backend", "store.map_size_gb", "store.grow_map", "store.sync",
    *(f"{section}.{name}" for section, cls in (("worker", WorkerConfig), ("kafka", KafkaConfig),
                                                ("service", ServiceConfig)) for name in (f.name for f in fields(cls))),
})


def model_changes(stored: "Config", new: "Config") -> list[str]:
    """``"hashing.seed: stored 0, now 5"`` for every :data:`MODEL_KEYS` key whose value
    differs between a stored model's config and the one it is opened with."""
    a, b = stored.to_dict(), new.to_dict()
    out = []
    for dotted in sorted(MODEL_KEYS):
        section, name = dotted.split(".")
        if a[section][name] != b[section][name]:
            out.append(f"{dotted}: stored {a[section][name]!r}, now {b[section][name]!r}")
    return out


def keep_stored(stored: "Config", new: "Config", given: Collection[str]) -> tuple["Config", list[str]]:
    """``new`` with the stored value of every :data:`MODEL_KEYS` key that differs and is
    not in ``given`` (the keys a user set, :func:`load_config_given`), and :func:`model_changes`'
    lines for the keys it kept. A worker restarted without its first run's flags, or under
    a release whose defaults moved, opens its model as it was; a model key the user set to
    another value is left for the restart check to refuse. A stored task brings its own
    defaults for the run keys the user did not set, as :meth:`Config.override` does.

    >>> old = Config().override("learner.task=next-item", "learner.recency=1", "model.out_B=4096")
    >>> cfg, kept = keep_stored(old, Config(), given=())
    >>> cfg.learner.task, cfg.learner.recency, cfg.learner.batch_size
    ('next-item', 1, 64)
    >>> [line for line in kept if line.startswith("learner.")]
    ['learner.recency: stored 1, now 3', "learner.task: stored 'next-item', now 'classify'"]
    >>> keep_stored(old, Config().override("learner.recency=5"), given={"learner.recency"})[0].learner.recency
    5
    """
    changes = [line for line in model_changes(stored, new) if line.partition(":")[0] not in given]
    if not changes:
        return new, []
    # A key the user set to the default of the task they run as (the default task, when a
    # stored next-token model is restarted without --task) is not "set" for override, which
    # would give it the stored task's default: such keys are assigned again, as given.
    restored = [line.partition(":")[0] for line in changes]
    clobbered = sorted({a.partition("=")[0] for a in task_defaults(stored.learner.task)} & set(given) - set(restored))
    assignments = [*values_of(stored, restored), *values_of(new, clobbered)]
    return new.override(*(f"{dotted}={value}" for dotted, value in assignments)), changes


def retasked(cfg: "Config", task: str, given: Collection[str]) -> "Config":
    """``cfg`` as a ``task`` model: the task's defaults, and every key in ``given`` (the
    keys a user set, :func:`load_config_given`) at its value in ``cfg``, as if the user had
    passed ``--task`` with them. A given key the task refuses raises ConfigError.

    >>> cfg = Config().override("learner.batch_size=8", "embedding.B=500")
    >>> new = retasked(cfg, "next-item", given={"embedding.B"})
    >>> new.learner.task, new.embedding.B, new.learner.batch_size
    ('next-item', 500, 64)
    >>> retasked(cfg, "next-item", given={"learner.batch_size"}).learner.batch_size
    8
    """
    # A given key at the old task's default counts as unset for override, so each is
    # assigned again; secrets (never task defaults) carry over through override itself.
    assignments = [f"{dotted}={value}" for dotted, value in values_of(cfg, sorted(set(given) - SECRET_KEYS))
                   if dotted != "learner.task"]
    return cfg.override(f"learner.task={task}", *assignments)


def stored_values(stored: "Config", changes: list[str]) -> list[tuple[str, str]]:
    """``(dotted key, value as a --set writes it)`` of the stored config for each of
    :func:`model_changes`' lines, for an error message to offer."""
    return values_of(stored, [line.partition(":")[0] for line in changes])


def values_of(cfg: "Config", keys: Iterable[str]) -> list[tuple[str, str]]:
    """``(dotted key, value as a --set writes it)`` of ``cfg`` for each dotted key."""
    data = cfg.to_dict()
    out = []
    for dotted in keys:
        section, name = dotted.split(".")
        value = data[section][name]
        out.append((dotted, str(value).lower() if isinstance(value, bool) else str(value)))
    return out


def _with_task_defaults(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` plus the defaults of its task (``learner.task``, else the default task)
    for the keys it does not set."""
    learner = data.get("learner", {})
    task = learner.get("task", LearnerConfig.task) if isinstance(learner, Mapping) else LearnerConfig.task
    defaults = task_defaults(task) if isinstance(task, str) else ()
    missing = [a for a in defaults if not _given(data, *a.partition("=")[0].split("."))]
    if not missing:
        return dict(data)
    return _assign({section: dict(table) if isinstance(table, Mapping) else table
                    for section, table in data.items()}, missing)


def _given(data: Mapping[str, Any], section: str, name: str) -> bool:
    table = data.get(section)
    return isinstance(table, Mapping) and name in table


def section_classes() -> dict[str, type]:
    """Section name -> its dataclass, in :class:`Config`'s order."""
    return {f.name: f.default_factory for f in fields(Config)}  # type: ignore[misc]


def _build_section(name: str, section_cls: type, values: Mapping[str, Any]) -> Any:
    if not isinstance(values, Mapping):
        raise ConfigError(f"config section [{name}] must be a table, got {type(values).__name__}")
    valid = {f.name for f in fields(section_cls)}
    unknown = set(values) - valid
    if unknown:
        raise ConfigError(f"unknown key(s) {sorted(unknown)} in [{name}]; valid: {sorted(valid)}")
    return section_cls(**values)


def _assign(data: dict[str, Any], assignments: Iterable[str]) -> dict[str, Any]:
    """``data`` (sections of raw values) with each ``section.key=value`` applied, the
    value read as the type of the key's default. Nothing is built or checked beyond the
    names, so values given together are checked together, once."""
    sections = section_classes()
    for item in assignments:
        section, name, raw = _split_assignment(item)
        dotted = f"{section}.{name}"
        if section not in sections:
            raise ConfigError(f"unknown config section {section!r} in {_unvalued(item)!r}; "
                              f"valid: {sorted(sections)}", dotted)
        defaults = {f.name: f.default for f in fields(sections[section])}
        if name not in defaults:
            raise ConfigError(f"unknown key {dotted} in {_unvalued(item)!r}; valid: {sorted(defaults)}", dotted)
        table = data.get(section, {})
        if isinstance(table, Mapping):  # else from_dict says the section must be a table
            data[section] = {**table, name: _coerce(raw, defaults[name], f"{section}.{name}")}
    return data


def _split_assignment(item: str) -> tuple[str, str, str]:
    path, sep, raw = item.partition("=")
    section, dot, name = path.strip().partition(".")
    if not sep or not dot or not name:
        raise ConfigError(f"override {_unvalued(item)!r} must look like section.key=value (e.g. model.layers=2)")
    # a password keeps the spaces around it (was: dropped silently); a line ending is never
    # part of one (a secret file or a Kubernetes secret often ends in a newline)
    return section, name, raw.rstrip("\r\n") if f"{section}.{name}" in SECRET_KEYS else raw.strip()


def _unvalued(item: str) -> str:
    """An override as shown in errors: without its value, which may be a password."""
    path, sep, _ = item.partition("=")
    if sep:
        return f"{path}=..."
    key = re.match(r"[\w.\-]*", item).group(0)  # 'kafka.ssl_password:secret': the key, not what follows
    return item if key == item else f"{key}..."


def _coerce(raw: str, default: Any, where: str) -> Any:
    try:
        if isinstance(default, bool):
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1")
        if isinstance(default, int):
            return _integer(raw)
        if isinstance(default, float):
            return float(raw)
    except (ValueError, OverflowError) as exc:
        shown = REDACTED if where in SECRET_KEYS else repr(raw)
        raise ConfigError(f"{where}={shown} is not a valid {type(default).__name__}", where) from exc
    return raw


def _integer(raw: str) -> int:
    """``1_000_000`` and large ints exactly (no float on the way: a 64-bit seed would
    lose its low bits), and ``1e6`` as a float that is a whole number."""
    try:
        return int(raw)
    except ValueError:
        number = float(raw)
        if not number.is_integer():
            raise
        return int(number)


def env_overrides(environ: Mapping[str, str] | None = None) -> list[str]:
    """Dotted overrides from ``STREAMLEARN__SECTION__KEY=value`` variables.

    This is the only place the library reads the environment for settings.
    """
    return [assignment for _, assignment in _env_items(os.environ if environ is None else environ)]


def _env_items(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """(variable, ``section.key=value``) for each ``STREAMLEARN__SECTION__KEY``, sorted."""
    # Variable names are upper case by convention, keys mostly lower case; the paper's
    # K and B are both, and K differs from k, so an exact key match wins over matching
    # without case (STREAMLEARN__EMBEDDING__K is embedding.K, __k is embedding.k).
    known = Config().to_dict()
    out = []
    for variable, value in sorted(environ.items()):
        if variable.startswith("STREAMLEARN__"):
            parts = variable.split("__")
            if len(parts) != 3 or not all(parts):  # a setting meant, and lost to a typo: say so
                raise ConfigError(f"environment variable {variable} is not a setting: name one as "
                                  "STREAMLEARN__SECTION__KEY (two underscores each), e.g. STREAMLEARN__OPTIM__DENSE_LR")
            _, section, name = parts
            section = section.lower()
            keys = known.get(section, {})
            if name not in keys:  # OUT_B is model.out_B; an unknown name is refused under its lower case
                name = next((k for k in keys if k.lower() == name.lower()), name.lower())
            out.append((variable, f"{section}.{name}={value}"))
    return out


def load_config(path: str | Path | None = None, overrides: Iterable[str] = (), use_env: bool = True) -> Config:
    """Defaults, then the TOML file at ``path``, then environment, then ``overrides``;
    the result is built and checked once, so a later source may mend an earlier one. A
    refused value from the file or the environment says where it came from."""
    return load_config_given(path, overrides, use_env)[0]


def load_config_given(path: str | Path | None = None, overrides: Iterable[str] = (),
                      use_env: bool = True, default_task: str | None = None) -> tuple[Config, frozenset[str]]:
    """:func:`load_config`'s config and the dotted keys its file, environment and
    ``overrides`` set: every key not left at its default. A restarted worker keeps the
    stored value of each model key outside these (:func:`keep_stored`).
    ``default_task``: the task when no source sets ``learner.task`` (a stored model's),
    so its defaults and rules apply; it is not among the keys given.

    >>> cfg, given = load_config_given(None, ["learner.task=next-item", "optim.sparse_lr = 0.1"], use_env=False)
    >>> sorted(given), cfg.optim.sparse_lr
    (['learner.task', 'optim.sparse_lr'], 0.1)
    """
    overrides = list(overrides)
    data = {} if path is None else _file_sections(path)
    env = _env_items(os.environ) if use_env else []
    origins = {f"{section}.{name}": f"config file {path}" for section, table in data.items()
               if isinstance(table, Mapping) for name in table}
    origins.update({assignment.partition("=")[0]: f"environment variable {variable}" for variable, assignment in env})
    typed = {assignment.partition("=")[0].strip() for assignment in overrides}
    for dotted in typed:
        origins.pop(dotted, None)  # the user just typed it
    task = ([f"learner.task={default_task}"] if default_task is not None and "learner.task" not in origins
            and "learner.task" not in typed else [])
    try:
        config = Config.from_dict(_assign(data, [*task, *(assignment for _, assignment in env), *overrides]))
    except ConfigError as exc:
        if exc.key not in origins:
            raise
        raise ConfigError(f"{exc} (from {origins[exc.key]})", exc.key) from exc
    return config, frozenset({*origins, *typed})


def _file_sections(path: str | Path) -> dict[str, Any]:
    """A config file's sections, their names and keys checked: an unknown section or key,
    or a section that is not a table, is refused naming the file (was: only a value's error
    named it; these said nothing of where they came from)."""
    data = _read_toml(path)
    sections = section_classes()
    for name, table in data.items():
        if name not in sections and not isinstance(table, Mapping):
            homes = [f"[{sec}]" for sec, cls in sections.items() if name in {f.name for f in fields(cls)}]
            raise ConfigError(f"{name} in config file {path} is outside any section: put it under "
                              + (" or ".join(homes) if homes else f"its section (one of {sorted(sections)})"))
        if name not in sections:
            raise ConfigError(f"unknown config section [{name}] in config file {path}; valid: {sorted(sections)}")
        if not isinstance(table, Mapping):
            raise ConfigError(f"config section [{name}] in config file {path} must be a table, got "
                              f"{type(table).__name__}")
        unknown = sorted(set(table) - {f.name for f in fields(sections[name])})
        if unknown:
            raise ConfigError(f"unknown key(s) {unknown} in [{name}] of config file {path}; valid: "
                              f"{sorted(f.name for f in fields(sections[name]))}")
    return data


def _read_toml(path: str | Path) -> dict[str, Any]:
    try:
        # utf-8-sig: a byte-order mark (Windows editors) is not a TOML statement
        return tomllib.loads(Path(path).read_text(encoding="utf-8-sig"))
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path} does not exist") from exc
    except OSError as exc:  # a directory, no permission, an I/O error
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {exc.start}): save it as UTF-8") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
