"""Populations of networks: a spec, a flat ``[B, D]`` tensor, and a batched forward pass.

A *population* is ``theta`` of shape ``[B, D]``: ``B`` networks with ``D`` parameters each, laid out
layer by layer as ``weight [out, in, ...]`` (row-major) followed by ``bias [out]`` -- the same order as
``torch.nn`` parameters, so ``from_modules`` is a plain flatten. Views of the layers are zero-copy.

Two architectures follow one protocol, :class:`NetSpec`: :class:`MLPSpec` (fully connected) and
:class:`CNNSpec` (convolutions, global average pooling, a linear head). Code written against the
protocol (the symmetry group actions, alignment, canonicalization, neural graphs) works for both.
See chapter 1 ("A population is a tensor") and chapter 6 ("Neural graphs from MLPs and CNNs").
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from wsbook import config, distributed
from wsbook.loop import Minibatches, descend, make_optimizer

ACTIVATIONS = ("relu", "tanh", "sine", "gelu")

#: The one vocabulary for what a network predicts, shared by nets, bayes, symmetry and data.
TASKS = ("classification", "regression")
_OLD_TASK_NAMES = {"cross_entropy": "classification", "categorical": "classification",
                   "mse": "regression", "gaussian": "regression"}


def check_task(task: str, name: str = "task") -> str:
    """Validate a task kind, ``"classification"`` or ``"regression"`` (:data:`TASKS`), and return it."""
    if task in TASKS:
        return task
    hint = f" ({task!r} is called {_OLD_TASK_NAMES[task]!r} here)" if task in _OLD_TASK_NAMES else ""
    raise ValueError(f"unknown {name} {task!r}: {name} must be one of {TASKS}{hint}")


def _positive_int(value: object, what: str) -> int:
    """``value`` as an ``int`` if it is a positive integer (a bool is not); a clear error otherwise."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral, np.integer)):
        raise TypeError(f"{what} must be a positive integer; got {value!r} ({type(value).__name__})")
    if int(value) < 1:
        raise ValueError(f"{what} must be a positive integer; got {value!r}")
    return int(value)


