"""Config files, overrides and their errors."""

from __future__ import annotations

import json  # feature: !fsdp|!text|!pretrained|!multilabel|!trackers
import re
from pathlib import Path

import pytest
import torch  # feature: !fsdp|!text|!pretrained|!multilabel|!trackers
import yaml
from conftest import CONFIGS, ROOT, missing_data_file

from {{ cookiecutter.package_name }} import checkpoint  # feature: !fsdp|!text|!pretrained|!multilabel|!trackers
from {{ cookiecutter.package_name }}.config import Config, flatten, from_dict, load_config, to_dict
from {{ cookiecutter.package_name }}.data import build_datasets, example_inputs
# >>> text
# >>> pretrained
# >>> multilabel
# >>> trackers
from {{ cookiecutter.package_name }}.errors import ConfigError  # feature: fsdp
# <<< trackers
# <<< multilabel
# <<< pretrained
# <<< text
from {{ cookiecutter.package_name }}.errors import LEFT_OUT, UNUSED, CheckpointError, ConfigError  # feature: !fsdp|!text|!pretrained|!multilabel|!trackers
from {{ cookiecutter.package_name }}.models import MODELS, architecture, build_model  # feature: pretrained
from {{ cookiecutter.package_name }}.models import build_model  # feature: !pretrained
from {{ cookiecutter.package_name }}.models.zoo import Zoo  # feature: pretrained
from {{ cookiecutter.package_name }}.tasks import TASKS, build_task
from {{ cookiecutter.package_name }}.trainer import build_data  # feature: pretrained

ALL_FILES = sorted(CONFIGS.rglob("*.yaml"))
# A user's experiment on their own table, which this checkout does not hold.
WINE = """extends: ../default.yaml
data:
  name: csv
  path: data/wine.csv
  label: quality
model:
  name: mlp
  width: 64
task:
  name: regression
"""


def test_default_yaml_mirrors_the_dataclass_defaults():
    assert yaml.safe_load((CONFIGS / "default.yaml").read_text()) == to_dict(Config())


def check_config_file(path: Path, monkeypatch, project: Path = ROOT) -> None:
    """Load and validate `path` (needs no data), then build its data, task and model: from the
    demo folder (the working directory, holding data/demo/), else from the project (where a
    user keeps their own data); skipped, naming the file, when neither holds the data."""
    cfg = load_config(path)
    missing = missing_data_file(cfg)
    if missing and not missing_data_file(cfg, project):
        monkeypatch.chdir(project)
    elif missing:
        pytest.skip(
            f"{path.name}: data file {missing} not found (demo folder or project): the "
            "config loads and validates; its data, task and model are checked once it exists"
        )
    # >>> pretrained
    if issubclass(MODELS[cfg.model.name], Zoo):  # a pretrained model: its library, weights
        try:
            train, _, _, task = build_data(cfg)
            model = build_model(architecture(cfg.model), example_inputs(train), task.num_outputs)
        except ConfigError as exc:  # here without the library or the network: said so
            assert re.search(r"pip install -e '\.\[(vision|hf)\]'|without the network", str(exc))
            return
    else:
        train, _, meta = build_datasets(cfg.data, TASKS[cfg.task.name].targets)
        task = build_task(cfg.task, getattr(train, "dataset", train), meta)  # class counts
        model = build_model(cfg.model, example_inputs(train), task.num_outputs)
    # <<< pretrained
    # >>> !pretrained
    train, _, meta = build_datasets(cfg.data, TASKS[cfg.task.name].targets)
    task = build_task(cfg.task, getattr(train, "dataset", train), meta)  # class counts
    model = build_model(cfg.model, example_inputs(train), task.num_outputs)
    # <<< !pretrained
    assert sum(p.numel() for p in model.parameters()) > 0


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: p.name)
def test_every_config_file_loads_and_builds(path, demo_data, monkeypatch):
    check_config_file(path, monkeypatch)


