"""Images as the pages show them: at their natural size, with their names, sizes and labels,
drawn from the page's own connection.

Streamlit serves what ``st.image`` is given as bytes at ``/media/<hash>``, to anyone who
asks for that URL, signed in or not, until the session's next runs drop it; the hash is of
the bytes, so whoever holds a picture can ask whether it is on the server. Every private
image (thumbnails, reconstructions, grids) is therefore handed to ``st.image`` as a
``data:`` URL made by :func:`inline`: the bytes travel inside the signed-in session's own
websocket and no URL serves them.
"""

from __future__ import annotations

import base64
import contextlib
import io

from PIL import Image

from auditlib.data import LabelledImages
from auditlib.grids import wrapped_grid


def inline(image: bytes | Image.Image) -> str:
    """A PNG's bytes, or a picture (encoded as PNG), as a ``data:`` URL for ``st.image``."""
    if isinstance(image, Image.Image):
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        image = buffer.getvalue()
    if not image.startswith(b"\x89PNG"):
        raise ValueError("inline takes PNG bytes or a PIL image")
    return "data:image/png;base64," + base64.b64encode(image).decode("ascii")


def png_width(png: bytes) -> int:
    """The pixel width of a PNG: images are shown at their natural size, pixels sharp."""
    with Image.open(io.BytesIO(png)) as image:
        return image.width


# The widest a grid of images is drawn in the main area: a 1280 px window with the sidebar
# open leaves some 900 px; wider grids wrap into blocks (``auditlib.grids.wrapped_grid``).
GRID_WIDTH = 880


def show_grid(target, png: bytes, rows: int, caption: str | None = None) -> None:
    """A grid PNG of ``rows`` rows of images in ``target`` (``st`` or a container), wrapped
    into blocks that fit the main area (issue 52: 16 images in one 4,210 px row ran off the
    page), at its natural size, scaled down only where one block is still wider."""
    with contextlib.suppress(ValueError):  # not a grid of square cells: drawn as it is
        png = wrapped_grid(png, rows, GRID_WIDTH)
    target.image(inline(png), width=min(png_width(png), GRID_WIDTH), caption=caption)


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
