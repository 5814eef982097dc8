"""wsbook.config, wsbook.data and wsbook.cache, plus the install files agreeing with each other."""
import dataclasses
import multiprocessing
import random
import re
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from wsbook import cache, config, data

ROOT = Path(__file__).resolve().parent.parent


def test_scale_knob(monkeypatch):
    for value in ("ci", "default", "full", " CI "):
        monkeypatch.setenv("WSBOOK_SCALE", value)
        assert config.scale() == value.strip().lower()
    monkeypatch.setenv("WSBOOK_SCALE", "ci")
    assert config.by_scale(ci=1, default=2, full=3) == 1
    monkeypatch.setenv("WSBOOK_SCALE", "huge")
    with pytest.raises(ValueError, match="ci, default, full.*'huge'"):
        config.scale()
    monkeypatch.delenv("WSBOOK_SCALE")
    assert config.scale() == "default"


def test_seeding_is_reproducible():
    config.seed_everything(3)
    a = torch.randn(4)
    config.seed_everything(3)
    assert torch.equal(a, torch.randn(4))



def test_seeded_block_ignores_and_restores_the_global_generator():
    inits = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        with config.seeded(7):
            inits.append(torch.nn.Linear(3, 2).weight.detach().clone())
        after = torch.randn(3)
        torch.manual_seed(global_seed)
        assert torch.equal(after, torch.randn(3))   # the global stream continues as if nothing was drawn
    assert torch.equal(inits[0], inits[1])


def test_progress_quiet_under_ci(monkeypatch):
    monkeypatch.delenv("WSBOOK_PROGRESS", raising=False)
    monkeypatch.setenv("CI", "true")
    assert not config.progress_enabled()
    monkeypatch.setenv("WSBOOK_PROGRESS", "1")
    assert config.progress_enabled()


@pytest.mark.parametrize("name", data.DATASETS)
def test_datasets_are_standardized_deterministic_splits(name):
    ds = data.load(name, device="cpu")
    again = data._load_cached.__wrapped__(name, "cpu")
    assert torch.equal(ds.x_train, again.x_train) and torch.equal(ds.y_test, again.y_test)
    assert len(ds.x_train) > len(ds.x_val) > 0 and len(ds.x_test) > 0 and ds.x_train.dtype == torch.float32
    if name not in ("digits", "mnist5k", "gap1d"):
        assert ds.x_train.mean(0).abs().max() < 1e-4 and (ds.x_train.std(0) - 1).abs().max() < 0.05
    if ds.task == "classification":
        assert ds.y_train.dtype == torch.long and int(ds.y_train.max()) + 1 == ds.n_classes


def test_unknown_dataset_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown dataset 'cifar'.*moons"):
        data.load("cifar")


def test_gap1d_has_a_gap_in_training_inputs():
    ds = data.load("gap1d", device="cpu")
    x = ds.x_train * 1.0  # standardized, symmetric clusters: the gap stays around 0
    assert (x.abs() > 0.3).all()


calls = []


@cache.cached("test/expensive", version="t1")
def _expensive(n: int, scale_by: float = 2.0):
    calls.append(n)
    return {"theta": torch.arange(n, dtype=torch.float32) * scale_by, "meta": {"n": n, "tags": ["a", "b"]}}


def test_cache_roundtrip_and_key():
    calls.clear()
    first = _expensive(3)
    second = _expensive(3)
    assert calls == [3]
    assert torch.equal(first["theta"], second["theta"]) and second["meta"] == {"n": 3, "tags": ["a", "b"]}
    _expensive(3, scale_by=3.0)
    assert calls == [3, 3], "a different argument is a different entry"
    assert _expensive.cache_path(3) != _expensive.cache_path(3, 3.0)
    assert _expensive.cache_path(3) == _expensive.cache_path(3, scale_by=2.0)


@cache.cached("test/randomness", version=1)
def _draws_randomness(n: int):
    return torch.randn(n) + float(np.random.rand()) + random.random()


