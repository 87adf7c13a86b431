"""The fault cases of fault_tools.py: what each one damages, the command it runs on the damage
and what a clean ending is. Each case's `prepare(ctx, folder)` builds its own fresh copy of
what it damages inside `folder` and returns a Plan; fault_tools.py runs and judges it."""

from __future__ import annotations

import json
import math
import os
import pickle
import random
import resource
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# The baked tests' TINY overrides (tests/conftest.py), one thread: a run takes seconds.
TINY = [
    "data.train_size=256",
    "data.val_size=96",
    "data.image_size=8",
    "data.num_classes=4",
    "model.width=8",
    "train.batch_size=16",
    "train.epochs=2",
    "train.warmup_steps=2",
    "run.log_every=4",
    "run.loggers=[csv]",
    "run.device=cpu",
    "run.threads=1",
]
MLP = [*TINY[4:], "model.name=mlp"]  # the CSV and tensor-file runs: no image settings
TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
KiB = 1024


@dataclass
class Plan:
    """One command on one damaged copy, and what a clean ending of it is."""

    cmd: list[str]  # after the interpreter: a script and its arguments, or TORCHRUN + ...
    expect: tuple[int, ...]  # the documented exit codes of a clean ending
    keep: list[Path] = field(default_factory=list)  # byte-identical afterwards, whatever the exit
    keep_refused: list[Path] = field(default_factory=list)  # byte-identical unless exit 0
    clean: list[Path] = field(default_factory=list)  # folders that must hold no temp files
    check: Callable[[object], str | None] | None = None  # a case's own check: a reason or None
    fsize: int | None = None  # RLIMIT_FSIZE of the command, bytes
    memory: int | None = None  # RLIMIT_AS of the command, bytes (hostile sizes)
    signals: list[tuple[str | None, float, int]] = field(default_factory=list)
    timed: bool = False  # a clean ending slower than fault_tools.py --slow is a failure
    torchrun: bool = False  # several processes write stderr: the one-line rule does not apply
    mounts: list[Path] = field(default_factory=list)  # tmpfs to unmount afterwards
    skip: str | None = None  # why the case cannot run here (not a failure)


@dataclass
class Case:
    name: str
    family: str
    needs: tuple[str, ...]  # the prepared bases it copies: syn, cls, reg, fsdp, sweep
    prepare: Callable[[object, Path], Plan]


def py(script: str, *args: str) -> list[str]:
    return [f"scripts/{script}.py", *args]


# ---- copies and damage ------------------------------------------------------------------


def copy_runs(ctx, folder: Path, *names: str) -> Path:
    """Copy base runs (and runs.csv) to folder/runs, hard links kept, the base's output_dir
    rewritten in the text files so that the copy is a run folder of its own."""
    runs = folder / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    for name in (*names, "runs.csv"):
        src = ctx.runs / name
        if src.exists():
            subprocess.run(["cp", "-a", str(src), str(runs)], check=True)
    for path in runs.rglob("*"):
        if path.suffix in (".yaml", ".json", ".csv") and path.is_file():
            data = path.read_bytes()
            new = data.replace(str(ctx.runs).encode(), str(runs).encode())
            if new != data:
                path.write_bytes(new)
    return runs


def damage(path: Path, how: str) -> None:
    """Truncate, insert non-UTF-8 bytes, non-numeric cells, empty or delete a record file."""
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "non-utf8":
        cut = len(data) // 2
        path.write_bytes(data[:cut] + b"\xff\xfe\x80\xc3(" + data[cut:])
    elif how == "non-numeric":
        lines = data.decode().splitlines()
        if path.suffix == ".yaml":
            lines = [ln.replace("lr: 0.003", "lr: three") for ln in lines]
            lines = [ln.replace("epochs: 2", "epochs: two") for ln in lines]
        else:  # every cell of the last row but the first two
            cells = lines[-1].split(",")
            lines[-1] = ",".join(cells[:2] + ["abc"] * (len(cells) - 2))
        path.write_text("\n".join(lines) + "\n")
    elif how == "emptied":
        path.write_bytes(b"")
    elif how == "zeroed":
        path.write_bytes(b"\0" * len(data))
    elif how == "deleted":
        path.unlink()
    else:
        raise ValueError(how)


def resumed_from(run: Path, step: int | None = None) -> Callable[[object], str | None]:
    """A resume after damage: it continued from a checkpoint (the newest unless `step`
    says which), started nothing fresh, set no checkpoint aside."""

    def check(res) -> str | None:
        bad = sorted(p.name for p in run.rglob("*.bad"))
        if bad:
            return f"checkpoint set aside: {', '.join(bad)}"
        want = f"resumed at step {step}" if step is not None else "resumed at step"
        if want not in res.out:
            return f"did not resume: no '{want}' in the output"
        if not (run / "last.pt").is_file():
            return "lost: last.pt"
        return None

    return check


def no_new_files(folder: Path) -> Callable[[object], str | None]:
    """A refused command writes nothing (an empty run folder or its lock file aside)."""

    def check(res) -> str | None:
        if res.rc == 0 or not folder.exists():
            return None
        made = [p for p in folder.rglob("*") if p.is_file() and p.name != ".lock"]
        return f"wrote files though refused: {made[0].name}" if made else None

    return check


# ---- control: the commands work on undamaged copies -------------------------------------


def control_cases() -> list[Case]:
    def resume(ctx, folder):
        runs = copy_runs(ctx, folder, "syn")
        cmd = py("train", *TINY, "run.name=syn", f"run.output_dir={runs}")
        cmd += ["train.epochs=3", "train.resume=auto"]
        return Plan(cmd, (0,), clean=[runs], check=resumed_from(runs / "syn", ctx.steps["syn"]))

    def predict(ctx, folder):
        out = folder / "preds.csv"
        table = write_table(folder / "rows.csv", ctx.cls_table, rows=8)
        return Plan(
            py("predict", "--checkpoint", best(ctx, folder, "cls"), str(table), "--out", str(out)),
            (0,),
            check=lambda res: None if out.is_file() else "no predictions written",
        )

    def export(ctx, folder):
        runs = copy_runs(ctx, folder, "syn")
        cmd = py("export", "--checkpoint", str(runs / "syn/best.pt"), "--format", "torchscript")
        return Plan(cmd, (0,), clean=[runs / "syn"])

    def predict_pt(ctx, folder):
        import torch

        torch.save({"x": torch.randn(6, *ctx.sample_shape)}, folder / "inputs.pt")
        plan = _predict_plan(ctx, folder, "syn", [str(folder / "inputs.pt")])
        # No earlier file at --out: over one that is no prediction of its own, predict refuses.
        (folder / "preds.csv").unlink()
        plan.expect, plan.keep_refused = (0,), []
        return plan

    return [
        Case("control-resume", "control", ("syn",), resume),
        Case("control-predict-csv", "control", ("cls",), predict),
        Case("control-predict-pt", "control", ("syn",), predict_pt),
        Case("control-export", "control", ("syn",), export),
    ]


def best(ctx, folder: Path, run: str) -> str:
    """A private copy of a base run's best.pt (predict must leave it as it was)."""
    dst = folder / f"{run}-best.pt"
    subprocess.run(["cp", "-a", str(ctx.runs / run / "best.pt"), str(dst)], check=True)
    return str(dst)


# ---- export under a file-size limit and on a full disk ----------------------------------


def export_cases(formats: list[str]) -> list[Case]:
    """Limits and free space are bytes, or "under"/"half"/"size": the artifact's size less one
    byte, half of it, all of it (known once the base artifacts exist)."""
    cases = []
    for fmt in formats:
        for label, limit in (("0", 0), ("4k", 4 * KiB), ("64k", 64 * KiB), ("under", "under")):
            cases.append(
                Case(f"export-{fmt}-fsize-{label}", "export-fsize", ("syn",), _fsize(fmt, limit))
            )
        for label, slack in (
            ("full", 0),
            ("8k-free", 8 * KiB),
            ("half-free", "half"),
            ("room-for-artifact-not-json", "size"),
        ):
            cases.append(
                Case(f"export-{fmt}-disk-{label}", "export-disk", ("syn",), _disk(fmt, slack))
            )
    return cases


