"""The private batch: decoding and validating user images, labels and bundled sample sets."""

from auditlib.data.decode import ALLOWED_FORMATS, DEFAULT_LIMITS, ImageLimits, decode_image
from auditlib.data.images import (
    LabelledImages,
    images_zip,
    load_image_folder,
    load_image_uploads,
    load_zip,
    write_image_folder,
)
from auditlib.data.labels import assign_labels, check_labels_fit, parse_labels_csv
from auditlib.data.model_input import content_hashes, to_model_batch
from auditlib.data.normalization import Normalization
from auditlib.data.samples import (
    DEFAULT_SAMPLE_SET,
    SAMPLE_SETS,
    SampleSetInfo,
    decode_ahead,
    load_sample_set,
    load_training_pool,
    sample_set_size,
)

__all__ = [
    "ALLOWED_FORMATS",
    "DEFAULT_LIMITS",
    "DEFAULT_SAMPLE_SET",
    "SAMPLE_SETS",
    "ImageLimits",
    "LabelledImages",
    "Normalization",
    "SampleSetInfo",
    "assign_labels",
    "check_labels_fit",
    "content_hashes",
    "decode_ahead",
    "decode_image",
    "images_zip",
    "load_image_folder",
    "load_image_uploads",
    "load_sample_set",
    "load_training_pool",
    "load_zip",
    "parse_labels_csv",
    "sample_set_size",
    "to_model_batch",
    "write_image_folder",
]
