"""SIREN INRs of digit images and an autoencoder that canonicalizes them (paper ``004``).

* :func:`pixel_grid` / :func:`render`: an INR's image on a grid (the zoo of digit SIRENs is
  :func:`wsbook.experiments.zoos.digit_inr_zoo`).
* :class:`INREncoder`: invariant to hidden-neuron permutations (a :class:`WeightSpaceGNN` with an
  invariant head) and to sign flips (hidden neurons are first sign-canonicalized by
  :func:`wsbook.symmetry.sign_canonicalize` so every hidden bias is non-negative; for odd activations such
  as sine this picks one member of each sign orbit).
* :class:`INRAutoencoder`: encoder + MLP decoder to a full weight vector; trained with the *functional*
  loss of paper ``004``: the decoded SIREN must reproduce the image's pixels.
* :func:`orbit_partner`: a random member of a network's permutation-and-sign orbit (pairs for the
  interpolation experiment of chapter 6; the paths and barriers come from :mod:`wsbook.symmetry.lmc`).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from wsbook.graphs.layers import mlp
from wsbook.graphs.models import WeightSpaceGNN
from wsbook.graphs.train import fit_minibatches
from wsbook.nets import MLPSpec
from wsbook.symmetry import flip_signs, permute, random_permutation, random_signs, sign_canonicalize


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
        self.spec = spec
        self.gnn = WeightSpaceGNN(spec, layer, dim=dim, n_layers=n_layers, head="invariant", out_dim=latent)
        self.graph = self.gnn.graph
        self.norm = nn.BatchNorm1d(latent)   # standardizes each latent coordinate over the zoo

    def forward(self, theta: Tensor) -> Tensor:
        return self.norm(self.gnn(sign_canonicalize(self.spec, theta)))


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
    model.encoder.gnn.set_normalization(sign_canonicalize(spec, theta))
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


def orbit_partner(spec: MLPSpec, theta: Tensor, noise: float = 0.01,
                  generator: torch.Generator | None = None) -> Tensor:
    """A random member of each network's permutation-and-sign orbit (an odd activation such as sine), plus
    Gaussian noise of std ``noise`` (the functionally equivalent pairs of paper ``004`` §5)."""
    B = spec.check(theta).shape[0]
    perms = random_permutation(spec, B, generator, device=theta.device)
    signs = [s.to(theta) for s in random_signs(spec, B, generator)]
    moved = flip_signs(spec, permute(spec, theta, perms), signs)
    return moved + noise * torch.randn(moved.shape, generator=generator).to(theta)
