"""Configuration: TOML, dotted overrides, unknown names rejected, environment in one place,
and every key checked against its range where it is declared."""
import dataclasses
import re
from typing import Any, NamedTuple

import pytest

from streamlearn.config import (
    NB_ROW, SPARSE_OPTIMIZERS, Config, LearnerConfig, ModelConfig, OptimConfig, StoreConfig,
    WorkerConfig, env_overrides, load_config, load_config_given, section_classes,
)
from streamlearn.config_rules import rule_of
from streamlearn.exceptions import ConfigError


def test_defaults_are_frozen():
    cfg = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.model.layers = 3  # type: ignore[misc]


def test_given_keys_are_what_the_file_the_environment_and_overrides_set(tmp_path, monkeypatch):
    path = tmp_path / "c.toml"
    path.write_text('[model]\nlayers = 1\n[learner]\ntask = "mlm"\n')
    monkeypatch.setenv("STREAMLEARN__OPTIM__SPARSE_LR", "0.1")
    cfg, given = load_config_given(path, ["embedding.K=10"])
    assert given == {"model.layers", "learner.task", "optim.sparse_lr", "embedding.K"}
    assert cfg == load_config(path, ["embedding.K=10"])
    assert load_config_given(path, use_env=False)[1] == {"model.layers", "learner.task"}
    assert load_config_given()[1] == {"optim.sparse_lr"}


def test_toml_then_overrides(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[model]\nlayers = 3\n[embedding]\nscheme = "bloom"\nd = 32\n[optim]\ndense_lr = 1\n')
    cfg = load_config(path, ["model.layers=0", "embedding.K=1e6", "store.sync=false"], use_env=False)
    assert (cfg.model.layers, cfg.embedding.scheme, cfg.embedding.d) == (0, "bloom", 32)
    assert cfg.embedding.K == 1_000_000 and cfg.store.sync is False
    assert cfg.optim.dense_lr == 1.0 and isinstance(cfg.optim.dense_lr, float)


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.layer=2", "unknown key model.layer"),
        ("modle.layers=2", "unknown config section 'modle'"),
        ("model.layers=two", "model.layers='two' is not a valid int"),
        ("model.layers=1.5", "not a valid int"),
        ("store.sync=maybe", "not a valid bool"),
        ("layers=2", "must look like section.key=value"),
        ("embedding.scheme=word2vec", "embedding.scheme must be one of 'hash', 'bloom'"),
        ("learner.task=regress", "learner.task must be one of 'classify', 'mlm', 'next-item', 'next-token', "
                                 "got 'regress'"),
    ],
)
def test_bad_overrides_say_what_to_change(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        Config().override(override)


def _written(path, data: bytes):
    path.write_bytes(data)
    return path


def test_bad_toml_is_a_config_error(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\nlayers=")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml")
    for unreadable, message in [(tmp_path, "cannot read config file"),  # a directory
                                (tmp_path / "bad.toml" / "x.toml", "cannot read config file"),
                                (_written(tmp_path / "latin1.toml", b'[kafka]\nclient_id = "caf\xe9"\n'),
                                 "is not UTF-8 text")]:
        with pytest.raises(ConfigError, match=message):  # was: a traceback
            load_config(unreadable)
    bom = _written(tmp_path / "bom.toml", b"\xef\xbb\xbf[model]\nlayers = 2\n")
    assert load_config(bom, use_env=False).model.layers == 2  # was: 'Invalid statement (at line 1, column 1)'
    typed = tmp_path / "typed.toml"
    typed.write_text('[model]\nlayers = "3"\n[extra]\nx = 1\n')
    with pytest.raises(ConfigError, match="unknown config section"):
        load_config(typed)


def test_environment_overrides():
    env = {"STREAMLEARN__MODEL__LAYERS": "4", "STREAMLEARN__EMBEDDING__K": "99", "STREAMLEARN_OTHER": "x"}
    assert env_overrides(env) == ["embedding.K=99", "model.layers=4"]
    assert Config().override(*env_overrides(env)).embedding.K == 99
    # the exact name first (K and k are two keys), then the name without case (was: OUT_B -> out_b, unknown)
    assert env_overrides({"STREAMLEARN__MODEL__OUT_B": "4096", "STREAMLEARN__EMBEDDING__k": "3",
                          "STREAMLEARN__EMBEDDING__B": "512"}) == ["embedding.B=512", "embedding.k=3",
                                                                   "model.out_B=4096"]
    with pytest.raises(ConfigError, match="model.no_such"):
        Config().override(*env_overrides({"STREAMLEARN__MODEL__NO_SUCH": "1"}))


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "mps", "CPU"])
def test_a_device_torch_does_not_have_is_refused_when_the_config_is_built(device):
    """Was: any lower-case word passed, and was refused only when the model was built,
    after a worker had created its state directory."""
    with pytest.raises(ConfigError, match="learner.device"):
        Config().override(f"learner.device={device}")


