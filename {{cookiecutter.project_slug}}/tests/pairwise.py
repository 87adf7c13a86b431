"""The option combinations that tests/test_combinations.py runs: every pair of values of the
axes below appears in at least one case (a covering array, built greedily), and each case is
either expected to train or to be refused up front by one of REFUSED's rules. The generator
takes other axes too (the template's tests build the covering array of its options with it).

Adding an axis or a value adds cases by itself; adding a refusal to the project means adding
its rule here (and a line to docs/combinations.md's table of refused combinations).
"""

from __future__ import annotations

import functools
import importlib.util  # feature: pretrained
import itertools
from dataclasses import dataclass

# Values of each axis; the first is the everyday one.
AXES: dict[str, list] = {
    "task": [
        "cls-synthetic-cnn",
        "cls-csv-mlp",
        "cls-images-cnn",  # feature: images
        "reg-csv-mlp",
        "lm-text",  # feature: text
        "cls-imbalanced-mlp",  # class weights auto, best.pt by macro-F1, a tuned threshold
        "ml-tags-mlp",  # multi-label: pos_weight auto, best.pt by mAP, tuned thresholds # feature: multilabel
        # >>> pretrained
        # Pretrained models, where their libraries are installed (the template's CI runs
        # these cases in the zoo environment of tests/test_zoo.py): a timm model on images
        # and a Hugging Face BERT on text, each frozen for its first epoch.  # feature: text
        # frozen for its first epoch.  # feature: !text
        *(["cls-images-timm"] if importlib.util.find_spec("timm") else []),
        *(["cls-text-hf"] if importlib.util.find_spec("transformers") else []),  # feature: text
        # <<< pretrained
    ],
    # How the model is wrapped, and on how many ranks (two: torchrun, gloo on the CPU). Two
    # axes, not one: every task then needs one two-rank case, not one per strategy.
    "strategy": ["ddp", "fsdp"],  # feature: fsdp
    "strategy": ["ddp"],  # feature: !fsdp
    "world": [1, 2],
    "amp": ["off", "bf16", "fp16"],
    "compile": [False, True],
    "channels_last": [False, True],
    "accum": [1, 3],
    "workers": [0, 2],
    # fresh: a new run, resumed with resume=auto | init: init_from=<a best.pt> and resume=auto
    # on both launches (SLURM) | init-fresh: init_from on the first launch only |
    # path: resumed with resume=<its last.pt>
    "start": ["fresh", "init", "init-fresh", "path"],
    "max_steps": ["off", "mid-epoch"],
    "early_stop": [False, True],
    "folds": [0, 3],
    "loggers": ["csv", "csv+tensorboard"],
    "export": ["torchscript", "export", "onnx"],  # feature: export
    "act_ckpt": [False, True],  # train.activation_checkpointing
    "sync_bn": [False, True],
    "cpu_offload": [False, True],  # feature: fsdp
    "deterministic": [False, True],  # run.deterministic
    # train.freeze_epochs: 1 freezes the backbone for the first epoch, then trains it (with
    # sharded parameters and bf16, that unfreeze once failed)
    "freeze": [0, 1],
    "ema": [0, 0.9],  # train.ema_decay: the weights' average is validated, saved and read back
    "nonfinite": ["stop", "skip"],  # train.on_nonfinite: skip agrees on every step over ranks
    # train.micro_batch_size: batches of 16 in parts of 6, 6 and 4, each weighted by its size,
    # the gradients reduced over ranks without DDP (auto, on out-of-memory: test_microbatch)
    "micro": [0, 6],
    # The one setting each resume changes: train.lr halved, train.amp off <-> bf16 (fp16 ->
    # bf16), train.channels_last flipped (refused on non-image inputs), run.seed (refused).
    "resume_change": ["lr", "amp", "channels_last", "seed"],
}

IMAGE_TASKS = ("cls-synthetic-cnn", "cls-images-cnn", "cls-images-timm")  # feature: pretrained
# >>> !pretrained
IMAGE_TASKS = ("cls-synthetic-cnn", "cls-images-cnn")  # feature: images
IMAGE_TASKS = ("cls-synthetic-cnn",)  # feature: !images
# <<< !pretrained

