"""Text classification with a Hugging Face model (models/hf.py, data/text_table.py), with the
real transformers and tokenizers and never the network: the model and its tokenizer are made
in the test (a tiny BERT from random init, its vocabulary the demo's words) and saved with
save_pretrained, as a user's offline folder would be. Sockets are blocked in every test.

Skipped where transformers is not installed; REQUIRE_EXTRAS=transformers makes that a
failure (the template's CI runs these in the environment of tests/test_zoo.py).
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS, block_network, needs

from {{ cookiecutter.package_name }} import checkpoint, data
from {{ cookiecutter.package_name }}.config import load_config
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.models import build_model
from {{ cookiecutter.package_name }}.tools import export  # feature: export
from {{ cookiecutter.package_name }}.tools.evaluate import evaluate_main
from {{ cookiecutter.package_name }}.tools.export import export_main  # feature: export
from {{ cookiecutter.package_name }}.tools.predict import predict_main
from {{ cookiecutter.package_name }}.trainer import build_data, fit

transformers = needs("transformers")
tokenizers = needs("tokenizers")
huggingface_hub = needs("huggingface_hub")


@pytest.fixture(autouse=True)
def no_network(monkeypatch, tmp_path):
    block_network(monkeypatch, tmp_path, "tests/test_hf_text.py")


def tiny_bert(folder: Path, texts: list[str], max_length: int = 128) -> Path:
    """A 2-layer BERT from random init and a WordPiece tokenizer of `texts`' words, saved as
    save_pretrained saves a hub model: the folder a user copies to an offline cluster."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words = sorted({w for text in texts for w in re.findall(r"\w+|[^\w\s]", text.lower())})
    vocab = {w: i for i, w in enumerate(special + words)}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2))
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=max_length,
    )
    fast.save_pretrained(folder)
    config = transformers.BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=max_length,
    )
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(config).save_pretrained(folder)
    return folder


def tickets(folder: Path, n: int = 240) -> Path:
    """A CSV of support tickets as the demo's (scripts/make_demo_data.py tickets), shorter."""
    from conftest import run_script

    proc = run_script("scripts/make_demo_data.py", "--out", str(folder), "tickets")
    assert proc.returncode == 0, proc.stderr
    path = folder / "tickets.csv"
    rows = path.read_text().splitlines()
    path.write_text("\n".join(rows[: n + 1]) + "\n")
    return path


def texts_of(path: Path) -> list[str]:
    with path.open(newline="") as f:
        return [row["text"] for row in csv.DictReader(f)]


@pytest.fixture
def bert(tmp_path) -> tuple[Path, Path]:
    """(the tickets CSV, the tiny BERT folder for them)."""
    table = tickets(tmp_path / "demo")
    return table, tiny_bert(tmp_path / "bert", texts_of(table))


def hf_args(table: Path, folder: Path, tmp_path: Path, *extra: str) -> list[str]:
    return [
        "--config",
        str(CONFIGS / "experiments" / "hf_text_classifier.yaml"),
        f"data.path={table}",
        f"model.arch={folder}",
        "run.device=cpu",
        "run.loggers=[csv]",
        f"run.output_dir={tmp_path / 'runs'}",
        *extra,
    ]


def cfg_of(args: list[str]):
    return load_config(args[1], args[2:])


def test_texts_are_tokenised_once_as_the_library_does_and_padded_per_batch(bert, monkeypatch):
    table, folder = bert
    calls = []
    tokenize = data.text_table.tokenize
    monkeypatch.setattr(data.text_table, "tokenize", lambda *a: calls.append(1) or tokenize(*a))
    train, _, meta, _ = build_data(cfg_of(hf_args(table, folder, folder)))
    assert len(calls) == 1  # one pool, tokenised when built: not per epoch, not per batch
    library = transformers.AutoTokenizer.from_pretrained(folder)
    texts = texts_of(table)
    want = library(texts, truncation=True, max_length=128)["input_ids"]
    pool = train.dataset
    assert [pool[i][0].tolist() for i in range(len(texts))] == want
    assert json.loads(meta["tokenizer"]) == json.loads((folder / "tokenizer.json").read_text())
    assert meta["pad_id"] == library.pad_token_id and meta["max_length"] == 128
    batch, _ = pool[[0, 1, 2]]
    assert batch.shape == (3, max(len(want[i]) for i in range(3)))  # its own longest text
    assert (batch[:, -1] == 0).any() or len({len(want[i]) for i in range(3)}) == 1


