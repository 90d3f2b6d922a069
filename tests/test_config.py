"""Configuration: TOML, dotted overrides, unknown names rejected, environment in one place."""
import dataclasses

import pytest

from streamlearn.config import Config, env_overrides, load_config
from streamlearn.exceptions import ConfigError


def test_defaults_are_frozen():
    cfg = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.model.layers = 3  # type: ignore[misc]


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
        ("embedding.scheme=word2vec", "choose one of"),
        ("learner.task=regress", "choose one of"),
    ],
)
def test_bad_overrides_say_what_to_change(override, message):
    with pytest.raises(ConfigError, match=message):
        Config().override(override)


def test_bad_toml_is_a_config_error(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\nlayers=")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml")
    typed = tmp_path / "typed.toml"
    typed.write_text('[model]\nlayers = "3"\n[extra]\nx = 1\n')
    with pytest.raises(ConfigError, match="unknown config section"):
        load_config(typed)


def test_environment_overrides():
    env = {"STREAMLEARN__MODEL__LAYERS": "4", "STREAMLEARN__EMBEDDING__K": "99", "STREAMLEARN_OTHER": "x"}
    assert env_overrides(env) == ["embedding.K=99", "model.layers=4"]
    assert Config().override(*env_overrides(env)).embedding.K == 99


def test_round_trip_through_dict():
    cfg = Config().override("model.layers=2", "hashing.seed=7")
    assert Config.from_dict(cfg.to_dict()) == cfg
