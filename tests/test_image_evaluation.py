"""`image_loader(..., training=False)`: every loader (Paddle and DALI, each with and without the
sample cache) yields float32 NCHW batches of the image resized to `resize` on its shorter side,
centre-cropped to `crop` and normalized as in training, that a conv program runs on.

The images are lossless PNGs, so decoding cannot differ. Where no resampling happens (shorter
side = `resize`) every loader feeds exactly the reference; where it does, DALI's resize and
PIL's are both the antialiased linear filter of the same ratio, and differ only in how they
round to uint8: one level, 1 / (255 std) after normalizing.
"""
import numpy as np
import paddle
import pytest
from PIL import Image

import fleetlite as fleet
from fleetlite.data import image_loader
from fleetlite.data.image_transforms import IMAGENET_MEAN, IMAGENET_STD

CROP, RESIZE, CLASSES, PER_CLASS, BATCH = 32, 40, 2, 3, 3
UNSCALED, SCALED = (40, 52), (48, 60)          # (height, width): 48 x 60 resizes by 5/6 to 40 x 50
LOADERS = {"paddle": ("paddle", []), "paddle cached": ("paddle", ["disk", "memory"]),
           "dali": ("dali", []), "dali cached": ("dali", ["disk", "memory"])}
STD = np.asarray(IMAGENET_STD, np.float32).reshape(3, 1, 1)
NORMALIZING_ATOL = 1e-5                        # float32 rounding of (x - mean) / std, computed in two ways


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{(height, width): a folder of CLASSES class folders of PER_CLASS smooth PNGs of that size}."""
    made = {}
    for height, width in (UNSCALED, SCALED):
        folder = tmp_path_factory.mktemp(f"png{height}x{width}")
        y, x = np.mgrid[0:height, 0:width]
        for i in range(CLASSES * PER_CLASS):
            picture = np.stack([x * 3 + i * 9, y * 4 + i * 13, x + y + i * 11], -1)     # below 256: no wrap
            (folder / f"class{i % CLASSES}").mkdir(exist_ok=True)
            Image.fromarray(picture.astype("uint8")).save(folder / f"class{i % CLASSES}" / f"{i}.png")
        made[(height, width)] = folder
    return made


def evaluation_batches(folder, name, cache_dir):
    """[(images, labels)] of one epoch of `image_loader(folder, training=False)` under LOADERS[name]."""
    loader, levels = LOADERS[name]
    if loader == "dali":
        pytest.importorskip("nvidia.dali", reason="the `test` extra installs nvidia-dali-cuda120; this checkout "
                                                  "lacks it")
    strategy = fleet.DistributedStrategy()
    strategy.data_configs = {"loader": loader, "cache_levels": levels, "cache_dir": str(cache_dir),
                             "memory_cache_MB": 1}
    batches = image_loader(folder, strategy, BATCH, crop=CROP, resize=RESIZE, training=False)
    epoch = [(images.copy(), labels.copy()) for images, labels in batches]
    if levels:
        batches.close()
        batches.dataset.memory.unlink()
    return epoch


def reference(path):
    """The centre CROP x CROP of a PNG whose shorter side is RESIZE, (x / 255 - mean) / std, CHW."""
    picture = np.asarray(Image.open(path).convert("RGB"), np.float32)
    top, left = (picture.shape[0] - CROP) // 2, (picture.shape[1] - CROP) // 2
    crop = picture[top:top + CROP, left:left + CROP].transpose(2, 0, 1) / 255
    return (crop - np.asarray(IMAGENET_MEAN, np.float32).reshape(3, 1, 1)) / STD


def conv_scores(batches):
    """A static conv program's output on each batch: the batches are what such a program takes."""
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        image = paddle.static.data("image", [None, 3, CROP, CROP], "float32")
        scores = paddle.mean(paddle.nn.Conv2D(3, 4, 3)(image), axis=[1, 2, 3])
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    return [exe.run(main, feed={"image": images}, fetch_list=[scores])[0] for images, _ in batches]


@pytest.mark.parametrize("name", sorted(LOADERS))
def test_evaluation_batches_are_the_normalized_centre_crop_in_nchw_and_feed_a_conv_program(name, folders, tmp_path):
    folder = folders[UNSCALED]
    batches = evaluation_batches(folder, name, tmp_path)
    assert [(images.dtype, images.shape, labels.dtype, labels.shape) for images, labels in batches] == \
        [(np.float32, (BATCH, 3, CROP, CROP), np.int64, (BATCH, 1))] * (CLASSES * PER_CLASS // BATCH)
    files = sorted(folder.glob("class*/*.png"))                  # the list order; evaluation does not shuffle
    expected = np.stack([reference(path) for path in files])
    np.testing.assert_allclose(np.concatenate([images for images, _ in batches]), expected, rtol=0,
                               atol=NORMALIZING_ATOL)
    assert np.concatenate([labels for _, labels in batches]).ravel().tolist() == \
        [int(path.parent.name[len("class"):]) for path in files]
    scores = conv_scores(batches)
    assert [s.shape for s in scores] == [(BATCH,)] * len(batches) and np.all(np.isfinite(np.concatenate(scores)))


def test_dali_resizes_for_evaluation_as_the_paddle_loader_does_within_one_level(folders, tmp_path):
    folder = folders[SCALED]
    feeds = {name: np.concatenate([images for images, _ in evaluation_batches(folder, name, tmp_path / name)])
             for name in LOADERS}
    paddle_feed = feeds.pop("paddle")
    np.testing.assert_allclose(feeds.pop("paddle cached"), paddle_feed, rtol=0, atol=NORMALIZING_ATOL)
    np.testing.assert_allclose(feeds.pop("dali cached"), paddle_feed, rtol=0, atol=NORMALIZING_ATOL)  # PIL's resize
    levels = np.abs(feeds.pop("dali") - paddle_feed) * 255 * STD                             # DALI's own resize
    assert levels.max() <= 1 + NORMALIZING_ATOL * 255, levels.max()
    assert levels.mean() < 0.5                # rounding differences, not a shifted crop or a different filter