def _bytes(ctx, fmt: str, n) -> int:
    size = ctx.sizes[fmt]
    return {"under": size - 1, "half": size // 2, "size": size}.get(n, n)


def _fsize(fmt: str, limit):
    def prepare(ctx, folder):
        limit_ = _bytes(ctx, fmt, limit)
        runs = copy_runs(ctx, folder, "syn")
        run = runs / "syn"
        artifact = run / ctx.artifacts[fmt]
        cmd = py("export", "--checkpoint", str(run / "best.pt"), "--format", fmt)
        expect = (2,) if limit_ < ctx.sizes[fmt] else (0, 2)
        keep = [run / "best.pt"]
        return Plan(
            cmd, expect, keep=keep, keep_refused=_with_json(artifact), clean=[run], fsize=limit_
        )

    return prepare


def _disk(fmt: str, slack):
    def prepare(ctx, folder):
        disk = folder / "disk"
        name = ctx.artifacts[fmt]
        artifact = ctx.runs / "syn" / name
        if not ctx.can_mount:
            return Plan([], (), skip=ctx.can_mount_why)
        used = sum(_pages(p.stat().st_size) for p in _with_json(artifact))
        used += _pages(_bytes(ctx, fmt, slack))
        disk.mkdir()
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={used}", "tmpfs", str(disk)],
            check=True,
        )
        for path in _with_json(artifact):
            subprocess.run(["cp", "-a", str(path), str(disk)], check=True)
        ckpt = best(ctx, folder, "syn")
        cmd = py("export", "--checkpoint", ckpt, "--format", fmt, "--out", str(disk / name))
        return Plan(
            cmd,
            (0, 2),
            keep=[Path(ckpt)],
            keep_refused=_with_json(disk / name),
            clean=[disk],
            mounts=[disk],
        )

    return prepare


def _with_json(artifact: Path) -> list[Path]:
    return [artifact, artifact.with_name(artifact.name + ".json")]


