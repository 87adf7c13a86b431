r"""Write small demo datasets under data/demo/, made on the spot (no download), for the example
configs in configs/experiments/ and for trying the data formats before using your own.

    python scripts/make_demo_data.py              # all of them
    python scripts/make_demo_data.py csv          # only data/demo/*.csv (regression, classes,
                                                  # classes_test, imbalanced, multilabel)  # feature: multilabel
                                                  # classes_test, imbalanced)  # feature: !multilabel
    python scripts/make_demo_data.py text         # only data/demo/text.txt  # feature: text
    python scripts/make_demo_data.py images       # only data/demo/images/<class>/NNN.png  # feature: images
# >>> text
    python scripts/make_demo_data.py tickets      # only data/demo/tickets.csv (text, label)  # feature: pretrained
# <<< text
    python scripts/make_demo_data.py --out /tmp/demo csv

Each is seeded: the same files every time.
"""

from __future__ import annotations

import csv
import random  # feature: text
import sys
from pathlib import Path

import torch

try:
    from {{ cookiecutter.package_name }}.data.synthetic import Options, SyntheticGratings  # feature: images
    from {{ cookiecutter.package_name }}.tools.cli import Parser
except ModuleNotFoundError as exc:  # before `pip install -e .`: one line says so
    import _bootstrap

    _bootstrap.not_installed(exc)


def write_csv(out: Path) -> list[Path]:
    """regression.csv: y from 8 features (linear, an interaction and a sine, plus noise);
    classes.csv: 2,000 rows of 20 features in 3 classes (Gaussian blobs, partly overlapping);
    classes_test.csv: 500 more rows of the same classes, held out;
    imbalanced.csv: 4,000 rows of 10 features, 10 % of them positive (fraud: yes); # feature: multilabel
    multilabel.csv: 3,000 rows of 12 features, each with any of 4 tags ("dog|beach").""" # feature: multilabel
    imbalanced.csv: 4,000 rows of 10 features, 10 % of them positive (fraud: yes).""" # feature: !multilabel
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2000, 8, generator=g)
    y = 2 * x[:, 0] - x[:, 1] + 0.5 * x[:, 2] * x[:, 3] + torch.sin(2 * x[:, 4])
    y = y + 0.1 * torch.randn(2000, generator=g)
    regression = _table(out / "regression.csv", [f"x{i}" for i in range(8)], x, "y", y.tolist())
    centres = 0.5 * torch.randn(3, 20, generator=g)  # overlapping: about 90% is attainable
    labels = torch.randint(3, (2000,), generator=g)
    rows = centres[labels] + torch.randn(2000, 20, generator=g)
    names = ["setosa", "versicolor", "virginica"]
    classes = _table(
        out / "classes.csv",
        [f"f{i}" for i in range(20)],
        rows,
        "species",
        [names[i] for i in labels.tolist()],
    )
    # 500 more rows of the same blobs: a held-out test table (table_with_test.yaml). Drawn
    # after the others, so regression.csv and classes.csv stay as they were.
    labels = torch.randint(3, (500,), generator=g)
    rows = centres[labels] + torch.randn(500, 20, generator=g)
    test = _table(
        out / "classes_test.csv",
        [f"f{i}" for i in range(20)],
        rows,
        "species",
        [names[i] for i in labels.tolist()],
    )
    imbalanced = write_imbalanced(out / "imbalanced.csv", g)
    return [regression, classes, test, imbalanced, write_multilabel(out / "multilabel.csv", g)]  # feature: multilabel
    return [regression, classes, test, imbalanced]  # feature: !multilabel


def write_imbalanced(path: Path, g: torch.Generator) -> Path:
    """A fraud-like table: positives differ from negatives by a shift in four of the ten
    features, so that a model picking the majority class is 90 % accurate and useless, and
    the positives' recall needs class weights or a tuned threshold."""
    fraud = torch.rand(4000, generator=g) < 0.1
    rows = torch.randn(4000, 10, generator=g)
    rows[:, :4] += 1.2 * fraud[:, None]
    names = ["yes" if f else "no" for f in fraud.tolist()]  # "yes" sorts second: positive
    return _table(path, [f"v{i}" for i in range(10)], rows, "fraud", names)


# >>> multilabel
def write_multilabel(path: Path, g: torch.Generator) -> Path:
    """A multi-label table: each of 4 tags is present where its own linear score of the 12
    features (plus noise) is high, at rates from about 10 % to 45 %, so a row has none, one
    or several tags, written in one column joined by "|" (multilabel_table.yaml)."""
    tags, rates = ["beach", "dog", "people", "sunset"], torch.tensor([0.45, 0.3, 0.2, 0.1])
    rows = torch.randn(3000, 12, generator=g)
    scores = rows @ torch.randn(12, 4, generator=g) + 0.7 * torch.randn(3000, 4, generator=g)
    present = scores > scores.quantile(1 - rates, dim=0).diagonal()  # each at its own rate
    joined = [
        "|".join(t for t, on in zip(tags, row, strict=True) if on) for row in present.tolist()
    ]
    return _table(path, [f"p{i}" for i in range(12)], rows, "tags", joined)
# <<< multilabel


def _table(path: Path, columns: list[str], x: torch.Tensor, label: str, y: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*columns, label])
        for row, target in zip(x.tolist(), y, strict=True):
            value = f"{target:.5f}" if isinstance(target, float) else target
            writer.writerow([f"{v:.5f}" for v in row] + [value])
    return path


