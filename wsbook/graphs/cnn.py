"""A small CNN spec with the same population convention as :class:`wsbook.nets.MLPSpec`.

``CNNSpec(in_channels, channels, kernel_size, n_classes)``: ``len(channels)`` convolutions (stride 1,
same padding, ``activation`` after each), global average pooling, and one linear classifier. The flat
layout is layer by layer ``weight`` then ``bias`` in ``torch.nn`` order, so a population is ``[B, D]``.
Hidden channels carry the permutation symmetry (thesis ``000`` ch. 4-5): permuting the filters of one
convolution and the input channels of the next leaves the function unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from wsbook import config
from wsbook.nets import check_population


@dataclass(frozen=True)
class CNNSpec:
    """Convolutions ``in_channels -> channels[0] -> ... -> channels[-1]``, average pooling, linear head."""

    in_channels: int
    channels: tuple[int, ...]
    kernel_size: int = 3
    n_classes: int = 10
    activation: str = "relu"
    _offsets: tuple[tuple[int, int, int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        channels = tuple(int(c) for c in self.channels)
        if self.in_channels < 1 or not channels or any(c < 1 for c in channels) or self.n_classes < 1:
            raise ValueError(f"CNNSpec needs positive in_channels, channels and n_classes; got {self!r}")
        if self.kernel_size < 1 or self.kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be a positive odd integer; got {self.kernel_size}")
        if self.activation not in ("relu", "tanh"):
            raise ValueError(f"activation must be 'relu' or 'tanh'; got {self.activation!r}")
        object.__setattr__(self, "channels", channels)
        offsets, start = [], 0
        for shape in self.layer_shapes:
            w_end = start + int(torch.Size(shape).numel())
            offsets.append((start, w_end, w_end + shape[0]))
            start = w_end + shape[0]
        object.__setattr__(self, "_offsets", tuple(offsets))

    @property
    def widths(self) -> tuple[int, ...]:
        """Nodes per layer of the neural graph: input channels, hidden channels, classes."""
        return (self.in_channels, *self.channels, self.n_classes)

    @property
    def n_layers(self) -> int:
        return len(self.channels) + 1

    @property
    def layer_shapes(self) -> list[tuple[int, ...]]:
        """Weight shapes: ``(out, in, k, k)`` for convolutions, ``(n_classes, channels[-1])`` for the head."""
        k, dims = self.kernel_size, (self.in_channels, *self.channels)
        convs = [(o, i, k, k) for i, o in zip(dims[:-1], dims[1:])]
        return [*convs, (self.n_classes, dims[-1])]

    @property
    def n_params(self) -> int:
        return self._offsets[-1][2]

    def slices(self, layer: int) -> tuple[slice, slice]:
        start, w_end, b_end = self._offsets[layer]
        return slice(start, w_end), slice(w_end, b_end)

    def check(self, theta: Tensor, name: str = "theta") -> Tensor:
        """Validate a population and return it as ``[B, D]``."""
        return check_population(theta, self.n_params, self, name)

    def weights(self, theta: Tensor) -> list[Tensor]:
        theta = self.check(theta)
        return [theta[:, self.slices(l)[0]].reshape(theta.shape[0], *s) for l, s in enumerate(self.layer_shapes)]

    def biases(self, theta: Tensor) -> list[Tensor]:
        theta = self.check(theta)
        return [theta[:, self.slices(l)[1]] for l in range(self.n_layers)]

    def init(self, n: int, generator: torch.Generator | None = None,
             device: torch.device | str | None = None) -> Tensor:
        """``n`` networks with the ``torch.nn`` default init, U(+-1/sqrt(fan_in)) for weights and biases."""
        theta = torch.empty(n, self.n_params)
        for layer, shape in enumerate(self.layer_shapes):
            fan_in = int(torch.Size(shape[1:]).numel())
            bound = fan_in ** -0.5
            for sl in self.slices(layer):
                width = sl.stop - sl.start
                theta[:, sl] = (torch.rand(n, width, generator=generator) * 2 - 1) * bound
        return theta.to(device or config.device())

    def forward(self, theta: Tensor, x: Tensor) -> Tensor:
        """All ``B`` networks on shared images ``x [N, C, H, W]`` -> logits ``[B, N, n_classes]``.

        Batched with grouped convolutions: the ``B`` networks become ``B`` groups of one convolution.
        """
        theta = self.check(theta)
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"x must be [N, {self.in_channels}, H, W]; got {tuple(x.shape)}")
        B, N = theta.shape[0], x.shape[0]
        ws, bs = self.weights(theta), self.biases(theta)
        act = torch.relu if self.activation == "relu" else torch.tanh
        h = x.repeat(1, B, 1, 1)                                   # [N, B*C, H, W]
        for w, b in zip(ws[:-1], bs[:-1]):
            h = F.conv2d(h, w.reshape(-1, *w.shape[2:]), b.reshape(-1), padding=self.kernel_size // 2, groups=B)
            h = act(h)
        pooled = h.mean((2, 3)).view(N, B, -1).transpose(0, 1)     # [B, N, C_last]
        return torch.baddbmm(bs[-1].unsqueeze(1), pooled, ws[-1].transpose(1, 2))

    __call__ = forward