def test_computing_a_cache_entry_draws_no_more_randomness_than_loading_it():
    """A cold cache must leave the global streams where a warm one does: otherwise code after a cached
    call (a chapter building a model) sees other random numbers the second time the chapter runs."""
    after = []
    for _ in ("cold", "warm"):
        config.seed_everything(11)
        _draws_randomness(5)
        after.append((torch.randn(2), np.random.rand(), random.random()))
    assert torch.equal(after[0][0], after[1][0])
    assert after[0][1:] == after[1][1:]


def test_cache_key_depends_on_scale(monkeypatch):
    path_ci = _expensive.cache_path(2)
    monkeypatch.setenv("WSBOOK_SCALE", "default")
    assert _expensive.cache_path(2) != path_ci


def test_cache_write_is_atomic(monkeypatch):
    calls.clear()
    _expensive(4)
    path = _expensive.cache_path(4)
    good = path.read_bytes()

    def broken_save(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(RuntimeError, match="disk full"):
        cache.save_entry("k", "x", {}, {"a": torch.ones(1)})
    monkeypatch.undo()
    assert path.read_bytes() == good
    leftovers = [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


@cache.cached("test/slow", version=1)
def _slow(n: int, log: str):
    with open(log, "a") as fh:          # one line per computation, from whichever process computes
        fh.write("computed\n")
    time.sleep(0.5)
    return torch.arange(n)


def _slow_in_child(n: int, log: str, out) -> None:
    out.put(_slow(n, log).tolist())


def test_processes_sharing_a_cache_compute_an_entry_once(tmp_path):
    """Two chapters of a parallel book build asking for the same entry: one computes, the other waits for
    its lock and reads the entry (no second computation, the same value)."""
    log = str(tmp_path / "log.txt")
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    children = [ctx.Process(target=_slow_in_child, args=(4, log, out)) for _ in range(2)]
    for child in children:
        child.start()
    values = [out.get(timeout=60) for _ in children]
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    assert values == [[0, 1, 2, 3]] * 2
    assert Path(log).read_text().splitlines() == ["computed"]
    assert _slow(4, log).tolist() == [0, 1, 2, 3] and Path(log).read_text().count("computed") == 1


def test_corrupt_entry_is_recomputed_with_a_warning():
    calls.clear()
    _expensive(5)
    path = _expensive.cache_path(5)
    path.write_bytes(b"not a torch file")
    with pytest.warns(RuntimeWarning, match="unreadable.*recomputing"):
        value = _expensive(5)
    assert calls == [5, 5] and value["theta"][1] == 2.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _expensive(5)  # the rewritten entry is good again
    assert calls == [5, 5]


def test_cache_never_unpickles_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    import pickle

    path = _expensive.cache_path(6)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"description": {}, "value": Evil()}, path, pickle_protocol=pickle.HIGHEST_PROTOCOL)
    with pytest.warns(RuntimeWarning, match="unreadable"):
        _expensive(6)


def test_cache_rejects_unsafe_values():
    @cache.cached("test/bad")
    def bad():
        return {"f": object()}

    with pytest.raises(TypeError, match="only tensors"):
        bad()


frame_calls = []


@cache.cached("test/frame", version=1)
def _table(n: int):
    import pandas as pd

    frame_calls.append(n)
    cols = pd.MultiIndex.from_tuples([("tv", "mean"), ("tv", "se"), ("verdict", "")])
    t = pd.DataFrame([[0.5, 0.1, "met"], [float("nan"), 0.2, "level"]], index=["flow", "vi"], columns=cols)
    t.index.name = "row"
    inner = pd.DataFrame({"k": [1, 2], "ok": [True, False]}, index=pd.Index([("a", 0), ("b", 1)], tupleize_cols=False))
    t.attrs.update(selected="flow", n=n, validation=inner, runs={"test": 2})
    return {"table": t, "theta": torch.ones(2)}


