"""Typed YAML configs: defaults, overrides, round trips, and one-line errors naming the dotted key."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamic_treerpo.trainer import ClipConfig, DanceGRPOConfig, LossConfig, MixGRPOConfig, TreeConfig
from dynamic_treerpo.trainer.config.files import (
    ConfigError,
    apply_overrides,
    from_dict,
    load_config,
    parse_override,
    save_config,
    to_dict,
)

ClipMode = Literal["dynamic", "fixed", "none"]


@dataclass(frozen=True)
class Clip:
    mode: ClipMode = "dynamic"
    eps: float = 0.2


@dataclass(frozen=True)
class Loss:
    clip: Clip = field(default_factory=Clip)
    beta: float = 0.0


@dataclass(frozen=True)
class Sampler:
    depth: int = 4
    noise_level: float = 0.6
    sizes: tuple[int, ...] = (512, 512)

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise ValueError(f"depth must be >= 1, got {self.depth}")


@dataclass
class Run:
    name: str = "run"
    iterations: int = 10
    seed: int | None = None
    flag: bool = False
    lr: float = 1e-5
    sampler: Sampler = field(default_factory=Sampler)
    loss: Loss = field(default_factory=Loss)
    prompts: list[str] = field(default_factory=list)
    weights: dict[str, float] = field(default_factory=dict)
    out: Path | None = None
    pair: tuple[int, str] = (1, "a")


@dataclass(frozen=True)
class Tuned:
    """Sections whose field defaults differ from their class defaults."""

    loss: Loss = field(default_factory=lambda: Loss(clip=Clip(mode="none", eps=0.1), beta=0.5))
    sampler: Sampler | None = field(default_factory=lambda: Sampler(depth=2))


@dataclass(frozen=True)
class Needs:
    model: str
    steps: int = 1


def _error(fn: Callable[[], Any]) -> str:
    """The ConfigError message of ``fn()``, checked to be a single line."""
    with pytest.raises(ConfigError) as info:
        fn()
    message = str(info.value)
    assert "\n" not in message and message == message.strip()
    return message


# --- building from dicts --------------------------------------------------------------------------


def test_missing_keys_take_defaults_and_factories_are_fresh() -> None:
    a, b = from_dict(Run, {}), from_dict(Run, {})
    assert a == Run() and a.sampler == Sampler() and a.loss.clip.mode == "dynamic"
    assert a.prompts is not b.prompts


def test_nested_frozen_sections_with_literal_tuple_and_optional() -> None:
    run = from_dict(Run, {"sampler": {"depth": 3, "sizes": [64, 64, 32]}, "loss": {"clip": {"mode": "fixed"}},
                          "seed": 7, "lr": 3, "weights": {"clip": 1, "aesthetic": 0.5}, "out": "runs/a",
                          "pair": [2, "b"], "prompts": ["a cat"]})
    assert run.sampler == Sampler(depth=3, sizes=(64, 64, 32)) and isinstance(run.sampler.sizes, tuple)
    assert run.loss.clip == Clip(mode="fixed") and run.seed == 7 and run.out == Path("runs/a")
    assert run.lr == 3.0 and isinstance(run.lr, float)
    assert run.weights == {"clip": 1.0, "aesthetic": 0.5} and run.pair == (2, "b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.sampler.depth = 5  # type: ignore[misc]


def test_partial_sections_keep_the_fields_own_defaults() -> None:
    assert from_dict(Tuned, {}) == Tuned()
    assert from_dict(Tuned, {"loss": {"beta": 1}}).loss == Loss(clip=Clip(mode="none", eps=0.1), beta=1.0)
    assert from_dict(Tuned, {"loss": {"clip": {"eps": 0.3}}}).loss == Loss(clip=Clip("none", 0.3), beta=0.5)
    assert from_dict(Tuned, {"sampler": {"noise_level": 0.9}}).sampler == Sampler(depth=2, noise_level=0.9)
    assert from_dict(Tuned, {"sampler": None}).sampler is None
    assert load_config(Tuned, None, ["loss.clip.eps=0.3"]).loss.clip == Clip("none", 0.3)
    assert _error(lambda: from_dict(Tuned, {"sampler": {"depth": 0}})) == "sampler: depth must be >= 1, got 0"


def test_pyyaml_exponent_strings_are_read_as_floats() -> None:
    # YAML 1.1 (PyYAML) reads `lr: 1e-4` as the string '1e-4'.
    assert yaml.safe_load("lr: 1e-4") == {"lr": "1e-4"}
    assert from_dict(Run, {"lr": "1e-4"}).lr == 1e-4


@pytest.mark.parametrize(("data", "message"), [
    ({"sampler": {"dept": 3}}, "unknown key 'sampler.dept' (did you mean 'sampler.depth'?)"),
    ({"iteration": 3}, "unknown key 'iteration' (did you mean 'iterations'?)"),
    ({"loss": {"clip": {"zzz": 1}}}, "unknown key 'loss.clip.zzz' (known keys: mode, eps)"),
    ({"sampler": {"depth": "abc"}}, "sampler.depth: expected int, got 'abc'"),
    ({"sampler": {"depth": 2.5}}, "sampler.depth: expected int, got 2.5"),
    ({"iterations": True}, "iterations: expected int, got True"),
    ({"loss": {"clip": {"mode": "x"}}},
     "loss.clip.mode: expected one of 'dynamic', 'fixed', 'none', got 'x'"),
    ({"flag": "true"}, "flag: expected bool (true or false), got 'true'"),
    ({"flag": 1}, "flag: expected bool (true or false), got 1"),
    ({"lr": "fast"}, "lr: expected float, got 'fast'"),
    ({"lr": False}, "lr: expected float, got False"),
    ({"name": 5}, "name: expected str, got 5"),
    ({"seed": "x"}, "seed: expected int or null, got 'x'"),
    ({"sampler": {"sizes": [64, "a"]}}, "sampler.sizes[1]: expected int, got 'a'"),
    ({"sampler": {"sizes": 64}}, "sampler.sizes: expected a list of int, got 64"),
    ({"pair": [1, "a", 3]}, "pair: expected a list of 2 items, got [1, 'a', 3]"),
    ({"weights": {"clip": "high"}}, "weights.clip: expected float, got 'high'"),
    ({"weights": {1: 0.5}}, "weights: keys must be str, got 1"),
    ({"sampler": 3}, "sampler: expected a mapping, got 3"),
    ({"sampler": {"depth": 0}}, "sampler: depth must be >= 1, got 0"),
])
def test_errors_name_the_dotted_key(data: dict, message: str) -> None:
    assert _error(lambda: from_dict(Run, data)) == message


def test_top_level_validation_missing_required_and_non_mapping() -> None:
    assert _error(lambda: from_dict(Sampler, {"depth": -1})) == "depth must be >= 1, got -1"
    assert _error(lambda: from_dict(Needs, {"steps": 2})) == "missing required key 'model'"
    assert from_dict(Needs, {"model": "flux"}) == Needs("flux")
    assert "expected a mapping" in _error(lambda: from_dict(Run, [1, 2]))  # type: ignore[arg-type]


def test_error_messages_stay_one_line_with_odd_keys_and_survive_pickling() -> None:
    message = _error(lambda: from_dict(Run, {"sampler": {"a\nb": 1}}))
    assert message.startswith("unknown key 'sampler.a\\nb'")
    err = pickle.loads(pickle.dumps(ConfigError("x\ny")))
    assert isinstance(err, ConfigError) and str(err) == "x y"
    with pytest.raises(ConfigError) as info:
        from_dict(Run, {"iterations": "x"})
    assert str(pickle.loads(pickle.dumps(info.value))) == str(info.value)


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)  # the CLI reports ValueErrors as one-line errors


@pytest.mark.parametrize("cls", [TreeConfig, MixGRPOConfig, DanceGRPOConfig, ClipConfig, LossConfig])
def test_the_trainers_own_configs_round_trip(cls: type) -> None:
    assert from_dict(cls, yaml.safe_load(yaml.safe_dump(to_dict(cls())))) == cls()


# --- arbitrary input only ever raises ConfigError ------------------------------------------------------

_SCALARS = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6)
            | st.sampled_from(["dynamic", "fixed", "1e-3", "inf", "depth"]))
_JSON = st.recursive(_SCALARS, lambda kids: st.lists(kids, max_size=3)
                     | st.dictionaries(st.text(max_size=5) | st.integers(), kids, max_size=3), max_leaves=8)


def _section(fields: dict[str, st.SearchStrategy]) -> st.SearchStrategy:
    """Mostly well-formed sections with some wrong values and stray keys, to reach the deep checks."""
    known = st.fixed_dictionaries({}, optional={k: st.one_of(v, v, v, _JSON) for k, v in fields.items()})
    stray = st.one_of(*[st.just({})] * 4, st.dictionaries(st.text(max_size=5), _JSON, min_size=1, max_size=1))
    return st.tuples(known, stray).map(
        lambda parts: {**parts[0], **parts[1]})


_CLIP = _section({"mode": st.sampled_from(["dynamic", "fixed", "none"]), "eps": st.floats()})
_RUN = _section({
    "name": st.text(max_size=5), "iterations": st.integers(), "seed": st.none() | st.integers(),
    "flag": st.booleans(), "lr": st.floats() | st.sampled_from(["1e-4", "1e999"]) | st.integers(),
    "sampler": _section({"depth": st.integers(-1, 5), "noise_level": st.floats(),
                         "sizes": st.lists(st.integers(), max_size=3)}),
    "loss": _section({"clip": _CLIP, "beta": st.floats()}),
    "prompts": st.lists(st.text(max_size=4), max_size=3),
    "weights": st.dictionaries(st.text(max_size=4), st.floats(), max_size=2),
    "out": st.text(max_size=4), "pair": st.tuples(st.integers(), st.text(max_size=3)).map(list),
})


@settings(max_examples=200, deadline=None)
@given(_RUN)
def test_from_dict_on_arbitrary_data_raises_only_config_error(data: dict) -> None:
    try:
        run = from_dict(Run, data)
    except ConfigError as err:
        assert "\n" not in str(err)
    else:
        assert isinstance(run, Run) and repr(from_dict(Run, to_dict(run))) == repr(run)  # repr: nan


# --- overrides -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("iterations=2", ("iterations", 2)),
    ("sampler.noise_level=0.5", ("sampler.noise_level", 0.5)),
    ("name=abc", ("name", "abc")),
    ("flag=true", ("flag", True)),
    ("list=[1,2]", ("list", [1, 2])),
    (" name = a=b ", ("name", "a=b")),
    ("seed=", ("seed", None)),
    ("name='2024'", ("name", "2024")),
])
def test_parse_override(text: str, expected: tuple) -> None:
    assert parse_override(text) == expected


@pytest.mark.parametrize("text", ["iterations", "=3", "a..b=1", "sampler.=1"])
def test_malformed_overrides_are_reported(text: str) -> None:
    assert _error(lambda: parse_override(text)).startswith(f"invalid override {text!r}: expected key=value")


def test_override_with_invalid_yaml_value() -> None:
    assert _error(lambda: parse_override("prompts=[a, b")).startswith("invalid value in override")


def test_apply_overrides_creates_sections_merges_mappings_and_copies() -> None:
    data = {"sampler": {"depth": 3, "sizes": [8]}, "name": "x"}
    out = apply_overrides(data, ["sampler.noise_level=0.5", "loss.clip.mode=none", "name=y",
                                 "sampler={depth: 5}"])
    assert out == {"sampler": {"depth": 5, "sizes": [8], "noise_level": 0.5}, "name": "y",
                   "loss": {"clip": {"mode": "none"}}}
    assert data == {"sampler": {"depth": 3, "sizes": [8]}, "name": "x"}
    assert _error(lambda: apply_overrides({"iterations": 5}, ["iterations.x=1"])) == \
        "cannot set 'iterations.x': 'iterations' is a value, not a section"
    assert apply_overrides({"out": None}, ["out.sub=1"]) == {"out": {"sub": 1}}


# --- files -----------------------------------------------------------------------------------------


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_load_file_then_overrides_win(tmp_path: Path) -> None:
    path = _write(tmp_path / "run.yaml", "name: exp\nsampler:\n  depth: 3\n  sizes: [64, 64]\nlr: 1.0e-4\n")
    run = load_config(Run, path, ["sampler.depth=2", "loss.clip.eps=0.3", "seed=1"])
    assert run == Run(name="exp", lr=1e-4, seed=1, sampler=Sampler(depth=2, sizes=(64, 64)),
                      loss=Loss(clip=Clip(eps=0.3)))


def test_no_file_means_defaults_plus_overrides() -> None:
    assert load_config(Run, None) == Run()
    assert load_config(Run, None, ["iterations=2", "flag=true"]) == Run(iterations=2, flag=True)


def test_empty_file_means_defaults(tmp_path: Path) -> None:
    assert load_config(Run, _write(tmp_path / "e.yaml", "# nothing yet\n")) == Run()


def test_unknown_override_key_is_reported_with_a_suggestion() -> None:
    assert _error(lambda: load_config(Run, None, ["sampler.dept=3"])) == \
        "unknown key 'sampler.dept' (did you mean 'sampler.depth'?)"
    assert _error(lambda: load_config(Run, None, ["sampler.depth=abc"])) == \
        "sampler.depth: expected int, got 'abc'"


def test_file_errors(tmp_path: Path) -> None:
    missing = tmp_path / "runs" / "x.yaml"
    assert _error(lambda: load_config(Run, missing)) == f"config file not found: {missing}"
    bad = _write(tmp_path / "bad.yaml", "name: a\nsampler:\n  depth: [1, 2\n  x: 1\n")
    assert _error(lambda: load_config(Run, bad)).startswith(f"{bad}: invalid YAML at line ")
    bad2 = _write(tmp_path / "bad2.yaml", "name: a\niterations: 3\nsampler: depth: 4\n")
    assert _error(lambda: load_config(Run, bad2)).startswith(f"{bad2}: invalid YAML at line 3: ")
    listed = _write(tmp_path / "list.yaml", "- name: a\n- name: b\n")
    assert _error(lambda: load_config(Run, listed)) == \
        f"{listed}: expected a mapping of keys at the top level, got list"
    scalar = _write(tmp_path / "scalar.yaml", "just text\n")
    assert "got str" in _error(lambda: load_config(Run, scalar))


def test_unsafe_yaml_tags_are_rejected(tmp_path: Path) -> None:
    evil = _write(tmp_path / "evil.yaml", "name: !!python/object/apply:os.system ['echo hi']\n")
    assert "invalid YAML" in _error(lambda: load_config(Run, evil))


def test_save_then_load_round_trips(tmp_path: Path) -> None:
    run = Run(name="exp: 1", seed=3, lr=1e-10, flag=True, sampler=Sampler(depth=2, sizes=(8, 16)),
              loss=Loss(clip=Clip(mode="none", eps=0.25), beta=0.01), prompts=["a", "b: c"],
              weights={"clip": 0.5}, out=Path("runs/x"), pair=(3, "z"))
    path = tmp_path / "out" / "config.yaml"
    save_config(run, path)
    assert load_config(Run, path) == run
    assert [p.name for p in path.parent.iterdir()] == ["config.yaml"]
    text = path.read_text()
    assert text.index("name:") < text.index("sampler:")  # field order, not alphabetical
    assert yaml.safe_load(text)["sampler"]["sizes"] == [8, 16]  # tuples are plain lists


def test_to_dict_is_plain_data() -> None:
    data = to_dict(Run(out=Path("a/b")))
    assert data["sampler"] == {"depth": 4, "noise_level": 0.6, "sizes": [512, 512]}
    assert data["out"] == "a/b" and data["pair"] == [1, "a"]
    yaml.safe_dump(data)  # no Python-specific tags needed
    with pytest.raises(TypeError):
        to_dict(Run)


# ------------------------------------------------------------------ the experimental: section
CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def _train_config(data: dict, tmp_path: Path):
    from dynamic_treerpo.trainer.config.schema import TrainConfig

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(TrainConfig, path)


def test_the_shipped_configs_keep_experimental_options_in_their_own_section(capsys) -> None:
    from dynamic_treerpo.trainer.config.schema import EXPERIMENTAL_OPTIONS, TrainConfig

    for path in sorted(CONFIGS.glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        for option in EXPERIMENTAL_OPTIONS:
            section, key = option.split(".")
            assert key not in (data.get(section) or {}), f"{path.name}: {option} outside experimental:"
        load_config(TrainConfig, path)
    assert capsys.readouterr().err == ""  # no note: nothing in an old place
    default = yaml.safe_load((CONFIGS / "default.yaml").read_text())
    assert set(default["experimental"]) == {"tree", "mixgrpo", "dancegrpo", "flow_grpo", "branchgrpo", "loss",
                                            "guard", "picks"}
    assert to_dict(load_config(TrainConfig, CONFIGS / "default.yaml")) == to_dict(TrainConfig())


def test_a_config_of_the_old_layout_loads_with_one_note(tmp_path: Path, capsys) -> None:
    old = {"tree": {"noise_pool": 4, "depth": 2},
           "loss": {"step_scale": "score", "clip": {"scale": 3.0, "mode": "fixed"}}}
    config = _train_config(old, tmp_path)
    assert (config.tree.noise_pool, config.tree.depth, config.loss.step_scale) == (4, 2, "score")
    assert config.loss.clip.mode == "fixed" and config.loss.clip.scale == 1.0
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    assert "tree.noise_pool -> experimental.tree.noise_pool" in lines[0]
    assert "loss.step_scale -> experimental.loss.step_scale" in lines[0]
    assert "loss.clip.scale" in lines[0]


def test_experimental_options_round_trip_through_their_section(tmp_path: Path, capsys) -> None:
    from dynamic_treerpo.trainer.config.schema import TrainConfig

    config = load_config(TrainConfig, None, ["experimental.tree.noise_pool=8",
                                             "experimental.loss.advantage_baseline=parent"])
    assert config.tree.noise_pool == 8 and config.loss.advantage_baseline == "parent"
    save_config(config, tmp_path / "saved.yaml")
    saved = yaml.safe_load((tmp_path / "saved.yaml").read_text())
    assert saved["experimental"]["tree"] == {"antithetic": False, "noise_pool": 8}
    assert "noise_pool" not in saved["tree"] and "scale" not in saved["loss"]["clip"]
    assert load_config(TrainConfig, tmp_path / "saved.yaml") == config
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(("overrides", "message"), [
    (["experimental.tree.noise_poll=4"],
     "unknown key 'experimental.tree.noise_poll' (did you mean 'experimental.tree.noise_pool'?)"),
    (["experimental.tree.noise_pool=4", "tree.noise_pool=2"],
     "'tree.noise_pool' and 'experimental.tree.noise_pool' are the same option: set only "
     "'experimental.tree.noise_pool'"),
])
def test_experimental_mistakes_are_one_line(overrides: list[str], message: str) -> None:
    from dynamic_treerpo.trainer.config.schema import TrainConfig

    with pytest.raises(ConfigError) as err:
        load_config(TrainConfig, None, overrides)
    assert str(err.value) == message
