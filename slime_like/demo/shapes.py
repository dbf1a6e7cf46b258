"""The visual demo task: count the shapes in a picture, "<image>How many shapes?" -> "3" then the end of turn.

Each picture is 84 x 84 pixels, a 3 x 3 grid of 28-pixel cells on a light background; 1 to 9 of the cells hold
one shape (a circle, a square or a triangle, of random size, colour and offset inside its cell) and the answer is
how many. The text is the same for every prompt, so only the image can tell the answer: a model that ignores it
scores about 1/9 (0.155 on the held-out set by always answering its most common count, 5).

Why cells of 28 pixels: the Qwen-VL vision tower cuts 14-pixel patches and merges 2 x 2 of them into one image
token, so an 84 x 84 picture is exactly 9 image tokens, one per cell. The task stays learnable by a tiny,
randomly initialised vision tower on a CPU in minutes (it has to tell a shape from the background in each token
and the language model has to count the tokens that hold one), which is the point of a demo.

The records follow slime's multimodal data format: {"prompt": "<image>How many shapes?", "images": [path],
"label": "3"} with `--multimodal-keys '{"image": "images"}'`; `<image>` is where the picture goes.
A fixed 200 pictures (seed 1234) are held out and never trained on, by SFT or by RL.

Use as the reward of a run:   --custom-rm-path slime_like.demo.shapes.reward
"""
from __future__ import annotations

import functools
import json
import os
import random

IMAGE_SIZE, GRID = 84, 3
CELL = IMAGE_SIZE // GRID
MIN_COUNT, MAX_COUNT = 1, GRID * GRID
QUESTION = "How many shapes?"
PROMPT = "<image>" + QUESTION      # slime's image placeholder, replaced by the picture in the chat template
MULTIMODAL_KEYS = {"image": "images"}   # --multimodal-keys: media type -> the record's key
END_OF_TURN = "<|im_end|>"   # the Qwen-VL chat template's end of an assistant turn: the demo's stop token
SHAPES = ("circle", "square", "triangle")
HELDOUT_SEED, TRAIN_SEED = 1234, 0
N_TRAIN, N_HELDOUT = 4000, 200
# The answer (one digit) + the end of turn + one spare token: a response that does not stop is cut quickly.
MAX_NEW_TOKENS = 3


def draw(rng: random.Random, count: int):
    """One picture with `count` shapes in distinct cells of the grid (a PIL RGB image)."""
    from PIL import Image, ImageDraw

    if not MIN_COUNT <= count <= MAX_COUNT:
        raise ValueError(f"count must be in {MIN_COUNT}..{MAX_COUNT}, got {count}")
    background = tuple(rng.randint(215, 255) for _ in range(3))
    img = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), background)
    pen = ImageDraw.Draw(img)
    for cell in rng.sample(range(GRID * GRID), count):
        size = rng.randint(12, 22)
        x0 = (cell % GRID) * CELL + rng.randint(1, CELL - size - 1)
        y0 = (cell // GRID) * CELL + rng.randint(1, CELL - size - 1)
        box = (x0, y0, x0 + size, y0 + size)
        colour = tuple(rng.randint(0, 160) for _ in range(3))   # darker than any background
        kind = rng.choice(SHAPES)
        if kind == "circle":
            pen.ellipse(box, fill=colour)
        elif kind == "square":
            pen.rectangle(box, fill=colour)
        else:
            pen.polygon([(x0, y0 + size), (x0 + size, y0 + size), (x0 + size // 2, y0)], fill=colour)
    return img


def make_split(name: str, n: int, seed: int, data_dir: str) -> list[dict]:
    """n records whose pictures are written to data_dir/images/<name>_<i>.png; counts uniform over 1..9.

    The records name their pictures relative to data_dir (the data source reads relative paths from the data
    file's folder), so the folder can move."""
    rng = random.Random(seed)
    records = []
    for i in range(n):
        count = rng.randint(MIN_COUNT, MAX_COUNT)
        rel = f"images/{name}_{i:05d}.png"
        draw(rng, count).save(os.path.join(data_dir, rel), format="PNG")
        records.append({"prompt": PROMPT, "images": [rel], "label": str(count)})
    return records


def write_data(data_dir: str, n_train: int = N_TRAIN, n_heldout: int = N_HELDOUT) -> dict[str, str]:
    """Write data_dir/images/*.png, train.jsonl and heldout.jsonl.

    Train and held-out pictures come from different seeds; every file is written under a temporary name first,
    so an interrupted run never leaves a file a later run would take as done.
    """
    os.makedirs(os.path.join(data_dir, "images"), exist_ok=True)
    paths = {}
    for name, n, seed in (("heldout", n_heldout, HELDOUT_SEED), ("train", n_train, TRAIN_SEED)):
        path = os.path.join(data_dir, f"{name}.jsonl")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            for rec in make_split(name, n, seed, data_dir):
                f.write(json.dumps(rec) + "\n")
        os.replace(tmp, path)
        paths[name] = path
    return paths


def read_jsonl(path: str) -> list[dict]:
    out = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                rec = json.loads(line)
                missing = [k for k in ("prompt", "images", "label") if k not in rec]
                if missing:
                    raise ValueError(f"{path}:{lineno}: a record needs keys 'prompt', 'images' and 'label'; "
                                     f"missing {missing}")
                out.append(rec)
    return out



def score(response: str, label, truncated: bool = False) -> float:
    """1.0 iff the response is exactly the label, then the end of turn (or the engine trimmed it), else 0.0.

    Strict: no stripping, no partial credit; a response cut at the length limit (`truncated`) without the end
    of turn scores 0.
    """
    text, ended = response or "", not truncated
    if END_OF_TURN in text:
        text, ended = text[:text.index(END_OF_TURN)], True
    return 1.0 if ended and text == str(label) else 0.0


@functools.lru_cache(maxsize=4)
def _token_rule(checkpoint: str) -> tuple:
    """(the stop ids, the tokenizer) of a checkpoint, loaded once per process."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoint)
    stops = {tok.convert_tokens_to_ids(END_OF_TURN), tok.eos_token_id} - {None, tok.unk_token_id}
    return frozenset(stops), tok


def score_ids(response_ids: list[int], label, checkpoint: str, truncated: bool = False) -> float:
    """The same rule on token ids: the ids before the first stop id are exactly the label's.

    Ids decide where the sample carries them, so a token that decodes to nothing (a padded-vocabulary id) cannot
    sneak into a right answer.
    """
    stops, tok = _token_rule(checkpoint)
    ids, ended = list(response_ids), not truncated
    cut = next((i for i, t in enumerate(ids) if t in stops), None)
    if cut is not None:
        ids, ended = ids[:cut], True
    return 1.0 if ended and ids == tok.encode(str(label), add_special_tokens=False) else 0.0


async def reward(args, sample) -> float:
    """slime's custom reward signature (`--custom-rm-path slime_like.demo.shapes.reward`): exact match."""
    from slime_like.sample import Status

    truncated = sample.status == Status.TRUNCATED
    if sample.response_length and len(sample.tokens) >= sample.response_length:
        response_ids = sample.tokens[len(sample.tokens) - sample.response_length:]
        return score_ids(response_ids, sample.label, args.hf_checkpoint, truncated=truncated)
    return score(sample.response, sample.label, truncated=truncated)