def test_cached_functions_may_return_tables():
    """A DataFrame (MultiIndex columns, NaN, strings, its attrs and a table inside them) comes back from a
    cache entry equal to the one computed, and the entry still loads with ``weights_only``."""
    import pandas as pd

    frame_calls.clear()
    first = _table(4)
    second = _table(4)
    assert frame_calls == [4]
    pd.testing.assert_frame_equal(first["table"], second["table"])
    pd.testing.assert_frame_equal(first["table"].attrs["validation"], second["table"].attrs["validation"])
    assert second["table"].attrs["runs"] == {"test": 2} and second["table"].attrs["selected"] == "flow"
    assert torch.load(_table.cache_path(4), weights_only=True)["value"]["theta"].shape == (2,)


probe_calls = []


@cache.cached("test/probe", version=1)
def _probe(x, opts=(1.0,)):
    probe_calls.append(1)
    return torch.zeros(1)


def test_cache_hits_with_nan_inside_a_tuple_argument():
    # nan != nan: a raw NaN in the stored description never matched the request, so every call warned
    # "unreadable" and recomputed
    probe_calls.clear()
    _probe(1, opts=(0.5, float("nan"), float("-inf")))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _probe(1, opts=(0.5, float("nan"), float("-inf")))
    assert len(probe_calls) == 1
    _probe(1, opts=(0.5, float("nan"), float("inf")))
    assert len(probe_calls) == 2, "inf and -inf are different keys"


@dataclasses.dataclass
class _Settings:
    lr: float = 0.25
    opts: tuple = (1, 2.5)


def test_cache_keys_of_non_finite_floats_and_of_dicts_never_collide():
    # a non-finite float was written as {"float": repr}: f(nan) and f({"float": "nan"}) shared one entry
    probe_calls.clear()
    for x in (float("nan"), float("inf"), float("-inf")):
        for lookalike in ({"float": repr(x)}, {"$float": repr(x)}):
            assert _probe.cache_path(x) != _probe.cache_path(lookalike), (x, lookalike)
            assert _probe.cache_path([x]) != _probe.cache_path([lookalike]), (x, lookalike)
    _probe(float("nan"))
    _probe({"float": "nan"})
    _probe({"$float": "nan"})
    assert len(probe_calls) == 3
    assert _probe.cache_path({"$a": 1}) != _probe.cache_path({"$$a": 1})


def test_cache_keys_of_finite_arguments_are_unchanged():
    # the key of ordinary arguments (finite floats, dicts, dataclasses, tensors) as every earlier version
    # of the module made it: existing entries stay valid
    args = {"x": 0.5, "opts": {"a": [1, 2.5, None, "nan"], "float": "inf"}, "s": _Settings(), "t": torch.arange(3.)}
    assert cache.make_key("test/probe", args, "1")[0] == "330d64a46461172db452ea2a"


def test_cache_keys_bfloat16_and_bool_tensors_by_content():
    # the key hash went through .numpy(), which has no bfloat16: TypeError
    probe_calls.clear()
    x = torch.linspace(-1, 1, 12, dtype=torch.bfloat16).view(3, 4)
    _probe(x)
    _probe(x.clone())
    assert len(probe_calls) == 1
    _probe(x + 1)
    _probe(x.t())            # same values, other shape: another entry
    _probe(torch.tensor(2.0, dtype=torch.bfloat16))
    _probe(torch.tensor([True, False]))
    assert len(probe_calls) == 5
    assert _probe.cache_path(x) == _probe.cache_path(x.t().contiguous().t())


def test_cache_name_is_explicit_and_unique():
    assert _probe.cache_name == "test/probe"
    assert _probe.cache_path(1).relative_to(cache.cache_dir()).parts[0] == "test", "the name, not the module path"
    with pytest.raises(ValueError, match="already used"):
        @cache.cached("test/probe")
        def other(x):
            return x
    with pytest.raises(ValueError, match="lower-case words"):
        cache.cached("wsbook.graphs.train.digits_zoo")