def test_the_pretrained_weights_load_and_the_classifier_is_new(bert):
    table, folder = bert
    cfg = cfg_of(hf_args(table, folder, folder))
    x = torch.tensor([[2, 5, 6, 7, 3, 0, 0]])
    model = build_model(cfg.model, x, 3).eval()
    library = transformers.BertModel.from_pretrained(folder).eval()
    mask = (x != 0).long()
    with torch.no_grad():
        ours = model.net.bert(input_ids=x, attention_mask=mask).last_hidden_state
        theirs = library(input_ids=x, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    assert model.head().out_features == 3
    assert "new: classifier.weight, classifier.bias" in model.weights_note


@pytest.mark.slow
def test_the_example_trains_a_text_classifier_then_evaluates_and_predicts(tmp_path):
    """configs/experiments/hf_text_classifier.yaml from the offline folder, the backbone frozen
    for the first epoch; evaluation, prediction on raw text (a CSV without labels, a .txt) and  # feature: export
    the ONNX export with its tokenizer beside it give the same answers."""  # feature: export
    for the first epoch; evaluation and prediction on raw text (a CSV without labels, a .txt)  # feature: !export
    give the same answers."""  # feature: !export
    table = tickets(tmp_path / "all", n=1200)  # the whole demo table
    folder = tiny_bert(tmp_path / "bert_all", texts_of(table))
    args = hf_args(table, folder, tmp_path, "train.epochs=4", "train.lr=0.003")
    args += ["train.batch_size=16"]
    result = fit(cfg_of([*args, "train.freeze_epochs=1"]))
    assert result["metrics"]["acc"] > 0.9
    best = tmp_path / "runs/hf_text_classifier/best.pt"
    assert evaluate_main(["--checkpoint", str(best)]) == 0
    new = tmp_path / "new.csv"
    new.write_text("text\nmy invoice shows a charge again\nthe courier lost my parcel\n")
    one = tmp_path / "one.txt"
    one.write_text("I cannot sign in, my password is locked")
    out = tmp_path / "predictions.csv"
    assert predict_main([str(new), str(one), "--checkpoint", str(best), "--out", str(out)]) == 0
    with out.open() as f:
        predicted = list(csv.DictReader(f))
    assert [row["prediction"] for row in predicted] == ["billing", "shipping", "login"]
    # >>> export

    artifact = tmp_path / "model.onnx"
    assert (
        export_main(["--checkpoint", str(best), "--format", "onnx", "--out", str(artifact)]) == 0
    )
    meta = json.loads(artifact.with_name("model.onnx.json").read_text())
    assert meta["input"]["shape"] == ["batch", "positions"]
    assert meta["input"]["positions"] == {"min": 1, "max": 128}
    shipped = tokenizers.Tokenizer.from_file(str(artifact.with_name("model.onnx.tokenizer.json")))
    ids = torch.tensor([shipped.encode("the courier lost my parcel").ids])
    probs = export.run_artifact("onnx", artifact, ids).softmax(-1)[0]
    assert probs.argmax().item() == meta["classes"].index("shipping")
    assert probs.max().item() == pytest.approx(float(predicted[1]["probability"]), abs=1e-4)
    # <<< export


def test_a_frozen_backbone_keeps_its_weights_while_the_classifier_trains(bert, tmp_path):
    table, folder = bert
    args = hf_args(table, folder, tmp_path, "train.epochs=1", "train.freeze_epochs=1")
    result = fit(cfg_of(args))
    after = result["model"].net.state_dict()
    before = transformers.BertForSequenceClassification.from_pretrained(folder).state_dict()
    assert all(torch.equal(after[k], before[k]) for k in before if k.startswith("bert."))
    assert not torch.equal(after["classifier.weight"][:1], before["classifier.weight"][:1])


def test_a_folder_of_class_folders_of_text_files_trains(bert, tmp_path):
    table, folder = bert
    with table.open(newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            path = tmp_path / "texts" / row["label"] / f"{i:04d}.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(row["text"])
    args = hf_args(table, folder, tmp_path, "train.epochs=1", f"data.path={tmp_path / 'texts'}")
    result = fit(cfg_of(args))
    meta = checkpoint.load(tmp_path / "runs/hf_text_classifier/last.pt")["data"]
    assert meta["classes"] == ["billing", "login", "shipping"] and result["step"] > 0


class Payload:
    def __reduce__(self):
        return (print, ("pickled code ran",))


@pytest.mark.parametrize(
    "change, match",
    [
        ("column", r"has no column 'text' \(it has words, label\); set data.text_column"),
        ("empty", r"line 3: column 'text' is empty; fill or drop that row"),
        ("tokenizer", r"tokenizer '.*' cannot be read \(.*\); give a folder holding tokenizer"),
        ("offline", r"could not be read .*; without the network, set model.arch \(or data"),
        ("not_hf", r"data.tokenizer=auto takes the model's tokenizer, but model.name is not hf"),
        # The model's folder without its tokenizer files: transformers built a WordPiece of
        # the special tokens from config.json, and every word trained as [UNK].
        ("no_tokenizer_files", r"holds only special tokens \(\d+\), so every word would read"),
        ("pickled_bin", r"hold pickled Python objects, which weights_only loading refuses"),
        ("damaged_safetensors", r"is not a Hugging Face model this machine can read"),
        # A .pth as model.weights used to be blamed on the tokenizer.
        ("pth_weights", r"model.weights='.*w.pth' is a file; model.name=hf reads a folder"),
        (
            "too_long",
            r"data.max_length=512 is beyond what tokenizer '.*' and its model take \(128\)",
        ),
    ],
)
def test_bad_text_input_is_one_line_and_writes_nothing(bert, tmp_path, change, match):
    table, folder = bert
    extra = []
    if change in ("column", "empty"):
        rows = table.read_text().splitlines()
        if change == "column":
            rows[0] = "words,label"
        else:
            rows[2] = "," + rows[2].rsplit(",", 1)[1]
        table.write_text("\n".join(rows) + "\n")
    elif change == "tokenizer":
        (tmp_path / "no_tokenizer").mkdir()
        extra = [f"data.tokenizer={tmp_path / 'no_tokenizer'}"]
    elif change == "too_long":
        extra = ["data.max_length=512"]
    elif change == "offline":
        extra = ["model.arch=prajjwal1/bert-tiny"]
    elif change == "no_tokenizer_files":
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            (folder / name).unlink(missing_ok=True)
    elif change == "pickled_bin":  # GLOBAL posix.system: loading it would run a command
        (folder / "model.safetensors").unlink()
        torch.save({"x": Payload()}, folder / "pytorch_model.bin")
    elif change == "pth_weights":
        torch.save({"x": torch.zeros(1)}, tmp_path / "w.pth")
        extra = [f"model.weights={tmp_path / 'w.pth'}"]
    elif change == "damaged_safetensors":
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[: len(data) // 3])
    args = hf_args(table, folder, tmp_path, *extra)
    if change == "not_hf":  # a text table without model.name=hf: no tokenizer to take
        args = [a for a in args if not a.startswith("model.arch")] + ["model.name=mlp"]
    with pytest.raises(ConfigError, match=match):
        fit(cfg_of(args))
    assert not (tmp_path / "runs").exists()