@pytest.mark.parametrize("variable", ["STREAMLEARN__OPTIM_DENSE_LR", "STREAMLEARN__OPTIM__DENSE_LR__X",
                                      "STREAMLEARN__OPTIM", "STREAMLEARN____DENSE_LR"])
def test_a_malformed_setting_variable_is_refused_not_ignored(variable):
    """Was: ignored, so the run went on with the default the user meant to change."""
    with pytest.raises(ConfigError, match=f"environment variable {variable} is not a setting.*STREAMLEARN__SECTION__KEY"):
        env_overrides({variable: "-1"})


def test_round_trip_through_dict():
    cfg = Config().override("model.layers=2", "hashing.seed=7")
    assert Config.from_dict(cfg.to_dict()) == cfg


# ---------------------------------------------------------------------------- every key's range

class Case(NamedTuple):
    valid: Any  # a non-default value the key accepts
    invalid: Any  # a value it refuses: out of range, or (bool keys, whose type is the range) of another type
    context: tuple[str, ...] = ()  # overrides a valid value needs from another key


NUL = "a\x00b"
KEYS: dict[str, Case] = {
    "hashing.seed": Case(7, -1),
    "hashing.tokenizer": Case("ids", "chars"),
    "hashing.lowercase": Case(False, 1),
    "hashing.ngrams": Case(3, 0),
    "hashing.shapes": Case(False, "yes"),
    "hashing.scripts": Case(False, "yes"),
    "hashing.max_tokens": Case(64, 1),
    "embedding.scheme": Case("bloom", "word2vec"),
    "embedding.d": Case(32, 0),
    "embedding.K": Case(2**32, 2**32 + 1),
    "embedding.B": Case(1000, 0),
    "embedding.k": Case(3, 0),
    "embedding.m": Case(3, 0),
    "embedding.append_p": Case(True, "yes"),
    "embedding.combine": Case("concat", "max"),
    "embedding.init": Case("paper", "xavier"),
    "embedding.hashformer_hash": Case("xxh3", "sha1"),
    "embedding.hashformer_bits": Case(64, 129),
    "embedding.hashformer_pool_bits": Case(16, 17),
    "embedding.tfree_rows": Case(1024, 0),
    "embedding.plain_vocab": Case(10, 0),
    "model.layers": Case(2, -1),
    "model.d_model": Case(128, 0),
    "model.heads": Case(8, 0),
    "model.ffn": Case(512, 0),
    "model.dropout": Case(0.1, 1.0),
    "model.positions": Case(True, 0),
    "model.max_labels": Case(16, 0),
    "model.out_B": Case(1000, 2**33),
    "model.out_m": Case(3, 0),
    "model.tie_output": Case(False, "no"),
    "model.output": Case("sampled", "softmax"),
    "model.negatives": Case(0, -1),
    "model.counts": Case("none", "trigram", ("learner.task=next-token",)),  # kn4 is next-token's default
    "model.count_slots": Case(4096, 1000),
    "model.recent": Case(100, -1, ("learner.task=next-token",)),
    "model.recent_pairs": Case(100, -1, ("learner.task=next-token",)),
    "model.input_ngrams": Case(2, 5, ("learner.task=next-token",)),
    "model.successors": Case(64, 0, ("learner.task=next-item",)),
    "model.count_join": Case("mixture", "sum", ("learner.task=next-item",)),
    "model.count_fit": Case("joint", "residual", ("learner.task=next-token",)),
    "optim.output_lr": Case(0.01, -0.1),
    "optim.sparse": Case("lazy-adam", "sgd"),
    "optim.sparse_lr": Case(0.05, -0.5),
    "optim.dense_lr": Case(0.01, -1.0),
    "optim.row_decay": Case(0.9, 1.5),
    "optim.weight_decay": Case(0.01, -0.1),
    "learner.task": Case("mlm", "regress"),
    "learner.batch_size": Case(32, 0),
    "learner.double_batch_after": Case(250, -1),
    "learner.device": Case("cuda:1", "GPU 0"),
    "learner.compiled": Case(False, "fast"),
    "learner.mask_prob": Case(0.3, 1.0),
    "learner.history": Case(5, 0),
    "learner.recency": Case(0, -1),
    "learner.key_token": Case(False, "no"),
    "learner.place_weights": Case(False, 0),
    "learner.beam": Case(10, 0),
    "learner.shuffle_random": Case(0.5, -0.1, ("model.positions=true",)),
    "learner.nb_weight": Case(0.0, -1.0),
    "learner.nb_alpha": Case(1.0, 0.0),
    "learner.nb_skip_unseen": Case(False, "no"),
    "learner.nb_cells": Case(65536, 1000),
    "learner.seed": Case(2**64 - 1, 2**64),
    "learner.sizing_window": Case(500, 0),
    "store.backend": Case("memory", "rocksdb"),
    "store.shards": Case(256, 257),
    "store.map_size_gb": Case(0.5, 0.0),
    "store.grow_map": Case(False, "false"),
    "store.sync": Case(False, 1),
    "worker.bootstrap": Case("kafka-1:9092, kafka-2.example.com:19092", "kafka-1"),
    "worker.group": Case("team a", ""),
    "worker.checkpoint_every": Case(1000, 0),
    "worker.checkpoint_seconds": Case(1.5, 0.0),
    "worker.max_record_bytes": Case(2**20, 2**31),
    "worker.dlq_suffix": Case("-dead", "/dlq"),
    "worker.dlq_max_bytes": Case(1024, 1023),
    "worker.poll_timeout_ms": Case(50, 0),
    "worker.queue_batches": Case(4, 0),
    "worker.torch_threads": Case(1, -1),
    "worker.eval_every": Case(0, -1),
    "worker.log_seconds": Case(0.5, 0.0),
    "worker.retry_max_s": Case(1.0, float("inf")),
    "worker.connect_timeout_s": Case(0.5, 0.0),
    "worker.assignment": Case("group", "static"),
    "worker.on_lost_offsets": Case("restart-from-start", "skip"),
    "worker.session_timeout_ms": Case(30_000, 0),
    "worker.heartbeat_interval_ms": Case(1000, 0),
    "worker.max_poll_interval_ms": Case(3000, 0),
    "worker.audit": Case(True, "x"),
    "worker.sync": Case("allreduce", "sum"),
    "kafka.security_protocol": Case("SSL", "TLS"),
    "kafka.ssl_cafile": Case("/etc/ssl/ca.pem", NUL),
    "kafka.ssl_certfile": Case("client.pem", NUL),
    "kafka.ssl_keyfile": Case("client.key", NUL),
    "kafka.ssl_password": Case("s3cret", NUL),
    "kafka.ssl_check_hostname": Case(False, "false"),
    "kafka.ssl_crlfile": Case("crl.pem", NUL),
    "kafka.sasl_mechanism": Case("PLAIN", "OAUTHBEARER"),
    "kafka.sasl_plain_username": Case("alice", NUL),
    "kafka.sasl_plain_password": Case("pw", NUL),
    "kafka.sasl_kerberos_service_name": Case("kafka-prod", "kafka prod"),
    "kafka.client_id": Case("worker-1", "a\nb"),
    "service.host": Case("0.0.0.0", "local host"),
    "service.port": Case(0, 65536),
    "service.max_tokens": Case(64, 0),
    "service.max_batch": Case(8, 0),
    "service.max_request_tokens": Case(100, 0),
    "service.max_body_bytes": Case(4096, 0),
}


