"""The image_folder dataset: layouts and splits, class order, undecodable files, augmentation."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import CONFIGS, run_script, stop_after, tiny_with
from PIL import Image

from {{ cookiecutter.package_name }} import checkpoint
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.data import (
    build_datasets,
    build_loader,
    close_loader,
    set_epoch,
    source_of,
)
from {{ cookiecutter.package_name }}.data.image_decode import decode
from {{ cookiecutter.package_name }}.data.image_folder import ImageFolder
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.trainer import fit


def write_images(folder: Path, count: int, seed: int = 0, size: int = 8) -> None:
    """`count` random RGB PNGs of size x size in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    for i in range(count):
        pixels = torch.randint(256, (size, size, 3), generator=g, dtype=torch.uint8)
        Image.fromarray(pixels.numpy()).save(folder / f"{i:03d}.png")


def options(root: Path, *extra: str) -> list[str]:
    return ["data.name=image_folder", f"data.root={root}", "data.image_size=8", *extra]


def datasets(root: Path, *extra: str):
    cfg = load_config(None, options(root, *extra))
    return build_datasets(cfg.data, "class")


def test_one_pool_holds_out_data_val_fraction_of_each_class(tmp_path):
    for name, count in (("b", 10), ("a", 20), ("c", 30)):
        write_images(tmp_path / name, count)
    train, val, meta = datasets(tmp_path, "data.val_fraction=0.2")
    assert meta["classes"] == ["a", "b", "c"]
    labels = source_of(val).y
    assert torch.bincount(labels[val.indices]).tolist() == [4, 2, 6]  # 20 % of each class
    assert torch.bincount(labels[train.indices]).tolist() == [16, 8, 24]
    assert meta["split"]["val"] == 12


def test_train_and_val_folders_are_the_split_when_present(tmp_path):
    for name in ("a", "b"):
        write_images(tmp_path / "train" / name, 6)
    write_images(tmp_path / "val" / "b", 3)  # val may lack a class
    train, val, meta = datasets(tmp_path, "data.val_fraction=0.5")
    assert (len(train), len(val)) == (12, 3) and "split" not in meta
    assert val.classes == ["a", "b"] and val.y.tolist() == [1, 1, 1]  # ids of the train folder


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ({}, "image folder '{root}/missing' not found; set data.root to a folder laid out as"),
        ({"a": 2}, "image folder '{root}' has 1 class sub-folders; a classifier needs at least 2"),
        ({"a": 2, "b": 0}, "image folder '{root}/b' holds no images (.bmp, .jpeg,"),
        (
            {"train/a": 2, "train/b": 2, "val/c": 1},
            "image folder '{root}/val/c' is a class the model was not trained on (its classes: "
            "a, b)",
        ),
        ({"train/a": 2, "train/b": 2}, "image folder '{root}/train' has no val/ folder beside it"),
    ],
    ids=["missing root", "one class", "empty class", "val class not in train", "train/ alone"],
)
def test_bad_layouts_are_named_in_one_line(tmp_path, layout, message):
    for name, count in layout.items():
        (tmp_path / name).mkdir(parents=True)
        write_images(tmp_path / name, count)
    root = tmp_path / "missing" if not layout else tmp_path
    with pytest.raises(ConfigError) as err:
        datasets(root)
    assert str(err.value).startswith(message.format(root=tmp_path)), err.value
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.mean=0.5,0.5", "data.mean must be 3 comma-separated numbers (R,G,B) or one number"),
        ("data.std=0", "data.std must be 3 numbers > 0 (R,G,B) or one, got '0'"),
        ("data.image_size=2", "data.image_size must be >= 4, or 0 (auto), got 2"),
    ],
)
def test_bad_options_are_refused_with_their_rule(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, ["data.name=image_folder", override])