def _pages(n: int) -> int:
    return -(-n // 4096) * 4096


# ---- the run's records damaged, then resumed ---------------------------------------------


def record_cases() -> list[Case]:
    cases = []
    for record in ("metrics.csv", "runs.csv", "config.yaml"):
        for how in ("truncated", "non-utf8", "non-numeric", "emptied", "deleted"):
            name = f"records-{record.split('.')[0]}-{how}"
            cases.append(Case(name, "records", ("syn",), _record(record, how)))
    cases.append(Case("records-refused-override", "records", ("syn",), _refused_override))
    for record in ("metrics.csv", "config.yaml"):
        name = f"records-compare-{record.split('.')[0]}-non-utf8"
        cases.append(Case(name, "records", ("syn", "cls"), _compare(record)))
    return cases


def _record(record: str, how: str):
    def prepare(ctx, folder):
        runs = copy_runs(ctx, folder, "syn")
        run = runs / "syn"
        damage(runs / record if record == "runs.csv" else run / record, how)
        cmd = py("train", *TINY, "run.name=syn", f"run.output_dir={runs}")
        cmd += ["train.epochs=3", "train.resume=auto"]
        return Plan(cmd, (0,), clean=[runs], check=resumed_from(run, ctx.steps["syn"]))

    return prepare


def _refused_override(ctx, folder):
    """run.seed cannot change on resume: refused, and config.yaml and the checkpoints stay."""
    runs = copy_runs(ctx, folder, "syn")
    run = runs / "syn"
    cmd = py("train", *TINY, "run.name=syn", f"run.output_dir={runs}")
    cmd += ["train.epochs=3", "train.resume=auto", "run.seed=7", "train.lr=0.001"]
    kept = [run / n for n in ("config.yaml", "best.pt", "last.pt", "metrics.csv")]
    return Plan(cmd, (2,), keep=kept, clean=[runs])


def _compare(record: str):
    def prepare(ctx, folder):
        runs = copy_runs(ctx, folder, "syn", "cls")
        damage(runs / "syn" / record, "non-utf8")
        cmd = py("compare_runs", str(runs / "syn"), str(runs / "cls"))
        cmd += ["--out", str(folder / "compare.png")]
        return Plan(cmd, (0,), keep=[runs / "cls/config.yaml"], clean=[runs])

    return prepare


# ---- damaged DCP shards -----------------------------------------------------------------


def dcp_cases() -> list[Case]:
    cases = []
    for tag, target, how in (
        ("shard0-truncated", "__0_0.distcp", "truncated"),
        ("shard0-zeroed", "__0_0.distcp", "zeroed"),
        ("shard1-deleted", "__1_0.distcp", "deleted"),
        ("metadata-truncated", ".metadata", "truncated"),
    ):
        cases.append(Case(f"dcp-{tag}-resume", "dcp", ("fsdp",), _dcp(target, how, "resume")))
        cases.append(Case(f"dcp-{tag}-consolidate", "dcp", ("fsdp",), _dcp(target, how, "cons")))
    return cases


def _dcp(target: str, how: str, tool: str):
    def prepare(ctx, folder):
        runs = copy_runs(ctx, folder, "fsdp")
        run = runs / "fsdp"
        newest = max(run.glob("step-*.dcp"))
        damage(newest / target, how)
        if tool == "resume":
            cmd = [*TORCHRUN, *py("train", *TINY, "train.strategy=fsdp", "run.name=fsdp")]
            cmd += [f"run.output_dir={runs}", "train.epochs=3", "train.resume=auto"]
            # Bytes overwritten at full length pass the size check; the read finds them and
            # the ranks stop with a line naming the checkpoint (the README's stated limit):
            # torchrun exits 1 for a rank's exit 2.
            expect = (0, 1) if how == "zeroed" else (0,)
            return Plan(cmd, expect, clean=[runs], torchrun=True, check=_fell_back(run))
        out = folder / "full.pt"
        cmd = py("consolidate", "--checkpoint", str(newest.with_suffix(".pt")), "--out", str(out))
        kept = [p for p in run.rglob("*") if p.is_file()]
        check = _names(target, out, ctx.base / "full.pt")
        return Plan(cmd, (0, 2), keep=kept, clean=[run, folder], check=check)

    return prepare


def _fell_back(run: Path):
    def check(res) -> str | None:
        if res.rc == 1:
            said = "has a damaged shard file" in res.err + res.out
            return None if said else "refused without naming the damaged shard"
        if "resumed at step" not in res.out:
            return "did not resume: no 'resumed at step' in the output"
        return None

    return check


def _names(target: str, out: Path, good: Path):
    """Refused: the line names the damaged file. Written (the model's tensors can sit in the
    shard's intact part; the optimizer's are not read): the model equals the undamaged one."""

    def check(res) -> str | None:
        if res.rc == 2 and target not in res.err and ".dcp" not in res.err:
            return "error line names no file"
        if res.rc == 0 and not same_tensors(_load(out), _load(good)):
            return "silently wrong: the consolidated model differs from the undamaged one"
        return None

    return check


def _load(path: Path):
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def same_tensors(a, b) -> bool:
    """The tensors of two loaded checkpoints are equal (other values are not compared)."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        keys = {k for k in a.keys() | b.keys() if _has_tensor(a.get(k)) or _has_tensor(b.get(k))}
        return all(same_tensors(a.get(k), b.get(k)) for k in keys)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(map(same_tensors, a, b))
    return True


def _has_tensor(x) -> bool:
    import torch

    if isinstance(x, torch.Tensor):
        return True
    if isinstance(x, dict):
        return any(map(_has_tensor, x.values()))
    return isinstance(x, (list, tuple)) and any(map(_has_tensor, x))


# ---- hostile sizes -----------------------------------------------------------------------

BOMB = "\n".join(
    [f"a0: &a0 [{', '.join(['lol'] * 9)}]"]
    + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
)


def hostile_cases() -> list[Case]:
    return [
        Case("hostile-yaml-alias-bomb-top", "hostile", (), _config(BOMB + "\n")),
        Case("hostile-yaml-alias-bomb-value", "hostile", (), _config(_bomb_value())),
        Case("hostile-config-1mb-name", "hostile", (), _config(f"run:\n  name: {'n' * 2**20}\n")),
        Case(
            "hostile-config-1mb-number",
            "hostile",
            (),
            _config(f"model:\n  width: {'9' * 2**20}\n"),
        ),
        Case("hostile-override-120k-name", "hostile", (), _override("run.name=" + "n" * 120_000)),
        Case(
            "hostile-override-120k-number", "hostile", (), _override("train.lr=" + "9" * 120_000)
        ),
        Case("hostile-tensor-huge-label", "hostile", (), _tensors(8, 2_000_000_000)),
        Case("hostile-tensor-zero-features", "hostile", (), _tensors(0, 1)),
        Case("hostile-csv-20k-columns", "hostile", (), _wide_csv(20_000)),
        Case("hostile-csv-100k-columns", "hostile", (), _wide_csv(100_000)),
    ]


def _bomb_value() -> str:
    lines = ["run:", "  name:"]
    lines += ["  - " + line for line in BOMB.replace(": &", ": &").splitlines()]
    return "\n".join(lines) + "\n  - *a8\n"


def _limits(folder: Path, cmd: list[str], expect=(2,)) -> Plan:
    return Plan(
        cmd,
        expect,
        memory=8 * 2**30,
        timed=True,
        clean=[folder],
        check=no_new_files(folder / "runs"),
    )


def _config(text: str):
    def prepare(ctx, folder):
        config = folder / "hostile.yaml"
        config.write_text(text)
        return _limits(folder, py("train", "--config", str(config), *TINY, _out(folder)))

    return prepare


def _override(value: str):
    def prepare(ctx, folder):
        return _limits(folder, py("train", *TINY, value, _out(folder)))

    return prepare


def _out(folder: Path) -> str:
    return f"run.output_dir={folder / 'runs'}"


def _tensors(features: int, label: int):
    def prepare(ctx, folder):
        import torch

        data = folder / "data"
        data.mkdir()
        y = torch.arange(64) % 2
        y[5] = label
        torch.save({"x": torch.randn(64, features), "y": y}, data / "train.pt")
        cmd = py("train", *MLP, "data.name=tensors", f"data.root={data}", _out(folder))
        check = _not_memory(no_new_files(folder / "runs"))
        plan = _limits(folder, cmd)
        plan.check = check
        return plan

    return prepare


def _not_memory(inner):
    def check(res) -> str | None:
        if res.rc == 2 and "memory" in res.err.lower():
            return "blamed on memory instead of the labels"
        return inner(res)

    return check


def _wide_csv(columns: int):
    def prepare(ctx, folder):
        table = folder / "wide.csv"
        rng = random.Random(columns)
        with table.open("w") as f:
            f.write(",".join(f"c{i}" for i in range(columns)) + ",label\n")
            for r in range(24):
                cells = [f"{rng.random():.2f}" for _ in range(columns)]
                f.write(",".join(cells) + f",{'ab'[r % 2]}\n")
        cmd = py("train", *MLP, "model.width=4", "train.epochs=1", "data.name=csv")
        cmd += [f"data.path={table}", "data.label=label", "run.name=wide", _out(folder)]
        return Plan(cmd, (0, 2), memory=8 * 2**30, timed=True, clean=[folder])

    return prepare


# ---- bad predict inputs -----------------------------------------------------------------


def write_table(path: Path, header_rows: tuple[list[str], list[list[str]]], rows: int) -> Path:
    header, body = header_rows
    path.write_text("\n".join([",".join(header)] + [",".join(r) for r in body[:rows]]) + "\n")
    return path


def predict_cases() -> list[Case]:
    csv_edits = {
        "missing-column": lambda h, b: ([c for c in h if c != "f2"], [r[:2] + r[3:] for r in b]),
        "ragged-row": lambda h, b: (h, [b[0], b[1][:-2], *b[2:]]),
        "nan": lambda h, b: (h, [b[0], ["nan", *b[1][1:]], *b[2:]]),
        "inf": lambda h, b: (h, [b[0], [b[1][0], "inf", *b[1][2:]], *b[2:]]),
        "text-cell": lambda h, b: (h, [b[0], ["abc", *b[1][1:]], *b[2:]]),
        "unknown-label": lambda h, b: (h, [b[0], [*b[1][:-1], "zebra"], *b[2:]]),
        "huge-field": lambda h, b: (h, [b[0], ["1" * 100_000, *b[1][1:]], *b[2:]]),
        "duplicate-column": lambda h, b: (
            [*h[:-1], "f0", h[-1]],
            [[*r[:-1], "0", r[-1]] for r in b],
        ),
    }
    cases = [
        Case(f"predict-csv-{k}", "predict", ("cls",), _predict_csv("cls", f))
        for k, f in csv_edits.items()
    ]
    cases.append(Case("predict-csv-non-utf8", "predict", ("cls",), _predict_csv("cls", None)))
    nan = _predict_csv("reg", csv_edits["nan"])
    cases.append(Case("predict-reg-nan", "predict", ("reg",), nan))
    for kind in ("text", "pickle", "label-out-of-range", "wrong-shape", "int-x", "nan"):
        cases.append(Case(f"predict-pt-{kind}", "predict", ("syn",), _predict_pt(kind)))
    for name, args in (
        ("batch-size-0", ["--split", "val", "--batch-size", "0"]),
        ("batch-size-negative", ["--split", "val", "--batch-size", "-3"]),
        ("device-nonsense", ["--split", "val", "--device", "nonsense"]),
        ("temperature-nan", ["--split", "val", "--temperature", "nan"]),
        ("files-with-split-val", ["--split", "val", "ROWS"]),
    ):
        cases.append(Case(f"predict-{name}", "predict", ("cls",), _predict_args(args)))
    return cases


def _predict_plan(ctx, folder: Path, run: str, inputs: list[str]) -> Plan:
    ckpt = best(ctx, folder, run)
    out = folder / "preds.csv"
    out.write_text("an earlier prediction file\n")
    cmd = py("predict", "--checkpoint", ckpt, *inputs, "--out", str(out))
    return Plan(cmd, (2,), keep=[Path(ckpt)], keep_refused=[out], clean=[folder])


def _predict_csv(run: str, edit):
    def prepare(ctx, folder):
        header, body = ctx.cls_table if run == "cls" else ctx.reg_table
        path = folder / "rows.csv"
        if edit is None:
            write_table(path, (header, body), rows=6)
            data = path.read_bytes()
            path.write_bytes(data.replace(b"\n", b"\n\xe9", 1))  # a Latin-1 byte
        else:
            write_table(path, edit(list(header), [list(r) for r in body[:6]]), rows=6)
        return _predict_plan(ctx, folder, run, [str(path)])

    return prepare


class _Opaque:  # a pickled object of a class weights_only loading does not allow
    pass


def _predict_pt(kind: str):
    def prepare(ctx, folder):
        import torch

        path = folder / "inputs.pt"
        x = torch.randn(6, *ctx.sample_shape)
        if kind == "text":
            path.write_text("these are not tensors\n")
        elif kind == "pickle":
            with path.open("wb") as f:
                pickle.dump({"x": x, "y": _Opaque()}, f, protocol=2)
        elif kind == "label-out-of-range":
            torch.save({"x": x, "y": torch.tensor([0, 1, 2, 3, 99, 0])}, path)
        elif kind == "wrong-shape":
            torch.save({"x": torch.randn(6, 5)}, path)
        elif kind == "int-x":
            torch.save({"x": torch.randint(0, 255, (6, *ctx.sample_shape))}, path)
        elif kind == "nan":
            x[2].view(-1)[0] = math.nan
            torch.save({"x": x}, path)
        return _predict_plan(ctx, folder, "syn", [str(path)])

    return prepare


def _predict_args(args: list[str]):
    def prepare(ctx, folder):
        rows = write_table(folder / "rows.csv", ctx.cls_table, rows=6)
        return _predict_plan(ctx, folder, "cls", [str(rows) if a == "ROWS" else a for a in args])

    return prepare


# ---- sweeps ------------------------------------------------------------------------------

SWEEP_FIXED = [*TINY[2:], "data.train_size=128", "data.val_size=32", "train.epochs=1"]
SWEEP_AXIS = "train.lr=1e-3,3e-3"


def sweep_cases() -> list[Case]:
    cases = [
        Case("sweep-report-alone", "sweep", ("sweep",), _sweep(None, "report")),
        Case("sweep-rerun-intact", "sweep", ("sweep",), _sweep(None, "rerun")),
    ]
    for how in ("truncated", "invalid", "missing-trials", "non-utf8", "emptied", "deleted"):
        for mode in ("report", "rerun"):
            cases.append(Case(f"sweep-json-{how}-{mode}", "sweep", ("sweep",), _sweep(how, mode)))
    return cases


def _sweep(how: str | None, mode: str):
    def prepare(ctx, folder):
        runs = copy_runs(ctx, folder, "sw")
        manifest = runs / "sw" / "sweep.json"
        if how == "invalid":
            manifest.write_text('{"config": null, "fixed": [,]}')
        elif how == "missing-trials":
            manifest.write_text(
                json.dumps(
                    {k: v for k, v in json.loads(manifest.read_text()).items() if k != "trials"}
                )
            )
        elif how is not None:
            damage(manifest, how)
        out = f"run.output_dir={runs}"
        if mode == "report":
            cmd = py("sweep", "--name", "sw", "--report", out)
        else:  # the command that made it (the bases' sweep), in the same order
            cmd = py("sweep", "--name", "sw", *SWEEP_FIXED, SWEEP_AXIS, out)
        expect = (0,) if how is None else (0, 2)
        keep = [manifest] if manifest.exists() else []
        return Plan(cmd, expect, keep_refused=keep, clean=[runs])

    return prepare


# ---- stop signals ------------------------------------------------------------------------


def signal_cases() -> list[Case]:
    cases = []
    for delay in (0.1, 0.3, 0.6, 1.0):
        steps = [("epoch 1/", 0.2, signal.SIGTERM), (None, delay, signal.SIGTERM)]
        cases.append(Case(f"signal-second-term-{delay}s", "signal", (), _stopped(steps)))
    for delay in (0.5, 1.0, 2.0, 4.0):
        steps = [(None, delay, signal.SIGTERM)]
        cases.append(Case(f"signal-term-at-start-{delay}s", "signal", (), _stopped(steps)))
    return cases


def _stopped(steps):
    def prepare(ctx, folder):
        cmd = py("train", *TINY, "train.epochs=60", "run.name=sig", _out(folder))
        return Plan(cmd, (75,), signals=steps, clean=[folder])

    return prepare


# ---- settings the machine or the run cannot honour (issue 30: items 6, 7, 15, 18) --------


def config_cases() -> list[Case]:
    """Counts beyond the machine, values that train nothing or nan, a section override, a
    CSV resumed, fine-tuned or evaluated on a table whose columns moved or were renamed, and
    `kill -9` of one torchrun rank."""
    refused = {
        "threads-100000": ["run.threads=100000"],  # a segfault, exit 139, no message
        "threads-10000": ["run.threads=10000"],  # accepted: a load above 1,000 on 2 CPUs
        "workers-beyond-cpus": ["data.num_workers=WORKERS"],
        "epochs-0": ["train.epochs=0"],  # trained nothing, printed the next commands
        "weight-decay-inf": ["train.weight_decay=inf"],
        "dropout-nan": ["model.dropout=.nan"],
        "grad-clip-inf": ["train.grad_clip=inf"],
    }
    cases = [Case(f"settings-{k}", "settings", (), _refused(v)) for k, v in refused.items()]
    cases += [
        Case("settings-section-override-merges", "settings", (), _section_override),
        Case("settings-yaml-section-twice", "settings", (), _section_twice),
        Case("settings-csv-resume-reordered", "settings", ("cls",), _csv_resume("reordered")),
        Case("settings-csv-resume-renamed", "settings", ("cls",), _csv_resume("renamed")),
        Case("settings-csv-resume-column-added", "settings", ("cls",), _csv_resume("added")),
        Case(
            "settings-csv-init-from-reordered", "settings", ("cls",), _csv_init_from("reordered")
        ),
        Case("settings-csv-init-from-renamed", "settings", ("cls",), _csv_init_from("renamed")),
        Case("settings-csv-evaluate-reordered", "settings", ("cls",), _csv_evaluate("reordered")),
        Case("settings-csv-evaluate-renamed", "settings", ("cls",), _csv_evaluate("renamed")),
    ]
    cases += [Case(f"settings-kill-rank{r}", "settings", (), _kill_rank(r)) for r in (1, 0)]
    return cases


def _refused(extra: list[str]):
    def prepare(ctx, folder):
        workers = 4 * len(os.sched_getaffinity(0)) + 1  # one past utils/device.py's limit
        args = [a.replace("WORKERS", str(workers)) for a in extra]
        return _limits(folder, py("train", *TINY, *args, _out(folder)))

    return prepare


def _section_override(ctx, folder):
    """train={...} merges key by key, as a config file's section does: train.lr stays."""
    cmd = py("train", *TINY, "train.lr=0.0007", "train={epochs: 1}", "run.name=s", _out(folder))

    def check(res) -> str | None:
        saved = (folder / "runs/s/config.yaml").read_text()
        return None if "lr: 0.0007" in saved else "train={...} dropped train.lr=0.0007"

    return Plan(cmd, (0,), clean=[folder], check=check)


def _section_twice(ctx, folder):
    config = folder / "twice.yaml"
    config.write_text("train:\n  lr: 0.0007\nrun:\n  name: t\ntrain:\n  epochs: 1\n")
    return _limits(folder, py("train", "--config", str(config), *TINY, _out(folder)))


def _edited_table(ctx, path: Path, how: str) -> Path:
    """The cls base's table with its feature columns reversed, one renamed, or one added."""
    header, body = ctx.cls_table
    if how == "reordered":
        order = [3, 2, 1, 0, 4]
        header, body = [header[i] for i in order], [[r[i] for i in order] for r in body]
    elif how == "renamed":
        header = [h.replace("f2", "g2") for h in header]
    else:
        header, body = ["extra", *header], [["0.5", *r] for r in body]
    return write_table(path, (header, body), rows=len(body))


def _csv_args(table: Path, runs: Path, name: str = "cls") -> list[str]:
    return [*MLP, "data.name=csv", f"data.path={table}", "data.label=label",
            "task.name=classification", f"run.name={name}", f"run.output_dir={runs}"]  # fmt: skip


def _csv_resume(how: str):
    def prepare(ctx, folder):
        runs = copy_runs(ctx, folder, "cls")
        run = runs / "cls"
        table = _edited_table(ctx, folder / "edited.csv", how)
        cmd = py("train", *_csv_args(table, runs), "train.epochs=3", "train.resume=auto")
        kept = [run / n for n in ("config.yaml", "best.pt", "last.pt", "metrics.csv")]
        if how != "reordered":
            return Plan(cmd, (2,), keep=kept, clean=[runs], check=_names_column(how))
        check = _same_as_original(ctx, folder, "cls", ["train.epochs=3", "train.resume=auto"])
        return Plan(cmd, (0,), clean=[runs], check=check)

    return prepare


def _names_column(how: str):
    column = {"renamed": "'f2'", "added": "'extra'"}[how]

    def check(res) -> str | None:
        return None if column in res.err else f"the error names no column {column}"

    return check


def _same_as_original(ctx, folder: Path, name: str, extra: list[str]):
    """The run on the reordered table (folder/runs/<name>) ends with the weights of the same
    command on the original table (a resume: of its own copy of the cls run)."""

    def check(res) -> str | None:
        runs = folder / "original" / "runs"
        if name == "cls":
            runs = copy_runs(ctx, folder / "original", "cls")
        table = write_table(folder / "original.csv", ctx.cls_table, rows=160)
        cmd = py("train", *_csv_args(table, runs, name), *extra)
        done = subprocess.run(
            [sys.executable, *cmd], cwd=ctx.project, env=ctx.env, capture_output=True
        )
        if done.returncode != 0:
            return f"the run on the original table failed: {done.stderr[-200:]!r}"
        ours, theirs = (_load(r / name / "last.pt")["model"] for r in (folder / "runs", runs))
        return None if same_tensors(ours, theirs) else "silently wrong: columns taken by position"

    return check


def _csv_init_from(how: str):
    def prepare(ctx, folder):
        ckpt = best(ctx, folder, "cls")
        table = _edited_table(ctx, folder / "edited.csv", how)
        init = [f"train.init_from={ckpt}"]
        cmd = py("train", *_csv_args(table, folder / "runs", "ft"), *init)
        if how == "renamed":
            refused = _names_column(how)
            made = no_new_files(folder / "runs")
            check = lambda res: refused(res) or made(res)  # noqa: E731
            return Plan(cmd, (2,), keep=[Path(ckpt)], clean=[folder], check=check)
        check = _same_as_original(ctx, folder, "ft", init)
        return Plan(cmd, (0,), keep=[Path(ckpt)], clean=[folder], check=check)

    return prepare


def _csv_evaluate(how: str):
    def prepare(ctx, folder):
        ckpt = best(ctx, folder, "cls")
        table = _edited_table(ctx, folder / "edited.csv", how)
        cmd = py("evaluate", "--checkpoint", ckpt, "--json", f"data.path={table}")
        if how == "renamed":
            return Plan(cmd, (2,), keep=[Path(ckpt)], clean=[folder], check=_names_column(how))

        def check(res) -> str | None:
            original = write_table(folder / "original.csv", ctx.cls_table, rows=160)
            cmd = py("evaluate", "--checkpoint", ckpt, "--json", f"data.path={original}")
            done = subprocess.run(
                [sys.executable, *cmd], cwd=ctx.project, env=ctx.env, capture_output=True
            )
            want = json.loads(done.stdout.splitlines()[-1]) if done.returncode == 0 else None
            got = json.loads(res.out.splitlines()[-1])
            return None if want == got else f"other metrics than on the original: {got}"

        return Plan(cmd, (0,), keep=[Path(ckpt)], clean=[folder], check=check)

    return prepare


# A 2-rank run long enough to be killed mid-training (about 300 steps an epoch per rank).
LONG = [*TINY, "data.train_size=20000", "train.epochs=3", "train.batch_size=32"]


def _kill_rank(rank: int):
    def prepare(ctx, folder):
        runs = folder / "runs"
        train = py("train", *LONG, "run.name=k", f"run.output_dir={runs}")
        here = str(Path(__file__).resolve().parent)
        code = f"import sys; sys.path.insert(0, {here!r}); import fault_cases as f; f.kill_rank()"
        cmd = ["-c", code, str(rank), str(runs / "k"), *TORCHRUN, *train]
        return Plan(cmd, (1,), clean=[runs], torchrun=True, check=_survivor(ctx, runs, rank))

    return prepare


def kill_rank() -> None:
    """`python -c ...kill_rank()` RANK RUN_DIR TORCHRUN-ARGS...: start torchrun, kill -9 the
    process of RANK one second after the run's first step checkpoint, exit as torchrun does."""
    import time

    rank, run, args = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    proc = subprocess.Popen([sys.executable, *args])
    while not list(run.glob("step-*.pt")) and proc.poll() is None:
        time.sleep(0.1)
    time.sleep(1.0)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:  # the field after the command's ")" is the state, then the parent's pid
            parent = int(stat.read_text().rpartition(")")[2].split()[1])
            environ = (stat.parent / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):  # a process that ended meanwhile
            continue
        if parent == proc.pid and f"RANK={rank}".encode() in environ:
            os.kill(int(stat.parent.name), signal.SIGKILL)
    sys.exit(proc.wait())


def _survivor(ctx, runs: Path, killed: int):
    """The other rank said so in one line, and a resume (one process) continues the run."""

    def check(res) -> str | None:
        lines = [ln for ln in res.err.splitlines() if ln.startswith("error: ")]
        if len(lines) != 1 or f"rank {killed} is gone" not in lines[0]:
            return f"not one 'rank {killed} is gone' line: {lines[:2]}"
        step = int(max((runs / "k").glob("step-*.pt")).stem.split("-")[1])
        cmd = py("train", *LONG, "run.name=k", f"run.output_dir={runs}", "train.resume=auto")
        cmd.append(f"train.max_steps={step + 2}")
        done = subprocess.run(
            [sys.executable, *cmd], cwd=ctx.project, env=ctx.env, capture_output=True, text=True
        )
        if done.returncode != 0 or f"resumed at step {step}" not in done.stdout:
            return f"resume after the kill failed (exit {done.returncode}): {done.stderr[-200:]}"
        return None

    return check


# ---- the tools' outputs, leftovers and start-up (issue 30: items 1, 13, 14, 19) ----------


def tool_cases() -> list[Case]:
    """--out over a run's files or the command's inputs (refused, whatever --force says),
    over another file (refused without --force), over the tool's own earlier output
    (replaced); leftovers of a killed tool (removed by the next start, a live process's
    kept); a report killed mid-write (the earlier one whole); stop signals during a tool's
    start-up (exit 75/130, nothing half-written); argument errors (one line); a second
    damaged record (both kept)."""
    cases = [
        Case(f"tool-out-{tool}-{tag}", "tools", (base,), _out_refused(tool, target))
        for tool, tag, base, target in (
            ("predict", "best-pt", "syn", "best.pt"),
            ("predict", "metrics-csv", "syn", "metrics.csv"),
            ("export", "best-pt", "syn", "best.pt"),
            ("export", "config-yaml", "syn", "config.yaml"),
            ("compare", "best-pt", "syn", "best.pt"),
            ("compare", "metrics-csv", "syn", "metrics.csv"),
            ("evaluate", "report-run-folder", "syn", "."),
            ("consolidate", "last-pt", "fsdp", "last.pt"),
            ("consolidate", "its-checkpoint", "fsdp", "CHECKPOINT"),
        )
    ]
    for how, expect in (
        ("input", 2),
        ("symlink-to-input", 2),
        ("hardlink-to-input", 2),
        ("other-file", 2),
        ("other-file-force", 0),
        ("own-earlier", 0),
    ):
        cases.append(Case(f"tool-out-predict-{how}", "tools", ("cls",), _out_table(how, expect)))
    cases.append(Case("tool-out-export-other-file", "tools", ("syn",), _out_other("export")))
    cases.append(Case("tool-out-evaluate-other-folder", "tools", ("syn",), _out_other("report")))
    for tool in ("export", "predict", "evaluate"):
        cases.append(Case(f"tool-stale-{tool}", "tools", ("syn",), _stale(tool)))
    cases.append(Case("tool-kill9-export-rerun", "tools", ("syn",), _kill9("export")))
    cases.append(Case("tool-kill9-report-mid-write", "tools", ("syn",), _kill9("report")))
    for tool in ("export", "evaluate"):
        for delay in (0.5, 1.0, 2.0):
            name = f"tool-signal-{tool}-term-{delay}s"
            cases.append(Case(name, "tools", ("syn",), _tool_signal(tool, delay, signal.SIGTERM)))
    cases.append(
        Case("tool-signal-predict-int-1.0s", "tools", ("syn",), _tool_signal("predict", 1.0))
    )
    big = "9" * 120_000  # one argument of a command line holds at most 128 KiB
    for name, args in (
        ("predict-batch-size", py("predict", "--checkpoint", "x.pt", "--batch-size", big)),
        ("export-format", py("export", "--checkpoint", "x.pt", "--format", big)),
        ("train-unknown-option", py("train", f"--nope={big}")),
        ("evaluate-no-checkpoint", py("evaluate", f"--nope={big}")),
        ("compare-x", py("compare_runs", "runs", "--x", big)),
        ("consolidate-unknown-option", py("consolidate", "--checkpoint", "x.pt", f"--{big}")),
        ("sweep-parallel", py("sweep", "--name", "s", "--parallel", big)),
    ):
        cases.append(Case(f"tool-argparse-{name}-120k", "tools", (), _argv(args)))
    cases.append(Case("tool-damaged-twice-metrics", "tools", ("syn",), _damaged_twice))
    return cases


def _run_files(run: Path) -> list[Path]:
    return [p for p in run.rglob("*") if p.is_file() and p.name != ".lock"]


def _tool_cmd(tool: str, ckpt: Path, out: Path, *extra: str) -> list[str]:
    """The tool's command writing to `out` (evaluate: its --report folder)."""
    if tool == "predict":
        return py("predict", "--checkpoint", str(ckpt), "--split", "val", "--out", str(out))
    if tool == "export":
        fmt = ["--format", "torchscript"]
        return py("export", "--checkpoint", str(ckpt), *fmt, "--out", str(out))
    if tool == "compare":
        return py("compare_runs", str(ckpt.parent), "--out", str(out), *extra)
    if tool == "consolidate":
        return py("consolidate", "--checkpoint", str(ckpt), "--out", str(out), *extra)
    return py("evaluate", "--checkpoint", str(ckpt), "--report", str(out), *extra)


def _out_refused(tool: str, target: str):
    def prepare(ctx, folder):
        name = "fsdp" if tool == "consolidate" else "syn"
        run = copy_runs(ctx, folder, name) / name
        ckpt = max(run.glob("step-*.pt")) if tool == "consolidate" else run / "best.pt"
        out = ckpt if target == "CHECKPOINT" else run / target
        force = ["--force"] if tool in ("compare", "consolidate") else []
        cmd = _tool_cmd(tool, ckpt, out, *force)
        return Plan(cmd, (2,), keep=_run_files(run), clean=[run], check=_names_run_file)

    return prepare


# ---- resume under changed terms (issue 30: items 2, 4, 5, 11, 16) -------------------------


def resume_terms_cases() -> list[Case]:
    """A resume that cannot honour its terms refuses them (one line, nothing changed): another
    run's checkpoint over an existing run, another best metric, a mid-epoch position the data
    no longer has; another run's checkpoint into a new name continues there; a run folder
    removed or replaced under a running run is not written again; kill -9 right after a
    checkpoint loses no metrics row."""
    return [
        Case("resume-terms-other-run-over-existing", "resume-terms", ("syn",), _other_run(False)),
        Case("resume-terms-other-run-into-new-name", "resume-terms", ("syn",), _other_run(True)),
        Case("resume-terms-best-metric-changed", "resume-terms", ("syn",), _best_terms("loss")),
        Case("resume-terms-best-metric-as-resolved", "resume-terms", ("syn",), _best_terms("acc")),
        Case("resume-terms-folder-removed", "resume-terms", (), _folder_taken("removed")),
        Case("resume-terms-folder-replaced", "resume-terms", (), _folder_taken("replaced")),
        Case("resume-terms-kill-9-after-checkpoint", "resume-terms", ("syn",), _killed_after_save),
        Case("resume-terms-mid-epoch-data-smaller", "resume-terms", (), _no_batch_left("smaller")),
        Case("resume-terms-mid-epoch-batch-larger", "resume-terms", (), _no_batch_left("batch")),
    ]


def _package(ctx) -> str:
    return next(ctx.project.glob("*/checkpoint/run_folder.py")).parent.parent.name


def _run_files(run: Path) -> list[Path]:
    return sorted(p for p in run.rglob("*") if p.is_file() and p.name != ".lock")


def _epochs(run: Path) -> list[str]:
    import csv

    with (run / "metrics.csv").open(newline="") as f:
        return [row["epoch"] for row in csv.DictReader(f)]


def _other_run(new_name: bool):
    """syn's last.pt into run mine (a copy of syn: checkpoints of its own), or into a new
    name, where it continues as a run of its own (metrics.csv from epoch 3, its best.pt)."""

    def prepare(ctx, folder):
        runs = copy_runs(ctx, folder, "syn")
        name = "fork" if new_name else "mine"
        if not new_name:
            subprocess.run(["cp", "-a", str(runs / "syn"), str(runs / "mine")], check=True)
        cmd = py("train", *TINY, f"run.name={name}", f"run.output_dir={runs}")
        cmd += [f"train.resume={runs / 'syn/last.pt'}", "train.epochs=3"]
        if not new_name:
            return Plan(cmd, (2,), keep=_run_files(runs / "mine"), clean=[runs])

        def check(res) -> str | None:
            run = runs / "fork"
            if "resumed at step" not in res.out:
                return "did not resume: no 'resumed at step' in the output"
            best = (run / "best.pt").is_file()
            if not best or _epochs(run) != ["3"]:
                return f"new run incoherent: best.pt {best}, epochs {_epochs(run)}"
            return None

        return Plan(cmd, (0,), keep=_run_files(runs / "syn"), clean=[runs], check=check)

    return prepare


# ---- sweeps that recover: kill -9, study.db, full disks, a changed --config, early stops ---
# (issue 30 items 3, 8, 9, 12 and the sweep's part of 19; issue 26 D10)

# Trials of a few seconds, long enough to be caught training: 1024 samples, 3 epochs.
RECOVERY_FIXED = [
    *(a for a in TINY if not a.startswith(("data.train_size", "data.val_size", "train.epochs"))),
    "data.train_size=1024",
    "data.val_size=64",
    "train.epochs=3",
]
AXES = {"optuna": "train.lr=log:1e-3:1e-2", "grid": "train.lr=1e-3,2e-3"}
STUDY_LOCK = threading.Lock()  # the Optuna base is made once, whichever case comes first


def sweep_recovery_cases() -> list[Case]:
    cases = [Case("sweeps-kill9-in-trial-optuna", "sweeps", (), _killed("optuna", None))]
    cases += [Case("sweeps-kill9-in-trial-grid", "sweeps", (), _killed("grid", None))]
    for delay in (1.0, 2.5):
        name = f"sweeps-kill9-at-{delay}s-optuna"
        cases.append(Case(name, "sweeps", (), _killed("optuna", delay)))
    for how in ("garbage", "truncated", "zeroed", "a-folder", "another-programs", "another-study",
                "other-trials", "another-schema", "locked", "deleted"):  # fmt: skip
        cases.append(Case(f"sweeps-study-db-{how}", "sweeps", (), _study(how)))
    for mode in ("optuna", "grid"):
        for how in ("fsize", "disk"):
            cases.append(Case(f"sweeps-{how}-retried-{mode}", "sweeps", (), _full(mode, how)))
        for what in ("file", "extended"):
            name = f"sweeps-config-{what}-changed-{mode}"
            cases.append(Case(name, "sweeps", (), _config_changed(mode, what)))
        for sig, delays in ((signal.SIGTERM, (0.2, 0.6, 1.2)), (signal.SIGINT, (0.3, 1.0))):
            for delay in delays:
                name = f"sweeps-{sig.name[3:].lower()}-at-start-{delay}s-{mode}"
                cases.append(Case(name, "sweeps", (), _stopped_early(mode, sig, delay)))
    for delay in (0.3, 0.6, 1.0):
        cases.append(Case(f"sweeps-term-in-report-{delay}s", "sweeps", ("sweep",), _report(delay)))
    cases.append(Case("sweeps-optuna-max-steps", "sweeps", (), _mid_epoch))
    return cases


def _sweep_cmd(out: Path, mode: str, n: int = 2, *extra: str, options=()) -> list[str]:
    """The sweep of `mode` (its folder out/<mode>) to n trials (Optuna), with `extra`
    overrides; options come before the overrides (argparse takes them there)."""
    head = ["--name", mode] + (["--optuna", str(n), "--prune-after", "9"] * (mode == "optuna"))
    return py("sweep", *head, *options, *RECOVERY_FIXED, *extra, AXES[mode],
              f"run.output_dir={out}")  # fmt: skip


def _phase(ctx, folder: Path, cmd: list[str], kill=None, fsize: int | None = None) -> tuple:
    """Run cmd to its end, or kill -9 it (the sweep only: its trials live on) once kill()
    says so; (exit code, stdout, stderr). The first half of a case, before its rerun."""
    out, err = folder / "phase.out", folder / "phase.err"
    limit = (lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))) if fsize else None
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen([sys.executable, *cmd], cwd=ctx.project, env=ctx.env, stdout=o,
                                stderr=e, start_new_session=True, preexec_fn=limit)  # fmt: skip
        start = time.monotonic()
        while proc.poll() is None and time.monotonic() - start < 300:
            if kill is not None and kill(time.monotonic() - start):
                proc.kill()
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    return proc.returncode, out.read_text(errors="replace"), err.read_text(errors="replace")