# What a value costs a case on CPU, in pairs it must cover to be worth it: two ranks start
# three processes per launch (torchrun and its ranks), and compiling costs more than
# everything else in a case, most of all on two ranks at once (each compiles). The generator
# takes a costly value only where it covers that many more new pairs than a cheap one:
# compile then lands on two ranks in the one case its pair with world 2 needs.
COST = {("world", 2): 2, ("compile", True): 3}
COST[("export", "onnx")] = 1  # feature: export


@dataclass(frozen=True)
class Rule:
    """Combinations the project refuses before anything is written: a case refused by this
    rule has every axis of `when` at one of its values. `keys` are what the error line
    names; `devices` where the rule holds (fp16 runs on CUDA)."""

    when: dict
    keys: tuple[str, ...]
    why: str
    devices: tuple[str, ...] = ("cpu", "cuda")

    def matches(self, case: dict, device: str) -> bool:
        return device in self.devices and all(
            axis in case and case[axis] in values for axis, values in self.when.items()
        )


# In the order the project checks them (config validation, the device's precision, the data,
# the model's build), so that a case two rules refuse is refused by the first.
OFFLOAD = "offloading moves fsdp's shards to CPU memory"  # feature: fsdp
REFUSED = [
    Rule(
        {"micro": [6], "sync_bn": [True]},
        ("train.micro_batch_size", "train.sync_bn=true"),
        "SyncBatchNorm's collectives in the forward pass would wait for a rank out of memory",
    ),
    # >>> fsdp
    Rule({"cpu_offload": [True], "strategy": ["ddp"]}, ("train.cpu_offload=true",), OFFLOAD),
    Rule(
        {"sync_bn": [True], "strategy": ["fsdp"]},
        ("train.sync_bn=true", "train.strategy=fsdp"),
        "BatchNorm statistics are synchronised before validation anyway",
    ),
    Rule(
        {"ema": [0.9], "strategy": ["fsdp"]},
        ("train.ema_decay",),
        "the average would be of each rank's shards; ddp averages the whole model",
    ),
    Rule(
        {"micro": [6], "strategy": ["fsdp"]},
        ("train.micro_batch_size", "train.strategy=fsdp"),
        "fsdp's collectives in forward and backward would wait for a rank out of memory",
    ),
    # <<< fsdp
    Rule({"amp": ["fp16"]}, ("train.amp=fp16",), "fp16 needs a GPU; bf16 runs on CPU", ("cpu",)),
    Rule(
        {"task": [t for t in AXES["task"] if t not in IMAGE_TASKS], "channels_last": [True]},
        ("train.channels_last",),
        "channels_last is a layout of image batches (N, C, H, W); other inputs have none",
    ),
    Rule({"cpu_offload": [True]}, ("train.cpu_offload=true",), OFFLOAD, ("cpu",)),  # feature: fsdp
    Rule(
        {"sync_bn": [True], "world": [2]},
        ("train.sync_bn=true",),
        "SyncBatchNorm runs on CUDA GPUs; one rank has nothing to synchronise",
        ("cpu",),
    ),
]

# Cases the CPU cannot run (listed by the suite; COMBINATIONS_DEVICE=cuda runs them).
GPU_ONLY = {"amp": ["fp16"], "cpu_offload": [True]}  # feature: fsdp
GPU_ONLY = {"amp": ["fp16"]}  # feature: !fsdp


def resume_refusal(case: dict) -> tuple[str, ...] | None:
    """What the resume's one error line names when it refuses the case's resume_change (run.seed
    fixes the data order the saved position points into; channels_last needs image inputs),
    or None when the change applies from the resumed step."""
    if case["resume_change"] == "seed":
        return ("run.seed",)
    if case["resume_change"] == "channels_last" and case["task"] not in IMAGE_TASKS:
        return ("train.channels_last",)
    return None


def refusal(case: dict, device: str) -> Rule | None:
    """The first rule that refuses `case` on `device`, or None when it must train."""
    return next((rule for rule in REFUSED if rule.matches(case, device)), None)