def test_classes_are_sorted_and_travel_in_the_checkpoint(tmp_path):
    for name in ("zebra", "apple", "mango"):
        write_images(tmp_path / "images" / name, 8)
    run = [
        *options(tmp_path / "images", "data.mean=0.4", "data.std=0.2,0.25,0.3"),
        *("model.width=4", "train.batch_size=8", "train.epochs=1", "train.warmup_steps=1"),
        *("run.device=cpu", "run.loggers=csv", f"run.output_dir={tmp_path / 'runs'}"),
    ]
    fit(load_config(None, run))
    meta = checkpoint.load(tmp_path / "runs" / "default" / "best.pt")["data"]
    assert meta["classes"] == ["apple", "mango", "zebra"]
    assert meta["image_size"] == 8
    assert meta["mean"] == pytest.approx([0.4] * 3)
    assert meta["std"] == pytest.approx([0.2, 0.25, 0.3])


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_an_undecodable_image_is_named_in_one_line_even_from_a_loader_worker(tmp_path, workers):
    for name in ("a", "b"):
        write_images(tmp_path / "train" / name, 8)
        write_images(tmp_path / "val" / name, 2)
    bad = tmp_path / "train" / "b" / "zz.png"  # sorted last: read by the loader, not at start-up
    bad.write_bytes(b"not a png at all")
    proc = run_script(
        "scripts/train.py",
        *options(tmp_path, f"data.num_workers={workers}"),
        *("model.width=4", "train.batch_size=4", "train.epochs=1", "run.device=cpu"),
        *("run.loggers=csv", f"run.output_dir={tmp_path / 'runs'}"),
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: image file '{bad}' cannot be decoded (not an image format Pillow reads); "
        "remove or replace it"
    ]


def modes_of(rgb: np.ndarray) -> dict:
    """The same picture in the modes Pillow reads, each with what it must decode to: the
    8-bit grey (or RGB) values / 255, never 16-bit values clipped at 255 (all white)."""
    grey = Image.fromarray(rgb).convert("L")
    g = np.asarray(grey)
    as_grey = np.repeat(g[:, :, None] / 255.0, 3, axis=2)
    rgba = Image.fromarray(rgb).convert("RGBA")
    rgba.putalpha(Image.fromarray((np.arange(g.size) % 256).astype(np.uint8).reshape(g.shape)))
    palette = Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    palette.info["transparency"] = 0
    bits = grey.convert("1")
    cmyk = Image.fromarray(rgb).convert("CMYK")
    return {
        "L": (grey, as_grey),
        "I;16": (Image.fromarray(g.astype(np.uint16) * 257), as_grey),  # a 16-bit PNG
        "I": (Image.fromarray(g.astype(np.int32) * 257, mode="I"), as_grey),
        "F": (Image.fromarray((g / 255.0).astype(np.float32), mode="F"), as_grey),
        "RGBA": (rgba, rgb / 255.0),  # alpha dropped, as torchvision and timm read it
        "LA": (grey.convert("LA"), as_grey),
        "P": (palette, np.asarray(palette.convert("RGB")) / 255.0),
        "1": (bits, np.repeat(np.asarray(bits.convert("L"))[:, :, None] / 255.0, 3, axis=2)),
        "CMYK": (cmyk, np.asarray(cmyk.convert("RGB")) / 255.0),
    }


@pytest.mark.parametrize("mode", ["L", "I;16", "I", "F", "RGBA", "LA", "P", "1", "CMYK"])
def test_every_image_mode_decodes_to_its_own_values_in_0_1(tmp_path, mode):
    g = torch.Generator().manual_seed(0)
    rgb = torch.randint(0, 256, (12, 12, 3), generator=g, dtype=torch.uint8).numpy()
    image, want = modes_of(rgb)[mode]
    path = tmp_path / ("x.tif" if mode in ("I", "F", "CMYK") else "x.png")
    image.save(path)
    with Image.open(path) as saved:
        assert saved.mode == mode or (mode, saved.mode) in {("I;16", "I"), ("I", "I;16")}
    got = decode(path, 12)  # its own size: no resampling, so exact
    assert got.shape == (3, 12, 12)
    assert torch.allclose(got, torch.from_numpy(want).permute(2, 0, 1).float(), atol=1e-6)