def _study_states(db: Path) -> list[str]:
    with sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True) as con:
        return [row[0] for row in con.execute("SELECT state FROM trials ORDER BY number")]


def _finished(sweep: Path, n: int, mode: str) -> str | None:
    """The sweep's n trials all finished, and (Optuna) its study agrees: no trial left
    RUNNING or WAITING, one finished study trial per finished record."""
    trials = json.loads((sweep / "sweep.json").read_text())["trials"]
    states = [t["state"] for t in trials]
    if len(states) != n or set(states) - {"done", "pruned"}:
        return f"trials not all finished: {states}"
    if mode == "optuna":
        study = _study_states(sweep / "study.db")
        if {"RUNNING", "WAITING"} & set(study):
            return f"study left unfinished trials: {study}"
        if sum(s in ("COMPLETE", "PRUNED") for s in study) != n:
            return f"study {study} does not match sweep.json's {states}"
    return None


def _killed(mode: str, delay: float | None):
    """kill -9 of the sweep while its first trial trains (after its first checkpoint) or at
    a moment; the same command again must finish every trial, the killed one resumed."""

    def prepare(ctx, folder):
        out = folder / "runs"
        cmd = _sweep_cmd(out, mode)

        def kill(seconds):
            return seconds >= delay if delay else any(out.glob(f"{mode}/t00*/step-*.pt"))

        _phase(ctx, folder, cmd, kill=kill)

        def check(res):
            reason = _finished(out / mode, 2, mode)
            logs = sorted((out / mode / "logs").glob("t00*.out"))
            if reason is None and delay is None and "resumed at step" not in logs[0].read_text():
                reason = f"the killed trial {logs[0].stem} did not resume"
            return reason

        return Plan(cmd, (0,), clean=[out], check=check)

    return prepare


