"""Inputs of the real-model test set, normalised as each model's package does before inference (pages
are resized to the input; ddddocr's detector would letterbox them on grey 114 instead).

* Calibration: documents rendered with Pillow's built-in font (random English words, sizes, ink and
  paper shades, the four orientations for pages, upright and upside down for text lines): a user's
  own sample pages, as a quantiser needs.
* Held out: a real scanned book page (scikit-image's `page.png`), never seen in calibration: whole,
  and its top and bottom halves, in the four orientations (12 inputs); for a text-line model, each
  text line of the page found by its ink profile, upright and upside down.
* Photos (a detector): calibration from scikit-image's sample photos (two with people, also
  mirrored) and mosaics of its Labeled Faces in the Wild crops; held out: Ultralytics' two sample
  photos (a bus with passers-by, two men) and three other scikit-image photos. Each is padded to a
  square at the bottom and right and resized, as the model's package does.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from .catalog import IMAGES, RealModel
from .fetch import fetch

WORDS = (
    "the of and to in is that for it as was with be by on not this are or from at which but have an "
    "they were there would their we been has when who will more no if out so said what up its about "
    "into than them can only other new some could time these two may then first any now such like "
    "over even most made after also did many before must through back years where much way well down "
    "should because each just those people how too little state good very make world still own see "
    "work long get here between both life being under never day same another know while last might "
    "great old year off come since against go came right used take three markers coins background"
).split()


def prepare(gray: np.ndarray, m: RealModel) -> np.ndarray:
    """A grey image resized to the model's input, as RGB, normalised: (1, 3, H, W) float32."""
    _, _, h, w = m.shape
    im = Image.fromarray(np.ascontiguousarray(gray)).convert("RGB").resize((w, h), Image.BILINEAR)
    x = np.asarray(im, np.float32).transpose(2, 0, 1) / 255.0
    mean, std = (np.asarray(v, np.float32).reshape(3, 1, 1) for v in m.norm)
    return ((x - mean) / std)[None].astype(np.float32)


def rendered(m: RealModel, rng: np.random.Generator) -> np.ndarray:
    """A page (or one text line) of random words in Pillow's font, in a random orientation."""
    line = m.kind == "line"
    height, width = (32, int(rng.integers(160, 320))) if line else (int(rng.integers(300, 600)),) * 2
    img = Image.new("L", (width, height), int(rng.integers(200, 250)))
    draw = ImageDraw.Draw(img)
    size = int(rng.integers(18, 24) if line else rng.integers(10, 22))
    font = ImageFont.load_default(size=size)
    y = 4 if line else int(rng.integers(2, 8))
    while y < height - size:
        x = float(rng.integers(4, 20))
        while True:
            word = str(rng.choice(WORDS))
            step = draw.textlength(word + " ", font=font)
            if x + step > width - 4:
                break
            draw.text((x, y), word, font=font, fill=int(rng.integers(10, 90)))
            x += step
        if line:
            break
        y += int(size * rng.uniform(1.3, 1.8))
    k = int(rng.choice([0, 2]) if line else rng.integers(4))
    x = prepare(np.rot90(np.asarray(img), k), m)
    return x + rng.normal(0, 0.02, x.shape).astype(np.float32)


def calibration(m: RealModel, n: int = 16, seed: int = 1) -> np.ndarray:
    """`n` rendered documents for `m` (or, for a photo model, the calibration photos), (n, 3, H, W)."""
    if m.kind == "photo":
        return photo_calibration(m, seed)
    rng = np.random.default_rng(seed)
    return np.concatenate([rendered(m, rng) for _ in range(n)])


def text_lines(page: np.ndarray) -> list[tuple[int, int]]:
    """Row ranges of the text lines of a grey page: runs of rows with ink, at least 6 rows tall."""
    ink = (page < 100).mean(axis=1) > 0.06
    runs, y = [], 0
    while y < len(ink):
        if ink[y]:
            y0 = y
            while y < len(ink) and ink[y]:
                y += 1
            if y - y0 >= 6:
                runs.append((max(0, y0 - 3), min(len(ink), y + 3)))
        y += 1
    return runs


def _image(name: str, mode: str = "RGB") -> np.ndarray:
    return np.asarray(Image.open(fetch(IMAGES[name], say=lambda _s: None)).convert(mode))


def square(rgb: np.ndarray, m: RealModel) -> np.ndarray:
    """A photo padded with black to a square (bottom, right), resized, normalised."""
    h, w = rgb.shape[:2]
    s = max(h, w)
    padded = np.zeros((s, s, 3), np.uint8)
    padded[:h, :w] = rgb
    return prepare(padded, m)


def face_mosaic(faces: np.ndarray, rng: np.random.Generator, k: int) -> np.ndarray:
    """k x k random face crops (25 x 25 grey, values 0..1) scaled 3x into one RGB picture."""
    tiles = [np.kron(faces[i], np.ones((3, 3))) for i in rng.choice(len(faces), k * k, replace=False)]
    grey = np.concatenate([np.concatenate(tiles[r * k : (r + 1) * k], axis=1) for r in range(k)])
    return np.repeat((grey * 255).astype(np.uint8)[..., None], 3, axis=2)


PHOTO_CALIB = ("astronaut", "camera", "coffee", "chelsea", "rocket", "motorcycle_left")
PHOTO_HELD_OUT = ("bus", "zidane", "motorcycle_right", "color")


def photo_calibration(m: RealModel, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    photos = [_image(n) for n in PHOTO_CALIB]
    faces = np.load(fetch(IMAGES["lfw_subset"], say=lambda _s: None))
    xs = [square(p, m) for p in photos] + [square(np.ascontiguousarray(p[:, ::-1]), m) for p in photos[:2]]
    xs += [square(face_mosaic(faces, rng, k), m) for k in (2, 3, 4, 5)]
    return np.concatenate(xs)


def held_out(m: RealModel) -> np.ndarray:
    """The held-out inputs of `m` from real pictures, (N, 3, H, W)."""
    if m.kind == "photo":
        return np.concatenate([square(_image(n), m) for n in PHOTO_HELD_OUT])
    page = _image("page", "L")
    if m.kind == "line":
        crops = [(page[y0:y1], k) for y0, y1 in text_lines(page) for k in (0, 2)]
    else:
        half = page.shape[0] // 2
        crops = [(c, k) for c in (page, page[: half + 20], page[half - 20 :]) for k in range(4)]
    return np.concatenate([prepare(np.rot90(c, k), m) for c, k in crops])
