"""Hostile sizes end in seconds with one bounded line: an alias bomb in YAML, a megabyte value
or key, a label of 2,000,000,000, a tensor file without features, a CSV of many columns."""

from __future__ import annotations

import time

import pytest
import torch
from conftest import tiny_with
from test_bad_input import assert_one_line, assert_unchanged, snapshot, tensor_files, train, write

from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.data import csv_table


def bomb(levels: int) -> str:
    """Billion laughs: each list holds 9 aliases of the one before, 9**levels values in all."""
    lists = ["&a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lists += [f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return f"[{', '.join(lists)}]"


def test_an_alias_bomb_in_a_config_file_is_refused_before_it_expands(tmp_path, tiny, capsys):
    text = f"model:\n  dropout: {bomb(9)}\n"  # ~400 bytes; 387 million values expanded
    assert len(text) < 500
    config = write(tmp_path / "bomb.yaml", text)
    before = snapshot(tmp_path)
    code, err = train([*tiny, "--config", str(config)], capsys)
    assert_one_line(code, err, f"config file {str(config)!r} holds over 100,000 values")
    assert "alias" in err
    assert_unchanged(before, tmp_path)


def test_an_alias_bomb_in_an_override_is_refused(tiny, capsys):
    # A million values: the old reader built them and printed them all in its message.
    code, err = train([*tiny, f"train.epochs={bomb(6)}"], capsys)
    assert_one_line(code, err, "override 'train.epochs=[&a0 [1, 1, 1, 1, 1, 1, 1, 1, 1], &a1")
    assert "an alias *name counts as the values it repeats" in err


def test_a_config_path_that_is_no_regular_file_is_named_as_such(tmp_path, tiny, capsys):
    """--config /dev/zero and a FIFO were "not found"."""
    import os

    os.mkfifo(tmp_path / "fifo")
    for path in ("/dev/zero", str(tmp_path / "fifo"), str(tmp_path)):
        code, err = train([*tiny, "--config", path], capsys)
        assert_one_line(code, err, f"config file {path!r} is not a regular file")


def test_a_config_file_too_large_is_refused_by_its_size_before_parsing(tmp_path, tiny, capsys):
    """A 24 MB list did not finish in 200 s; a 28 MB mapping was refused after a minute for
    aliases it did not have."""
    items = ", ".join(["1"] * 150_000)  # 450 KB, no alias
    config = write(tmp_path / "big.yaml", f"model:\n  dropout: [{items}]\n")
    code, err = train([*tiny, "--config", str(config)], capsys)
    assert_one_line(code, err, f"config file {str(config)!r} is 0.4 MB, over the 256 KB")


def test_mapping_keys_stay_names_where_yaml_1_1_would_read_booleans_or_numbers(tmp_path, tiny):
    """The docs' own `task.class_weights={no: 1, yes: 9}` was refused: {False: 1, True: 9}."""
    cfg = load_config(None, ["task.class_weights={no: 1, yes: 9}"])
    assert cfg.task.options.class_weights == {"no": 1, "yes": 9}
    numbered = write(tmp_path / "w.yaml", "task:\n  class_weights: {0: 1, 1: 4, off: 2}\n")
    assert load_config(numbered, []).task.options.class_weights == {"0": 1, "1": 4, "off": 2}
    assert load_config(None, ["train.compile=yes"]).train.compile is True  # values still are


def test_a_few_aliases_still_read(tmp_path):
    text = "train:\n  epochs: &n 4\n  warmup_steps: *n\n"
    with_aliases = load_config(write(tmp_path / "t.yaml", text), [])
    assert with_aliases.train.epochs == with_aliases.train.warmup_steps == 4


def test_a_number_too_long_to_convert_is_one_line(tmp_path, tiny, capsys):
    # Python refuses to convert integers of more than 4300 digits (a ValueError inside YAML).
    config = write(tmp_path / "long.yaml", f"train:\n  epochs: {'9' * 100_000}\n")
    code, err = train([*tiny, "--config", str(config)], capsys)
    assert_one_line(code, err, f"config file {str(config)!r} holds a value that cannot be read")
    code, err = train([*tiny, f"train.epochs={'9' * 10_000}"], capsys)
    assert_one_line(code, err, "override 'train.epochs=999")


BIG = "x" * 200_000


@pytest.mark.parametrize(
    ("override", "start", "end"),
    [
        (f"train.epochs={BIG}", "train.epochs expects int, got 'xxx", "(str)"),
        (f"train.{BIG}=3", "unknown config key 'train.xxx", ""),
        (f"model.name={BIG}", "model.name='xxx", ""),
        (f"run.loggers={BIG}", "run.loggers[0] must be one of", ""),
    ],
)
def test_an_error_line_quotes_at_most_200_characters_of_a_huge_value(
    tiny, capsys, override, start, end
):
    code, err = train([*tiny, override], capsys)
    assert_one_line(code, err, start)
    assert len(err) < 1100 and "x" * 190 + "…'" in err, err[:2000]
    assert err.strip().endswith(end)


def test_a_huge_column_name_is_cut_in_the_message(tmp_path, tiny, capsys):
    table = write(tmp_path / "t.csv", f"{BIG[:100_000]},b\n1,2\n")  # csv's field limit: 128 KB
    code, err = train(tiny_with(tiny, "data.name=csv", f"data.path={table}"), capsys)
    assert_one_line(code, err, "has no column 'label' (columns: xxx")
    assert len(err) < 1100 and err.strip().endswith("set data.label to the target column")


X = torch.randn(64, 5)


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (
            {"x": X, "y": torch.cat([torch.arange(63) % 2, torch.tensor([2_000_000_000])])},
            "it holds class id 2,000,000,000, which asks for 2,000,000,001 class ids for 64 "
            "samples; number the ids 0..K-1",
        ),
        # >>> text
        (
            {"x": torch.full((8, 4), 2_000_000_000), "y": torch.ones(8, 4, dtype=torch.long)},
            "it holds token id 2,000,000,000",
        ),
        # <<< text
        ({"x": torch.randn(64, 0), "y": torch.arange(64) % 2}, "its samples hold no features"),
    ],
    ids=["class 2e9", "token 2e9", "no features"],  # feature: text
    ids=["class 2e9", "no features"],  # feature: !text
)
def test_tensor_files_with_hostile_sizes_are_refused_with_one_line(
    tmp_path, tiny, capsys, blob, message
):
    data = tensor_files(blob)(tmp_path)
    before = snapshot(tmp_path)
    code, err = train(tiny_with(tiny, *data, "model.name=mlp"), capsys)
    assert_one_line(code, err, message)
    assert_unchanged(before, tmp_path)


def test_reading_a_csv_grows_linearly_with_its_columns(tmp_path):
    """16 times the columns may take about 16 times as long (a ratio of times measured in one
    run, best of 7, the two sizes taken in turn so a busy moment slows both); a lookup per
    column in the header list made it ~200 times."""
    tables = {}
    for columns in (500, 8_000):
        header = ",".join([f"f{i}" for i in range(columns)] + ["label"])
        path = write(tmp_path / f"{columns}.csv", f"{header}\n{'0.5,' * columns}1\n")
        tables[columns] = (path, csv_table.Options(path=str(path)))
    times = {columns: [] for columns in tables}
    for _ in range(7):
        for columns, (path, opts) in tables.items():
            start = time.perf_counter()
            csv_table.read_table(path, "data.path", opts)
            times[columns].append(time.perf_counter() - start)
    small, large = min(times[500]), min(times[8_000])
    assert large / small < 64, (small, large)
