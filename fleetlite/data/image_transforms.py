"""Image classification transforms for the Paddle path, split where the cache splits them:
`decode_image` is deterministic (its output is what the memory level keeps); `augment_image`
is the random part, drawn from a generator per (seed, epoch, sample), so a cached run feeds
exactly what an uncached one does.

The augmentations are DALI's `random_resized_crop` + `crop_mirror_normalize` in PIL/numpy:
area fraction in [0.08, 1], aspect ratio in [3/4, 4/3] (log-uniform), 10 tries then a centre
crop, a horizontal flip with probability 1/2, CHW float32 normalized by ImageNet's mean and std.
Evaluation (`centre_crop_image`) is DALI's evaluation pipeline the same way: the centre crop of
the decoded image, normalized as in training, so both loaders feed the same layout and values.
"""
import io
import math

import numpy as np

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def decode_image(data, size):
    """JPEG/PNG bytes -> uint8 HWC RGB, shorter side resized to `size`, centre `size` x `size`."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        image = image.convert("RGB")
        width, height = image.size
        scale = size / min(width, height)
        if scale != 1:
            image = image.resize((max(size, round(width * scale)), max(size, round(height * scale))),
                                 Image.BILINEAR)
        left, top = (image.width - size) // 2, (image.height - size) // 2
        return np.asarray(image.crop((left, top, left + size, top + size)))


def random_crop_box(width, height, rng, area=(0.08, 1.0), ratio=(3 / 4, 4 / 3), tries=10):
    """(left, top, crop width, crop height) of a random resized crop."""
    for _ in range(tries):
        target = width * height * rng.uniform(*area)
        aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1)), w, h
    side = min(width, height)
    return (width - side) // 2, (height - side) // 2, side, side


def augment_image(image, rng, crop, mean=IMAGENET_MEAN, std=IMAGENET_STD):
    """uint8 HWC -> float32 CHW: random resized crop to `crop`, random flip, normalize."""
    from PIL import Image

    picture = Image.fromarray(np.asarray(image))
    left, top, w, h = random_crop_box(picture.width, picture.height, rng)
    patch = picture.resize((crop, crop), Image.BILINEAR, box=(left, top, left + w, top + h))
    if rng.random() < 0.5:
        patch = patch.transpose(Image.FLIP_LEFT_RIGHT)
    return normalized_chw(np.asarray(patch), mean, std)


def centre_crop_image(image, rng, crop, mean=IMAGENET_MEAN, std=IMAGENET_STD):
    """uint8 HWC -> float32 CHW: the evaluation transform, a centre `crop` x `crop` normalized as
    in training. Deterministic: it takes `rng` only to fit CachedSamples' augment slot."""
    pixels = np.asarray(image)
    top, left = (pixels.shape[0] - crop) // 2, (pixels.shape[1] - crop) // 2
    return normalized_chw(pixels[top:top + crop, left:left + crop], mean, std)


def normalized_chw(pixels, mean=IMAGENET_MEAN, std=IMAGENET_STD):
    """uint8 HWC -> float32 CHW, (x / 255 - mean) / std per channel."""
    scale = 1 / (255 * np.asarray(std, np.float32))
    shift = -np.asarray(mean, np.float32) / np.asarray(std, np.float32)
    out = np.empty((3, *pixels.shape[:2]), np.float32)
    for channel in range(3):     # (x / 255 - mean) / std as one multiply-add, written straight into CHW
        np.multiply(pixels[:, :, channel], scale[channel], out=out[channel], casting="unsafe")
        out[channel] += shift[channel]
    return out
