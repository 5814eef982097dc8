"""A keyed, atomic, safe-to-load cache for expensive artifacts (trained zoos, posterior samples, flows).

Key = an explicit artifact name (``"zoo/digits"``, not the module path, so code can move without
discarding artifacts) + arguments + scale + version. Values are tensors, numbers, strings, ``None`` and
lists / tuples / dicts of those; they are written with ``torch.save`` to a temporary file and renamed
into place (atomic), and read with ``torch.load(weights_only=True)``, which never executes code.
A corrupt or mismatched entry is recomputed with a warning. The directory is ``WSBOOK_CACHE_DIR``
(default: the user cache directory); ``WSBOOK_CACHE=off`` disables reading and writing.

Several processes may share one directory (the book builds its chapters two at a time): a process that
is about to compute an entry holds an exclusive lock on ``.<entry>.lock`` meanwhile, and another process
that needs the same entry waits for it and then reads it instead of computing it a second time.

Strict mode: ``WSBOOK_CACHE_STRICT`` holds comma-separated prefixes of artifact names (``flows/``); a cached
function whose name starts with one of them reads its entry as always, but where the entry is missing it
raises :class:`StrictMiss` (naming the entry) instead of computing it. The chapters run that way in the
tests, after ``python -m wsbook``, so a training the command line does not precompute fails loudly.

Every computed entry appends its wall-clock seconds to ``computed.jsonl`` in the cache directory
(:func:`compute_log`; ``python -m wsbook --timings`` sums it by artifact): a cold build says where its time went.
"""
from __future__ import annotations

import contextlib
import functools
import fcntl
import hashlib
import inspect
import json
import math
import os
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from wsbook import config, distributed

_ALLOWED = (torch.Tensor, int, float, str, bool, type(None))
_NAME = re.compile(r"[a-z0-9_]+(/[a-z0-9_]+)*")
_REGISTRY: dict[str, str] = {}   # artifact name -> qualified name of the function that owns it
_PROBING = False                 # inside probe(): a missing entry raises MissingEntry instead of computing
_NESTED: list[float] = []        # seconds spent computing inner entries, one slot per entry being computed
#: the file in the cache directory to which every computed entry appends a line (see :func:`compute_log`)
COMPUTE_LOG = "computed.jsonl"


class MissingEntry(LookupError):
    """Raised inside :func:`probe` by a cached function whose entry is not in the cache."""


class StrictMiss(MissingEntry):
    """Raised in strict mode (``WSBOOK_CACHE_STRICT``, :func:`strict_prefixes`) by a cached function whose
    name matches a strict prefix and whose entry is not in the cache: it would have been computed."""


STRICT_ENV = "WSBOOK_CACHE_STRICT"


def strict_prefixes() -> tuple[str, ...]:
    """The artifact-name prefixes of ``WSBOOK_CACHE_STRICT`` (comma-separated; blanks ignored): cached
    functions whose name starts with one of them never compute, a missing entry raises :class:`StrictMiss`."""
    return tuple(p.strip() for p in os.environ.get(STRICT_ENV, "").split(",") if p.strip())


def is_strict(name: str) -> bool:
    """Whether the artifact ``name`` is under strict mode now (see :func:`strict_prefixes`)."""
    return any(name.startswith(p) for p in strict_prefixes())


@contextlib.contextmanager
def probe() -> Iterator[None]:
    """Within this block cached functions never compute: a present entry is read (memory-mapped, so a
    large one costs nothing until used) and a missing one raises :class:`MissingEntry`. Running an
    artifact's code inside it tells whether everything it needs is cached (``python -m wsbook --list``)."""
    global _PROBING
    before, _PROBING = _PROBING, True
    try:
        yield
    finally:
        _PROBING = before