def declared_keys() -> list[str]:
    return [f"{name}.{f.name}" for name, cls in section_classes().items() for f in dataclasses.fields(cls)]


def test_the_table_covers_every_key():
    """A new key needs a row in KEYS (a value it accepts, one it refuses) and a rule."""
    assert sorted(KEYS) == sorted(declared_keys())
    for cls in section_classes().values():
        for f in dataclasses.fields(cls):
            assert rule_of(f).text


def _split(dotted: str) -> tuple[str, str]:
    section, name = dotted.split(".")
    return section, name


@pytest.mark.parametrize("dotted", sorted(KEYS))
def test_each_key_accepts_a_valid_value(dotted):
    section, name = _split(dotted)
    case = KEYS[dotted]
    base = Config().override(*case.context)
    assert case.valid != getattr(getattr(base, section), name), "use a non-default value"
    typed = Config.from_dict({**base.to_dict(), section: {**base.to_dict()[section], name: case.valid}})
    assert getattr(getattr(typed, section), name) == case.valid
    parsed = base.override(f"{dotted}={case.valid}")  # as --set and STREAMLEARN__* give it: a string
    assert getattr(getattr(parsed, section), name) == case.valid


@pytest.mark.parametrize("dotted", sorted(KEYS))
def test_each_key_refuses_an_invalid_value_in_one_line_naming_it(dotted):
    section, name = _split(dotted)
    with pytest.raises(ConfigError) as refused:
        Config.from_dict({section: {name: KEYS[dotted].invalid}})
    message = str(refused.value)
    assert message.startswith(f"{dotted} must be ") and "\n" not in message
    if "password" in name:
        assert "<redacted>" in message and "\x00" not in message
    with pytest.raises(ConfigError, match=re.escape(dotted)):  # the section alone refuses it too
        section_classes()[section](**{name: KEYS[dotted].invalid})


