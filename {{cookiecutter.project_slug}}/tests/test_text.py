"""Character-level language modelling: the text dataset, the causal transformer, the example."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS, ROOT, lm_overrides, run_script

from {{ cookiecutter.package_name }} import checkpoint
from {{ cookiecutter.package_name }}.config import DataConfig, ModelConfig, load_config
from {{ cookiecutter.package_name }}.data import build_datasets
from {{ cookiecutter.package_name }}.data.text import Options, TextChars
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.models import build_model
from {{ cookiecutter.package_name }}.models.transformer import Options as TransformerOptions
from {{ cookiecutter.package_name }}.models.transformer import Transformer
from {{ cookiecutter.package_name }}.tools.evaluate import evaluate_checkpoint
from {{ cookiecutter.package_name }}.tools.train import train_main
from {{ cookiecutter.package_name }}.trainer import fit

TEXT = "The quick brown fox jumps over the lazy dog; déjà vu, ☃.\n" * 4


def text_file(tmp_path: Path, text: str = TEXT) -> Path:
    path = tmp_path / "text.txt"
    path.write_text(text, encoding="utf-8")
    return path


def decode(vocab: str, ids: torch.Tensor) -> str:
    return "".join(vocab[i] for i in ids.tolist())


def test_windows_are_consecutive_chunks_and_targets_are_shifted_by_one(tmp_path):
    data = TextChars(Options(path=str(text_file(tmp_path)), seq_len=8), "all")
    assert data.vocab == "".join(sorted(set(TEXT))) and data.vocab_size == len(data.vocab)
    assert len(data) == len(TEXT) // 9
    for i in range(len(data)):
        x, y = data[i]
        assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (8,)
        assert decode(data.vocab, x) == TEXT[9 * i : 9 * i + 8]
        assert decode(data.vocab, y) == TEXT[9 * i + 1 : 9 * i + 9]


def test_holdout_is_a_contiguous_tail_sharing_no_character_with_training(tmp_path):
    # Every character distinct: a token id is a position in the text.
    text = "".join(chr(0x4E00 + i) for i in range(300))
    cfg = DataConfig(name="text", options=Options(path=str(text_file(tmp_path, text)), seq_len=9))
    train, val, meta = build_datasets(cfg, "tokens")
    n = len(train) + len(val)
    assert val.indices == list(range(n - len(val), n)) and len(val) == round(0.1 * n)

    def positions(subset) -> set[int]:
        return {p for i in range(len(subset)) for part in subset[i] for p in part.tolist()}

    seen_in_training, validated = positions(train), positions(val)
    assert not seen_in_training & validated
    assert max(seen_in_training) < min(validated)


@pytest.mark.slow
def test_the_checkpoint_carries_the_vocabulary_and_evaluation_checks_it(tmp_path):
    path = text_file(tmp_path, TEXT * 2)
    result = fit(load_config(None, lm_overrides(tmp_path, path)))
    best = tmp_path / "runs" / "default" / "best.pt"
    assert checkpoint.load(best)["data"]["vocab"] == "".join(sorted(set(TEXT)))
    assert evaluate_checkpoint(str(best))["perplexity"] == pytest.approx(result["best"])
    # Same length and windows, one character swapped for a new one: other token ids.
    path.write_text((TEXT * 2).replace("q", "Q"), encoding="utf-8")
    with pytest.raises(ConfigError, match="another character set than the training run's"):
        evaluate_checkpoint(str(best))


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "not found; set data.path to a UTF-8 text file"),
        (b"abc\xffdef" * 20, "is not UTF-8 (byte 0xff at offset 3); save it as UTF-8"),
        (b"short", "holds 5 characters, too few for one window of data.seq_len + 1 = 17"),
    ],
)
def test_bad_text_files_get_one_error_line(tmp_path, capsys, content, message):
    path = tmp_path / "text.txt"
    if content is not None:
        path.write_bytes(content)
    assert train_main(lm_overrides(tmp_path, path)) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: text file ") and message in lines[0]
    assert not (tmp_path / "runs").exists()


def tiny_transformer(vocab: int = 11, max_len: int = 16) -> Transformer:
    opts = TransformerOptions(width=16, depth=2, heads=2, dropout=0.0, max_len=max_len)
    cfg = ModelConfig(name="transformer", options=opts)
    return build_model(cfg, Transformer.example_input(2), vocab)


def test_transformer_is_causal_and_gives_logits_per_position():
    torch.manual_seed(0)
    model = tiny_transformer().eval()
    x = torch.randint(11, (3, 12))
    changed = x.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 11
    out, out_changed = model(x), model(changed)
    assert out.shape == (3, 12, 11)
    torch.testing.assert_close(out[:, :7], out_changed[:, :7])  # the past ignores the future
    assert not torch.allclose(out[:, 7:], out_changed[:, 7:])  # from position 7 on it matters


def test_transformer_refuses_windows_longer_than_max_len():
    opts = TransformerOptions(max_len=8)
    with pytest.raises(ConfigError, match="windows of 16 tokens exceed model.max_len=8"):
        build_model(ModelConfig(name="transformer", options=opts), Transformer.example_input(2), 5)


def test_generate_appends_the_requested_tokens_from_the_vocabulary():
    torch.manual_seed(0)
    model = tiny_transformer(vocab=11, max_len=16)
    prompt = torch.randint(11, (2, 3))
    # 3 + 20 tokens: past max_len, so the context is cropped to the last 16.
    out = model.generate(prompt, 20, temperature=1.0, top_k=3)
    assert out.shape == (2, 23) and out.dtype == torch.int64
    assert torch.equal(out[:, :3], prompt) and out.min() >= 0 and out.max() < 11
    greedy = model.generate(prompt, 20, temperature=0)
    assert torch.equal(greedy, model.generate(prompt, 20, temperature=0))
    assert torch.equal(greedy, model.generate(prompt, 20, top_k=1))  # one candidate: the top
    assert model.training  # generate() restores the mode it found


@pytest.mark.slow
def test_char_lm_example_learns_and_evaluate_reproduces_its_best(demo_data, tmp_path):
    cfg = load_config(
        CONFIGS / "experiments" / "char_lm.yaml",
        ["run.device=cpu", "run.loggers=csv", f"run.output_dir={tmp_path}"],
    )
    result = fit(cfg)
    vocab = len(checkpoint.load(tmp_path / "char_lm" / "best.pt")["data"]["vocab"])
    # Uniform guessing scores perplexity = vocabulary size (30 for the demo text), character
    # frequencies alone ~18.5; the example reaches ~2.
    assert vocab == 30 and result["best"] < 3.0
    proc = run_script(
        str(ROOT / "scripts" / "evaluate.py"),
        "--checkpoint",
        str(tmp_path / "char_lm" / "best.pt"),
        "--json",
        "run.device=cpu",
        cwd=demo_data,  # the checkpoint's config names data/demo/text.txt, relative
        env={"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])},
    )
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads(proc.stdout.splitlines()[-1])
    assert metrics["perplexity"] == pytest.approx(result["best"], rel=1e-5)