def _names_run_file(res) -> str | None:
    said = ("a checkpoint", "a record of", "a run, sweep or output folder", "inputs")
    return None if any(s in res.err for s in said) else "refused without naming the run's file"


def _out_table(how: str, expect: int):
    """predict <table> --out X, X: the table, links to it, another file, its own CSV."""

    def prepare(ctx, folder):
        table = write_table(folder / "rows.csv", ctx.cls_table, rows=8)
        out, extra = folder / "preds.csv", []
        if how == "input":
            out = table
        elif how == "symlink-to-input":
            out.symlink_to(table)
        elif how == "hardlink-to-input":
            os.link(table, out)
        elif how.startswith("other-file"):
            out.write_text("my notes\n")
            extra = ["--force"] if how.endswith("force") else []
        else:  # a prediction CSV written by an earlier run of the same command
            out.write_text("input,prediction,probability,label\nrows.csv:2,a,0.9,a\n")
        ckpt = best(ctx, folder, "cls")
        cmd = py("predict", "--checkpoint", ckpt, str(table), "--out", str(out), *extra)
        keep = [table, Path(ckpt)] + ([out] if expect == 2 else [])
        check = _wrote_predictions(out, 8) if expect == 0 else None
        return Plan(cmd, (expect,), keep=keep, clean=[folder], check=check)

    return prepare