# >>> text
def write_text(out: Path) -> list[Path]:
    """text.txt: ~150 KB of sentences from a small grammar (subject, verb, object, place, with
    number agreement), for character-level language modelling. Words and the grammar are
    learnable; which word comes next is random, so a model cannot reach perplexity 1."""
    rng = random.Random(0)
    nouns = {
        "cat": "cats", "dog": "dogs", "bird": "birds", "child": "children", "fox": "foxes",
        "farmer": "farmers", "teacher": "teachers", "horse": "horses", "baker": "bakers",
        "sailor": "sailors",
    }  # fmt: skip
    verbs = {
        "see": "sees", "like": "likes", "follow": "follows", "carry": "carries", "find": "finds",
        "watch": "watches", "help": "helps", "chase": "chases",
    }  # fmt: skip
    adjectives = ["small", "old", "quick", "quiet", "happy", "brown", "clever", "tired"]
    things = [
        "the river", "the old bridge", "a red ball", "the green hill", "a wooden boat",
        "the market", "a basket of apples", "the village",
    ]  # fmt: skip
    places = [
        "in the morning", "at night", "near the forest", "by the sea", "after the rain",
        "every day", "on the road", "in the garden",
    ]  # fmt: skip

    def noun_phrase() -> tuple[str, bool]:
        noun, plural = rng.choice(list(nouns)), rng.random() < 0.4
        det = rng.choice(["the", "two", "three", "many"] if plural else ["the", "a"])
        adjective = f"{rng.choice(adjectives)} " if rng.random() < 0.5 else ""
        return f"{det} {adjective}{nouns[noun] if plural else noun}", plural

    def sentence() -> str:
        subject, plural = noun_phrase()
        verb = rng.choice(list(verbs))
        thing = rng.choice(things) if rng.random() < 0.5 else noun_phrase()[0]
        place = f" {rng.choice(places)}" if rng.random() < 0.5 else ""
        words = f"{subject} {verb if plural else verbs[verb]} {thing}{place}"
        return words[0].upper() + words[1:] + "."

    paragraphs, size = [], 0
    while size < 150_000:
        paragraphs.append(" ".join(sentence() for _ in range(rng.randint(3, 6))))
        size += len(paragraphs[-1]) + 1
    path = out / "text.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(paragraphs) + "\n", encoding="utf-8")
    return [path]


# <<< text
# >>> images
def write_images(out: Path) -> list[Path]:
    """images/<class>/NNN.png: 480 noisy gratings of 32x32 pixels in 6 classes (orientation
    and colour tell them apart), the image_folder layout with one pool of images."""
    from PIL import Image  # Pillow: optional, only images need it

    grat = SyntheticGratings(Options(train_size=480, image_size=32, num_classes=6), "train")
    # Gratings are about -1..1 plus noise of std 1.5: +-4 maps onto the 8 bits of a PNG.
    pixels = ((grat.x / 8 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8)
    pixels = pixels.permute(0, 2, 3, 1).contiguous()  # (N, H, W, 3), as Pillow reads arrays
    folder = out / "images"
    counts = [0] * grat.num_classes
    for image, label in zip(pixels.numpy(), grat.y.tolist(), strict=True):
        name = grat.meta["classes"][label]
        (folder / name).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / name / f"{counts[label]:03d}.png")
        counts[label] += 1
    return [folder]
# <<< images


# >>> text
# >>> pretrained
def write_tickets(out: Path) -> list[Path]:
    """tickets.csv: 1,200 support tickets (a text column, a label column) in 3 classes, for a
    text classifier (hf_text_classifier.yaml). The words of each class overlap: a model must
    read more than one word."""
    rng = random.Random(0)
    topics = {
        "billing": ["invoice", "charge", "refund", "card", "payment", "price"],
        "login": ["password", "account", "sign in", "two-factor", "email code", "locked"],
        "shipping": ["parcel", "delivery", "address", "courier", "tracking", "package"],
    }
    shared = ["my", "order", "again", "today", "please", "help", "the app", "still", "not"]
    moods = ["I cannot understand", "why is", "there is a problem with", "what happened to"]
    rows = []
    for _ in range(1200):
        label = rng.choice(list(topics))
        words = rng.sample(topics[label], 2) + rng.sample(shared, rng.randint(1, 4))
        if rng.random() < 0.3:  # a word of another topic: one word does not decide
            words.append(rng.choice(topics[rng.choice([t for t in topics if t != label])]))
        rng.shuffle(words)
        rows.append([f"{rng.choice(moods)} {' '.join(words)}", label])
    path = out / "tickets.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([["text", "label"], *rows])
    return [path]
# <<< pretrained
# <<< text


WRITERS = {"csv": write_csv}
WRITERS["images"] = write_images  # feature: images
WRITERS["text"] = write_text  # feature: text
# >>> text
WRITERS["tickets"] = write_tickets  # feature: pretrained
# <<< text


def main(argv: list[str] | None = None) -> int:
    # An argument error: one line
    parser = Parser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("kinds", nargs="*", help=f"any of {', '.join(WRITERS)}; default: all")
    parser.add_argument("--out", default="data/demo", help="folder to write (default data/demo)")
    args = parser.parse_args(argv)
    unknown = [kind for kind in args.kinds if kind not in WRITERS]
    if unknown:
        parser.error(f"unknown kind {unknown[0]!r}; choose from {', '.join(WRITERS)}")
    for kind in args.kinds or WRITERS:
        paths = WRITERS[kind](Path(args.out))
        print(f"{kind}: {', '.join(map(str, paths))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