def test_a_16_bit_image_resized_keeps_its_values_and_out_of_range_ones_are_refused(tmp_path):
    ramp = np.tile(np.linspace(0, 255, 32).astype(np.uint8), (32, 1))
    Image.fromarray(ramp).save(tmp_path / "8.png")
    Image.fromarray(ramp.astype(np.uint16) * 257).save(tmp_path / "16.png")
    eight, sixteen = decode(tmp_path / "8.png", 8, 0.875), decode(tmp_path / "16.png", 8, 0.875)
    assert (eight - sixteen).abs().max() < 1 / 255 and 0.3 < sixteen.mean() < 0.7
    for mode, values in (
        ("I", np.full((4, 4), -5, np.int32)),
        ("F", np.full((4, 4), 2.0, np.float32)),
    ):
        Image.fromarray(values, mode=mode).save(tmp_path / f"{mode}.tif")
        with pytest.raises(ConfigError, match=r"(I|F)\.tif' \(mode \1\) holds values (-5|2) to"):
            decode(tmp_path / f"{mode}.tif", 4)


@pytest.mark.parametrize("size, free_gb", [(100_000, None), (3000, 4.0)])
def test_an_image_size_whose_batches_do_not_fit_in_memory_is_one_line(
    tmp_path, monkeypatch, size, free_gb
):
    """data.image_size=3000 ran until the OOM killer ended it, having taken all 23 GB."""
    from {{ cookiecutter.package_name }}.utils import device

    if free_gb is not None:  # the same rule on a machine with 4 GB free, as a small one has
        monkeypatch.setattr(device, "free_memory", lambda: int(free_gb * 2**30))
    write_images(tmp_path / "img" / "a", 4)
    write_images(tmp_path / "img" / "b", 4, seed=1)
    args = ["data.name=image_folder", f"data.root={tmp_path / 'img'}", f"data.image_size={size}",
            "train.batch_size=16", "data.num_workers=1", f"run.output_dir={tmp_path / 'runs'}",
            "run.device=cpu"]  # fmt: skip
    line = r"a batch of 16 inputs takes [\d.]+ GB decoded \([\d.]+ GB with the 1 loader "
    with pytest.raises(ConfigError, match=line + r"workers' prefetch\), over half the [\d.]+ GB"):
        fit(load_config(None, args))
    assert not (tmp_path / "runs").exists()


def test_augmentation_is_random_in_training_only_and_repeats_with_the_seed(tmp_path):
    for name in ("a", "b"):
        write_images(tmp_path / "train" / name, 2)
        write_images(tmp_path / "val" / name, 2)
    cfg = load_config(None, options(tmp_path))
    train = ImageFolder(cfg.data.options, "train")
    val = ImageFolder(cfg.data.options, "val")

    def draw(dataset, seed):
        torch.manual_seed(seed)
        return dataset[0][0]

    assert torch.equal(draw(train, 0), draw(train, 0))
    assert not all(torch.equal(draw(train, 0), draw(train, s)) for s in range(1, 6))
    assert torch.equal(draw(val, 0), draw(val, 1))
    no_augment = load_config(None, options(tmp_path, "data.augment=false"))
    plain = ImageFolder(no_augment.data.options, "train")
    assert torch.equal(draw(plain, 0), draw(plain, 1))
    # The unaugmented image is the file's pixels, mapped to [-1, 1] by the 0.5/0.5 default.
    pixels = torch.from_numpy(np.array(Image.open(val.files[0])))  # (8, 8, 3), as written
    assert torch.allclose(val[0][0], pixels.permute(2, 0, 1) / 127.5 - 1, atol=1e-6)