def test_a_users_experiment_without_its_data_is_skipped_naming_the_file(
    tmp_path, demo_data, monkeypatch
):
    """A user's own experiment file whose data is not here: skipped, not failed; an invalid
    one still fails."""
    experiments = tmp_path / "configs" / "experiments"
    experiments.mkdir(parents=True)
    (tmp_path / "configs" / "default.yaml").write_text((CONFIGS / "default.yaml").read_text())
    wine = experiments / "wine.yaml"
    wine.write_text(WINE)
    with pytest.raises(pytest.skip.Exception, match=r"data\.path=data/wine\.csv not found"):
        check_config_file(wine, monkeypatch)
    # The same file where the user keeps the table: built from there.
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "wine.csv").write_text("alcohol,acid,quality\n" + "9.5,0.7,5\n" * 8)
    check_config_file(wine, monkeypatch, project=tmp_path)
    wine.write_text(WINE.replace("width: 64", "widht: 64"))
    with pytest.raises(ConfigError, match="did you mean 'model.width'"):
        check_config_file(wine, monkeypatch)


def test_experiment_file_extends_the_default_and_holds_only_changes():
    cfg = load_config(CONFIGS / "experiments" / "mlp_large_batch.yaml")
    assert cfg.model.name == "mlp" and cfg.train.grad_accum_steps == 4
    assert cfg.train.batch_size == Config().train.batch_size  # inherited


def test_precedence_defaults_then_file_then_command_line(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("train:\n  epochs: 7\n  batch_size: 8\n")
    cfg = load_config(path, ["train.epochs=3"])
    assert (cfg.train.epochs, cfg.train.batch_size, cfg.train.lr) == (3, 8, Config().train.lr)


def test_override_values_are_typed():
    cfg = load_config(
        None,
        [
            "train.lr=1e-4",
            "train.amp=bf16",
            "run.deterministic=true",
            "train.amp=off",
            "run.name=123",
            "train.resume=",
        ],
    )
    assert cfg.train.lr == 1e-4 and isinstance(cfg.train.lr, float)
    assert cfg.train.amp == "off"  # YAML reads `off` as false; the Literal field maps it back
    assert cfg.run.deterministic is True and cfg.run.name == "123" and cfg.train.resume == ""


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.epoch=3", "unknown config key 'train.epoch' (did you mean 'train.epochs'?)"),
        ("trian.epochs=3", "unknown config key 'trian.epochs' (did you mean 'train.epochs'?)"),
        ("Train.Epochs=3", "unknown config key 'Train.Epochs' (did you mean 'train.epochs'?)"),
        ("train.seed=1", "unknown config key 'train.seed' (did you mean 'run.seed'?)"),
        ("epochs=3", "unknown config key 'epochs' (did you mean 'train.epochs'?)"),
        ("modle.nme=x", "unknown config key 'modle.nme' (did you mean 'model.name'?)"),
        ("run.threads=-1", "run.threads must be >= 1, or 0 for auto, got -1"),
        ("train.epochs=three", "train.epochs expects int, got 'three' (str)"),
        ("train.lr=fast", "train.lr expects float, got 'fast' (str)"),
        ("train.amp=fp8", "train.amp must be one of off, bf16, fp16, got 'fp8'"),
        ("train.batch_size=0", "train.batch_size must be >= 1, got 0"),
        ("train.lr=-0.1", "train.lr must be a finite number > 0, got -0.1"),
        ("run.device=gpu", "run.device must be auto, cpu, cuda, cuda:N or mps, got 'gpu'"),
        ("run.name=../x", "run.name must be a folder name"),
        ("train.epochs", "override 'train.epochs' is not key=value"),
        ("train=3", "train must be a section"),
    ],
)
def test_bad_overrides_name_the_key_and_the_fix(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def float_keys() -> list[str]:
    """Every float setting: the sections' and the default components' options."""
    flat = flatten(to_dict(Config()))
    return [key for key, value in flat.items() if isinstance(value, float)]


@pytest.mark.parametrize("value", ["inf", "-inf", ".nan", "1e400"])
def test_no_float_setting_takes_nan_or_inf(value):
    """One rule for every number: train.weight_decay=inf trained every weight to nan."""
    assert "train.weight_decay" in float_keys() and "model.dropout" in float_keys()
    for key in float_keys():
        with pytest.raises(ConfigError, match=f"^{key} must be "):
            load_config(None, [f"{key}={value}"])


def test_train_epochs_0_is_refused():
    """It trained nothing, then printed the commands to evaluate a best.pt never written."""
    with pytest.raises(ConfigError, match="train.epochs must be >= 1, got 0"):
        load_config(None, ["train.epochs=0"])


@pytest.mark.parametrize(
    "overrides",
    [
        ["train.lr=0.01", "train={epochs: 3, batch_size: 8}"],
        ["train={epochs: 3, batch_size: 8}", "train.lr=0.01"],
        ["train={lr: 0.01}", "train={epochs: 3}", "train.batch_size=8"],
    ],
)
def test_a_section_override_merges_key_by_key_in_any_order(overrides):
    """train={...} sets its keys and leaves the section's others, as a config file's section
    does; it replaced a train.lr given before it."""
    train = load_config(None, overrides).train
    assert (train.lr, train.epochs, train.batch_size) == (0.01, 3, 8)


def test_a_section_override_merges_over_a_file_as_a_file_merges_over_its_parent(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("extends: " + str(CONFIGS / "default.yaml") + "\ntrain:\n  lr: 0.01\n")
    cfg = load_config(path, ["train={epochs: 3}"])
    assert (cfg.train.lr, cfg.train.epochs, cfg.train.batch_size) == (0.01, 3, 64)


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("train:\n  lr: 0.01\nrun:\n  name: x\ntrain:\n  epochs: 3\n", 5),
        ("train:\n  lr: 0.01\n  epochs: 2\n  lr: 0.1\n", 4),
    ],
)
def test_a_key_given_twice_in_a_file_is_refused(tmp_path, text, line):
    """YAML keeps the last of two equal keys: a second train: section dropped the first's."""
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"exp.yaml' line {line} gives the key .* twice"):
        load_config(path)


