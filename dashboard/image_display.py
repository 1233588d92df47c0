"""Images as the pages show them: at their natural size, with their names, sizes and labels."""

from __future__ import annotations

import io

from PIL import Image

from auditlib.data import LabelledImages


def png_width(png: bytes) -> int:
    """The pixel width of a PNG: images are shown at their natural size, pixels sharp."""
    with Image.open(io.BytesIO(png)) as image:
        return image.width


def image_captions(images: LabelledImages) -> list[str]:
    """'name (WxH) · label' for each image: the detected size before any resizing."""
    captions = []
    for i, name in enumerate(images.names):
        h, w = images.images[i].shape[:2]
        label = ""
        if images.labels is not None:
            label_id = images.labels[i]
            classes = images.class_names
            label = f" · {classes[label_id] if classes and label_id < len(classes) else label_id}"
        captions.append(f"{name} ({w}x{h}){label}")
    return captions