def test_messages_say_key_value_and_range():
    cases = {
        "optim.sparse_lr=-0.5": "optim.sparse_lr must be > 0, got -0.5",
        "learner.batch_size=0": "learner.batch_size must be in [1, 2^20], got 0",
        "optim.dense_lr=-1": "optim.dense_lr must be > 0, got -1.0",
        "learner.mask_prob=1": "learner.mask_prob must be in (0, 1), got 1.0",
        "embedding.K=0": "embedding.K must be in [1, 2^32], got 0",
        "learner.nb_cells=1000": "learner.nb_cells must be a multiple of 64 in [64, 2^32], got 1000",
        "optim.dense_lr=nan": "optim.dense_lr must be > 0, got nan",
        # were accepted, then a traceback (torch.set_num_threads, islice) or a worker that never stopped
        "worker.torch_threads=100000000000000000000": "worker.torch_threads must be in [0, 1024], got 100000000000000000000",
        "learner.batch_size=9223372036854775808": "learner.batch_size must be in [1, 2^20], got 9223372036854775808",
        "worker.poll_timeout_ms=10000000000000000000000":
            "worker.poll_timeout_ms must be in [1, 30000], got 10000000000000000000000",
    }
    for assignment, message in cases.items():
        with pytest.raises(ConfigError) as refused:
            Config().override(assignment)
        assert str(refused.value) == message