def _best_terms(metric: str):
    """syn chose best.pt by val acc (auto): loss is refused; acc, max (the same) resumes."""

    def prepare(ctx, folder):
        runs = copy_runs(ctx, folder, "syn")
        cmd = py("train", *TINY, "run.name=syn", f"run.output_dir={runs}", "train.epochs=3")
        cmd += ["train.resume=auto", f"train.best_metric={metric}"]
        if metric == "loss":
            return Plan(cmd, (2,), keep=_run_files(runs / "syn"), clean=[runs])
        cmd.append("train.best_mode=max")
        return Plan(cmd, (0,), clean=[runs], check=resumed_from(runs / "syn", ctx.steps["syn"]))

    return prepare


def _study_base(ctx) -> Path:
    """A finished 1-trial Optuna sweep in the bases (runs/optuna), made on first use."""
    with STUDY_LOCK:
        if not (ctx.runs / "optuna" / "sweep.json").is_file():
            rc, _, err = _phase(ctx, ctx.base, _sweep_cmd(ctx.runs, "optuna", 1))
            if rc != 0:
                raise RuntimeError(f"the Optuna base sweep failed (exit {rc}): {err[-300:]}")
    return ctx.runs / "optuna"


def _study(how: str):
    """study.db damaged, not this sweep's, locked or gone; the same command (to 2 trials)
    refuses in one line and writes nothing; a deleted study.db is rebuilt from sweep.json."""

    def prepare(ctx, folder):
        _study_base(ctx)
        runs = copy_runs(ctx, folder, "optuna")
        db = runs / "optuna" / "study.db"
        holder = _damage_study(db, how)
        listing = sorted(p.name for p in (runs / "optuna").rglob("*"))

        def check(res):
            if holder is not None:
                holder.kill()
            if how == "deleted":
                return _finished(runs / "optuna", 2, "optuna")
            now = sorted(p.name for p in (runs / "optuna").rglob("*"))
            return None if now == listing else f"files changed: {set(now) ^ set(listing)}"

        keep = [runs / "optuna" / "sweep.json", *([db] if db.is_file() else [])]
        expect = (0,) if how == "deleted" else (2,)
        return Plan(_sweep_cmd(runs, "optuna"), expect, keep_refused=keep, clean=[runs],
                    check=check)  # fmt: skip

    return prepare


