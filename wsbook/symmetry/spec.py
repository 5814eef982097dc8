"""A declarative description of the symmetries of a network's weights, derived from its spec.

Every hidden layer ``l`` (a hidden neuron of an MLP, a hidden channel of a CNN) carries one permutation
group ``S_{width_l}`` and one per-neuron scaling group. The permutation of layer ``l`` acts on axis 0 (the
*rows*) of ``W_l``, the entries of ``b_l`` and axis 1 (the *columns*, or input channels) of ``W_{l+1}``
(Git Re-Basin's "permutation spec", Ainsworth et al., 2023). The scaling acts on the same axes,
multiplying the incoming side and dividing the outgoing side. Which scalings leave the function unchanged
depends on the activation: ``relu`` is positively homogeneous (any ``s > 0``); ``tanh`` and ``sine`` are
odd (``s in {-1, +1}``); ``gelu`` has none.

Every function of :mod:`wsbook.symmetry` (the group actions, weight matching, canonicalization, the
product-of-spheres layout) and the neural graphs of :mod:`wsbook.graphs` read this description, so an
architecture that follows the :class:`wsbook.nets.NetSpec` protocol is described here once and can then be
permuted, aligned and canonicalized by the same code. See chapter 5, "The symmetry group of a network".
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from wsbook.nets import NetSpec

#: per-neuron scaling group of each activation: "positive" (s > 0), "sign" (s = +-1) or None
SCALING = {"relu": "positive", "tanh": "sign", "sine": "sign", "gelu": None}


@dataclass(frozen=True)
class Axis:
    """One tensor axis that a hidden layer's group element acts on: ``kind`` is ``"W"`` or ``"b"``,
    ``layer`` the layer with weights, ``dim`` the axis of that layer's weight ``[out, in, ...]`` (0 rows,
    1 columns / input channels) or 0 for a bias, and ``side`` ``"in"`` (incoming: multiply by s) or
    ``"out"`` (outgoing: divide by s)."""

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
    """All hidden-layer groups of one architecture (the product group acting on its weight space).

    ``acting_on[(kind, layer)]`` maps each axis of a parameter tensor to the hidden group that acts on it
    (Git Re-Basin's ``axes_to_perm``): what every algorithm needs to apply the *other* groups' current
    elements to a tensor while it optimises one group.
    """

    spec: NetSpec
    groups: tuple[HiddenGroup, ...]

    @property
    def widths(self) -> list[int]:
        """Widths of the hidden layers, one group each."""
        return [g.width for g in self.groups]

    @property
    def scaling(self) -> str | None:
        """The per-neuron scaling group shared by all hidden layers."""
        return SCALING[self.spec.activation]

    @property
    def acting_on(self) -> dict[tuple[str, int], dict[int, int]]:
        """``{(kind, layer): {dim: group index}}`` for every parameter tensor some group acts on."""
        table: dict[tuple[str, int], dict[int, int]] = {}
        for h, g in enumerate(self.groups):
            for ax in g.axes:
                table.setdefault((ax.kind, ax.layer), {})[ax.dim] = h
        return table


@lru_cache(maxsize=256)
def _describe(spec: NetSpec) -> SymmetrySpec:
    groups = []
    for h in range(spec.n_layers - 1):
        axes = [Axis("W", h, 0, "in")]
        if spec.bias:
            axes.append(Axis("b", h, 0, "in"))
        axes.append(Axis("W", h + 1, 1, "out"))
        groups.append(HiddenGroup(h, spec.widths[h + 1], SCALING[spec.activation], tuple(axes)))
    return SymmetrySpec(spec, tuple(groups))


def symmetry_spec(spec: NetSpec) -> SymmetrySpec:
    """Describe which axes each hidden layer's permutation and scaling act on (the permutation spec).

    Works for any spec of the :class:`wsbook.nets.NetSpec` protocol whose layer ``l`` maps the nodes of
    ``widths[l]`` to those of ``widths[l + 1]`` along axes 1 and 0 of its weight (MLPs and CNNs)."""
    if not isinstance(spec, NetSpec):
        raise TypeError(f"symmetry_spec expects a network spec (MLPSpec, CNNSpec); got {type(spec).__name__}")
    if spec.activation not in SCALING:
        raise ValueError(f"no symmetry description for activation {spec.activation!r}; known: {sorted(SCALING)}")
    return _describe(spec)


def check_same_architecture(spec: NetSpec, *others: NetSpec) -> None:
    """Raise a clear error when architectures that should match (e.g. for alignment) do not."""
    for other in others:
        if other != spec:
            raise ValueError(f"architectures differ: {spec} versus {other}; alignment needs one architecture")