def test_moving_a_cached_function_keeps_its_entries():
    # the same name on a function defined elsewhere (as after a move) reads the same entry
    probe_calls.clear()
    _probe(7)
    cache._REGISTRY.pop("test/probe")
    try:
        moved = cache.cached("test/probe", version=1)(lambda x, opts=(1.0,): probe_calls.append(2))
        assert moved.cache_path(7) == _probe.cache_path(7)
        moved(7)
        assert probe_calls == [1]
    finally:
        cache._REGISTRY["test/probe"] = f"{_probe.__module__}.{_probe.__qualname__}"


strict_calls = []


@cache.cached("test/strict/trained", version=1)
def _strict_trained(n: int):
    strict_calls.append(("trained", n))
    return torch.full((n,), float(n))


@cache.cached("test/loose", version=1)
def _loose(n: int):
    strict_calls.append(("loose", n))
    return torch.zeros(n)


def test_strict_mode_reads_entries_and_refuses_to_compute_them(monkeypatch):
    """WSBOOK_CACHE_STRICT: a cached function under one of its prefixes loads a present entry and raises a
    clear error naming a missing one instead of computing it; other names compute as usual."""
    strict_calls.clear()
    _strict_trained(2)                                      # computed before strict mode: a hit below
    monkeypatch.setenv("WSBOOK_CACHE_STRICT", " other/, test/strict/ ,")
    assert cache.strict_prefixes() == ("other/", "test/strict/")
    assert cache.is_strict("test/strict/trained") and not cache.is_strict("test/loose")
    assert torch.equal(_strict_trained(2), torch.full((2,), 2.0))
    with pytest.raises(cache.StrictMiss) as err:
        _strict_trained(3)
    message = str(err.value)
    assert "test/strict/trained" in message and _strict_trained.cache_path(3).name in message
    assert "WSBOOK_CACHE_STRICT" in message and "python -m wsbook" in message and '"n": 3' in message
    assert isinstance(err.value, cache.MissingEntry)       # what `python -m wsbook --list` catches
    assert not _strict_trained.cache_path(3).exists()
    _loose(3)                                               # not under a strict prefix: computed
    assert strict_calls == [("trained", 2), ("loose", 3)]
    with cache.probe(), pytest.raises(cache.MissingEntry):  # probing still answers as before
        _strict_trained(4)
    monkeypatch.setenv("WSBOOK_CACHE", "off")               # no cache: nothing to read, still no computing
    with pytest.raises(cache.StrictMiss, match="the cache is off"):
        _strict_trained(2)
    monkeypatch.delenv("WSBOOK_CACHE")
    monkeypatch.setenv("WSBOOK_CACHE_STRICT", " , ")
    assert cache.strict_prefixes() == ()
    _strict_trained(3)
    assert strict_calls[-1] == ("trained", 3)


def test_entries_under_an_old_name_are_carried_over():
    # an entry as the module-path keys stored it (same arguments, scale and version)
    probe_calls.clear()
    old = "tests.old_module._probe"
    key, description = cache.make_key(old, {"x": 11, "opts": (1.0,)}, "1")
    cache.save_entry(key, old, description, torch.full((1,), 7.0))
    assert cache.rename_entries(old, "test/probe") == 1
    assert _probe(11).item() == 7.0 and probe_calls == [], "the carried-over entry is a hit"
    assert cache.rename_entries(old, "test/probe") == 0


def _requirements(text: str) -> dict[str, str]:
    out = {}
    for line in text:
        m = re.match(r"\s*-?\s*\"?([A-Za-z0-9_.\-]+)\s*([<>=!~][^\"#,]*(?:,[^\"#]*)?)?\"?,?\s*$", line)
        if m:
            out[m.group(1).lower()] = (m.group(2) or "").replace(" ", "").rstrip(",")
    return out


def test_environment_yml_mirrors_pyproject():
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {}
    for req in meta["dependencies"] + meta["optional-dependencies"]["dev"]:
        name, spec = re.match(r"([A-Za-z0-9_.\-]+)\s*(.*)", req).groups()
        wanted[name.lower()] = spec.replace(" ", "")
    env = (ROOT / "environment.yml").read_text().split("pip:")[1].splitlines()
    pinned = {}
    for line in env:
        m = re.match(r"\s*-\s*([A-Za-z0-9_.\-]+)\s*([<>=!~].*)?$", line.strip())
        if m and m.group(1) not in ("-e",):
            pinned[m.group(1).lower()] = (m.group(2) or "").replace(" ", "")
    assert pinned.pop("torch") == "==2.13.0"
    wanted.pop("torch")
    assert pinned == wanted


