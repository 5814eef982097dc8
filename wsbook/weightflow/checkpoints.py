"""Flows over your own networks: a directory of ordinary PyTorch checkpoints in, a population out, and back.

:func:`load_checkpoints` reads every ``state_dict`` saved with ``torch.save`` in a directory and stacks them
into a population ``[B, D]``, the form every flow of :mod:`wsbook.weightflow` learns from:

* an MLP (``nn.Sequential`` of ``nn.Linear`` layers and activations, or any module whose only parameters are
  ``nn.Linear`` layers applied in the order they were registered) becomes an :class:`~wsbook.nets.MLPSpec`;
* a CNN of ``nn.Conv2d`` layers (square odd kernels, one size for all, a bias in every layer), then one
  ``nn.Linear`` head reading each channel's global average, becomes a :class:`~wsbook.nets.CNNSpec`
  (:meth:`CNNSpec.to_module`'s layout). A state dict records neither strides, dilation, groups, padding nor
  pooling: the files are read as that layout (stride 1, no dilation, no groups, same padding, global average
  pooling), so a CNN that downsamples on the way, or dilates or groups its convolutions, is read wrongly.

:func:`save_checkpoints` writes a population (e.g. :meth:`WeightFlow.sample`'s networks) back as one
``state_dict`` file per network, which ``module.load_state_dict(torch.load(path))`` loads into the user's
own module. Book appendix "Flows over your own networks".

A checkpoint that cannot be one of the population raises :class:`CheckpointError` (a ``ValueError``)
naming the file: a file ``torch.load`` cannot read (or only by unpickling code: files are read with
``weights_only=True``), one that holds something else than a state dict, a state dict with entries that
are not weights and biases (a normalisation layer's), weights of other layers (a 1-D convolution's), layers
that do not chain or that a spec cannot hold (kernels of two sizes, several Linear layers after the
convolutions), NaN or infinite weights, or an architecture that differs from the first file's.
"""
from __future__ import annotations

import math
import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from wsbook import config
from wsbook.nets import ACTIVATIONS, CNNSpec, MLPSpec

#: the file names :func:`load_checkpoints` reads by default
PATTERNS = ("*.pt", "*.pth")
#: keys under which training loops commonly nest the model's state dict in a larger checkpoint
NESTED_KEYS = ("state_dict", "model_state_dict")


class CheckpointError(ValueError):
    """A checkpoint file that cannot join the population; ``path`` is the file."""

    def __init__(self, path: str | os.PathLike, problem: str):
        self.path = Path(path)
        super().__init__(f"{self.path}: {problem}")


def _describe(obj: object) -> str:
    if isinstance(obj, Tensor):
        return f"a tensor of shape {list(obj.shape)}"
    if isinstance(obj, nn.Module):
        return f"a whole {type(obj).__name__} module"
    name = type(obj).__name__
    return f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"


