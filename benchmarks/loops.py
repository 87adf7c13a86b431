"""The three training loops the benchmark compares, each run in a fresh process by
bench_training.py:

    python benchmarks/loops.py {minimal|project|lightning} SPEC.json OUT.json

  minimal    a hand-written loop: index a batch, forward, loss, backward, step. Nothing else.
             AdamW is fused, as the project's trainer picks it on CPU and CUDA, so that b/a
             measures the trainer's own overhead, not the optimizer's implementation.
  minimal_torch_default
             the same loop with torch's default AdamW (a per-tensor loop on CPU), to show what
             the fused optimizer is worth.
  project    the baked project's own entry point (train_main, as scripts/train.py calls it)
             with its default features: progress bar, logging, TensorBoard, checkpoint per epoch.
  lightning  lightning.Trainer with its defaults, fed the project's model, data and loader.

All three build the same model from the same config, on the same synthetic data, with the same
batch size, dtype (fp32) and torch.set_num_threads. A global optimizer-step hook (identical for
all three, ~1 us) time-stamps every optimizer step; the driver turns the stamps into samples/s.
Wall-clock marks (time.time()) let the driver measure from process start to the first step.
"""

from __future__ import annotations

import json
import sys
import time

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

MARKS: dict[str, float] = {"torch_imported": time.time()}
STAMPS: list[float] = []


def _on_step(optimizer, args, kwargs) -> None:
    STAMPS.append(time.perf_counter())
    if len(STAMPS) == 1:
        MARKS["first_step"] = time.time()
        MARKS["threads"] = torch.get_num_threads()


def main(which: str, spec_path: str, out_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    torch.set_num_threads(spec["threads"])
    register_optimizer_step_post_hook(_on_step)
    loops = {
        "minimal": minimal,
        "minimal_torch_default": lambda spec: minimal(spec, fused=None),
        "project": project,
        "lightning": lightning,
    }
    result = loops[which](spec)
    result.update(marks=MARKS, stamps=STAMPS)
    with open(out_path, "w") as f:
        json.dump(result, f)


def minimal(spec: dict, fused: bool | None = True) -> dict:
    import importlib

    import torch.nn.functional as F

    pkg = spec["package"]
    config = importlib.import_module(f"{pkg}.config")
    data = importlib.import_module(f"{pkg}.data")
    models = importlib.import_module(f"{pkg}.models")
    MARKS["imports_done"] = time.time()

    cfg = config.load_config(None, spec["overrides"])
    torch.manual_seed(cfg.run.seed)
    train_set = data.DATASETS["synthetic"](cfg.data.options, "train")
    model = models.build_model(cfg.model, train_set.x[:2], train_set.num_classes)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay, fused=fused
    )
    x_all, y_all, batch = train_set.x, train_set.y, cfg.train.batch_size
    steps = len(train_set) // batch
    model.train()
    for _ in range(cfg.train.epochs):
        order = torch.randperm(len(train_set))
        for i in range(steps):
            idx = order[i * batch : (i + 1) * batch]
            loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return {"steps_per_epoch": steps, "batch_size": batch, "excluded": []}


def project(spec: dict) -> dict:
    import importlib

    pkg = spec["package"]
    entry = importlib.import_module(f"{pkg}.tools.train")
    loop = importlib.import_module(f"{pkg}.loop")
    MARKS["imports_done"] = time.time()

    # Validation is counted separately: its time spans are cut out of the measured interval.
    excluded: list[list[float]] = []
    evaluate = loop.evaluate

    def timed_evaluate(*args, **kwargs):
        start = time.perf_counter()
        try:
            return evaluate(*args, **kwargs)
        finally:
            excluded.append([start, time.perf_counter()])

    loop.evaluate = timed_evaluate
    code = entry.train_main(spec["overrides"])
    if code != 0:
        raise SystemExit(f"train_main exited with {code}")
    cfg = importlib.import_module(f"{pkg}.config").load_config(None, spec["overrides"])
    steps = cfg.data.options.train_size // cfg.train.batch_size
    return {"steps_per_epoch": steps, "batch_size": cfg.train.batch_size, "excluded": excluded}


def lightning(spec: dict) -> dict:
    import importlib

    import lightning as L
    import torch.nn.functional as F

    pkg = spec["package"]
    config = importlib.import_module(f"{pkg}.config")
    data = importlib.import_module(f"{pkg}.data")
    models = importlib.import_module(f"{pkg}.models")
    optim = importlib.import_module(f"{pkg}.optim")
    MARKS["imports_done"] = time.time()

    cfg = config.load_config(None, spec["overrides"])
    L.seed_everything(cfg.run.seed, verbose=False)
    train_set = data.DATASETS["synthetic"](cfg.data.options, "train")
    loader = data.build_loader(
        train_set, cfg.data, batch_size=cfg.train.batch_size, train=True, seed=cfg.run.seed
    )
    steps = len(loader)

    class Classifier(L.LightningModule):
        # The usual LightningModule: the project's model, optimizer and per-step schedule.
        def __init__(self):
            super().__init__()
            example, classes = train_set.x[:2], train_set.num_classes
            self.model = models.build_model(cfg.model, example, classes)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self.model(x), y)
            self.log("train/loss", loss)
            return loss

        def configure_optimizers(self):
            # The project's optimizer (same groups, fused as in the trainer) and schedule.
            optimizer = optim.build_optimizer(self.model, cfg.train, cfg.train.lr, True)
            total = steps * cfg.train.epochs
            scheduler = optim.build_scheduler(optimizer, cfg.train, total)
            schedule = {"scheduler": scheduler, "interval": "step"}
            return {"optimizer": optimizer, "lr_scheduler": schedule}

    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        precision="32-true",
        max_epochs=cfg.train.epochs,
        gradient_clip_val=cfg.train.grad_clip or None,
        log_every_n_steps=cfg.run.log_every,
        default_root_dir=spec["workdir"],
    )
    trainer.fit(Classifier(), train_dataloaders=loader)
    return {"steps_per_epoch": steps, "batch_size": cfg.train.batch_size, "excluded": []}


if __name__ == "__main__":
    main(*sys.argv[1:4])