def test_held_out_rows_of_a_pool_are_not_augmented_and_workers_repeat_with_the_seed(tmp_path):
    for name in ("a", "b"):
        write_images(tmp_path / name, 8)
    cfg = load_config(None, options(tmp_path, "data.num_workers=1", "data.val_fraction=0.5"))
    train, val, _ = build_datasets(cfg.data, "class")
    assert train.dataset is val.dataset  # one pool: augmentation goes by row
    torch.manual_seed(0)
    first = val[0][0]
    assert all(torch.equal(first, val[0][0]) for _ in range(5))

    def first_batch(seed):
        loader = build_loader(train, cfg.data, 8, train=True, seed=seed)
        return next(iter(loader))[0]

    batch = first_batch(3)
    assert torch.equal(batch, first_batch(3))
    assert not torch.equal(batch, first_batch(4))


@pytest.mark.slow
def test_image_folder_example_learns_and_evaluate_agrees(demo_data, tmp_path):
    cfg = load_config(
        CONFIGS / "experiments" / "image_folder.yaml",
        [
            "train.epochs=3",
            "run.device=cpu",
            "run.loggers=csv",
            f"run.output_dir={tmp_path}",
        ],
    )
    result = fit(cfg)
    assert result["best"] >= 0.9  # 6 classes: chance is 0.17
    best = tmp_path / "image_folder" / "best.pt"
    proc = run_script(
        "scripts/evaluate.py",
        *("--checkpoint", str(best), f"data.root={demo_data / 'data' / 'demo' / 'images'}"),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["acc"] == result["best"]


def test_without_pillow_image_folders_say_how_to_install_it_and_the_rest_works(
    tmp_path, monkeypatch
):
    for name in ("a", "b"):
        write_images(tmp_path / name, 2)
    monkeypatch.setitem(sys.modules, "PIL", None)  # as if Pillow were not installed
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    with pytest.raises(ConfigError, match=r"needs Pillow: pip install pillow"):
        ImageFolder(load_config(None, options(tmp_path)).data.options, "all")
    assert build_datasets(load_config(None, ["data.train_size=8"]).data, "class")[0] is not None


def test_augmentation_follows_the_item_seed_whatever_the_workers_and_epoch(tmp_path):
    for name in ("a", "b"):
        write_images(tmp_path / name, 8)
    cfg = load_config(None, options(tmp_path, "data.val_fraction=0.25"))
    train, _, _ = build_datasets(cfg.data, "class")
    assert torch.equal(train[(0, 7)][0], train[(0, 7)][0])  # (index, seed): a pure function
    assert not all(torch.equal(train[(0, 7)][0], train[(0, s)][0]) for s in range(8, 14))

    def epoch(workers: int, number: int) -> torch.Tensor:
        data_cfg = load_config(None, options(tmp_path, f"data.num_workers={workers}")).data
        loader = build_loader(train, data_cfg, 4, train=True, seed=5)
        set_epoch(loader, number)
        try:
            return torch.cat([x for x, _ in loader])
        finally:
            close_loader(loader)

    assert torch.equal(epoch(0, 1), epoch(2, 1))  # workers change nothing
    assert not torch.equal(epoch(0, 1), epoch(0, 2))  # a new epoch draws anew


@pytest.mark.slow
def test_a_stopped_and_resumed_run_with_workers_matches_an_uninterrupted_one(
    tmp_path, tiny, monkeypatch
):
    for name in ("a", "b"):
        write_images(tmp_path / "img" / name, 16)
    args = tiny_with(
        tiny,
        *options(tmp_path / "img"),
        "model.name=mlp",
        "train.batch_size=4",
        "train.epochs=2",
        "run.deterministic=true",
    )
    straight = fit(load_config(None, [*args, "run.name=straight", "data.num_workers=2"]))
    stopping = stop_after(monkeypatch, 9)  # mid-epoch 2
    fit(load_config(None, [*args, *stopping, "run.name=split"]))
    resumed = fit(
        load_config(None, [*args, "run.name=split", "train.resume=auto", "data.num_workers=2"])
    )
    assert resumed["step"] == straight["step"]
    for key, value in straight["model"].state_dict().items():
        assert torch.equal(value, resumed["model"].state_dict()[key]), key
