"""Which image files prepare reads, with their class and split.

A source is a folder in ImageFolder's layout, `<class>/<images>`, or with a split level above
it, `train/<class>/...` and `val/<class>/...` (a `val/` folder fixes the validation split;
without one, prepare holds images out of each class); or a CSV or parquet table with a `path`
and a `label` column (and optionally `split`: train or val), its paths relative to the table's
folder. Classes are the training split's labels in sorted order: the class id of a label is
its position there, whatever order the files are listed in.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
TABLE_SUFFIXES = (".csv", ".parquet")
SPLIT_FOLDERS = ("train", "val")


@dataclass(frozen=True)
class Item:
    """One image file: its `label` (a class name) and `split` (train, val, or None: prepare
    decides)."""

    path: Path
    label: str
    split: str | None


@dataclass(frozen=True)
class Found:
    """What the sources hold: the images in a fixed order (by source, then path), the classes
    (sorted), and how many files were not images (skipped, counted)."""

    items: tuple[Item, ...]
    classes: tuple[str, ...]
    not_images: int

    @property
    def has_val(self) -> bool:
        """Whether the sources name a validation split themselves."""
        return any(item.split == "val" for item in self.items)


def find_images(sources: list[str]) -> Found:
    """The labelled images of `sources` (folders or tables, see the module docstring).

    Raises:
        ValueError: a source that does not exist or is neither a folder nor a .csv/.parquet
            table; a folder without class folders; a class folder without images; a table
            without `path` and `label` columns, or naming a file that does not exist; a
            validation label that is not a training class; no images at all.
    """
    items: list[Item] = []
    not_images = 0
    for source in sources:
        path = Path(source)
        if path.is_dir():
            found, skipped = folder_items(path)
            items += found
            not_images += skipped
        elif path.is_file() and path.suffix.lower() in TABLE_SUFFIXES:
            items += table_items(path)
        elif path.exists():
            raise ValueError(f"{path}: not a folder of class folders nor a .csv/.parquet table")
        else:
            raise ValueError(f"{path}: no such file or folder")
    if not items:
        raise ValueError(f"no images in {', '.join(sources)}")
    classes = tuple(sorted({item.label for item in items if item.split != "val"}))
    outside = sorted({item.label for item in items if item.label not in classes})
    if outside:
        raise ValueError(
            f"validation label(s) {', '.join(outside)} are not classes of the training images "
            f"({', '.join(classes)}); add training images of them or remove them"
        )
    return Found(tuple(items), classes, not_images)


def folder_items(root: Path) -> tuple[list[Item], int]:
    """The images under `root`'s class folders (with `train/`, `val/` split folders where it
    has a `train/`), and the count of other files there."""
    splits = [(root / name, name) for name in SPLIT_FOLDERS if (root / name).is_dir()]
    if not splits or splits[0][1] != "train":
        splits = [(root, None)]
    items, not_images = [], 0
    for folder, split in splits:
        class_folders = sorted(p for p in folder.iterdir() if p.is_dir() and not hidden(p))
        if not class_folders:
            raise ValueError(
                f"{folder} holds no class folders: lay the images out as <class>/<image> "
                "(or train/<class>/<image> and val/<class>/<image>)"
            )
        for class_folder in class_folders:
            files = sorted(p for p in class_folder.rglob("*") if p.is_file() and not hidden(p))
            images = [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
            if not images:
                raise ValueError(
                    f"class {class_folder.name!r} ({class_folder}) has no images "
                    f"({', '.join(IMAGE_SUFFIXES)}); add some or remove the folder"
                )
            not_images += len(files) - len(images)
            items += [Item(image, class_folder.name, split) for image in images]
    return items, not_images


def table_items(table: Path) -> list[Item]:
    """The rows of a CSV or parquet table of `path`, `label` (and `split`) columns."""
    if table.suffix.lower() == ".csv":
        with table.open(newline="", encoding="utf-8") as file:
            rows = list(csv.DictReader(file))
        columns = set(rows[0]) if rows else set()
    else:
        import pyarrow.parquet as pq

        data = pq.read_table(table)
        columns = set(data.column_names)
        rows = data.to_pylist()
    if not {"path", "label"} <= columns:
        raise ValueError(
            f"{table}: a table of images needs a `path` and a `label` column; it has "
            f"{', '.join(sorted(columns)) or 'none'}"
        )
    items = []
    for number, row in enumerate(rows, start=1):
        path = table.parent / str(row["path"])
        split = (row.get("split") or None) if "split" in columns else None
        if not path.is_file():
            raise ValueError(f"{table}, row {number}: {path} does not exist")
        if split not in (None, *SPLIT_FOLDERS):
            raise ValueError(f"{table}, row {number}: split must be train or val, got {split!r}")
        items.append(Item(path, str(row["label"]), split))
    return items


def hidden(path: Path) -> bool:
    """A dot file or folder (`.DS_Store`, `.ipynb_checkpoints`): never a class or an image."""
    return path.name.startswith(".")
