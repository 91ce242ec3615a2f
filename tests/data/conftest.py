"""Fixtures the data tests share."""
import numpy as np
import pytest
from PIL import Image


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """30 small JPEGs in 3 class folders."""
    folder = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    for i in range(30):
        (folder / f"class{i % 3}").mkdir(exist_ok=True)
        picture = rng.integers(0, 255, (26 + i % 5, 34, 3), dtype=np.uint8)
        Image.fromarray(picture).save(folder / f"class{i % 3}" / f"{i:03d}.jpg")
    return folder