def test_a_misspelt_section_in_a_file_gets_the_section_and_key(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("Trian:\n  Lr: 0.1\n")
    with pytest.raises(ConfigError, match=r"'Trian.Lr' \(did you mean 'train.lr'\?\)"):
        load_config(path)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.name=MLP", "model.name='MLP' is not one of the registered choices cnn, mlp"),
        ("model.name=MLP", "(did you mean 'mlp'?)"),
        ("data.name=Synthetic", "data.name='Synthetic' is not one of the registered choices"),
        ("data.name=Synthetic", "(did you mean 'synthetic'?)"),
        ("task.name=Regresion", "(did you mean 'regression'?)"),
    ],
)
def test_registries_suggest_names_whatever_their_case(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    loop = tmp_path / "loop.yaml"
    loop.write_text("extends: loop.yaml\n")
    with pytest.raises(ConfigError, match="extends itself"):
        load_config(loop)


def test_round_trip_through_a_dict():
    cfg = load_config(None, ["model.name=mlp", "train.epochs=1"])
    assert from_dict(to_dict(cfg)) == cfg


# Each component's options: typed, checked, did-you-mean, and only the chosen one's are kept.


def test_a_component_s_options_are_typed_and_checked():
    cfg = load_config(None, ["model.name=mlp", "model.width=7", "task.label_smoothing=0.1"])
    assert cfg.model.options.width == 7 and cfg.task.options.label_smoothing == 0.1
    with pytest.raises(ConfigError, match="model.width expects int, got 'wide'"):
        load_config(None, ["model.width=wide"])
    with pytest.raises(ConfigError, match=r"data.image_size must be >= 4, got 2"):
        load_config(None, ["data.image_size=2"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["data.imag_size=8"],
            "unknown config key 'data.imag_size' (did you mean 'data.image_size'?)",
        ),
        (
            ["data.root=x"],
            "data.root is not an option of data.name=synthetic; it belongs to data.name=tensors",
        ),
        (["model.name=mlp", "model.widht=8"], "(did you mean 'model.width'?)"),
        (
            ["data.name=csv", "data.image_size=8"],
            "data.image_size is not an option of data.name=csv",
        ),
        (
            ["train.best_metric=r2"],
            "train.best_metric='r2' is not a metric of task.name=classification",
        ),
        (
            ["task.name=regression", "train.best_metric=acc"],
            "choose auto or one of rmse, mae, r2, loss",
        ),
        (
            ["task.name=regression", "train.best_metric=r2", "train.best_mode=min"],
            "would keep the worst r2",
        ),
    ],
)
def test_component_options_errors_name_the_key_and_the_fix(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_choosing_another_component_drops_the_other_s_options(tmp_path):
    """A file extending default.yaml (synthetic data, cnn) may switch to csv and an mlp: the
    synthetic sizes and the cnn's options are not inherited, and the saved config records
    only what the run used."""
    path = tmp_path / "exp.yaml"
    path.write_text(
        f"extends: {CONFIGS / 'default.yaml'}\n"
        "data:\n  name: csv\n  path: t.csv\n  label: y\nmodel:\n  name: mlp\n"
    )
    cfg = load_config(path, ["model.width=16"])
    saved = to_dict(cfg)
    assert "image_size" not in saved["data"] and "train_size" not in saved["data"]
    assert saved["data"]["path"] == "t.csv" and saved["data"]["num_workers"] == 0
    assert saved["model"] == {"name": "mlp", "width": 16, "depth": 2, "dropout": 0.1}
    assert load_config(base=saved) == cfg  # what a checkpoint's config rebuilds


def test_best_metric_auto_is_the_task_s_first_metric():
    assert load_config(None).best() == ("acc", "max")
    assert load_config(None, ["task.name=regression"]).best() == ("rmse", "min")
    assert load_config(None, ["task.name=language_model"]).best() == ("perplexity", "min")  # feature: text
    assert load_config(None, ["train.best_metric=loss"]).best() == ("loss", "min")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("run.tensorboard=false", "config key 'run.tensorboard' is now run.loggers"),
        ("data.fold_seed=3", "config key 'data.fold_seed' is now data.split_seed"),
    ],
)
def test_keys_of_earlier_versions_name_what_replaced_them(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


@pytest.mark.parametrize(
    ("value", "loggers"),
    [
        ("csv,tensorboard", ["csv", "tensorboard"]),  # the shell-friendly form
        ("[tensorboard, csv]", ["tensorboard", "csv"]),
        ("[csv, csv]", ["csv"]),
        ("", []),
    ],
)
def test_loggers_read_as_a_list(value, loggers):
    assert load_config(None, [f"run.loggers={value}"]).run.loggers == loggers


@pytest.mark.parametrize(
    ("value", "messages"),
    [
        (
            "csv,tensorbord",
            ["run.loggers[1] must be one of csv, tensorboard", "(did you mean 'tensorboard'?)"],
        ),
        ("3", ["run.loggers expects a list such as [a, b] or a,b; got 3 (int)"]),
        ("{a: 1}", ["run.loggers expects a list"]),
    ],
)
def test_bad_loggers_name_the_item_and_the_closest_choice(value, messages):
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"run.loggers={value}"])
    assert all(message in str(err.value) for message in messages), str(err.value)