def _wrote_predictions(out: Path, rows: int):
    def check(res) -> str | None:
        lines = out.read_text().splitlines() if out.is_file() else []
        if len(lines) != rows + 1 or not lines[0].startswith("input,prediction"):
            return f"no predictions in {out.name}: {lines[:1]}"
        return None

    return check


def _out_other(tool: str):
    """An existing file (export) or a folder of the user's (evaluate --report): refused."""

    def prepare(ctx, folder):
        run = copy_runs(ctx, folder, "syn") / "syn"
        if tool == "export":
            out = folder / "model.pt"
            out.write_bytes(b"someone else's file")
            kept = [out]
        else:
            out = folder / "mine"
            out.mkdir()
            (out / "notes.txt").write_text("keep me")
            kept = [out / "notes.txt"]
        cmd = _tool_cmd("export" if tool == "export" else "evaluate", run / "best.pt", out)
        return Plan(cmd, (2,), keep=kept + _run_files(run), clean=[folder])

    return prepare


def _damage_study(db: Path, how: str):
    """Returns the process holding db locked, for "locked"."""
    sql = {
        "another-programs": "CREATE TABLE notes (text)",
        "another-study": "UPDATE studies SET study_name = 'another'",
        "other-trials": "UPDATE trial_params SET param_value = param_value * 1.5",
        "another-schema": "UPDATE alembic_version SET version_num = 'v99.0.0'",
    }
    if how in ("truncated", "zeroed", "deleted"):
        damage(db, how)
    elif how == "garbage":
        db.write_bytes(b"not a database " * 512)
    elif how == "a-folder":
        db.unlink()
        db.mkdir()
    elif how == "locked":
        hold = "import sqlite3,sys,time; c = sqlite3.connect(sys.argv[1], isolation_level=None)"
        hold += "; c.execute('BEGIN EXCLUSIVE'); print('held', flush=True); time.sleep(60)"
        holder = subprocess.Popen([sys.executable, "-c", hold, str(db)], stdout=subprocess.PIPE)
        holder.stdout.readline()  # held from here
        return holder
    else:
        if how == "another-programs":
            db.unlink()
        with sqlite3.connect(db) as con:
            con.execute(sql[how])
    return None


def _full(mode: str, how: str):
    """A full disk (tmpfs) or a file-size limit under the first trial's checkpoint: the sweep
    stops at that trial with one line (exit 2), no trial started after it; with room again,
    the same command retries it and finishes."""

    def prepare(ctx, folder):
        if how == "disk" and not ctx.can_mount:
            return Plan([], (), skip=ctx.can_mount_why)
        out, mounts = folder / "runs", []
        out.mkdir()
        if how == "disk":  # room for the records, not for a checkpoint of the wider model
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(out)],
                           check=True)  # fmt: skip
            mounts = [out]
        cmd = _sweep_cmd(out, mode, 2, "model.width=32")  # checkpoints of ~800 KB
        first = _phase(ctx, folder, cmd, fsize=400 * KiB if how == "fsize" else None)
        if how == "disk":
            subprocess.run(["mount", "-o", "remount,size=64m", str(out)], check=True)

        def check(res):
            rc, stdout, stderr = first
            lines = [ln for ln in stderr.splitlines() if ln.strip()]
            if rc != 2 or len(lines) != 1 or not lines[0].startswith("error:"):
                return f"the full-disk run ended {rc} with {len(lines)} stderr lines: {lines[:1]}"
            if stdout.count(": started") != 1:
                return f"{stdout.count(': started')} trials started on the full disk, not 1"
            return _finished(out / mode, 2, mode)

        return Plan(cmd, (0,), clean=[out], check=check, mounts=mounts)

    return prepare


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _stale(tool: str):
    """What a kill -9 mid-write leaves beside the target (a staging folder, a temporary
    file) is removed by the next start; the driver's own (a live process's) is kept."""

    def prepare(ctx, folder):
        run = copy_runs(ctx, folder, "syn") / "syn"
        target = {
            "export": run / "best.torchscript.pt",
            "predict": folder / "preds.csv",
            "evaluate": run / "best_report",
        }[tool]
        dead = target.with_name(f".{target.name}.tmp{dead_pid()}")
        live = target.with_name(f".{target.name}.tmp{os.getpid()}")
        if tool == "predict":
            dead.write_text("half a table")
        else:
            dead.mkdir()
            (dead / "half").write_bytes(b"x")
        live.mkdir()
        cmd = _tool_cmd(tool, run / "best.pt", target)

        def check(res) -> str | None:
            if dead.exists():
                return f"stale temporary left: {dead.name}"
            return None if live.is_dir() else f"a live process's temporary removed: {live.name}"

        return Plan(cmd, (0,), keep=[run / "best.pt"], check=check)

    return prepare


_TAKEN = """
import shutil, sys
from pathlib import Path
from {pkg} import loop
from {pkg}.checkpoint import RunFolder
from {pkg}.tools.train import train_main

FOLDER, HOW = Path(sys.argv[1]), sys.argv[2]
read, taker = loop.read_losses, RunFolder(FOLDER, 2)

def taken_at_step_20(run, *args):  # in epoch 2 (16 steps an epoch)
    if run.progress.step == 20:
        shutil.rmtree(FOLDER)
        if HOW == "replaced":  # as a second train.resume=auto would: its own lock and files
            taker.lock()
            (FOLDER / "metrics.csv").write_text("epoch,step\\n")
    return read(run, *args)

loop.read_losses = taken_at_step_20
raise SystemExit(train_main(sys.argv[3:]))
"""


def _folder_taken(how: str):
    """The run folder removed (or removed and taken by another process) during epoch 2: the
    run stops with one line at its next write and writes nothing there."""

    def prepare(ctx, folder):
        script = folder / "taken.py"
        script.write_text(_TAKEN.format(pkg=_package(ctx)))
        run = folder / "runs" / "gone"
        cmd = [str(script), str(run), how, *TINY, "train.epochs=3", "run.name=gone", _out(folder)]

        def check(res) -> str | None:
            left = sorted(p.name for p in run.iterdir()) if run.exists() else []
            want = [".lock", "metrics.csv"] if how == "replaced" else []
            if left != want or (want and (run / "metrics.csv").read_text() != "epoch,step\n"):
                return f"wrote into a folder it no longer holds: {left}"
            return None

        return Plan(cmd, (2,), clean=[folder / "runs"], check=check)

    return prepare


# Run the tool, kill -9 it once its staging folder exists, then check and rerun it.
KILL9 = """
import json, os, signal, subprocess, sys, time
mode, target, first, second = sys.argv[1:5]
tool = [sys.executable, "scripts/export.py", "--format", "torchscript", "--out", target]
if mode == "report":
    tool = [sys.executable, "scripts/evaluate.py", "--report", target]
    assert subprocess.run(tool + ["--checkpoint", first]).returncode == 0
before = {n: open(os.path.join(target, n), "rb").read() for n in os.listdir(target)} \\
    if mode == "report" else None
folder, stage = os.path.dirname(target), "." + os.path.basename(target) + ".tmp"
proc = subprocess.Popen(tool + ["--checkpoint", second])
while proc.poll() is None and not any(n.startswith(stage) for n in os.listdir(folder)):
    time.sleep(0.005)
if proc.poll() is not None:
    sys.exit("the kill did not land: the tool ended first")
os.kill(proc.pid, signal.SIGKILL)
proc.wait()
if before is not None:
    now = {n: open(os.path.join(target, n), "rb").read() for n in os.listdir(target)}
    if now != before:
        sys.exit("the report killed mid-write is not the earlier one: " + str(sorted(now)))
rc = subprocess.run(tool + ["--checkpoint", second]).returncode
if mode == "report":
    saved = json.load(open(os.path.join(target, "report.json")))["metrics"]["checkpoint"]
    if saved != second:
        sys.exit("the rerun's report describes " + saved)
sys.exit(rc)
"""


def _kill9(mode: str):
    def prepare(ctx, folder):
        run = copy_runs(ctx, folder, "syn") / "syn"
        if mode == "report":  # an earlier report of the first epoch, then the second's
            target, (first, second) = folder / "report", sorted(run.glob("step-*.pt"))[:2]
        else:
            target, first, second = run / "best.torchscript.pt", run / "best.pt", run / "best.pt"
        cmd = ["-c", KILL9, mode, str(target), str(first), str(second)]
        return Plan(cmd, (0,), keep=[run / "best.pt"], clean=[run, folder])

    return prepare