def _read(path: Path) -> Mapping[str, Tensor]:
    """The state dict in the file ``path`` (read on the CPU with ``weights_only=True``), or the one nested
    under :data:`NESTED_KEYS` in a training checkpoint."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises pickle, zip and runtime errors alike for a foreign file
        reason = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
        raise CheckpointError(path, f"cannot be read as a state dict by torch.load(weights_only=True) "
                                    f"({reason}); save each network with "
                                    "torch.save(model.state_dict(), path)") from err
    if isinstance(obj, Mapping):
        nested = [k for k in NESTED_KEYS if isinstance(obj.get(k), Mapping)]
        if nested and not all(isinstance(v, Tensor) for v in obj.values()):
            obj = obj[nested[0]]
    if not isinstance(obj, Mapping) or not obj:
        what = "an empty dict" if isinstance(obj, Mapping) else _describe(obj)
        raise CheckpointError(path, f"holds {what}, not a state dict; save each network with "
                                    "torch.save(model.state_dict(), path)")
    for key, value in obj.items():
        if not isinstance(key, str) or not isinstance(value, Tensor):
            raise CheckpointError(path, f"is not a state dict: its entry {key!r} is {_describe(value)}, not a "
                                        "tensor; save each network with torch.save(model.state_dict(), path)")
    return obj


def _layers(path: Path, state: Mapping[str, Tensor]) -> list[tuple[str, Tensor, Tensor | None]]:
    """``(module name, weight, bias or None)`` of every ``nn.Linear`` (weight ``[out, in]``) and ``nn.Conv2d``
    (weight ``[out, in, k, k]``) layer of a state dict, in the order of the dict (the order the layers were
    registered in), each checked on its own; :func:`_spec` checks that they form a network."""
    modules: OrderedDict[str, dict[str, Tensor]] = OrderedDict()
    for key, value in state.items():
        module, _, name = key.rpartition(".")
        if name not in ("weight", "bias"):
            raise CheckpointError(path, f"has the entry {key!r} ({list(value.shape)}), which is no Linear or Conv2d "
                                        "layer's weight or bias; load_checkpoints reads MLPs and CNNs without "
                                        "normalisation or other layers")
        modules.setdefault(module, {})[name] = value
    layers = []
    for module, params in modules.items():
        w, b = params.get("weight"), params.get("bias")
        where = f"layer {module!r}" if module else "the layer"
        if w is None:
            raise CheckpointError(path, f"{where} has a bias but no weight; not an nn.Linear or nn.Conv2d layer")
        if w.dim() not in (2, 4):
            kind = " (a 1-D or 3-D convolution's)" if w.dim() in (3, 5) else ""
            raise CheckpointError(path, f"{where} has a weight of shape {list(w.shape)}{kind}; load_checkpoints "
                                        "reads nn.Linear weights [out, in] and nn.Conv2d weights [out, in, k, k]")
        if b is not None and tuple(b.shape) != (w.shape[0],):
            raise CheckpointError(path, f"{where} has a bias of shape {list(b.shape)} for a weight of shape "
                                        f"{list(w.shape)}; not an nn.Linear or nn.Conv2d layer")
        for name, t in (("weight", w), ("bias", b)):
            if t is None:
                continue
            if not t.is_floating_point():
                raise CheckpointError(path, f"{where}'s {name} has dtype {t.dtype}, not a floating-point one")
            bad = int((~torch.isfinite(t)).sum())
            if bad:
                key = f"{module}.{name}" if module else name
                raise CheckpointError(path, f"has {bad} NaN or infinite value{'s' * (bad > 1)} in {key!r}; a "
                                            "flow cannot learn from a diverged network (leave the file out)")
        layers.append((module, w, b))
    return layers


def _spec(path: Path, layers: list[tuple[str, Tensor, Tensor | None]], activation: str) -> MLPSpec | CNNSpec:
    """The architecture of a checkpoint's layers: an :class:`MLPSpec` for Linear layers alone, a
    :class:`CNNSpec` for Conv2d layers then one Linear head; anything else raises :class:`CheckpointError`."""
    n_conv = sum(w.dim() == 4 for _, w, _ in layers)
    if any(w.dim() == 4 for _, w, _ in layers[n_conv:]):
        raise CheckpointError(path, "has a Conv2d layer after a Linear one; load_checkpoints reads CNNs as "
                                    "convolutions, then global average pooling, then one Linear head")
    for (before, w0, _), (module, w1, _) in zip(layers[:-1], layers[1:]):
        if w1.shape[1] != w0.shape[0]:
            if w0.dim() == 2:
                what = "outputs"
            elif w1.dim() == 4:
                what = "channels"
            else:
                what = ("channels to pool (a Linear head after flattened feature maps is not read: CNNSpec's head "
                        "reads each channel's global average)")
            raise CheckpointError(path, f"layer {module!r} takes {w1.shape[1]} inputs but layer {before!r} before it "
                                        f"gives {w0.shape[0]} {what}; not a chain of layers")
    biases = {b is None for _, _, b in layers}
    if n_conv == 0:
        if len(biases) > 1:
            without = [m for m, _, b in layers if b is None]
            raise CheckpointError(path, f"layers {without} have no bias and the others have one; an MLPSpec has "
                                        "biases in every layer or in none")
        ws = [w for _, w, _ in layers]
        return MLPSpec((ws[0].shape[1], *(w.shape[0] for w in ws)), activation=activation, bias=True not in biases)
    if len(layers) != n_conv + 1:
        raise CheckpointError(path, f"has {len(layers) - n_conv} Linear layers after its convolutions; a CNNSpec "
                                    "has one Linear head")
    if True in biases:
        raise CheckpointError(path, "has a layer without bias; a CNNSpec has a bias in every layer")
    kernels = {tuple(w.shape[2:]) for _, w, _ in layers[:n_conv]}
    k = next(iter(kernels))[0]
    if kernels != {(k, k)} or k % 2 == 0:
        raise CheckpointError(path, f"has convolution kernels {sorted(kernels)}; a CNNSpec has one square kernel of "
                                    "odd size (same padding) in every convolution")
    if activation not in ("relu", "tanh"):
        raise ValueError(f"load_checkpoints: a CNN's activation must be 'relu' or 'tanh'; got {activation!r}")
    convs = [w for _, w, _ in layers[:n_conv]]
    return CNNSpec(convs[0].shape[1], tuple(w.shape[0] for w in convs), kernel_size=k,
                   n_classes=layers[-1][1].shape[0], activation=activation)


def _architecture(layers: list[tuple[str, Tensor, Tensor | None]]) -> tuple[tuple[tuple[int, ...], ...],
                                                                            tuple[bool, ...]]:
    """Every layer's weight shape and whether it has a bias: what two files of one population share."""
    return tuple(tuple(w.shape) for _, w, _ in layers), tuple(b is not None for _, _, b in layers)