def _pairs(case: dict) -> set:
    items = sorted((axis, repr(value)) for axis, value in case.items())
    return set(itertools.combinations(items, 2))


def possible(case: dict, device: str, axes: dict = AXES) -> bool:
    """Whether some case holding `case` (a part of one) trains on `device`: no rule refuses
    it. Only the axes the rules name matter: a search over them, remembered."""
    named = sorted({axis for rule in REFUSED for axis in rule.when if axis in axes})
    fixed = tuple((axis, case[axis]) for axis in named if axis in case)
    free = tuple((axis, tuple(axes[axis])) for axis in named if axis not in case)
    return _possible(fixed, free, device)


@functools.cache
def _possible(fixed: tuple, free: tuple, device: str) -> bool:
    for values in itertools.product(*(options for _, options in free)):
        trial = {**dict(fixed), **dict(zip((axis for axis, _ in free), values, strict=True))}
        if refusal(trial, device) is None:
            return True
    return False


def covering_cases(axes: dict = AXES, device: str = "cpu") -> list[dict]:
    """Cases that train, holding every pair of values that some case can train with; then one
    case per rule, holding its refused combination. Deterministic: the same list every time."""
    names = list(axes)
    uncovered = set()
    for a, b in itertools.combinations(names, 2):
        for va, vb in itertools.product(axes[a], axes[b]):
            if possible({a: va, b: vb}, device, axes):
                uncovered.add(tuple(sorted([(a, repr(va)), (b, repr(vb))])))
    uses = {(axis, repr(value)): 0 for axis in names for value in axes[axis]}
    cases: list[dict] = []
    while uncovered:
        (a, ra), (b, rb) = min(uncovered)
        case = {a: _value(axes, a, ra), b: _value(axes, b, rb)}
        for axis in sorted(names, key=lambda n: -len(axes[n])):
            if axis in case:
                continue
            best, score = None, None
            for value in axes[axis]:
                trial = {**case, axis: value}
                if not possible(trial, device, axes):
                    continue
                gain = len(_pairs(trial) & uncovered) - len(_pairs(case) & uncovered)
                cost = _cost(trial)
                key = (gain - cost, -cost, -uses[(axis, repr(value))])
                if score is None or key > score:
                    best, score = value, key
            case[axis] = best
        case = {axis: case[axis] for axis in names}
        uncovered -= _pairs(case)
        for axis, value in case.items():
            uses[(axis, repr(value))] += 1
        cases.append(case)
    return cases + _refused_cases(cases, device, axes)


def _refused_cases(cases: list[dict], device: str, axes: dict) -> list[dict]:
    """One case per rule that holds on `device` (and names only these axes): a training case
    with the rule's combination put in, preferably one that had none of it, and that no
    earlier rule refuses."""
    refused = []
    for rule in REFUSED:
        if device not in rule.devices or not set(rule.when) <= set(axes):
            continue
        fresh = [c for c in cases if all(c[a] != values[0] for a, values in rule.when.items())]
        for base in fresh + cases:
            case = {**base, **{axis: values[0] for axis, values in rule.when.items()}}
            if refusal(case, device) is rule:
                refused.append(case)
                break
    return refused


def _cost(case: dict) -> int:
    """A case's cost: its values' costs, and compiling on two ranks counted twice."""
    cost = sum(COST.get(item, 0) for item in case.items())
    return cost + 3 * (case.get("compile") is True and case.get("world") == 2)


def _value(axes: dict, axis: str, text: str):
    return next(value for value in axes[axis] if repr(value) == text)


def case_id(case: dict) -> str:
    """A short readable id: the case's values that differ from each axis's first."""
    parts = [case["task"], f"{case['strategy']}-{case['world']}"]
    for axis, value in case.items():
        if axis in ("task", "strategy", "world") or value == AXES[axis][0]:
            continue
        parts.append(axis if value is True else f"{axis}-{value}")
    return "-".join(str(p) for p in parts).replace("_", "").replace("+", "-")
