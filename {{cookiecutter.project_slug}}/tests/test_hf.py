"""Image classification with a Hugging Face model (model.name=hf_image, models/hf.py), with
the real transformers and never the network: a tiny ViT and its image processor are made in
the test (random init) and saved with save_pretrained, as a user's offline folder would be.
Sockets are blocked in every test.

Skipped where transformers is not installed; REQUIRE_EXTRAS=transformers makes that a
failure (the template's CI runs these in the environment of tests/test_zoo.py).
"""

from __future__ import annotations

import json  # feature: export
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS, block_network, needs

from {{ cookiecutter.package_name }} import checkpoint
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.tools.evaluate import evaluate_main
from {{ cookiecutter.package_name }}.tools.export import export_main  # feature: export
from {{ cookiecutter.package_name }}.tools.predict import predict_main
from {{ cookiecutter.package_name }}.trainer import fit

transformers = needs("transformers")
huggingface_hub = needs("huggingface_hub")


@pytest.fixture(autouse=True)
def no_network(monkeypatch, tmp_path):
    block_network(monkeypatch, tmp_path, "tests/test_hf.py")


def tiny_vit(folder: Path, size: int = 32) -> Path:
    """A 2-layer ViT from random init and its image processor (ImageNet's mean and std),
    saved with save_pretrained."""
    transformers.ViTImageProcessor(
        size={"height": size, "width": size},
        image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225],
    ).save_pretrained(folder)
    config = transformers.ViTConfig(
        image_size=size,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
    )
    torch.manual_seed(0)
    transformers.ViTForImageClassification(config).save_pretrained(folder)
    return folder


def test_an_image_model_reads_images_as_its_processor_does(tmp_path):
    """model.name=hf_image: the image processor's size, resampling, mean and std become the
    data's, and decoding gives its pixels exactly (its PIL backend; the torchvision one
    resizes by another kernel)."""
    from PIL import Image
    from test_image_folder import write_images

    from {{ cookiecutter.package_name }}.data.image_decode import decode
    from {{ cookiecutter.package_name }}.models import preprocessing

    folder = tiny_vit(tmp_path / "vit")
    prep = preprocessing(load_config(None, ["model.name=hf_image", f"model.arch={folder}"]).model)
    assert prep == {
        "image_size": 32,
        "crop_pct": 0.0,
        "interpolation": "bilinear",
        "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225],
    }
    write_images(tmp_path / "images", 2, size=47)
    processor = transformers.AutoImageProcessor.from_pretrained(folder, backend="pil")
    for path in sorted((tmp_path / "images").glob("*.png")):
        ours = decode(path, 32, None, prep["interpolation"])
        ours = (ours - torch.tensor(prep["mean"]).view(3, 1, 1)) / torch.tensor(prep["std"]).view(
            3, 1, 1
        )
        theirs = processor(images=[Image.open(path).convert("RGB")], return_tensors="pt")
        torch.testing.assert_close(ours, theirs["pixel_values"][0], rtol=0, atol=1e-6)


@pytest.mark.slow
def test_an_image_classifier_from_hugging_face_fine_tunes_then_predicts(tmp_path):
    from test_image_folder import write_images

    for i, name in enumerate(("cat", "dog")):
        write_images(tmp_path / "images" / name, 6, seed=i, size=40)
    folder = tiny_vit(tmp_path / "vit")
    args = [f"data.root={tmp_path / 'images'}", "data.val_fraction=0.34", "data.num_workers=0"]
    args += ["model.name=hf_image", f"model.arch={folder}", "train.epochs=2", "run.name=vit"]
    args += ["train.batch_size=4", "run.device=cpu", "run.loggers=[csv]"]
    args += [f"run.output_dir={tmp_path / 'runs'}"]
    fit(load_config(CONFIGS / "experiments" / "finetune_image_folder.yaml", args))
    best = tmp_path / "runs/vit/best.pt"
    meta = checkpoint.load(best)["data"]
    assert (meta["image_size"], meta["crop_pct"]) == (32, None)  # the whole image, squashed
    assert meta["mean"] == pytest.approx([0.485, 0.456, 0.406])
    # The image processor is not read again (the checkpoint says how); the model's config.json
    # is (its architecture: transformers builds from it), its weights come from the checkpoint.
    (folder / "preprocessor_config.json").unlink()
    assert evaluate_main(["--checkpoint", str(best)]) == 0
    out = tmp_path / "predictions.csv"
    assert (
        predict_main([str(tmp_path / "images"), "--checkpoint", str(best), "--out", str(out)]) == 0
    )
    assert len(out.read_text().splitlines()) == 13
    # >>> export
    artifact = tmp_path / "vit.onnx"
    assert (
        export_main(["--checkpoint", str(best), "--format", "onnx", "--out", str(artifact)]) == 0
    )
    parity = json.loads(artifact.with_name("vit.onnx.json").read_text())["parity"]
    assert parity["passed"] and parity["inputs"] == "validation"
    # <<< export