def _int_tuple(values: object, what: str) -> tuple[int, ...]:
    """A sequence of positive integers as a tuple (a string or a single number is rejected)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray, Tensor)):
        raise TypeError(f"{what} must be a sequence of positive integers; got {values!r}")
    items = values.tolist() if isinstance(values, (np.ndarray, Tensor)) else list(values)
    return tuple(_positive_int(v, f"{what}[{k}]") for k, v in enumerate(items))


class Sine(nn.Module):
    """``sin(frequency * x)``, the SIREN activation (Sitzmann et al., 2020)."""

    def __init__(self, frequency: float = 30.0):
        super().__init__()
        self.frequency = float(frequency)

    def forward(self, x: Tensor) -> Tensor:
        return torch.sin(self.frequency * x)

    def extra_repr(self) -> str:
        return f"frequency={self.frequency}"


def check_population(theta: Tensor, n_params: int, spec: object, name: str = "theta") -> Tensor:
    """Validate a population for any spec with ``n_params`` parameters; ``[D]`` becomes ``[1, D]``."""
    if not isinstance(theta, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape [B, {n_params}]; got {type(theta).__name__}")
    if theta.dim() == 1:
        theta = theta.unsqueeze(0)
    if theta.dim() != 2 or theta.shape[1] != n_params:
        raise ValueError(f"{name} must have shape [B, {n_params}] for {spec}; got {tuple(theta.shape)}")
    return theta


@runtime_checkable
class NetSpec(Protocol):
    """The spec protocol: what :class:`MLPSpec` and :class:`CNNSpec` (and any new architecture) provide.

    A spec is an immutable description of one architecture. It knows the flat layout of one network's
    parameters (``n_params``, ``layer_shapes``, ``slices``), gives zero-copy per-layer views of a population
    ``[B, D]`` (``weights`` ``[B, out, in, ...]``, ``biases`` ``[B, out]``) and packs them back, draws
    populations (``init``), evaluates all members at once (``forward``), and converts to and from plain
    ``torch.nn`` modules. ``widths`` lists the nodes per layer (input features or channels, hidden neurons or
    channels, outputs); every hidden layer carries a permutation symmetry (:mod:`wsbook.symmetry`).
    """

    activation: str
    bias: bool

    @property
    def widths(self) -> tuple[int, ...]: ...

    @property
    def n_layers(self) -> int: ...

    @property
    def n_params(self) -> int: ...

    @property
    def layer_shapes(self) -> list[tuple[int, ...]]: ...

    def slices(self, layer: int) -> tuple[slice, slice | None]: ...

    def check(self, theta: Tensor, name: str = "theta") -> Tensor: ...

    def weights(self, theta: Tensor) -> list[Tensor]: ...

    def biases(self, theta: Tensor) -> list[Tensor | None]: ...

    def pack(self, weights: Sequence[Tensor], biases: Sequence[Tensor | None] | None = None) -> Tensor: ...

    def init(self, n: int, scheme: str = "kaiming", generator: torch.Generator | None = None,
             device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Tensor: ...

    def forward(self, theta: Tensor, x: Tensor, return_hidden: bool = False) -> Tensor | tuple[Tensor, list[Tensor]]: ...

    def to_module(self, theta: Tensor) -> nn.Sequential: ...

    def from_modules(self, modules: Sequence[nn.Module]) -> Tensor: ...


def _pack(spec: NetSpec, weights: Sequence[Tensor], biases: Sequence[Tensor | None] | None) -> Tensor:
    """Concatenate per-layer ``[B, out, in, ...]`` weights and ``[B, out]`` biases into ``[B, D]``."""
    if len(weights) != spec.n_layers:
        raise ValueError(f"expected {spec.n_layers} weight tensors, got {len(weights)}")
    parts = []
    for layer, (w, shape) in enumerate(zip(weights, spec.layer_shapes)):
        if tuple(w.shape[1:]) != tuple(shape):
            raise ValueError(f"layer {layer} weight must be [B, {', '.join(map(str, shape))}]; got {tuple(w.shape)}")
        parts.append(w.reshape(w.shape[0], -1))
        if spec.bias:
            if biases is None or biases[layer] is None:
                raise ValueError(f"spec has biases but none given for layer {layer}")
            parts.append(biases[layer].reshape(w.shape[0], -1))
    return torch.cat(parts, dim=1)


@dataclass(frozen=True)
class MLPSpec:
    """A fully connected network ``widths[0] -> ... -> widths[-1]`` with one activation between layers.

    ``frequency`` is the SIREN ``w0`` used when ``activation == "sine"``. The output layer is linear.
    """

    widths: tuple[int, ...]
    activation: str = "relu"
    bias: bool = True
    frequency: float = 30.0
    _offsets: tuple[tuple[int, int, int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        widths = _int_tuple(self.widths, "MLPSpec widths")
        if len(widths) < 2:
            raise ValueError(f"MLPSpec needs at least two positive widths (input, output); got {self.widths!r}")
        if not isinstance(self.bias, (bool, np.bool_)):
            raise TypeError(f"bias must be True or False; got {self.bias!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}; got {self.activation!r}")
        object.__setattr__(self, "widths", widths)
        offsets, start = [], 0
        for fan_in, fan_out in zip(widths[:-1], widths[1:]):
            w_end = start + fan_out * fan_in
            b_end = w_end + (fan_out if self.bias else 0)
            offsets.append((start, w_end, b_end))
            start = b_end
        object.__setattr__(self, "_offsets", tuple(offsets))

    # ----------------------------------------------------------------- layout
    @property
    def n_layers(self) -> int:
        """Number of linear layers."""
        return len(self.widths) - 1

    @property
    def n_params(self) -> int:
        """``D``, the length of one network's flat parameter vector."""
        return self._offsets[-1][2]

    @property
    def layer_shapes(self) -> list[tuple[int, int]]:
        """``(out, in)`` of every weight matrix."""
        return [(o, i) for i, o in zip(self.widths[:-1], self.widths[1:])]

    def slices(self, layer: int) -> tuple[slice, slice | None]:
        """Slices of the flat vector holding layer ``layer``'s weight and bias (``None`` without biases)."""
        start, w_end, b_end = self._offsets[layer]
        return slice(start, w_end), (slice(w_end, b_end) if self.bias else None)

    def check(self, theta: Tensor, name: str = "theta") -> Tensor:
        """Validate a population and return it as ``[B, D]`` (a single ``[D]`` vector becomes ``[1, D]``)."""
        return check_population(theta, self.n_params, self, name)

    def weights(self, theta: Tensor) -> list[Tensor]:
        """Per-layer weight views ``[B, out, in]`` (no copies)."""
        return self.layers(theta)[0]

    def biases(self, theta: Tensor) -> list[Tensor | None]:
        """Per-layer bias views ``[B, out]`` (``None`` for a spec without biases)."""
        return self.layers(theta)[1]

    def layers(self, theta: Tensor) -> tuple[list[Tensor], list[Tensor | None]]:
        """Per-layer weight views ``[B, out, in]`` and bias views ``[B, out]`` (``None`` without biases).

        One ``split`` of the flat vector: its backward writes all layers' gradients in one concatenation,
        where a slice per layer would each scatter into a zero ``[B, D]`` gradient that is then summed.
        """
        theta = self.check(theta)
        parts = theta.split([n for start, w_end, b_end in self._offsets for n in (w_end - start, b_end - w_end)], 1)
        ws = [w.unflatten(1, shape) for w, shape in zip(parts[::2], self.layer_shapes)]
        return ws, list(parts[1::2]) if self.bias else [None] * self.n_layers

    def pack(self, weights: Sequence[Tensor], biases: Sequence[Tensor | None] | None = None) -> Tensor:
        """Inverse of :meth:`weights` / :meth:`biases`: concatenate per-layer tensors into ``[B, D]``."""
        return _pack(self, weights, biases)

    # ---------------------------------------------------------------- forward
    def act(self, z: Tensor) -> Tensor:
        """The hidden activation applied elementwise."""
        if self.activation == "relu":
            return torch.relu(z)
        if self.activation == "tanh":
            return torch.tanh(z)
        if self.activation == "gelu":
            return F.gelu(z)
        return torch.sin(self.frequency * z)

    def forward(self, theta: Tensor, x: Tensor, return_hidden: bool = False) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Evaluate all ``B`` networks: ``x`` is ``[N, in]`` (shared) or ``[B, N, in]``; returns ``[B, N, out]``.

        Differentiable in ``theta``. With a shared input the first layer is one wide matrix product
        ``x @ [W_1; ...; W_B]^T``; later layers are batched products (``baddbmm``). With
        ``return_hidden`` the post-activation hidden states ``[B, N, width]`` are returned too.
        """
        theta = self.check(theta)
        B = theta.shape[0]
        if x.dim() not in (2, 3) or x.shape[-1] != self.widths[0]:
            raise ValueError(f"x must be [N, {self.widths[0]}] or [B, N, {self.widths[0]}]; got {tuple(x.shape)}")
        if x.dim() == 3 and x.shape[0] != B:
            raise ValueError(f"x has {x.shape[0]} input batches but theta has {B} networks")
        ws, bs = self.layers(theta)
        # Hidden states are kept feature-major, [B, width, N]: every product below then reads and writes
        # contiguous memory (BLAS takes the transposes as flags), so no layer copies its activations.
        # The output is returned as a [B, N, out] view of a [B, out, N] tensor (softmax over classes then
        # runs along contiguous points, which is much faster for few classes).
        hidden = []
        h_t = x.transpose(-2, -1)  # [in, N] shared or [B, in, N]
        for layer, (w, b) in enumerate(zip(ws, bs)):
            o, i = self.layer_shapes[layer]
            if layer == 0 and x.dim() == 2:
                # Shared input: one wide GEMM [B*o, i+1] @ [i+1, N] for all networks, the bias folded in
                # as an extra input column so that neither forward nor backward needs a separate pass.
                if b is not None:
                    w_aug = torch.cat([w, b.unsqueeze(2)], dim=2).reshape(B * o, i + 1)
                    x_aug = torch.cat([h_t, h_t.new_ones(1, h_t.shape[1])], dim=0)
                    z = w_aug @ x_aug               # [B*o, N]
                else:
                    z = w.reshape(B * o, i) @ h_t
            elif b is not None:
                z = torch.baddbmm(b.unsqueeze(2), w, h_t)
            else:
                z = torch.bmm(w, h_t)
            if layer == self.n_layers - 1:
                out = z.view(B, o, -1).transpose(1, 2)
                return (out, hidden) if return_hidden else out
            # no backward needs the fresh product z: a ReLU overwrites it (one activation buffer fewer)
            h_t = (torch.relu_(z) if self.activation == "relu" else self.act(z)).view(B, o, -1)
            if return_hidden:
                hidden.append(h_t.transpose(1, 2))
        raise AssertionError("unreachable")

    __call__ = forward

    # ---------------------------------------------------------- initialisers
    def init(self, n: int, scheme: str = "kaiming", generator: torch.Generator | None = None,
             device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Tensor:
        """Draw ``n`` networks ``[n, D]``.

        ``kaiming``: the ``torch.nn.Linear`` default, U(+-1/sqrt(fan_in)) for weights and biases.
        ``kaiming_normal``: N(0, 2/fan_in) weights (He et al., 2015), zero biases.
        ``xavier``: U(+-sqrt(6/(fan_in+fan_out))) weights (Glorot & Bengio, 2010), zero biases.
        ``siren``: first layer U(+-1/fan_in), others U(+-sqrt(6/fan_in)/frequency) (Sitzmann et al., 2020).
        """
        device = device or config.device()
        dtype = dtype or config.dtype()
        theta = torch.zeros(n, self.n_params, dtype=dtype)
        for layer, (o, i) in enumerate(self.layer_shapes):
            w_slice, b_slice = self.slices(layer)
            if scheme == "kaiming":
                bound_w = bound_b = 1.0 / math.sqrt(i)
            elif scheme == "kaiming_normal":
                theta[:, w_slice] = torch.randn(n, o * i, generator=generator, dtype=dtype) * math.sqrt(2.0 / i)
                continue
            elif scheme == "xavier":
                bound_w, bound_b = math.sqrt(6.0 / (i + o)), 0.0
            elif scheme == "siren":
                bound_w = 1.0 / i if layer == 0 else math.sqrt(6.0 / i) / self.frequency
                bound_b = 1.0 / math.sqrt(i)
            else:
                raise ValueError(f"unknown init scheme {scheme!r}; use kaiming, kaiming_normal, xavier or siren")
            theta[:, w_slice] = (torch.rand(n, o * i, generator=generator, dtype=dtype) * 2 - 1) * bound_w
            if b_slice is not None and bound_b > 0:
                theta[:, b_slice] = (torch.rand(n, o, generator=generator, dtype=dtype) * 2 - 1) * bound_b
        return theta.to(device)

    # --------------------------------------------------------------- interop
    def to_module(self, theta: Tensor) -> nn.Sequential:
        """One network (``[D]`` or ``[1, D]``) as a plain ``torch.nn.Sequential`` of Linear layers and activations."""
        theta = self.check(theta.detach())
        if theta.shape[0] != 1:
            raise ValueError(f"to_module takes one network; got a population of {theta.shape[0]}")
        layers: list[nn.Module] = []
        for layer, (o, i) in enumerate(self.layer_shapes):
            lin = nn.Linear(i, o, bias=self.bias, device=theta.device, dtype=theta.dtype)
            w_slice, b_slice = self.slices(layer)
            with torch.no_grad():
                lin.weight.copy_(theta[0, w_slice].view(o, i))
                if b_slice is not None:
                    lin.bias.copy_(theta[0, b_slice])
            layers.append(lin)
            if layer < self.n_layers - 1:
                layers.append(self._activation_module())
        return nn.Sequential(*layers)

    def _activation_module(self) -> nn.Module:
        return {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU}[self.activation]() if self.activation != "sine" \
            else Sine(self.frequency)

    def from_modules(self, modules: Sequence[nn.Module]) -> Tensor:
        """Stack plain ``nn.Sequential`` MLPs (Linear layers in order) into a population ``[B, D]``."""
        rows = []
        for k, module in enumerate(modules):
            linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
            shapes = [tuple(m.weight.shape) for m in linears]
            if shapes != self.layer_shapes or any((m.bias is not None) != self.bias for m in linears):
                raise ValueError(
                    f"module {k} has Linear shapes {shapes} (bias={[m.bias is not None for m in linears]}); "
                    f"{self} expects {self.layer_shapes} (bias={self.bias})"
                )
            rows.append(torch.cat([p.detach().reshape(-1) for m in linears for p in m.parameters()]))
        if not rows:
            raise ValueError("from_modules needs at least one module")
        return torch.stack(rows)


# ---------------------------------------------------------------------- CNNs
@dataclass(frozen=True)
class CNNSpec:
    """Convolutions ``in_channels -> channels[0] -> ... -> channels[-1]``, global average pooling, linear head.

    Each convolution has stride 1 and same padding (``kernel_size`` odd) and is followed by ``activation``.
    The flat layout is layer by layer ``weight`` then ``bias`` in ``torch.nn`` order (``Conv2d`` weights
    ``[out, in, k, k]``, then the ``Linear`` head ``[n_classes, channels[-1]]``), so a population is ``[B, D]``.
    Hidden channels carry the same symmetries as hidden neurons of an MLP: permuting the filters of one
    convolution and the input channels of the next leaves the function unchanged, and so does a positive
    per-channel scaling for ReLU (pooling and convolution are linear). See chapter 6, "Neural graphs from
    MLPs and CNNs".
    """

    in_channels: int
    channels: tuple[int, ...]
    kernel_size: int = 3
    n_classes: int = 10
    activation: str = "relu"
    _offsets: tuple[tuple[int, int, int], ...] = field(init=False, repr=False, compare=False)

    #: convolutions and the head always have biases
    bias = True

    def __post_init__(self) -> None:
        in_channels = _positive_int(self.in_channels, "CNNSpec in_channels")
        channels = _int_tuple(self.channels, "CNNSpec channels")
        if not channels:
            raise ValueError(f"CNNSpec needs at least one convolution; got channels={self.channels!r}")
        n_classes = _positive_int(self.n_classes, "CNNSpec n_classes")
        kernel_size = _positive_int(self.kernel_size, "CNNSpec kernel_size")
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be a positive odd integer (same padding); got {self.kernel_size}")
        if self.activation not in ("relu", "tanh"):
            raise ValueError(f"activation must be 'relu' or 'tanh'; got {self.activation!r}")
        for name, value in (("in_channels", in_channels), ("channels", channels), ("n_classes", n_classes),
                            ("kernel_size", kernel_size)):
            object.__setattr__(self, name, value)
        offsets, start = [], 0
        for shape in self.layer_shapes:
            w_end = start + math.prod(shape)
            offsets.append((start, w_end, w_end + shape[0]))
            start = w_end + shape[0]
        object.__setattr__(self, "_offsets", tuple(offsets))

    @property
    def widths(self) -> tuple[int, ...]:
        """Nodes per layer of the neural graph: input channels, hidden channels, classes."""
        return (self.in_channels, *self.channels, self.n_classes)

    @property
    def n_layers(self) -> int:
        """Number of layers with weights (convolutions and the head)."""
        return len(self.channels) + 1

    @property
    def layer_shapes(self) -> list[tuple[int, ...]]:
        """Weight shapes: ``(out, in, k, k)`` for convolutions, ``(n_classes, channels[-1])`` for the head."""
        k, dims = self.kernel_size, (self.in_channels, *self.channels)
        convs = [(o, i, k, k) for i, o in zip(dims[:-1], dims[1:])]
        return [*convs, (self.n_classes, dims[-1])]

    @property
    def n_params(self) -> int:
        """``D``, the length of one network's flat parameter vector."""
        return self._offsets[-1][2]

    def slices(self, layer: int) -> tuple[slice, slice]:
        """Slices of the flat vector holding layer ``layer``'s weight and bias."""
        start, w_end, b_end = self._offsets[layer]
        return slice(start, w_end), slice(w_end, b_end)

    def check(self, theta: Tensor, name: str = "theta") -> Tensor:
        """Validate a population and return it as ``[B, D]``."""
        return check_population(theta, self.n_params, self, name)

    def weights(self, theta: Tensor) -> list[Tensor]:
        """Per-layer weight views ``[B, out, in, k, k]`` (convolutions) and ``[B, n_classes, in]`` (head)."""
        theta = self.check(theta)
        return [theta[:, self.slices(l)[0]].reshape(theta.shape[0], *s) for l, s in enumerate(self.layer_shapes)]

    def biases(self, theta: Tensor) -> list[Tensor]:
        """Per-layer bias views ``[B, out]``."""
        theta = self.check(theta)
        return [theta[:, self.slices(l)[1]] for l in range(self.n_layers)]

    def pack(self, weights: Sequence[Tensor], biases: Sequence[Tensor | None] | None = None) -> Tensor:
        """Inverse of :meth:`weights` / :meth:`biases`: concatenate per-layer tensors into ``[B, D]``."""
        return _pack(self, weights, biases)

    def init(self, n: int, scheme: str = "kaiming", generator: torch.Generator | None = None,
             device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Tensor:
        """Draw ``n`` networks ``[n, D]``.

        ``kaiming``: the ``torch.nn`` default, U(+-1/sqrt(fan_in)) for weights and biases (``fan_in`` counts
        the kernel, ``in * k * k``). ``kaiming_normal``: N(0, 2/fan_in) weights, zero biases.

        Args:
            n: number of networks.
            scheme: ``"kaiming"`` or ``"kaiming_normal"``.
            generator: randomness (``None``: torch's global generator).
            device: where the population lives (default :func:`wsbook.config.device`).
            dtype: floating dtype (default :func:`wsbook.config.dtype`).
        """
        if scheme not in ("kaiming", "kaiming_normal"):
            raise ValueError(f"unknown init scheme {scheme!r} for a CNN; use kaiming or kaiming_normal")
        dtype = dtype or config.dtype()
        theta = torch.zeros(n, self.n_params, dtype=dtype)
        for layer, shape in enumerate(self.layer_shapes):
            fan_in = math.prod(shape[1:])
            w_slice, b_slice = self.slices(layer)
            if scheme == "kaiming_normal":
                theta[:, w_slice] = torch.randn(n, w_slice.stop - w_slice.start, generator=generator,
                                                dtype=dtype) * math.sqrt(2.0 / fan_in)
                continue
            for sl in (w_slice, b_slice):
                theta[:, sl] = (torch.rand(n, sl.stop - sl.start, generator=generator, dtype=dtype) * 2 - 1) \
                    * fan_in ** -0.5
        return theta.to(device or config.device())

    def act(self, z: Tensor) -> Tensor:
        """The hidden activation applied elementwise."""
        return torch.relu(z) if self.activation == "relu" else torch.tanh(z)

    def forward(self, theta: Tensor, x: Tensor, return_hidden: bool = False) -> Tensor | tuple[Tensor, list[Tensor]]:
        """All ``B`` networks on shared images ``x [N, C, H, W]`` (or one batch per network,
        ``[B, N, C, H, W]``, e.g. per-member minibatches) -> logits ``[B, N, n_classes]``.

        Batched with grouped convolutions: the ``B`` networks become ``B`` groups of one convolution. With
        ``return_hidden`` each convolution's post-activations come back too, as ``[B, N * H * W, channels]``
        (every pixel of every image is one sample of the channel's activation, the layout
        :func:`wsbook.symmetry.activation_statistics` reads).
        """
        theta = self.check(theta)
        B = theta.shape[0]
        per_member = x.dim() == 5
        if x.dim() not in (4, 5) or x.shape[-3] != self.in_channels or (per_member and x.shape[0] != B):
            raise ValueError(f"x must be [N, {self.in_channels}, H, W] or [{B}, N, {self.in_channels}, H, W]; "
                             f"got {tuple(x.shape)}")
        N = x.shape[-4]
        ws, bs = self.weights(theta), self.biases(theta)
        if per_member:                                             # [B, N, C, H, W] -> [N, B*C, H, W]
            h = x.transpose(0, 1).reshape(N, B * self.in_channels, *x.shape[-2:])
        else:
            h = x.repeat(1, B, 1, 1)                               # [N, B*C, H, W]
        hidden = []
        for w, b in zip(ws[:-1], bs[:-1]):
            h = F.conv2d(h, w.reshape(-1, *w.shape[2:]), b.reshape(-1), padding=self.kernel_size // 2, groups=B)
            h = self.act(h)
            if return_hidden:
                c = h.shape[1] // B                                # [N, B*c, H, W] -> [B, N*H*W, c]
                hidden.append(h.view(N, B, c, *h.shape[2:]).permute(1, 0, 3, 4, 2).reshape(B, -1, c))
        pooled = h.mean((2, 3)).view(N, B, -1).transpose(0, 1)     # [B, N, C_last]
        out = torch.baddbmm(bs[-1].unsqueeze(1), pooled, ws[-1].transpose(1, 2))
        return (out, hidden) if return_hidden else out

    __call__ = forward

    def to_module(self, theta: Tensor) -> nn.Sequential:
        """One network (``[D]`` or ``[1, D]``) as ``Conv2d, act, ..., AdaptiveAvgPool2d(1), Flatten, Linear``."""
        theta = self.check(theta.detach())
        if theta.shape[0] != 1:
            raise ValueError(f"to_module takes one network; got a population of {theta.shape[0]}")
        ws, bs = self.weights(theta), self.biases(theta)
        layers: list[nn.Module] = []
        kw = dict(device=theta.device, dtype=theta.dtype)
        for w, b in zip(ws[:-1], bs[:-1]):
            conv = nn.Conv2d(w.shape[2], w.shape[1], self.kernel_size, padding=self.kernel_size // 2, **kw)
            with torch.no_grad():
                conv.weight.copy_(w[0])
                conv.bias.copy_(b[0])
            layers += [conv, nn.ReLU() if self.activation == "relu" else nn.Tanh()]
        head = nn.Linear(ws[-1].shape[2], self.n_classes, **kw)
        with torch.no_grad():
            head.weight.copy_(ws[-1][0])
            head.bias.copy_(bs[-1][0])
        return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), head)

    def from_modules(self, modules: Sequence[nn.Module]) -> Tensor:
        """Stack ``nn.Sequential`` CNNs (``Conv2d`` layers with stride 1 and same padding, then one ``Linear``
        head after global average pooling) into a population ``[B, D]``."""
        rows = []
        for k, module in enumerate(modules):
            layers = [m for m in module.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
            shapes = [tuple(m.weight.shape) for m in layers]
            convs_ok = all(isinstance(m, nn.Conv2d) and m.stride == (1, 1) and m.padding == (self.kernel_size // 2,) * 2
                           and m.dilation == (1, 1) and m.groups == 1 for m in layers[:-1])
            if shapes != [tuple(s) for s in self.layer_shapes] or not convs_ok or not isinstance(layers[-1], nn.Linear) \
                    or any(m.bias is None for m in layers):
                raise ValueError(f"module {k} has layers {shapes} (convolutions with stride 1, padding "
                                 f"{self.kernel_size // 2} and biases: {convs_ok}); {self} expects {self.layer_shapes}")
            rows.append(torch.cat([p.detach().reshape(-1) for m in layers for p in (m.weight, m.bias)]))
        if not rows:
            raise ValueError("from_modules needs at least one module")
        return torch.stack(rows)


def pack_cnns(spec: CNNSpec, members: Tensor, k: int) -> tuple[CNNSpec, Tensor]:
    """Pack every ``k`` consecutive CNNs of ``members [n * k, D]`` side by side into one CNN with ``k`` times
    the hidden channels: ``(wide spec, theta [n, D_wide])``.

    Member ``m`` of a packed network owns channels ``m * c_h, ..., (m + 1) * c_h - 1`` of every hidden layer:
    the first convolution stacks the members' filters, every later convolution is block-diagonal (a filter
    reads only the channels of its own member; the kernels between members are zero), and the head reads
    all channels with the members' weights divided by ``k`` and the mean of their biases. Pooling and the
    head are linear, so the packed network's logits are the mean of its members' logits (a packed
    ensemble: one wide network that computes the average of ``k`` narrow ones).
    """
    members = spec.check(members, "members")
    k = _positive_int(k, "pack_cnns k")
    if members.shape[0] % k:
        raise ValueError(f"pack_cnns: {members.shape[0]} networks do not make whole groups of k={k}")
    n = members.shape[0] // k
    wide = CNNSpec(spec.in_channels, tuple(c * k for c in spec.channels), spec.kernel_size, spec.n_classes,
                   spec.activation)
    ws = [w.reshape(n, k, *w.shape[1:]) for w in spec.weights(members)]        # [n, k, out, in, ...]
    bs = [b.reshape(n, k, -1) for b in spec.biases(members)]
    weights = [ws[0].flatten(1, 2)]                                            # [n, k * c_1, in, kk, kk]
    for w in ws[1:-1]:
        out_c, in_c = w.shape[2], w.shape[3]
        block = w.new_zeros(n, k, out_c, k, in_c, *w.shape[4:])
        for m in range(k):
            block[:, m, :, m] = w[:, m]
        weights.append(block.reshape(n, k * out_c, k * in_c, *w.shape[4:]))
    weights.append(ws[-1].permute(0, 2, 1, 3).reshape(n, spec.n_classes, -1) / k)
    biases = [b.flatten(1) for b in bs[:-1]] + [bs[-1].mean(1)]
    return wide, wide.pack(weights, biases)


def check_other_widths(spec: NetSpec, other: NetSpec, where: str) -> None:
    """Raise unless ``other`` is ``spec`` with other hidden widths only: the same kind of network, depth, inputs
    and outputs (and a CNN's kernel size)."""
    if type(other) is not type(spec) or len(other.widths) != len(spec.widths) \
            or (other.widths[0], other.widths[-1]) != (spec.widths[0], spec.widths[-1]) \
            or getattr(other, "kernel_size", None) != getattr(spec, "kernel_size", None):
        raise ValueError(f"{where}: {other} must keep the kind of network, depth, inputs and outputs (and kernel "
                         f"size) of {spec}")


def repeat_units(spec: NetSpec, theta: Tensor, wide: NetSpec) -> Tensor:
    """Networks ``theta`` of ``spec`` carried to the hidden widths of ``wide`` by repeating hidden units:
    unit ``j`` of every hidden layer of the result is unit ``j mod h`` of the original (``h`` its width), with
    that unit's incoming weights, bias and outgoing weights, so that every weight between two hidden units
    is repeated along both ends. Returns ``[B, D_wide]``.

    The copies keep the weights sized for the original width: a layer that reads ``k`` times as many hidden
    units sums ``k`` copies, so divide every weight that reads hidden units by the width ratio to compute the
    original network (the function-preserving widening of Net2Net, Chen et al. 2016).
    """
    theta = spec.check(theta, "theta")
    check_other_widths(spec, wide, "repeat_units")
    last = spec.n_layers - 1
    weights, biases = [], []
    for l, (w, b) in enumerate(zip(spec.weights(theta), spec.biases(theta))):
        out_idx = torch.arange(wide.widths[l + 1], device=w.device) % spec.widths[l + 1]
        in_idx = torch.arange(wide.widths[l], device=w.device) % spec.widths[l]
        if l < last:
            w, b = w[:, out_idx], (None if b is None else b[:, out_idx])
        weights.append(w if l == 0 else w[:, :, in_idx])
        biases.append(b)
    return wide.pack(weights, biases)


# ------------------------------------------------------------------ training
def output_loss(out: Tensor, y: Tensor, task: str = "classification") -> Tensor:
    """Mean loss ``[B]`` of every member's outputs ``out [B, N, out]`` against targets ``y``: cross-entropy for
    ``classification`` (class labels ``[N]`` shared or ``[B, N]``), squared error for ``regression`` (values
    ``[N]`` / ``[N, out]`` shared or ``[B, N, out]``)."""
    task = check_task(task)
    B, N = out.shape[0], out.shape[1]
    if task == "classification":
        target = y.expand(B, N) if y.dim() == 1 else y
        # [B, C, N] layout: log-softmax over classes with the points contiguous (see MLPSpec.forward)
        return F.cross_entropy(out.transpose(1, 2), target, reduction="none").mean(1)
    target = y if y.dim() == 3 else y.reshape(N, -1).unsqueeze(0)  # [B, N, out] or shared [N, out]
    return ((out - target) ** 2).flatten(1).mean(1)


def per_member_loss(spec: NetSpec, theta: Tensor, x: Tensor, y: Tensor, task: str = "classification") -> Tensor:
    """Mean loss of every member on its batch: ``[B]``. ``x`` is ``[N, in]`` or ``[B, N, in]``, ``y`` matches
    (see :func:`output_loss`)."""
    return output_loss(spec.forward(theta, x), y, task)


def output_accuracy(out: Tensor, y: Tensor) -> Tensor:
    """Fraction of points whose highest-scoring class is the label: ``out [..., N, C]`` (logits or
    probabilities) against labels ``y [N]`` (or ``[..., N]``), ``[...]``."""
    return (out.argmax(-1) == y).float().mean(-1)


def accuracy(spec: NetSpec, theta: Tensor, x: Tensor, y: Tensor) -> Tensor:
    """Per-member classification accuracy ``[B]`` (:func:`output_accuracy` of the outputs, without grad)."""
    with torch.no_grad():
        return output_accuracy(spec.forward(theta, x), y)


def _accumulate_gradients(spec: MLPSpec, theta: Tensor, x: Tensor, y: Tensor, task: str,
                          chunk_size: int | None) -> Tensor:
    """Backpropagate the summed per-member mean loss in chunks of points; return the per-member loss ``[B]``.
    The points are axis -2 of vector inputs ``[.., N, in]`` and axis -4 of images ``[.., N, C, H, W]``."""
    x_axis = x.dim() - (4 if isinstance(spec, CNNSpec) else 2)
    y_axis = y.dim() - (1 if task == "classification" else 2)
    n = x.shape[x_axis]
    if not chunk_size or n <= chunk_size:
        member_loss = per_member_loss(spec, theta, x, y, task)
        member_loss.sum().backward()
        return member_loss.detach()
    total = torch.zeros(theta.shape[0], device=theta.device, dtype=theta.dtype)
    for start in range(0, n, chunk_size):
        size = min(chunk_size, n - start)
        xc, yc = x.narrow(x_axis, start, size), y.narrow(y_axis, start, size)
        part = per_member_loss(spec, theta, xc, yc, task) * (size / n)
        part.sum().backward()
        total += part.detach()
    return total


def _take_rows(data: Tensor, idx: Tensor) -> Tensor:
    """``data[idx]`` for indices of any shape: ``index_select`` copies whole rows, where advanced
    indexing gathers element by element (6x slower for the population's minibatches)."""
    return data.index_select(0, idx.reshape(-1)).unflatten(0, idx.shape)


@dataclass
class TrainResult:
    """What :func:`train_population` returns: final weights, per-step per-member losses, optional checkpoints."""

    theta: Tensor            # [B, D]
    loss_history: Tensor     # [steps, B]
    checkpoints: Tensor | None = None   # [K, B, D] at checkpoint_steps
    checkpoint_steps: list[int] = field(default_factory=list)


def _check_size(value, name: str, allow_none: bool = False) -> None:
    """A training size must be a positive int (a ValueError naming the argument otherwise)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        what = "a positive int or None" if allow_none else "a positive int"
        raise ValueError(f"{name} must be {what}; got {value!r}")


def train_population(
    spec: MLPSpec,
    theta: Tensor,
    x: Tensor,
    y: Tensor,
    *,
    steps: int,
    lr: float = 1e-3,
    optimizer: str = "adam",
    task: str = "classification",
    batch_size: int | None = None,
    weight_decay: float = 0.0,
    momentum: float = 0.0,
    shared_batches: bool = False,
    checkpoint_every: int | None = None,
    generator: torch.Generator | None = None,
    progress: bool | None = None,
    desc: str = "training",
    chunk_size: int | str | None = "auto",
    shard: bool | None = None,
) -> TrainResult:
    """Train all ``B`` networks of ``theta`` at once: one optimizer over one ``[B, D]`` leaf.

    Adam and SGD update every coordinate independently, so this equals ``B`` separate runs. Each member
    draws its own minibatch of ``batch_size`` (``None`` = full batch) unless ``shared_batches``. The
    summed loss is backpropagated, so each member receives exactly the gradient of its own mean loss.
    A batch larger than ``chunk_size`` points is processed in chunks whose gradients are accumulated
    (the step is unchanged; activations stay in cache, which doubles full-batch throughput on a CPU).
    The steps run in :func:`wsbook.loop.descend` (fused optimizer, NaN check every step, progress, history).
    See chapter 1, "Many networks, one tensor".

    Args:
        spec: the architecture of every member.
        theta: initial weights ``[B, D]``.
        x: inputs ``[N, in]``; y: labels ``[N]`` (classification) or targets ``[N]`` / ``[N, out]`` (regression).
        steps: number of optimizer steps (positive).
        lr: learning rate.
        optimizer: ``"adam"``, ``"adamw"`` or ``"sgd"``.
        task: ``"classification"`` (cross-entropy) or ``"regression"`` (squared error).
        batch_size: points per minibatch (positive), or ``None`` for full-batch steps.
        weight_decay, momentum: optimizer settings (momentum for SGD only).
        shared_batches: all members see the same minibatches.
        checkpoint_every: keep a copy of the weights every this many steps.
        generator: random stream of the minibatches (``None``: torch's global generator).
        progress: show a progress bar (default per :func:`wsbook.config.progress_enabled`).
        desc: name of the run in the progress bar and in errors.
        chunk_size: points per gradient-accumulation chunk; ``"auto"`` sizes chunks so one hidden
            activation holds about 4M numbers; ``None`` never chunks.
        shard: under ``torchrun`` (:mod:`wsbook.distributed`), split the members over the processes and
            gather them back: every process draws the whole population's minibatch orders and trains its
            own block (starting on a vector boundary of the weights, :func:`wsbook.distributed.granule_for`),
            so the result equals the single-process run bit for bit (on CPUs). ``None``: shard whenever a process
            group is running and every process gets a block (:func:`wsbook.distributed.splits`).

    Raises:
        ValueError: for a non-positive ``steps``, ``batch_size`` or ``checkpoint_every``, or mismatched data.
        FloatingPointError: when a member's loss becomes NaN or infinite (naming the step).
    """
    theta0 = spec.check(theta)
    _check_size(steps, "steps")
    _check_size(batch_size, "batch_size", allow_none=True)
    _check_size(checkpoint_every, "checkpoint_every", allow_none=True)
    task = check_task(task)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x has {x.shape[0]} examples but y has {y.shape[0]}")
    B, N = theta0.shape[0], x.shape[0]
    # blocks start on a vector boundary of the [B, D] leaf, so the fused optimizer rounds as in the whole
    granule = distributed.granule_for(theta0.shape[1] * theta0.element_size())
    split = shard is not False and distributed.splits(B, granule=granule)
    rows = distributed.shard(B, granule=granule) if split else slice(0, B)
    param = theta0[rows].detach().clone().requires_grad_(True)
    opt = make_optimizer([param], optimizer, lr=lr, weight_decay=weight_decay, momentum=momentum)
    checkpoints, checkpoint_steps = [], []
    batches = Minibatches(N, batch_size, members=None if shared_batches else B, generator=generator,
                          device=x.device, rows=None if shared_batches else rows)
    if task == "regression":
        y = y.reshape(N, -1)
    if chunk_size == "auto":          # from the whole population: a block accumulates exactly as it would
        chunk_size = max(64, 2**22 // (B * max(spec.widths[1:])))

    def step_fn(step: int) -> Tensor:
        idx = batches(step)
        xb, yb = (x, y) if idx is None else (_take_rows(x, idx), _take_rows(y, idx))
        return _accumulate_gradients(spec, param, xb, yb, task, chunk_size)

    def keep(step: int) -> None:
        if checkpoint_every and (step + 1) % checkpoint_every == 0:
            checkpoints.append(param.detach().clone())
            checkpoint_steps.append(step + 1)

    run = descend(step_fn, opt, steps, backward=False, on_step=keep, progress=progress, desc=desc)
    gather = distributed.all_gather_rows if split else (lambda t, dim=0: t)
    return TrainResult(
        theta=gather(param.detach()),
        loss_history=gather(run.losses, 1),
        checkpoints=gather(torch.stack(checkpoints), 1) if checkpoints else None,
        checkpoint_steps=checkpoint_steps,
    )
