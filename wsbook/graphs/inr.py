"""SIREN INRs of digit images and an autoencoder that canonicalizes them (paper ``004``).

* :func:`pixel_grid` / :func:`render`: an INR's image on a grid (the zoo of digit SIRENs is
  :func:`wsbook.experiments.zoos.digit_inr_zoo`).
* :class:`INREncoder`: invariant to hidden-neuron permutations (a :class:`WeightSpaceGNN` with an
  invariant head) and to sign flips (hidden neurons are first sign-canonicalized so every hidden bias is
  non-negative; for odd activations such as sine this picks one member of each sign orbit).
* :class:`INRAutoencoder`: encoder + MLP decoder to a full weight vector; trained with the *functional*
  loss of paper ``004``: the decoded SIREN must reproduce the image's pixels.
* :func:`interpolation_losses` / :func:`barrier`: reconstruction error along a linear path in weight space.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from wsbook.graphs.layers import mlp
from wsbook.graphs.models import WeightSpaceGNN
from wsbook.graphs.neural_graph import NeuralGraph
from wsbook.graphs.train import fit_minibatches
from wsbook.nets import MLPSpec


def pixel_grid(side: int = 8, device: torch.device | str | None = None) -> Tensor:
    """Pixel-centre coordinates in [-1, 1]^2, row-major like a flattened image: ``[side*side, 2]``."""
    lin = torch.linspace(-1, 1, side, device=device)
    yy, xx = torch.meshgrid(lin, lin, indexing="ij")
    return torch.stack([xx.flatten(), yy.flatten()], 1)


def render(spec: MLPSpec, theta: Tensor, coords: Tensor) -> Tensor:
    """Pixel values of every INR in ``theta`` at ``coords``: ``[B, P]``."""
    return spec.forward(theta, coords).squeeze(-1)


class INREncoder(nn.Module):
    """Permutation- and sign-invariant encoder: sign canonicalization, then an invariant GNN, then batch
    normalization of the latent (the pooled GNN features differ little between networks at initialisation;
    standardizing them over the zoo gives the decoder an informative code from the first step)."""

    def __init__(self, spec: MLPSpec, dim: int = 32, n_layers: int = 2, latent: int = 32, layer: str = "pna"):
        super().__init__()
        if spec.activation not in ("sine", "tanh"):
            raise ValueError(f"sign flips are a symmetry only for odd activations; got {spec.activation!r}")
        self.gnn = WeightSpaceGNN(spec, layer, dim=dim, n_layers=n_layers, head="invariant", out_dim=latent)
        self.graph = self.gnn.graph
        self.norm = nn.BatchNorm1d(latent)   # standardizes each latent coordinate over the zoo

    def forward(self, theta: Tensor) -> Tensor:
        return self.norm(self.gnn(self.graph.sign_canonicalize(theta)))


class INRAutoencoder(nn.Module):
    """Invariant encoder and MLP decoder ``z -> theta_hat [D]`` (paper ``004``, fig. 1)."""

    def __init__(self, spec: MLPSpec, dim: int = 32, n_layers: int = 2, latent: int = 32, decoder_hidden: int = 256,
                 layer: str = "pna"):
        super().__init__()
        self.spec = spec
        self.encoder = INREncoder(spec, dim, n_layers, latent, layer)
        self.decoder = mlp([latent, decoder_hidden, decoder_hidden, spec.n_params])
        self.register_buffer("theta_scale", torch.ones(spec.n_params))

    def decode(self, z: Tensor) -> Tensor:
        return self.decoder(z) * self.theta_scale

    def forward(self, theta: Tensor) -> Tensor:
        """The canonical representative ``decode(encode(theta))`` ``[B, D]``."""
        return self.decode(self.encoder(theta))


def fit_autoencoder(model: INRAutoencoder, theta: Tensor, images: Tensor, *, epochs: int = 100, lr: float = 1e-3,
                    batch_size: int = 32, seed: int = 0) -> Tensor:
    """Train with the functional loss: MSE between the decoded SIREN's pixels and the image. Returns per-epoch loss."""
    spec = model.spec
    spec.check(theta)
    if images.shape != (theta.shape[0], 64):
        raise ValueError(f"images must be [{theta.shape[0]}, 64]; got {tuple(images.shape)}")
    coords = pixel_grid(8, theta.device)
    with torch.no_grad():   # decoder outputs start at the zoo's per-parameter scale
        model.theta_scale.copy_(theta.abs().mean(0).clamp_min(1e-3))
    model.encoder.gnn.set_normalization(model.encoder.graph.sign_canonicalize(theta))
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)

    def batch_loss(idx: Tensor) -> Tensor:
        return ((render(spec, model(theta[idx]), coords) - images[idx]) ** 2).mean()

    history = fit_minibatches(opt, batch_loss, theta.shape[0], epochs=epochs, batch_size=batch_size,
                              generator=gen, device=theta.device, what="autoencoder")
    model.eval()
    return history


@torch.no_grad()
def reconstruction_mse(model: INRAutoencoder, theta: Tensor, images: Tensor) -> Tensor:
    """Per-INR pixel MSE of the decoded network against the image ``[B]``."""
    out = render(model.spec, model(theta), pixel_grid(8, theta.device))
    return ((out - images) ** 2).mean(1)


@torch.no_grad()
def interpolation_losses(spec: MLPSpec, theta_a: Tensor, theta_b: Tensor, images: Tensor, n_points: int = 11) -> Tensor:
    """Pixel MSE along ``(1 - t) theta_a + t theta_b`` for ``n_points`` values of ``t``: ``[B, n_points]`` (all pairs
    and all ``t`` in one batched forward)."""
    theta_a, theta_b = spec.check(theta_a), spec.check(theta_b)
    B = theta_a.shape[0]
    t = torch.linspace(0, 1, n_points, device=theta_a.device).view(1, -1, 1)
    path = ((1 - t) * theta_a.unsqueeze(1) + t * theta_b.unsqueeze(1)).reshape(B * n_points, -1)
    out = render(spec, path, pixel_grid(8, theta_a.device)).view(B, n_points, -1)
    return ((out - images.unsqueeze(1)) ** 2).mean(-1)


def barrier(losses: Tensor) -> Tensor:
    """Loss barrier of each path ``[B, T]``: ``max_t [L(t) - ((1 - t) L(0) + t L(1))]`` (Frankle et al., 2020)."""
    t = torch.linspace(0, 1, losses.shape[1], device=losses.device)
    return (losses - ((1 - t) * losses[:, :1] + t * losses[:, -1:])).max(1).values


def orbit_partner(graph: NeuralGraph, theta: Tensor, noise: float = 0.01,
                  generator: torch.Generator | None = None) -> Tensor:
    """A random member of each network's permutation-and-sign orbit, plus Gaussian noise of std ``noise``
    (the functionally equivalent pairs of paper ``004`` §5)."""
    B = theta.shape[0]
    perm = graph.random_hidden_permutation(B, generator)
    signs = torch.ones(B, graph.n_nodes)
    flips = torch.rand(B, int(graph.hidden_mask.sum()), generator=generator) < 0.5
    signs[:, graph.hidden_mask] = torch.where(flips, -1.0, 1.0)
    moved = graph.flip_signs(graph.permute_nodes(theta, perm), signs.to(theta))
    return moved + noise * torch.randn(moved.shape, generator=generator).to(theta)
