"""State that survives a page switch, a refresh, a server restart and a shared link.

- Form fields keep their value across pages (:func:`persist`).
- The URL carries what a refresh must not lose: the ids of the open run, comparison and
  sweep and of the uploaded images and weights (``URL_IDS``), and every Setup choice that
  differs from its default (``SETUP_FIELDS``: architecture, classes, input size, ...), so
  ``?weights=...`` never arrives without the architecture those weights were checked for.

On the first run of a session (a refresh, a shared link, a tab reconnecting to a restarted
server) the URL's values are adopted, each checked; after that the session is
authoritative and the URL follows it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import streamlit as st

from auditlib.data import DEFAULT_LIMITS, SAMPLE_SETS
from auditlib.errors import AuditInputError
from auditlib.models import ARCHITECTURES
from auditlib.models.architectures import ACTIVATIONS as MODEL_ACTIVATIONS
from auditlib.models.architectures import STEMS as MODEL_STEMS
from auditlib.models.registry import (
    CHANNELS,
    INITS,
    MAX_CLASSES,
    MAX_SIDE,
    MIN_SIDE,
    architecture_info,
)
from auditlib.models.zoo import PREFIX as TORCHVISION_PREFIX
from auditlib.models.zoo import torchvision_names
from dashboard.plain import literal

# Ids kept in the URL so that a refresh or a shared link reopens the same state.
# Each is a lowercase hex id of a fixed length: run and batch ids, and assets' sha256.
URL_IDS = {
    "run": 32,
    "comparison": 32,
    "sweep": 32,
    "sample": 32,  # an audit of the sample (a batch of updates)
    "images": 64,
    "weights": 64,
    "observed": 64,  # an observed update's bundle, uploaded (auditlib.observed.upload)
    "code": 64,  # the uploaded file of its model class of the client's own code
}
_HEX = re.compile(r"[0-9a-f]+")


def is_url_id(key: str, value: str) -> bool:
    """Whether ``value`` is a well-formed id for the URL key ``key``."""
    return len(value) == URL_IDS[key] and _HEX.fullmatch(value) is not None


# The model's choices come from ``auditlib.models`` (what ModelSpec accepts); the Setup page
# adds one "let the library decide" entry where the spec takes None.
CLASSES_RANGE = (2, MAX_CLASSES)
INPUT_SIZE_RANGE = (MIN_SIDE, MAX_SIDE)  # pixels, height = width
SEED_RANGE = (0, 2**31 - 1)
# Images drawn from a bundled sample set, and of an upload in one batch: what the library
# accepts (README's malicious-server runs take 16 photographs).
MAX_SAMPLE_COUNT = DEFAULT_LIMITS.max_images
MAX_UPLOAD_BATCH = DEFAULT_LIMITS.max_images
ARCHITECTURE_DEFAULT = "architecture default"  # activation None: the architecture's own
AUTOMATIC_STEM = "automatic"  # stem None: by input size (ResNets only)
ACTIVATIONS = (ARCHITECTURE_DEFAULT, *MODEL_ACTIVATIONS)
STEMS = (AUTOMATIC_STEM, *MODEL_STEMS)
# A bundled sample set, an upload (an images asset), or none: only an observed update is
# audited without the client's images (its reconstructions then shown, not scored).
SOURCES = ("samples", "upload", "none")
MAX_NORMALIZATION_CHARS = 200


@dataclasses.dataclass(frozen=True)
class SetupField:
    """One Setup choice: its session key, its URL name, its default and how a URL value is
    read (``parse`` raises ValueError with what was expected)."""

    key: str
    url: str
    default: Any
    parse: Callable[[str], Any]


def _choice(options) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in options:
            raise ValueError(f"one of {', '.join(sorted(options))}")
        return text

    return parse


def architecture_options() -> list[str]:
    """Every architecture the Setup page offers: the built-ins (sorted), then each
    torchvision classification model as ``torchvision:NAME`` (sorted)."""
    return sorted(ARCHITECTURES) + [TORCHVISION_PREFIX + n for n in torchvision_names()]


def is_torchvision(architecture: str) -> bool:
    return architecture.startswith(TORCHVISION_PREFIX)


def _architecture(text: str) -> str:
    """A built-in name or ``torchvision:NAME`` (normalised by the library)."""
    if text in ARCHITECTURES:
        return text
    if is_torchvision(text.strip().lower()):
        try:
            return architecture_info(text).name
        except AuditInputError:
            pass
    raise ValueError(f"one of {', '.join(sorted(ARCHITECTURES))}, or torchvision:NAME")


def _integer(low: int, high: int, allowed: tuple[int, ...] | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        expected = (
            f"one of {', '.join(map(str, allowed))}" if allowed else f"an integer {low}-{high}"
        )
        try:
            value = int(text)
        except ValueError:
            raise ValueError(expected) from None
        if not low <= value <= high or (allowed and value not in allowed):
            raise ValueError(expected)
        return value

    return parse


def _text(max_chars: int) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if len(text) > max_chars:
            raise ValueError(f"at most {max_chars} characters")
        return text

    return parse


SETUP_FIELDS = (
    SetupField("architecture", "arch", "lenet", _architecture),
    SetupField("num_classes", "classes", 10, _integer(*CLASSES_RANGE)),
    SetupField("input_size", "size", 32, _integer(*INPUT_SIZE_RANGE)),
    SetupField(
        "channels",
        "channels",
        CHANNELS[0],
        _integer(min(CHANNELS), max(CHANNELS), allowed=CHANNELS),
    ),
    # session key "weights_init": streamlit-authenticator's cookie component owns "init"
    SetupField("weights_init", "init", "uniform", _choice(INITS)),
    SetupField("activation", "activation", ARCHITECTURE_DEFAULT, _choice(ACTIVATIONS)),
    SetupField("stem", "stem", AUTOMATIC_STEM, _choice(STEMS)),
    SetupField("source", "source", "samples", _choice(SOURCES)),
    SetupField("sample_set", "samples", "photographs", _choice(SAMPLE_SETS)),
    SetupField("count", "count", 1, _integer(1, MAX_SAMPLE_COUNT)),
    # Checked by the library when the setup is read (setup_problems), like a typed value.
    SetupField("normalization", "norm", "none", _text(MAX_NORMALIZATION_CHARS)),
    SetupField("seed", "seed", 0, _integer(*SEED_RANGE)),
)
# Default value of every persisted form field of the Setup page.
SETUP_DEFAULTS: dict[str, Any] = {f.key: f.default for f in SETUP_FIELDS}
UPLOAD_COUNT_URL = "batch"  # images of the upload in the batch
_upload_count = _integer(1, MAX_UPLOAD_BATCH)


def upload_count_key(sha: str) -> str:
    """The session key of how many images of upload ``sha`` the batch takes."""
    return f"upload_count.{sha[:16]}"


def persist(key: str, default: Any) -> str:
    """A widget key whose value is ``default`` until the user changes it; returns ``key``.

    The widget is created with ``persist_state="session"`` (its value then survives page
    switches) and without a value argument: its value comes from the session state.
    """
    if key not in st.session_state:
        st.session_state[key] = default
    else:
        # Written back before the widget is created, so a widget first drawn on this page
        # takes the value chosen on another page instead of its element default.
        st.session_state[key] = st.session_state[key]
    return key


def _adopt_url() -> list[str]:
    """Take the URL's ids and Setup choices into the session; the values refused, in words."""
    state, params = st.session_state, st.query_params
    refused: list[str] = []
    for key, digits in URL_IDS.items():
        value = params.get(key)
        if value and is_url_id(key, value):
            state[key] = value
        elif value:
            refused.append(
                f"{literal(f'{key}={value}', 40)} (expected {digits} lowercase hex digits)"
            )
    for field in SETUP_FIELDS:
        value = params.get(field.url)
        if value is None:
            continue
        try:
            state[field.key] = field.parse(value)
        except ValueError as exc:
            refused.append(f"{literal(f'{field.url}={value}', 40)} (expected {exc})")
    if state.get("images"):
        value = params.get(UPLOAD_COUNT_URL)
        if value is not None:
            try:
                state[upload_count_key(state["images"])] = _upload_count(value)
            except ValueError as exc:
                refused.append(f"{literal(f'{UPLOAD_COUNT_URL}={value}', 40)} (expected {exc})")
        if params.get("source") is None:
            state["source"] = "upload"  # a link from before the source was in the URL
    return refused