def _config_changed(mode: str, what: str):
    """The sweep's --config file (or the file it extends) edited between two runs: the
    second is refused in one line and writes nothing."""

    def prepare(ctx, folder):
        base, config, out = folder / "base.yaml", folder / "exp.yaml", folder / "runs"
        base.write_text("train:\n  weight_decay: 0.01\n")
        config.write_text("extends: base.yaml\ntrain:\n  grad_clip: 0.5\n")
        options = ["--config", str(config)] + ["--slurm", "--no-submit"] * (mode == "grid")
        rc, _, err = _phase(ctx, folder, _sweep_cmd(out, mode, 1, options=options))
        if rc != 0:
            raise RuntimeError(f"the first sweep failed (exit {rc}): {err[-300:]}")
        if what == "file":
            config.write_text("extends: base.yaml\ntrain:\n  grad_clip: 0.25\n")
        else:
            base.write_text("train:\n  weight_decay: 0.02\n")
        listing = sorted(p.name for p in out.rglob("*"))

        def check(res):
            now = sorted(p.name for p in out.rglob("*"))
            return None if now == listing else f"files changed: {set(now) ^ set(listing)}"

        cmd = _sweep_cmd(out, mode, 2, options=options)
        return Plan(cmd, (2,), keep_refused=[out / mode / "sweep.json"], clean=[out], check=check)

    return prepare


def _ends_its_lines(res) -> str | None:
    return None if res.out.endswith("\n") else f"output cut mid-line: {res.out[-60:]!r}"


def _stopped_early(mode: str, sig, delay: float):
    """A stop signal while the sweep starts (imports, checks, the study) or as its first
    trial starts: exit 75, no traceback, whole records, the output's last line ended."""

    def prepare(ctx, folder):
        out = folder / "runs"
        if sig == signal.SIGINT and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            why = "SIGINT is ignored here (a background job): the sweep keeps it so, as it must"
            return Plan([], (), skip=why)

        def check(res):
            manifest = out / mode / "sweep.json"
            if manifest.exists() and "running" in manifest.read_text():
                return "a trial left 'running' in sweep.json"
            return _ends_its_lines(res)

        cmd = _sweep_cmd(out, mode)
        return Plan(cmd, (75,), signals=[(None, delay, sig)], clean=[folder], check=check)

    return prepare


def _tool_signal(tool: str, delay: float, sig: int = signal.SIGINT):
    """A stop signal while the tool starts or works: 0 (it had finished or was putting its
    output in place), or 75 (130: Ctrl-C) with one line, the earlier output unchanged."""

    def prepare(ctx, folder):
        run = copy_runs(ctx, folder, "syn") / "syn"
        target = {
            "export": run / "best.torchscript.pt",
            "predict": folder / "preds.csv",
            "evaluate": run / "best_report",
        }[tool]
        cmd = _tool_cmd(tool, run / "best.pt", target)
        earlier = _with_json(target) if tool == "export" else []
        expect = (0, 75) if sig == signal.SIGTERM else (0, 130)

        def check(res) -> str | None:
            if res.rc in (75, 130) and len(res.err.strip().splitlines()) != 1:
                return f"stopped with {len(res.err.strip().splitlines())} lines on stderr"
            return None

        return Plan(
            cmd,
            expect,
            keep=[run / "best.pt"],
            keep_refused=earlier,
            clean=[run, folder],
            signals=[(None, delay, sig)],
            check=check,
        )

    return prepare


def _report(delay: float):
    """SIGTERM while a finished sweep's rerun prints and writes its report: it finishes the
    report (0) or, stopped before it, says so (75); never a report cut short."""

    def prepare(ctx, folder):
        runs = copy_runs(ctx, folder, "sw")
        cmd = py("sweep", "--name", "sw", *SWEEP_FIXED, SWEEP_AXIS, f"run.output_dir={runs}")
        signals = [(None, delay, signal.SIGTERM)]
        return Plan(cmd, (0, 75), signals=signals, clean=[runs], check=_ends_its_lines)

    return prepare


def _argv(cmd: list[str]):
    def prepare(ctx, folder):
        return Plan(cmd, (2,), clean=[folder])

    return prepare


_KILLED = """
import os, signal, sys
from {pkg}.checkpoint import run_folder
from {pkg}.tools.train import train_main

STEP, save = int(sys.argv[1]), run_folder.RunFolder.save

def save_then_kill(self, state, step, *args):
    path = save(self, state, step, *args)
    if step == STEP:
        os.kill(os.getpid(), signal.SIGKILL)
    return path

run_folder.RunFolder.save = save_then_kill
raise SystemExit(train_main(sys.argv[2:]))
"""


def _killed_after_save(ctx, folder):
    """syn resumed to epoch 4 and killed (-9) right after epoch 3's checkpoint; the resume
    finishes with one metrics row per epoch."""
    runs = copy_runs(ctx, folder, "syn")
    script = folder / "killed.py"
    script.write_text(_KILLED.format(pkg=_package(ctx)))
    args = [*TINY, "run.name=syn", f"run.output_dir={runs}", "train.epochs=4", "train.resume=auto"]
    step = ctx.steps["syn"] + ctx.steps["syn"] // 2  # the end of epoch 3
    done = subprocess.run([sys.executable, str(script), str(step), *args], cwd=ctx.project,
                          env=ctx.env, capture_output=True, timeout=300)  # fmt: skip
    if done.returncode != -signal.SIGKILL:
        raise RuntimeError(f"the killed run exited {done.returncode}: {done.stderr[-300:]!r}")

    def check(res) -> str | None:
        epochs = _epochs(runs / "syn")
        return None if epochs == ["1", "2", "3", "4"] else f"metrics rows lost: epochs {epochs}"

    return Plan(py("train", *args), (0,), clean=[runs], check=check)


def _no_batch_left(change: str):
    """A tensors run (train.pt and an explicit val.pt: no split to compare) validated at
    train.max_steps=6, 48 of 64 samples into epoch 1; resumed on 32 rows, or with a batch of
    32 (16 samples left): refused, nothing changed."""

    def prepare(ctx, folder):
        import torch

        for name, rows in (("big", 64), ("small", 32)):
            (folder / name).mkdir()
            for split, n in (("train", rows), ("val", 16)):
                data = {"x": torch.randn(n, 6), "y": torch.arange(n) % 2}
                torch.save(data, folder / name / f"{split}.pt")
        base = [*MLP, "data.name=tensors", "train.batch_size=8", "run.name=tens", _out(folder)]
        first = py("train", *base, f"data.root={folder / 'big'}", "train.max_steps=6")
        done = subprocess.run([sys.executable, *first], cwd=ctx.project, env=ctx.env,
                              capture_output=True, timeout=300)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"the first run exited {done.returncode}: {done.stderr[-300:]!r}")
        cmd = py("train", *base, "train.resume=auto", "train.max_steps=0")
        if change == "smaller":
            cmd.append(f"data.root={folder / 'small'}")
        else:
            cmd += [f"data.root={folder / 'big'}", "train.batch_size=32"]
        run = folder / "runs" / "tens"
        return Plan(cmd, (2,), keep=_run_files(run), clean=[folder / "runs"])

    return prepare


def _damaged_twice(ctx, folder):
    """A metrics.csv damaged again beside an earlier metrics.csv.damaged: both are kept."""
    runs = copy_runs(ctx, folder, "syn")
    run = runs / "syn"
    earlier = run / "metrics.csv.damaged"
    earlier.write_bytes(b"epoch,step\n1,\xff\xfe\n")
    damage(run / "metrics.csv", "non-utf8")
    damaged = (run / "metrics.csv").read_bytes()
    cmd = py("train", *TINY, "run.name=syn", f"run.output_dir={runs}")
    cmd += ["train.epochs=3", "train.resume=auto"]
    resumed = resumed_from(run, ctx.steps["syn"])

    def check(res) -> str | None:
        second = run / "metrics.csv.damaged.2"
        if not second.is_file() or second.read_bytes() != damaged:
            return "the second damaged metrics.csv was not kept beside the first"
        return resumed(res)

    return Plan(cmd, (0,), keep=[earlier], clean=[runs], check=check)


def _mid_epoch(ctx, folder):
    """train.max_steps inside an epoch (64 steps an epoch, 100 steps): Optuna is told the
    last validation at its own step (1562 thousandths of an epoch), not only epoch 1's."""
    out = folder / "runs"

    def check(res):
        with sqlite3.connect(out / "optuna" / "study.db") as con:
            steps = {row[0] for row in con.execute("SELECT step FROM trial_intermediate_values")}
        return None if 1562 in steps else f"no mid-epoch step among {sorted(steps)}"

    cmd = _sweep_cmd(out, "optuna", 2, "train.max_steps=100")
    return Plan(cmd, (0,), clean=[out], check=check)


def all_cases(formats: list[str]) -> list[Case]:
    return [
        *control_cases(),
        *export_cases(formats),
        *record_cases(),
        *dcp_cases(),
        *hostile_cases(),
        *predict_cases(),
        *sweep_cases(),
        *sweep_recovery_cases(),
        *signal_cases(),
        *config_cases(),
        *tool_cases(),
        *resume_terms_cases(),
    ]


def can_mount() -> tuple[bool, str]:
    """Full-disk cases mount a small tmpfs: root only (and a kernel that lets us)."""
    if os.geteuid() != 0:
        return False, "not root: full-disk cases (tmpfs) were not run"
    with tempfile.TemporaryDirectory() as probe:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", probe],
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0:
            why = done.stderr.strip()[:80]
            return False, f"tmpfs cannot be mounted here ({why}): full-disk cases not run"
        subprocess.run(["umount", probe], check=False)
    return True, ""
