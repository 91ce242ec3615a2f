"""Write a dataset as WebDataset tar shards with their indexes.

    python -m fleetlite.data.write_records OUT_DIR --digits [--shards 4]
    python -m fleetlite.data.write_records OUT_DIR --images FOLDER [--shards 4]

--digits: scikit-learn's embedded 8x8 digits, each sample `<key>.npy` (uint8 8x8, values 0-16)
and `<key>.cls`. --images: a folder with one sub-folder per class; each image keeps its bytes
and extension, `<key>.cls` is the class's position among the sorted sub-folder names (the
names are written to OUT_DIR/classes.json). Samples keep the dataset's order and are split into
contiguous shards `data-00000.tar`, ... of equal size (+-1).
"""
import argparse
import io
import json
import os
import sys
import tarfile

import numpy as np

from fleetlite.data.records import RecordIndex
from fleetlite.errors import DataError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def digits_samples():
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise DataError("--digits reads scikit-learn's embedded digits, and scikit-learn is not installed: "
                        "pip install 'fleetlite[cpu]' (or 'fleetlite[examples]' beside a GPU Paddle)") from None

    digits = load_digits()
    for i, (image, label) in enumerate(zip(digits.images, digits.target)):
        array = io.BytesIO()
        np.save(array, image.astype("uint8"))
        yield f"{i:06d}", {"npy": array.getvalue(), "cls": str(int(label)).encode()}


def image_folder_samples(folder, classes_out):
    classes = sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d)))
    if not classes:
        raise DataError(f"{folder} has no class sub-folders (expected FOLDER/<class>/<image>)")
    with open(classes_out, "w") as out:
        json.dump(classes, out)
    key = 0
    for label, name in enumerate(classes):
        for file in sorted(os.listdir(os.path.join(folder, name))):
            ext = os.path.splitext(file)[1].lower()
            if ext in IMAGE_EXTENSIONS:
                with open(os.path.join(folder, name, file), "rb") as image:
                    yield f"{key:06d}", {ext[1:]: image.read(), "cls": str(label).encode()}
                key += 1


def write_shards(samples, out_dir, shards, prefix="data"):
    """Write (key, {ext: bytes}) samples into `shards` tar files and index each; returns the paths."""
    samples = list(samples)
    if not samples:
        raise DataError("no samples to write")
    if shards < 1:
        raise DataError(f"--shards {shards}: write at least one shard")
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for shard in range(shards):
        path = os.path.join(out_dir, f"{prefix}-{shard:05d}.tar")
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for key, members in samples[shard * len(samples) // shards:(shard + 1) * len(samples) // shards]:
                for ext, payload in members.items():
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size, info.mode = len(payload), 0o444
                    tar.addfile(info, io.BytesIO(payload))
        RecordIndex.load(path)
        paths.append(path)
    return paths


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--digits", action="store_true", help="scikit-learn's embedded digits")
    source.add_argument("--images", metavar="FOLDER", help="a folder of class sub-folders of images")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--prefix", default="data")
    args = parser.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    samples = (digits_samples() if args.digits
               else image_folder_samples(args.images, os.path.join(args.out_dir, "classes.json")))
    try:
        paths = write_shards(samples, args.out_dir, args.shards, args.prefix)
    except DataError as error:
        print(f"write_records: error: {error}", file=sys.stderr)
        return 2
    for path in paths:
        print(f"{path}: {len(RecordIndex.load(path))} samples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