def cache_dir() -> Path:
    """Where entries live: ``WSBOOK_CACHE_DIR`` or the platform's user cache directory."""
    env = os.environ.get("WSBOOK_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("wsbook"))


def enabled() -> bool:
    return os.environ.get("WSBOOK_CACHE", "on").strip().lower() not in ("off", "0", "false", "no")


def _tensor_digest(value: torch.Tensor) -> str:
    """Hash of a tensor's raw bytes (any dtype, bfloat16 and bool included; no NumPy round trip)."""
    flat = value.detach().cpu().contiguous().reshape(-1)
    return hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


#: first character of the keys that tag a value which is not a plain dict (``{"$float": "nan"}``); a plain dict's
#: keys that begin with it are escaped by doubling it, so no dict argument can produce a tag
_TAG = "$"


def _dict_key(key: Any) -> str:
    key = str(key)
    return _TAG + key if key.startswith(_TAG) else key


def _canonical(value: Any) -> Any:
    """A JSON-able description of an argument, stable across runs (tensors by content hash).

    A non-finite float becomes a tagged string, ``{"$float": "nan"}`` (``"inf"``, ``"-inf"``): ``nan != nan``,
    so a raw NaN in the stored description would never match the requested one again. A dict key that
    begins with ``$`` gets a second one (the argument ``{"$float": "nan"}`` is described as
    ``{"$$float": "nan"}``), so no dict shares a description with a float. Every other argument (finite
    floats, dicts without ``$`` keys, tensors, dataclasses) is described as before the tag existed, so
    their entries stay valid.
    """
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided:
            raise TypeError(f"cannot build a cache key from a {value.layout} tensor; pass a dense tensor")
        return {"tensor": list(value.shape), "dtype": str(value.dtype), "sha": _tensor_digest(value)}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, dict):
        return {_dict_key(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, float) and not math.isfinite(value):
        return {_TAG + "float": repr(value)}
    if isinstance(value, (int, float, str, bool, type(None))):
        return value
    if hasattr(value, "__dataclass_fields__"):
        fields = value.__dataclass_fields__
        return {type(value).__name__: _canonical({k: getattr(value, k) for k, f in fields.items()
                                                  if not k.startswith("_") and not _at_keyless_default(value, f)})}
    if isinstance(value, torch.device):
        return str(value)
    raise TypeError(f"cannot build a cache key from an argument of type {type(value).__name__}")


#: the metadata key of a dataclass field that is left out of cache keys while it holds its default:
#: ``field(default=..., metadata={KEYLESS_DEFAULT: True})``. A setting added to a settings dataclass that way
#: keeps every entry computed before it existed valid (their key is the same), and keys the new values only.
KEYLESS_DEFAULT = "cache_key_omits_default"


def _at_keyless_default(value: Any, f: Any) -> bool:
    return bool(f.metadata.get(KEYLESS_DEFAULT)) and getattr(value, f.name) == f.default


_FRAME = "$frame"   # the tag of an encoded DataFrame (a dict key no other cached value uses)


def _encode_frames(value: Any) -> Any:
    """``value`` with every pandas DataFrame in it (attrs included) as plain lists and dicts, so that cached
    functions may return tables and entries still load with ``weights_only``."""
    pd = sys.modules.get("pandas")
    if pd is not None and isinstance(value, pd.DataFrame):
        kinds = {str(t) for t in value.dtypes if t.kind not in "fiubO"}
        if kinds:
            raise TypeError(f"cannot cache a DataFrame with columns of dtype {sorted(kinds)}")
        return {_FRAME: {"columns": value.columns.tolist(), "column_names": list(value.columns.names),
                         "index": value.index.tolist(), "index_names": list(value.index.names),
                         "multi": [isinstance(value.columns, pd.MultiIndex), isinstance(value.index, pd.MultiIndex)],
                         "dtypes": [str(t) for t in value.dtypes],
                         "data": [value.iloc[:, i].to_numpy(object).tolist() for i in range(value.shape[1])],
                         "attrs": _encode_frames(dict(value.attrs))}}
    if isinstance(value, dict):
        return {k: _encode_frames(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_encode_frames(v) for v in value)
    return value


def _decode_frames(value: Any) -> Any:
    """The inverse of :func:`_encode_frames`."""
    if isinstance(value, dict) and set(value) == {_FRAME}:
        import pandas as pd

        f = value[_FRAME]

        def index(values, names, multi):
            return (pd.MultiIndex.from_tuples(values, names=names) if multi
                    else pd.Index(values, name=names[0], tupleize_cols=False))

        columns = enumerate(zip(f["data"], f["dtypes"]))
        frame = pd.DataFrame({i: pd.Series(col, dtype=dtype) for i, (col, dtype) in columns},
                             index=pd.RangeIndex(len(f["index"])))
        frame.columns = index(f["columns"], f["column_names"], f["multi"][0])
        frame.index = index(f["index"], f["index_names"], f["multi"][1])
        frame.attrs.update(_decode_frames(f["attrs"]))
        return frame
    if isinstance(value, dict):
        return {k: _decode_frames(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode_frames(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_decode_frames(v) for v in value)
    return value


def _check_value(value: Any, where: str = "result") -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"cached {where} has a non-string key {k!r}")
            _check_value(v, f"{where}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_value(v, f"{where}[{i}]")
    elif not isinstance(value, _ALLOWED):
        raise TypeError(f"cached {where} is a {type(value).__name__}; only tensors, numbers, strings, None "
                        "and lists/dicts of them can be cached safely")


def make_key(name: str, arguments: dict[str, Any], version: str) -> tuple[str, dict[str, Any]]:
    """The entry's hash and the description it was made from."""
    description = {"name": name, "args": _canonical(arguments), "scale": config.scale(), "version": version}
    blob = json.dumps(description, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:24], description


def _path(key: str, name: str) -> Path:
    """``<cache dir>/<name>-<key>.pt``; an artifact name's ``/`` makes sub-directories (``zoo/digits-...``)."""
    return cache_dir() / f"{name.replace('.', '_')}-{key}.pt"


def load_entry(key: str, name: str, description: dict[str, Any], mmap: bool = False) -> tuple[bool, Any]:
    """``(True, value)`` for a valid entry; ``(False, None)`` when missing, corrupt or mismatched (warned).
    ``mmap`` maps the tensors' storage instead of reading it."""
    path = _path(key, name)
    if not path.exists():
        return False, None
    try:
        stored = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        if not isinstance(stored, dict) or stored.get("description") != json.loads(json.dumps(description)):
            raise ValueError("stored description does not match the requested key")
        return True, _decode_frames(stored["value"])
    except Exception as err:  # any unreadable entry is recomputed, never trusted
        reason = (str(err).strip().splitlines() or [""])[0][:200]
        warnings.warn(f"wsbook cache: entry {path.name} is unreadable ({type(err).__name__}: {reason}); recomputing",
                      RuntimeWarning, stacklevel=3)
        return False, None


def save_entry(key: str, name: str, description: dict[str, Any], value: Any) -> Path:
    """Write an entry atomically (temporary file in the same directory, then ``os.replace``)."""
    value = _encode_frames(value)
    _check_value(value)
    path = _path(key, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save({"description": description, "value": value}, fh)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def rename_entries(old_name: str, new_name: str) -> int:
    """Re-key the stored entries of artifact ``old_name`` to ``new_name`` (same arguments, scale and version),
    so renaming an artifact, or moving to explicit names from the module-path names used before, keeps
    what was computed. Unreadable entries and entries whose description cannot be carried over are left
    alone (they are recomputed on use). Returns the number of entries moved.

    Args:
        old_name: the name stored in the entries, e.g. ``"wsbook.graphs.train.digits_zoo"``.
        new_name: the name of a :func:`cached` function now, e.g. ``"zoo/digits"``.
    """
    if not _NAME.fullmatch(new_name):
        raise ValueError(f"a cache name is lower-case words joined by '/' (e.g. 'zoo/digits'); got {new_name!r}")
    moved = 0
    for path in sorted(cache_dir().glob(f"{old_name.replace('.', '_')}-*.pt")):
        try:
            stored = torch.load(path, map_location="cpu", weights_only=True)
            description = stored["description"]
            blob = json.dumps(description, sort_keys=True, allow_nan=False)   # NaN keys never matched anyway
        except Exception:   # unreadable or not carried over: recomputed on use, as any bad entry
            continue
        if description.get("name") != old_name:
            continue
        description = {**json.loads(blob), "name": new_name}
        key = hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:24]
        save_entry(key, new_name, description, stored["value"])
        path.unlink()
        moved += 1
    return moved


def _lock_path(key: str, name: str) -> Path:
    entry = _path(key, name)
    return entry.with_name(f".{entry.stem}.lock")


@contextlib.contextmanager
def computing(key: str, name: str) -> Iterator[None]:
    """Hold the entry's lock file (``.<entry>.lock``, exclusive, blocking) while it is computed, so that
    processes sharing the cache compute each entry once. Cached functions that call one another take
    their locks in the order of their dependencies, which cannot form a cycle."""
    lock = _lock_path(key, name)                         # hidden, like the temporary files; never deleted
    # (removing a lock file another process may be waiting on would let a third compute alongside)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_device(v, device) for v in value]
    if isinstance(value, tuple):
        return tuple(_to_device(v, device) for v in value)
    return value


def _strict_load(key: str, name: str, description: dict[str, Any]) -> Any:
    """Strict mode's lookup: the entry's value, or :class:`StrictMiss`. A missing entry is looked for once
    more after waiting for its lock, in case another (non-strict) process sharing the cache is writing it."""
    path = _path(key, name)
    if enabled():
        hit, value = load_entry(key, name, description)
        if not hit and not path.exists() and _lock_path(key, name).exists():
            with computing(key, name):
                hit, value = load_entry(key, name, description)
        if hit:
            return _to_device(value, config.device())
    args = json.dumps(description["args"], sort_keys=True)
    raise StrictMiss(
        f"wsbook cache: strict mode ({STRICT_ENV}={os.environ.get(STRICT_ENV, '')}) forbids computing {name} "
        f"(scale {description['scale']}, version {description['version']}): entry {path} is "
        f"{'missing' if not path.exists() else 'unreadable'}" + ("" if enabled() else " (the cache is off)")
        + f"; arguments {args[:600]}{' ...' if len(args) > 600 else ''}. Precompute it with `python -m wsbook` "
        "(wsbook/cli.py registers what the chapters compute) or unset " + STRICT_ENV)


@contextlib.contextmanager
def _timed(key: str, name: str, description: dict[str, Any]) -> Iterator[None]:
    """Append the computation's wall-clock seconds to :data:`COMPUTE_LOG`: ``seconds`` in all and ``own``
    (less what the entries it computed inside took), so a cold build says where its time went."""
    start, began = time.perf_counter(), time.time()
    _NESTED.append(0.0)
    try:
        yield
    finally:
        inner = _NESTED.pop()
        seconds = time.perf_counter() - start
        if _NESTED:
            _NESTED[-1] += seconds
        if enabled() and distributed.is_main():
            line = json.dumps({"name": name, "entry": _path(key, name).name, "scale": description["scale"],
                               "seconds": round(seconds, 3), "own": round(seconds - inner, 3),
                               "started": round(began, 1), "pid": os.getpid()})
            try:
                cache_dir().mkdir(parents=True, exist_ok=True)
                with open(cache_dir() / COMPUTE_LOG, "a") as fh:     # one short line, appended in one write
                    fh.write(line + "\n")
            except OSError as err:
                warnings.warn(f"wsbook cache: could not append to {COMPUTE_LOG}: {err}", stacklevel=3)


def compute_log(directory: Path | None = None) -> list[dict[str, Any]]:
    """The computations recorded in ``directory`` (default :func:`cache_dir`): one dict per computed entry,
    in the order they finished, with ``name``, ``entry`` (its file name), ``scale``, ``seconds`` (wall clock,
    the entries it computed inside included), ``own`` (those excluded), ``started`` (Unix time) and
    ``pid``. Lines that do not parse (a write cut short) are skipped."""
    path = (cache_dir() if directory is None else Path(directory)) / COMPUTE_LOG
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def cached(name: str, version: int | str = 1) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: cache a function's result under an explicit artifact ``name``, its bound arguments, the
    scale and ``version``.

    Args:
        name: the artifact's name, lower-case words separated by ``/`` (``"zoo/digits"``). It is part of
            the key instead of the function's module path, so moving or renaming the function keeps its
            artifacts; two functions cannot claim the same name.
        version: bump it when the function's meaning changes (old entries are then ignored).

    Under ``torchrun`` (:mod:`wsbook.distributed`) every rank runs the function (which splits its work
    over the ranks where it can), all ranks load only when every one of them finds the entry, and rank 0
    alone writes it. Results come back on the configured device. In strict mode (:func:`is_strict`) a
    missing entry raises :class:`StrictMiss` instead of computing. The wrapper has ``cache_path(*args, **kwargs)`` (the
    entry's file) and ``cache_name``.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"a cache name is lower-case words joined by '/' (e.g. 'zoo/digits'); got {name!r}")
    if not isinstance(version, (int, str)) or isinstance(version, bool):
        raise TypeError(f"version must be an int or a str; got {type(version).__name__}")

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(fn)
        owner = f"{fn.__module__}.{fn.__qualname__}"
        if _REGISTRY.setdefault(name, owner) != owner:
            raise ValueError(f"cache name {name!r} is already used by {_REGISTRY[name]}; pick another for {owner}")

        def key_of(args: tuple, kwargs: dict) -> tuple[str, dict[str, Any]]:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return make_key(name, dict(bound.arguments), str(version))

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            key, description = key_of(args, kwargs)
            if _PROBING:
                hit, value = load_entry(key, name, description, mmap=True)
                if not hit:
                    raise MissingEntry(f"{name}: {_path(key, name).name}")
                return value
            if is_strict(name):
                return _strict_load(key, name, description)
            existed = _path(key, name).exists()
            if enabled():
                hit, value = load_entry(key, name, description)
                if distributed.all_agree(hit):      # under torchrun: all ranks load, or all compute
                    return _to_device(value, config.device())
            # another process of the same book build may be computing this entry: wait for it, then read
            # (under torchrun the ranks compute together and need no lock)
            alone = enabled() and not distributed.active()
            with computing(key, name) if alone else contextlib.nullcontext():
                if alone and not existed and _path(key, name).exists():
                    hit, value = load_entry(key, name, description)
                    if hit:
                        return _to_device(value, config.device())
                # computing must draw no more randomness than loading
                with config.isolated_rng(), _timed(key, name, description):
                    value = fn(*args, **kwargs)
                if enabled() and distributed.is_main():
                    save_entry(key, name, description, _to_device(value, torch.device("cpu")))
            distributed.barrier()
            return value

        def cache_path(*args: Any, **kwargs: Any) -> Path:
            """The file an entry for these arguments lives in (whether or not it exists yet)."""
            return _path(key_of(args, kwargs)[0], name)

        wrapper.cache_path = cache_path  # type: ignore[attr-defined]
        wrapper.cache_name = name  # type: ignore[attr-defined]
        return wrapper

    return decorate
