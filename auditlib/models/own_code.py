"""A model class of the user's own code: ``path/to/file.py:ClassName`` with its constructor
arguments (a JSON object), as a federation's client builds it (Flower's quickstart ``Net``).

Importing the file runs its code, so a class is built only where that was allowed:

- in a process of its own that exists for it (``engine.isolation``'s child, started only
  after the user's trust flag, ``--i-trust-this-file``), which calls :func:`allow_own_code`;
- for the duration of :func:`own_code_allowed`, by a caller that runs in the user's own
  process already (the Flower recorder inside the federation the user wrote).

Everywhere else (the command line's own process, the dashboard, a Ray worker) building one
is refused in one line saying why. The file's folder is put first on ``sys.path`` while it
is imported, so its sibling modules import as they do for the client.

The dashboard, where an admin allows trusted code (``access.trusted_code``), takes the file
as an upload: :func:`check_own_file` reads it as text and parses it (``ast``, nothing runs),
and the isolated child writes it to a private folder and names it with :func:`provide_file`
in place of the path training.json gives, which is the client's and not the server's.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib.util
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch import nn

from auditlib.errors import AuditInputError

SOURCE = "own code"
_NAME = re.compile(r"^(?P<path>[^:\s][^:]*\.py):(?P<cls>[A-Za-z_][A-Za-z0-9_]*)$")
_allowed = False  # set in a process that exists to run the user's code
_allowed_depth = 0  # inside own_code_allowed()
MAX_ARGS_CHARS = 2_000
MAX_FILE_BYTES = 256 * 1024  # an uploaded class file: one module of source, not a package
_provided: dict[str, Path] = {}  # the path training.json names -> where the upload was written

REFUSAL = (
    "runs the code of {file} to build the model; it is built only in a process of its own "
    "after you accept that: add --i-trust-this-file (the dashboard builds it only where an "
    "admin allows trusted code)"
)


def is_own_class(name: object) -> bool:
    """Whether ``name`` names a class in a Python file (``path/to/file.py:ClassName``)."""
    return isinstance(name, str) and _NAME.match(name.strip()) is not None


def parts(name: str) -> tuple[str, str]:
    """(the file's path, the class name) of ``path/to/file.py:ClassName``."""
    match = _NAME.match(name.strip())
    if match is None:
        raise AuditInputError(f"{name!r} is not path/to/file.py:ClassName")
    return match["path"], match["cls"]


def canonical_args(args: object) -> str | None:
    """The constructor arguments as canonical JSON text (an object), None for none; refused
    where they are not a JSON object of plain values."""
    if args is None:
        return None
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError as exc:
            raise AuditInputError(
                f"the model's constructor arguments are not JSON ({exc}); expected an object "
                'such as {"num_classes": 10}'
            ) from None
    if not isinstance(args, dict) or not all(isinstance(k, str) for k in args):
        raise AuditInputError(
            f"the model's constructor arguments must be a JSON object of named values, got "
            f'{args!r:.60}; expected e.g. {{"num_classes": 10}}'
        )
    try:
        text = json.dumps(args, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise AuditInputError(
            f"the model's constructor arguments hold a value JSON cannot (exc: {exc})"
        ) from None
    if len(text) > MAX_ARGS_CHARS:
        raise AuditInputError(
            f"the model's constructor arguments are {len(text):,} characters of JSON; expected "
            f"at most {MAX_ARGS_CHARS:,}"
        )
    return None if args == {} else text


def allow_own_code() -> None:
    """Allow building the user's own classes in this process, for good: only a process that
    exists to run them (the isolated audit worker) calls this."""
    global _allowed
    _allowed = True


@contextlib.contextmanager
def own_code_allowed() -> Iterator[None]:
    """Allow building the user's own classes for the block: for a caller already inside the
    user's own process (the Flower recorder in the user's federation)."""
    global _allowed_depth
    _allowed_depth += 1
    try:
        yield
    finally:
        _allowed_depth -= 1


def allowed() -> bool:
    return _allowed or _allowed_depth > 0


def provide_file(named: str, path: Path) -> None:
    """Build the class of the file ``named`` (the path in ``path/to/file.py:ClassName``) from
    ``path``: the uploaded copy the isolated child wrote for it."""
    _provided[named] = path


def check_own_file(data: bytes, upload_name: str, name: str) -> None:
    """Refuse, in one line, an uploaded file that cannot be the one ``name``
    (``path/to/file.py:ClassName``) names: another file name, too large, not UTF-8 text, not
    Python, or without a top-level class of that name. The file is parsed, never run."""
    file, cls = parts(name)
    expected = Path(file).name
    uploaded = Path(upload_name.replace("\\", "/")).name
    if uploaded != expected:
        raise AuditInputError(
            f"the uploaded file is {uploaded}; training.json names the model {name}, so "
            f"expected {expected}"
        )
    if len(data) > MAX_FILE_BYTES:
        raise AuditInputError(
            f"{uploaded} is {len(data):,} bytes; a model class's file is at most "
            f"{MAX_FILE_BYTES:,} bytes"
        )
    try:
        tree = ast.parse(data.decode("utf-8"), filename=uploaded)
    except UnicodeDecodeError:
        raise AuditInputError(f"{uploaded} is not UTF-8 text; expected Python source") from None
    except SyntaxError as exc:
        raise AuditInputError(
            f"{uploaded} is not valid Python (line {exc.lineno}: {exc.msg}); expected the file "
            "that defines the client's model class"
        ) from None
    classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef)]
    if cls not in classes:
        found = f"its classes are {', '.join(classes)}" if classes else "it defines no class"
        raise AuditInputError(
            f"{uploaded} has no top-level class {cls} ({found}); expected the file that "
            f"defines {cls}"
        )


def _module_of(path: Path) -> Any:
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    name = f"auditlib_own_model_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise AuditInputError(f"{path} cannot be imported as Python; expected a .py file")
    module = importlib.util.module_from_spec(spec)
    folder = str(path.parent)
    sys.path.insert(0, folder)  # the file's sibling modules import as for the client
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's code may raise anything while it is imported
        del sys.modules[name]
        raise AuditInputError(
            f"importing {path} failed ({type(exc).__name__}: {str(exc)[:200]}); expected the "
            "file that defines the client's model class, importable in this environment"
        ) from None
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)
    return module


def construct_own(name: str, args: str | None) -> nn.Module:
    """An instance of the class ``name`` names, built with ``args`` (canonical JSON); refused
    unless :func:`allowed` here, or where the file, the class or its construction fails."""
    file, cls = parts(name)
    if not allowed():
        raise AuditInputError(f"the model {name} " + REFUSAL.format(file=file))
    path = _provided.get(file) or Path(file).expanduser().resolve()
    if not path.is_file():
        raise AuditInputError(
            f"the model's file {file} was not found (from {Path.cwd()}); expected the .py file "
            "that defines the client's model, relative to the folder the audit runs in"
        )
    module = _module_of(path)
    found = getattr(module, cls, None)
    if not (isinstance(found, type) and issubclass(found, nn.Module)):
        kind = "nothing" if found is None else type(found).__name__
        raise AuditInputError(
            f"{file} has {kind} named {cls}; expected a torch.nn.Module subclass (the client's "
            "model)"
        )
    kwargs = json.loads(args) if args else {}
    try:
        return found(**kwargs)
    except Exception as exc:  # the user's constructor may raise anything
        raise AuditInputError(
            f"{cls}(**{kwargs}) failed ({type(exc).__name__}: {str(exc)[:200]}); expected the "
            "constructor arguments the client builds it with (training.json's model_args, "
            "--model-args)"
        ) from None