@dataclasses.dataclass(frozen=True)
class _Grown:
    """_Settings' shape after a new setting was added with a default that keys no entry."""

    a: int = 1
    new: str = dataclasses.field(default="old behaviour", metadata={cache.KEYLESS_DEFAULT: True})


@dataclasses.dataclass(frozen=True)
class _Before:
    a: int = 1


def test_a_setting_added_with_a_keyless_default_keeps_the_old_keys():
    # at its default the new field is left out (the key of the class before the field existed, up to the
    # class name); any other value keys the entry
    strip = (lambda key: {k: v for k, v in key.items() if k != "args"} | {"args": list(key["args"]["s"].values())})
    grown = cache.make_key("test/probe", {"s": _Grown()}, "1")[1]
    before = cache.make_key("test/probe", {"s": _Before()}, "1")[1]
    assert strip(grown) == strip(before)
    assert "new" not in grown["args"]["s"]["_Grown"]
    other = cache.make_key("test/probe", {"s": _Grown(new="new behaviour")}, "1")
    assert other[1]["args"]["s"]["_Grown"]["new"] == "new behaviour"
    assert other[0] != cache.make_key("test/probe", {"s": _Grown()}, "1")[0]


@cache.cached("test/inner_timed", version=1)
def _inner_timed(n: int):
    time.sleep(0.05)
    return n


@cache.cached("test/outer_timed", version=1)
def _outer_timed(n: int):
    time.sleep(0.05)
    return _inner_timed(n) + 1


def test_computed_entries_log_their_seconds_and_own_seconds(monkeypatch, tmp_path, capsys):
    """Every computed entry appends one line to the compute log; an entry computed inside another counts in
    the outer's seconds but not in its own; a cache hit logs nothing. ``python -m wsbook --timings`` sums it."""
    from wsbook import cli

    monkeypatch.setenv("WSBOOK_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("WSBOOK_SCALE", "ci")
    assert cache.compute_log() == []
    assert _outer_timed(4) == 5 and _outer_timed(4) == 5             # the second call is a hit
    log = {r["name"]: r for r in cache.compute_log()}
    assert set(log) == {"test/inner_timed", "test/outer_timed"} and len(cache.compute_log()) == 2
    inner, outer = log["test/inner_timed"], log["test/outer_timed"]
    assert inner["own"] == pytest.approx(inner["seconds"]) and inner["seconds"] >= 0.05
    assert outer["seconds"] >= inner["seconds"] + 0.05
    assert outer["own"] == pytest.approx(outer["seconds"] - inner["seconds"], abs=2e-3)
    assert outer["entry"] == _outer_timed.cache_path(4).name and outer["scale"] == "ci"
    with open(tmp_path / cache.COMPUTE_LOG, "a") as fh:                # a line cut short is skipped
        fh.write('{"name": "test/cut')
    assert len(cache.compute_log()) == 2
    assert cli.main(["--timings"]) == 0
    out = capsys.readouterr().out
    assert out.index("test/outer_timed") > 0 and "total" in out
    monkeypatch.setenv("WSBOOK_SCALE", "default")
    assert cli.main(["--timings"]) == 0
    assert "no computations recorded at scale default" in capsys.readouterr().out


def test_timed_on_names_the_threads_a_timing_ran_on():
    """Chapters label their timings with where they ran: torch's thread count on a CPU."""
    from wsbook import config, report

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        expected = "one CPU thread" if config.device().type == "cpu" else report.timed_on()
        assert report.timed_on() == expected
        torch.set_num_threads(2)
        if config.device().type == "cpu":
            assert report.timed_on() == "2 CPU threads"
    finally:
        torch.set_num_threads(before)