def test_an_int_for_a_float_key_is_stored_as_a_float():
    assert OptimConfig(dense_lr=1).dense_lr == 1.0 and isinstance(OptimConfig(dense_lr=1).dense_lr, float)
    with pytest.raises(ConfigError, match="learner.batch_size must be int, got 16.0"):
        LearnerConfig(batch_size=16.0)


# ---------------------------------------------------------------------------- rules across keys

def test_heads_divide_d_model_only_with_layers():
    assert ModelConfig(layers=0, heads=3).heads == 3  # a bag has no attention
    with pytest.raises(ConfigError, match="model.d_model=64 must be divisible by model.heads=3"):
        ModelConfig(layers=1, heads=3)


def test_heartbeat_below_session_timeout():
    assert WorkerConfig(session_timeout_ms=1500, heartbeat_interval_ms=300).heartbeat_interval_ms == 300
    with pytest.raises(ConfigError, match="worker.heartbeat_interval_ms=3000 must be below worker.session_timeout_ms"):
        WorkerConfig(session_timeout_ms=3000)


def test_shuffle_random_needs_positions():
    assert Config().override("learner.shuffle_random=0.5", "model.positions=true").learner.shuffle_random == 0.5
    with pytest.raises(ConfigError, match="learner.shuffle_random=0.5 needs token order.*model.positions=true"):
        Config().override("learner.shuffle_random=0.5")