def checkpoint_files(directory: str | os.PathLike, pattern: str | Sequence[str] = PATTERNS) -> list[Path]:
    """The checkpoint files of ``directory`` that :func:`load_checkpoints` reads, sorted by name (its rows'
    order): files matching ``pattern`` (one glob or several), hidden files left out. Raises
    ``FileNotFoundError`` for a missing or empty directory, ``NotADirectoryError`` for a file."""
    root = Path(directory)
    if not root.exists():
        raise FileNotFoundError(f"load_checkpoints: no directory {root}")
    if not root.is_dir():
        raise NotADirectoryError(f"load_checkpoints: {root} is a file, not a directory of checkpoints")
    patterns = (pattern,) if isinstance(pattern, str) else tuple(pattern)
    files = sorted({p for pat in patterns for p in root.glob(pat) if p.is_file() and not p.name.startswith(".")})
    if not files:
        raise FileNotFoundError(f"load_checkpoints: no checkpoint files ({', '.join(patterns)}) in {root}")
    return files


def load_checkpoints(directory: str | os.PathLike, *, activation: str = "relu",
                     pattern: str | Sequence[str] = PATTERNS, dtype: torch.dtype | None = None,
                     device: torch.device | str | None = None) -> tuple[MLPSpec | CNNSpec, Tensor]:
    """Stack the MLP or CNN ``state_dict`` files of ``directory`` into ``(spec, theta)``.

    Every file (``*.pt`` and ``*.pth`` by default, sorted by name: row ``k`` of ``theta`` is file ``k`` of
    :func:`checkpoint_files`) holds the ``state_dict`` of one network, as ``torch.save(model.state_dict(),
    path)`` writes it, or a training checkpoint with the state dict under ``"state_dict"`` or
    ``"model_state_dict"``. Its ``nn.Linear`` and ``nn.Conv2d`` layers are read in the dict's order, which is
    the order ``nn.Sequential`` applies them: Linear layers alone make an MLP, Conv2d layers then one Linear
    head a CNN read as :meth:`CNNSpec.to_module` builds one (stride 1, no dilation or groups, same padding, the
    head on each channel's global average: the state dict does not say, so other CNNs are read wrongly). All files must have the same
    layers; the first file fixes them.

    Args:
        directory: the directory of checkpoint files.
        activation: the hidden activation (a state dict does not record it): one of
            :data:`wsbook.nets.ACTIVATIONS` (a CNN's: ``"relu"`` or ``"tanh"``). The canonical charts need
            ``"relu"``.
        pattern: a glob, or several, selecting the checkpoint files.
        dtype: floating dtype of ``theta`` (default :func:`wsbook.config.dtype`).
        device: where ``theta`` lives (default the CPU, where the files were read).

    Returns:
        ``spec`` (an :class:`~wsbook.nets.MLPSpec` with the files' widths, or a :class:`~wsbook.nets.CNNSpec`
        with their channels) and ``theta [B, D]``, one network per file in the spec's flat layout (its
        ``from_modules``'s).

    Raises:
        FileNotFoundError: no such directory, or no checkpoint files in it.
        CheckpointError: (a ``ValueError``) a file that is no MLP or CNN state dict, has NaN or infinite
            weights, or has other layers than the first file; the message names the file.
        ValueError: an unknown activation.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"load_checkpoints: activation must be one of {ACTIVATIONS}; got {activation!r}")
    files = checkpoint_files(directory, pattern)
    weights: list[list[Tensor]] = []
    biases: list[list[Tensor]] = []
    first: tuple | None = None
    for path in files:
        layers = _layers(path, _read(path))
        arch = _architecture(layers)
        if first is None:
            first, spec = arch, _spec(path, layers, activation)
        elif arch != first:
            raise CheckpointError(path, f"has layers {list(arch[0])} (biases {list(arch[1])}) but "
                                        f"{files[0].name}, the first checkpoint, has {list(first[0])} (biases "
                                        f"{list(first[1])}); every checkpoint must have the same architecture")
        weights.append([w for _, w, _ in layers])
        biases.append([b for _, _, b in layers])
    dtype = dtype or config.dtype()
    stacked_w = [torch.stack([ws[k] for ws in weights]).to(dtype) for k in range(spec.n_layers)]
    stacked_b = ([torch.stack([bs[k] for bs in biases]).to(dtype) for k in range(spec.n_layers)]
                 if spec.bias else None)
    theta = spec.pack(stacked_w, stacked_b)
    return spec, theta if device is None else theta.to(device)


def _names(spec: MLPSpec | CNNSpec, like: object) -> list[str]:
    """The module names of the layers in the saved state dicts: those of the spec's ``to_module``
    (``nn.Sequential``'s ``0, 2, 4, ...``, a CNN's head after its pooling and flattening), or those of ``like``
    (a module, a state dict or a checkpoint file)."""
    if like is None:
        names = [str(2 * k) for k in range(spec.n_layers)]
        if isinstance(spec, CNNSpec):       # ..., activation, AdaptiveAvgPool2d, Flatten, Linear
            names[-1] = str(2 * spec.n_layers)
        return names
    if isinstance(like, nn.Module):
        path, state = Path(f"<{type(like).__name__} module>"), like.state_dict()
    elif isinstance(like, Mapping):
        path, state = Path("<state dict>"), like
    elif isinstance(like, (str, os.PathLike)):
        path = Path(like)
        state = _read(path)
    else:
        raise TypeError(f"save_checkpoints: like must be a module, a state dict or a checkpoint file; got "
                        f"{type(like).__name__}")
    layers = _layers(path, state)
    shapes, biases = _architecture(layers)
    if list(shapes) != [tuple(s) for s in spec.layer_shapes] or set(biases) != {spec.bias}:
        raise ValueError(f"save_checkpoints: like ({path}) has layers {list(shapes)} (biases {list(biases)}); "
                         f"{spec} has {spec.layer_shapes} (bias={spec.bias} in every layer)")
    return [m for m, _, _ in layers]


def save_checkpoints(spec: MLPSpec | CNNSpec, theta: Tensor, directory: str | os.PathLike, *, prefix: str = "sample",
                     like: object = None, overwrite: bool = False) -> list[Path]:
    """Write every network of ``theta [B, D]`` as its own ``state_dict`` file ``{prefix}_{k:03d}.pt``.

    The keys are those of the spec's ``to_module``: ``nn.Sequential(Linear, activation, Linear, ...)``
    (``"0.weight"``, ``"0.bias"``, ``"2.weight"``, ...) for an MLP, ``nn.Sequential(Conv2d, activation, ...,
    AdaptiveAvgPool2d, Flatten, Linear)`` for a CNN; so ``net.load_state_dict(torch.load(path))`` loads a file
    into such a module. With ``like`` (a module of the user's, a state dict, or a checkpoint file) the layers
    get ``like``'s names instead. :func:`load_checkpoints` reads the directory back.

    Args:
        spec: the architecture of the networks.
        theta: the networks ``[B, D]`` (or one ``[D]``), e.g. :meth:`WeightFlow.sample`'s.
        directory: where to write (created if missing).
        prefix: the files' name before the index.
        like: the layer names to use, from a module, a state dict or a checkpoint file.
        overwrite: replace existing files of the same names (otherwise ``FileExistsError``, raised before
            anything is written).

    Returns:
        The paths written, in the order of ``theta``'s rows.

    Raises:
        TypeError: ``spec`` is neither an :class:`~wsbook.nets.MLPSpec` nor a :class:`~wsbook.nets.CNNSpec`.
        ValueError: ``theta`` does not fit ``spec``, holds NaN or infinite values, or ``like`` has other layers.
        FileExistsError: a file to write exists and ``overwrite`` is false.
    """
    if not isinstance(spec, (MLPSpec, CNNSpec)):
        raise TypeError(f"save_checkpoints: spec must be an MLPSpec or a CNNSpec; got {type(spec).__name__}")
    theta = spec.check(theta.detach())
    bad = (~torch.isfinite(theta)).any(1)
    if bool(bad.any()):
        raise ValueError(f"save_checkpoints: {int(bad.sum())} of {theta.shape[0]} networks have NaN or infinite "
                         f"weights (first: row {int(bad.nonzero()[0])}); nothing was written")
    if not prefix or os.sep in prefix or (os.altsep and os.altsep in prefix):
        raise ValueError(f"save_checkpoints: prefix must be a non-empty file-name part; got {prefix!r}")
    names = _names(spec, like)
    root = Path(directory)
    width = max(3, int(math.log10(max(theta.shape[0] - 1, 1))) + 1)
    paths = [root / f"{prefix}_{k:0{width}d}.pt" for k in range(theta.shape[0])]
    existing = [p.name for p in paths if p.exists()]
    if existing and not overwrite:
        raise FileExistsError(f"save_checkpoints: {len(existing)} files exist in {root} (first {existing[0]}); "
                              "pass overwrite=True or another prefix or directory")
    root.mkdir(parents=True, exist_ok=True)
    theta = theta.cpu()
    ws, bs = spec.weights(theta), spec.biases(theta)
    for k, path in enumerate(paths):
        state: OrderedDict[str, Tensor] = OrderedDict()
        for name, w, b in zip(names, ws, bs):
            prefix_dot = f"{name}." if name else ""
            state[f"{prefix_dot}weight"] = w[k].clone()     # a copy: a view would save all of theta's storage
            if b is not None:
                state[f"{prefix_dot}bias"] = b[k].clone()
        torch.save(state, path)
    return paths


__all__ = ["CheckpointError", "checkpoint_files", "load_checkpoints", "save_checkpoints", "PATTERNS"]
