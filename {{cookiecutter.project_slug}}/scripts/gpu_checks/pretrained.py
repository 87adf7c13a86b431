"""The pretrained-model check: the two example configs (a timm ResNet-18 on the demo images, a  # feature: text
small BERT on the demo tickets) fine-tuned on the GPU with bf16, channels_last and compile  # feature: text
"""The pretrained-model check: the example config (a timm ResNet-18 on the demo images)  # feature: !text
fine-tuned on the GPU with bf16, channels_last and compile  # feature: !text
across the unfreeze, under fsdp on two ranks, then evaluated and predicted  # feature: fsdp
across the unfreeze, under ddp on two ranks, then evaluated and predicted  # feature: !fsdp
from the CUDA checkpoint. Weights are made on the spot (random init in the library's own
format): the check needs no network, only the [vision] and [hf] extras."""  # feature: text
format): the check needs no network, only the [vision] extra."""  # feature: !text

from __future__ import annotations

import csv  # feature: text
import importlib.util
import json  # feature: export
import sys  # feature: text

# >>> text
from .common import ROOT, Check, Failed, Skipped, last_epoch_line  # feature: export
from .common import ROOT, Check, Skipped, last_epoch_line  # feature: !export
# <<< text
# >>> !text
from .common import Check, Failed, Skipped, last_epoch_line  # feature: export
from .common import Check, Skipped, last_epoch_line  # feature: !export
# <<< !text

LIBRARIES = ("timm", "transformers", "tokenizers")  # feature: text
LIBRARIES = ("timm",)  # feature: !text


def check_pretrained(c: Check) -> str:
    # >>> text
    """timm resnet18 (224 px, bf16, channels_last, compile, frozen first epoch) and an hf BERT
    (bf16, frozen first epoch) fine-tuned, resumed-free; fsdp on 2 ranks for the timm model;  # feature: fsdp
    (bf16, frozen first epoch) fine-tuned, resumed-free; ddp on 2 ranks for the timm model;  # feature: !fsdp
    # <<< text
    # >>> !text
    """timm resnet18 (224 px, bf16, channels_last, compile, frozen first epoch) fine-tuned,
    resumed-free; fsdp on 2 ranks;  # feature: fsdp
    resumed-free; ddp on 2 ranks;  # feature: !fsdp
    # <<< !text
    evaluate, predict and ONNX/torch.export parity from the CUDA checkpoints."""  # feature: export
    evaluate and predict from the CUDA checkpoints."""  # feature: !export
    missing = [m for m in LIBRARIES if importlib.util.find_spec(m) is None]
    if missing:
        raise Skipped(f"{', '.join(missing)} not installed: pip install -e '.[vision,hf]'")  # feature: text
        raise Skipped(f"{', '.join(missing)} not installed: pip install -e '.[vision]'")  # feature: !text
    import timm
    import torch

    demo = c.workdir / "demo"
    c.python("scripts/make_demo_data.py", "--out", str(demo), "images", "tickets")  # feature: text
    c.python("scripts/make_demo_data.py", "--out", str(demo), "images")  # feature: !text
    torch.save(timm.create_model("resnet18").state_dict(), c.workdir / "resnet18.pth")
    # >>> text
    sys.path.insert(0, str(ROOT / "tests"))
    import test_hf_text  # the tests' tiny BERT maker: a save_pretrained folder, no network

    with (demo / "tickets.csv").open() as f:
        test_hf_text.tiny_bert(c.workdir / "bert", [row["text"] for row in csv.DictReader(f)])
    # <<< text
    device, runs = c.machine.device, c.workdir / "runs"
    common = [f"run.device={device}", f"run.output_dir={runs}", "run.loggers=[csv]"]
    common += ["train.epochs=2", "train.freeze_epochs=1", "train.amp=bf16"]
    vision = [
        "--config",
        "configs/experiments/finetune_image_folder.yaml",
        f"data.root={demo / 'images'}",
        f"model.weights={c.workdir / 'resnet18.pth'}",
        *common,
    ]
    out = c.python("scripts/train.py", *vision, "train.channels_last=true", "train.compile=true")
    lines = [last_epoch_line(out)]
    # >>> text
    text = ["--config", "configs/experiments/hf_text_classifier.yaml"]
    text += [f"data.path={demo / 'tickets.csv'}", f"model.arch={c.workdir / 'bert'}", *common]
    lines.append(last_epoch_line(c.python("scripts/train.py", *text)))
    # <<< text
    launch, env = c.launch(2)
    two = [*vision, "run.name=vision_fsdp", "train.strategy=fsdp"]  # feature: fsdp
    two = [*vision, "run.name=vision_ddp"]  # feature: !fsdp
    c.wait(c.start(*launch, *two, env=env))
    for run in ("finetune_image_folder", "hf_text_classifier"):  # feature: text
    for run in ("finetune_image_folder",):  # feature: !text
        best = str(runs / run / "best.pt")
        c.python("scripts/evaluate.py", "--checkpoint", best, f"run.device={device}")
        c.python("scripts/predict.py", "--checkpoint", best, "--split", "val", "--device", device)
        # >>> export
        fmt = "onnx" if importlib.util.find_spec("onnxruntime") else "export"
        c.python("scripts/export.py", "--checkpoint", best, "--format", fmt)
        suffix = {"onnx": ".onnx", "export": ".pt2"}[fmt]
        meta = json.loads((runs / run / f"best{suffix}.json").read_text())
        if meta["parity"].get("passed") is False:
            raise Failed(f"{run}: the {fmt} export differs from the model ({meta['parity']})")
        # <<< export
    return " / ".join(line.split("|")[0].strip() + " ok" for line in lines)