# >>> !fsdp|!text|!pretrained|!multilabel|!trackers


def test_what_needs_an_option_this_project_left_out_is_refused_naming_it(tmp_path):
    """A config or checkpoint of a project generated with more of the template's options
    (errors.LEFT_OUT): one line naming the option and the cruft command that brings it,
    unless the setting holds the value meaning unused (errors.UNUSED, else false), as in
    that project's config of a run that did not use it."""
    assert LEFT_OUT, "this project was generated without an option: LEFT_OUT names it"
    for key, option in LEFT_OUT.items():
        command = "cruft update --variables-to-update '" + json.dumps({option: "yes"}) + "'"
        if "." in key:  # a config key (true; unused: its UNUSED value), or key=value
            if "=" not in key:
                load_config(None, [f"{key}={json.dumps(UNUSED.get(key, False))}"])
            with pytest.raises(ConfigError) as caught:
                load_config(None, [key if "=" in key else f"{key}=true"])
        else:  # an entry of a checkpoint file
            path = tmp_path / "step-00000001.pt"
            torch.save({key: "x", "progress": {}, "config": {}}, path)
            with pytest.raises(CheckpointError) as caught:
                checkpoint.load(path)
        message = str(caught.value)
        assert f"needs the template option {option}, which this project was" in message, key
        assert message.endswith(command), message


def test_resuming_a_fuller_project_s_run_names_the_option_it_needs():
    """A lean project resuming a fuller project's run said "drop the override" of a
    task.name nobody had given."""
    from {{ cookiecutter.package_name }}.checkpoint.resume import changes

    cfg = load_config(None, [])
    for key, option in LEFT_OUT.items():
        section, _, rest = key.partition(".")
        name, is_value, value = rest.partition("=")
        if not is_value:
            continue
        saved = to_dict(cfg)
        saved[section][name] = value
        needs = f"the checkpoint's {key} needs the template option {option}"
        with pytest.raises(ConfigError, match=re.escape(needs)):
            changes({"config": saved}, cfg)
# <<< !fsdp|!text|!pretrained|!multilabel|!trackers