def url_state() -> dict[str, str]:
    """What the URL holds for this session, as query parameters (also for
    ``st.switch_page(..., query_params=...)``): the ids that are set and the Setup choices
    that are not defaults."""
    state = st.session_state
    wanted: dict[str, str] = {}
    for key in URL_IDS:
        if state.get(key):
            wanted[key] = str(state[key])
    for field in SETUP_FIELDS:
        value = state.get(field.key, field.default)
        if value != field.default:
            wanted[field.url] = str(value)
    images = state.get("images")
    if images and state.get(upload_count_key(images)) is not None:
        wanted[UPLOAD_COUNT_URL] = str(state[upload_count_key(images)])
    return wanted


def _write_url() -> None:
    """The URL follows the session."""
    params = st.query_params
    wanted = url_state()
    names = (*URL_IDS, *(f.url for f in SETUP_FIELDS), UPLOAD_COUNT_URL)
    for name in names:
        if name in wanted:
            if params.get(name) != wanted[name]:
                params[name] = wanted[name]
        elif name in params:
            del params[name]


def sync_url_state() -> None:
    """The URL's state into a new session (once), then the session's state into the URL.

    Values in a link that are not valid are left out with a warning that says what was
    expected; the rest of the link still opens.
    """
    if not st.session_state.get("_url_loaded"):
        refused = _adopt_url()
        st.session_state["_url_loaded"] = True
        if refused:
            st.warning("This link's " + "; ".join(refused) + " was not used.")
    _write_url()


def set_url_state(key: str, value: str | None) -> None:
    """Set (or, with None, clear) one of the URL ids in the session and the URL."""
    if value:
        st.session_state[key] = value
        st.query_params[key] = value
    else:
        st.session_state.pop(key, None)
        if key in st.query_params:
            del st.query_params[key]
