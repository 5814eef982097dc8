"""A declarative description of the symmetries of an MLP's weights, derived from its :class:`MLPSpec`.

Every hidden layer ``l`` carries one permutation group ``S_{width_l}`` and one per-neuron scaling group.
The permutation of layer ``l`` acts on the *rows* of ``W_l``, the entries of ``b_l`` and the *columns* of
``W_{l+1}`` (Git Re-Basin's "permutation spec", Ainsworth et al., 2023). The scaling acts on the same
axes, multiplying the incoming side and dividing the outgoing side. Which scalings leave the function
unchanged depends on the activation: ``relu`` is positively homogeneous (any ``s > 0``); ``tanh`` and
``sine`` are odd (``s in {-1, +1}``); ``gelu`` has none. Every function of :mod:`wsbook.symmetry` reads
this description, so a new architecture only has to be described here once.
"""
from __future__ import annotations

from dataclasses import dataclass

from wsbook.nets import MLPSpec

#: per-neuron scaling group of each activation: "positive" (s > 0), "sign" (s = +-1) or None
SCALING = {"relu": "positive", "tanh": "sign", "sine": "sign", "gelu": None}


@dataclass(frozen=True)
class Axis:
    """One tensor axis that a hidden layer's group element acts on: ``kind`` is ``"W"`` or ``"b"``,
    ``layer`` the linear layer, ``dim`` the axis of that layer's ``[out, in]`` weight (0 rows, 1 columns)
    or 0 for a bias, and ``side`` ``"in"`` (incoming: multiply by s) or ``"out"`` (outgoing: divide by s)."""

    kind: str
    layer: int
    dim: int
    side: str


@dataclass(frozen=True)
class HiddenGroup:
    """The group acting on hidden layer ``index``: ``S_width`` times per-neuron ``scaling``."""

    index: int
    width: int
    scaling: str | None
    axes: tuple[Axis, ...]


@dataclass(frozen=True)
class SymmetrySpec:
    """All hidden-layer groups of one architecture (the product group acting on its weight space)."""

    spec: MLPSpec
    groups: tuple[HiddenGroup, ...]

    @property
    def widths(self) -> list[int]:
        """Widths of the hidden layers, one group each."""
        return [g.width for g in self.groups]

    @property
    def scaling(self) -> str | None:
        """The per-neuron scaling group shared by all hidden layers."""
        return SCALING[self.spec.activation]


def symmetry_spec(spec: MLPSpec) -> SymmetrySpec:
    """Describe which axes each hidden layer's permutation and scaling act on (the permutation spec)."""
    if not isinstance(spec, MLPSpec):
        raise TypeError(f"symmetry_spec expects an MLPSpec; got {type(spec).__name__}")
    groups = []
    for h in range(spec.n_layers - 1):
        axes = [Axis("W", h, 0, "in")]
        if spec.bias:
            axes.append(Axis("b", h, 0, "in"))
        axes.append(Axis("W", h + 1, 1, "out"))
        groups.append(HiddenGroup(h, spec.widths[h + 1], SCALING[spec.activation], tuple(axes)))
    return SymmetrySpec(spec, tuple(groups))


def check_same_architecture(spec: MLPSpec, *others: MLPSpec) -> None:
    """Raise a clear error when architectures that should match (e.g. for alignment) do not."""
    for other in others:
        if other != spec:
            raise ValueError(f"architectures differ: {spec} versus {other}; alignment needs one architecture")