def test_naive_bayes_cells_leave_room_for_the_label_cells():
    least = 2 * 1024 + 1 + NB_ROW  # 2113 cells: labels, documents, the vocabulary count, one row of pairs
    fits = -(-least // NB_ROW) * NB_ROW
    assert Config().override(f"learner.nb_cells={fits}").learner.nb_cells == fits == 2176
    with pytest.raises(ConfigError, match="learner.nb_cells=2112 leaves no room.*at least 2176"):
        Config().override("learner.nb_cells=2112")
    assert Config().override("learner.nb_cells=2112", "learner.nb_weight=0").learner.nb_cells == 2112  # part off
    with pytest.raises(ConfigError, match="learner.nb_cells=2176 leaves no room"):
        Config().override("model.max_labels=2048", "learner.nb_cells=2176")


def test_values_given_together_are_checked_together(tmp_path):
    """A file, the environment and --set are merged first, then checked once: a later
    source may mend what an earlier one left inconsistent."""
    path = tmp_path / "c.toml"
    path.write_text("[model]\nlayers = 1\nheads = 3\n")
    with pytest.raises(ConfigError, match="divisible"):
        load_config(path, use_env=False)
    assert load_config(path, ["model.heads=4"], use_env=False).model.heads == 4
    assert Config().override("model.heads=3", "model.layers=1", "model.heads=2").model.heads == 2


def test_bad_values_from_toml_and_environment_are_refused(tmp_path, monkeypatch):
    path = tmp_path / "c.toml"
    path.write_text("[optim]\nsparse_lr = -0.5\n")
    with pytest.raises(ConfigError, match=re.escape("optim.sparse_lr must be > 0, got -0.5")):
        load_config(path, use_env=False)
    monkeypatch.setenv("STREAMLEARN__LEARNER__BATCH_SIZE", "0")
    with pytest.raises(ConfigError, match=re.escape("learner.batch_size must be in [1, 2^20], got 0")):
        load_config()
    monkeypatch.setenv("STREAMLEARN__LEARNER__BATCH_SIZE", "32")
    assert load_config().learner.batch_size == 32
    # a rule across keys names where its key came from too (was: no source for these)
    monkeypatch.setenv("STREAMLEARN__MODEL__RECENT", "5")
    with pytest.raises(ConfigError, match=re.escape("(from environment variable STREAMLEARN__MODEL__RECENT)")):
        load_config()
    monkeypatch.delenv("STREAMLEARN__MODEL__RECENT")
    path.write_text("[model]\nlayers = 1\nd_model = 30\nheads = 4\n")
    with pytest.raises(ConfigError, match=re.escape(f"(from config file {path})")):
        load_config(path)


def test_store_backend_argument_is_checked_as_the_key():
    from streamlearn.state import open_store

    with pytest.raises(ConfigError, match="store.backend must be one of 'lmdb', 'memory', got 'rocksdb'"):
        open_store(None, backend="rocksdb")
    with pytest.raises(ConfigError, match="store.shards must be in"):
        StoreConfig(shards=0)


def test_choices_match_the_modules_that_implement_them():
    from streamlearn.heads import NaiveBayesHead
    from streamlearn.optim import SPARSE_RULES

    assert sorted(SPARSE_RULES) == sorted(SPARSE_OPTIMIZERS)
    assert NaiveBayesHead.ROW == NB_ROW


def test_a_refused_value_says_which_file_or_variable_set_it(tmp_path, monkeypatch):
    path = tmp_path / "c.toml"
    path.write_text("[optim]\nsparse_lr = -0.5\n")
    with pytest.raises(ConfigError, match=re.escape(f"got -0.5 (from config file {path})")):
        load_config(path, use_env=False)
    monkeypatch.setenv("STREAMLEARN__OPTIM__DENSE_LR", "-1")
    from_env = "got -1.0 (from environment variable STREAMLEARN__OPTIM__DENSE_LR)"
    with pytest.raises(ConfigError, match=re.escape(from_env)):
        load_config(path, ["optim.sparse_lr=0.1"])
    with pytest.raises(ConfigError) as typed:  # given on the command line: said as given, nothing added
        load_config(path, ["optim.dense_lr=-2", "optim.sparse_lr=0.1"])
    assert str(typed.value) == "optim.dense_lr must be > 0, got -2.0"


@pytest.mark.parametrize("text, says", [
    ("[optim]\ndense_lrr = 1\n", "unknown key(s) ['dense_lrr'] in [optim] of config file {path}; valid: ["),
    ("[optimx]\na = 1\n", "unknown config section [optimx] in config file {path}; valid: ["),
    ("dense_lr = 1\n", "dense_lr in config file {path} is outside any section: put it under [optim]"),
    ("model = 3\n", "config section [model] in config file {path} must be a table, got int"),
])
def test_a_misnamed_section_or_key_says_which_file_holds_it(tmp_path, text, says):
    """Was: a value's error named its file, an unknown key or section did not."""
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        load_config(path, use_env=False)
    assert str(refused.value).startswith(says.format(path=path))


# ---------------------------------------------------------------------------- the commands

COMMANDS = {
    "worker": ["worker", "--topic", "t", "--state", "{tmp}/state"],
    "replay": ["replay", "--file", "{tmp}/d.csv", "--no-progress"],
    "serve": ["serve", "--state", "{tmp}/state"],
}
BAD = {
    "optim.sparse_lr=-0.5": "optim.sparse_lr must be > 0, got -0.5",
    "learner.batch_size=0": "learner.batch_size must be in [1, 2^20], got 0",
    "optim.dense_lr=-1": "optim.dense_lr must be > 0, got -1.0",
}


def _command(name: str, tmp_path) -> list[str]:
    (tmp_path / "d.csv").write_text("free prize now,spam\nsee you,ham\n")
    return [arg.format(tmp=tmp_path) for arg in COMMANDS[name]]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_commands_refuse_bad_values_in_one_line(name, tmp_path, capsys, monkeypatch):
    from streamlearn.cli import main

    command = _command(name, tmp_path)
    for assignment, message in BAD.items():
        assert main([*command, "--set", assignment]) == 2
        if name == "serve":  # it reads [service] only: another key is refused as such, whatever its value
            message = f"serve --set {assignment.partition('=')[0]}: serve reads only [service] keys"
        assert capsys.readouterr().err.startswith(f"streamlearn {name}: error: {message}")
    toml = tmp_path / "bad.toml"
    toml.write_text("[learner]\nbatch_size = 0\n")
    assert main([*command, "--config", str(toml)]) == 2
    assert capsys.readouterr().err.endswith(f"got 0 (from config file {toml})\n")
    monkeypatch.setenv("STREAMLEARN__OPTIM__SPARSE_LR", "-0.5")
    assert main(command) == 2
    assert capsys.readouterr().err.endswith("(from environment variable STREAMLEARN__OPTIM__SPARSE_LR)\n")
    assert not (tmp_path / "state").exists()  # refused before anything was created


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_installed_command_exits_2_without_a_traceback(name, tmp_path):
    import subprocess
    import sys

    bad = "service.max_batch=0" if name == "serve" else "optim.dense_lr=-1"  # serve reads [service] only
    command = [sys.executable, "-m", "streamlearn.cli", *_command(name, tmp_path), "--set", bad]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    message = "service.max_batch must be" if name == "serve" else "optim.dense_lr must be > 0, got -1.0\n"
    assert out.stderr.startswith(f"streamlearn {name}: error: {message}"), out.stderr


def test_the_demo_refuses_a_bad_value_before_starting_a_broker(tmp_path, capsys):
    from streamlearn.demo import main

    assert main(["--state", str(tmp_path / "state"), "--set", "optim.dense_lr=-1"]) == 2
    captured = capsys.readouterr()
    assert captured.err == "streamlearn demo: error: optim.dense_lr must be > 0, got -1.0\n"
    assert "broker" not in captured.out


def test_token_tasks_keep_words_alone_and_classify_gets_bigrams_and_shapes():
    """Classify (the default task) adds word bigrams and digit shapes; a model that
    predicts tokens must not see a masked or next word's bigrams, so mlm and next-token
    keep words alone (task defaults), with the token-stream configuration's batches of 8."""
    c = Config.from_dict({})
    assert (c.hashing.ngrams, c.hashing.shapes, c.learner.batch_size) == (2, True, 8)
    assert Config() == c
    for task in ("mlm", "next-token"):
        t = Config().override(f"learner.task={task}")
        assert (t.hashing.ngrams, t.hashing.shapes, t.learner.batch_size) == (1, False, 8), task
        assert (t.model.output, t.model.counts) == ("sampled", {"mlm": "kn3", "next-token": "kn4"}[task]), task


def test_out_B_zero_is_derived_for_next_item_only():
    """0 means "derived from the stream" (streamlearn.sizing): next-item's default, and
    refused for a task that does not derive it, naming the key."""
    assert Config().override("learner.task=next-item").model.out_B == 0
    for task in ("classify", "mlm", "next-token"):
        with pytest.raises(ConfigError, match=r"model.out_B=0 .*derived.* set model.out_B >= 1") as exc:
            Config().override(f"learner.task={task}", "model.out_B=0")
        assert exc.value.key == "model.out_B"


def test_a_restart_without_task_keeps_the_run_keys_the_user_set_to_the_default_tasks_defaults():
    """Was: a next-token model restarted without --task took next-token's defaults for
    every run key the user set to the default task's value (row_decay 1.0 -> 0.95,
    negatives 256 -> 128), silently."""
    from streamlearn.config import keep_stored

    stored = Config().override("learner.task=next-token")
    new = Config().override("optim.row_decay=1.0", "model.negatives=256", "optim.dense_lr=0.004")
    cfg, kept = keep_stored(stored, new, given={"optim.row_decay", "model.negatives", "optim.dense_lr"})
    assert cfg.learner.task == "next-token" and any(line.startswith("learner.task") for line in kept)
    assert (cfg.optim.row_decay, cfg.model.negatives, cfg.optim.dense_lr) == (1.0, 256, 0.004)
    assert cfg.optim.output_lr == stored.optim.output_lr  # not given: the stored task's default
    again, _ = keep_stored(stored, new, given=set())
    assert (again.optim.row_decay, again.model.negatives) == (0.95, 128)
