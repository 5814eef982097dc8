"""SIREN INRs of digit images, and an autoencoder that canonicalizes networks (paper ``004``).

* :func:`pixel_grid` / :func:`render`: an INR's image on a grid (the zoo of digit SIRENs is
  :func:`wsbook.experiments.zoos.digit_inr_zoo`).
* :class:`WeightEncoder`: invariant to permutations of hidden neurons (or CNN channels; a
  :class:`WeightSpaceGNN` with an invariant head) and to their scalings: sign flips for odd activations
  such as sine (hidden neurons are first sign-canonicalized by :func:`wsbook.symmetry.sign_canonicalize` so
  every hidden bias is non-negative), positive scalings for ReLU (every hidden neuron rescaled to unit
  incoming norm by :func:`wsbook.symmetry.rescale_neurons`).
* :class:`WeightAutoencoder`: encoder + MLP decoder to a full weight vector, for MLPs and CNNs alike
  (``INREncoder`` and ``INRAutoencoder`` are the same classes); :func:`fit_autoencoder` trains it with the
  *functional* loss of paper ``004``: the decoded SIREN must reproduce the image's pixels, or the decoded
  classifier the original's temperature-scaled output distribution (:func:`output_kl`).
* :func:`reconstruction_mse` (SIRENs) and :func:`reconstruction_accuracy` / :func:`accuracy_agreement`
  (classifiers: L1 error of test accuracy and Kendall's tau, the CNN table of paper ``004``).
* :func:`orbit_partner`: a random member of a network's permutation-and-sign orbit (pairs for the
  interpolation experiment of chapter 6; the paths and barriers come from :mod:`wsbook.symmetry.lmc`).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from wsbook.graphs.layers import mlp
from wsbook.graphs.models import WeightSpaceGNN
from wsbook.graphs.neural_graph import Spec
from wsbook.graphs.train import fit_minibatches, kendall_tau
from wsbook.nets import CNNSpec, MLPSpec, accuracy
from wsbook.symmetry import (flip_signs, permute, random_permutation, random_signs, rescale_neurons,
                             sign_canonicalize, symmetry_spec)


def pixel_grid(side: int = 8, device: torch.device | str | None = None) -> Tensor:
    """Pixel-centre coordinates in [-1, 1]^2, row-major like a flattened image: ``[side*side, 2]``."""
    lin = torch.linspace(-1, 1, side, device=device)
    yy, xx = torch.meshgrid(lin, lin, indexing="ij")
    return torch.stack([xx.flatten(), yy.flatten()], 1)


def render(spec: MLPSpec, theta: Tensor, coords: Tensor) -> Tensor:
    """Pixel values of every INR in ``theta`` at ``coords``: ``[B, P]``."""
    return spec.forward(theta, coords).squeeze(-1)


class WeightEncoder(nn.Module):
    """An encoder invariant to a network's symmetries: a canonicalization of the per-neuron scaling, then an
    invariant GNN over the neural graph (one node per hidden neuron, or per channel of a CNN), then batch
    normalization of the latent (the pooled GNN features differ little between networks at initialisation;
    standardizing them over the zoo gives the decoder an informative code from the first step).

    The GNN is invariant to permutations of hidden neurons or channels. With ``canonicalize=True`` the input is
    first mapped to one member of its scaling orbit, so the code is also invariant to scalings: odd
    activations (sine, tanh) by :func:`wsbook.symmetry.sign_canonicalize` (every hidden bias made
    non-negative), ReLU by :func:`wsbook.symmetry.rescale_neurons` (every hidden neuron's incoming weights
    and bias scaled to unit norm, the outgoing weights inversely). ``canonicalize=False`` keeps only the
    permutation invariance (the "Neural Graphs" encoder of paper ``004``).

    Args:
        spec: an :class:`~wsbook.nets.MLPSpec` (e.g. a SIREN) or a :class:`~wsbook.nets.CNNSpec`.
        dim, n_layers, layer: width, depth and layer kind of the :class:`WeightSpaceGNN`.
        latent: size of the code.
        canonicalize: remove the scaling symmetry before the GNN (see above).
    """

    def __init__(self, spec: Spec, dim: int = 32, n_layers: int = 2, latent: int = 32, layer: str = "pna",
                 canonicalize: bool = True):
        super().__init__()
        if not isinstance(spec, (MLPSpec, CNNSpec)):
            raise TypeError(f"spec must be an MLPSpec or a CNNSpec; got {type(spec).__name__}")
        self.scaling = symmetry_spec(spec).scaling if canonicalize else None
        if canonicalize and self.scaling is None:
            raise ValueError(f"{spec.activation!r} has no per-neuron scaling symmetry to canonicalize; pass "
                             "canonicalize=False")
        if self.scaling == "sign" and not spec.bias:
            raise ValueError(f"sign canonicalization reads the hidden biases; {spec} has none")
        self.spec = spec
        self.gnn = WeightSpaceGNN(spec, layer, dim=dim, n_layers=n_layers, head="invariant", out_dim=latent)
        self.graph = self.gnn.graph
        self.norm = nn.BatchNorm1d(latent)   # standardizes each latent coordinate over the zoo

    def canonical_input(self, theta: Tensor) -> Tensor:
        """The member of each network's scaling orbit that the GNN reads ``[B, D]`` (same functions)."""
        if self.scaling == "sign":
            return sign_canonicalize(self.spec, theta)
        if self.scaling == "positive":
            return rescale_neurons(self.spec, theta, 1.0)
        return self.spec.check(theta)

    def forward(self, theta: Tensor) -> Tensor:
        """Codes ``[B, latent]``."""
        return self.norm(self.gnn(self.canonical_input(theta)))


class WeightAutoencoder(nn.Module):
    """Invariant encoder and MLP decoder ``z -> theta_hat [D]`` (paper ``004``, fig. 1): every member of a
    symmetry orbit gets the same code and so decodes to the same weights, the orbit's canonical form.

    Trained by :func:`fit_autoencoder` with a functional loss: the decoded SIREN must draw the image
    (``images=``), or the decoded classifier must give the original's output distribution (``inputs=``).

    Args:
        spec: the architecture of the networks (MLP or CNN), in and out.
        dim, n_layers, latent, layer, canonicalize: as for :class:`WeightEncoder`.
        decoder_hidden: width of the decoder's two hidden layers.
    """

    def __init__(self, spec: Spec, dim: int = 32, n_layers: int = 2, latent: int = 32, decoder_hidden: int = 256,
                 layer: str = "pna", canonicalize: bool = True):
        super().__init__()
        self.spec = spec
        self.encoder = WeightEncoder(spec, dim, n_layers, latent, layer, canonicalize)
        self.decoder = mlp([latent, decoder_hidden, decoder_hidden, spec.n_params])
        self.register_buffer("theta_scale", torch.ones(spec.n_params))

    def decode(self, z: Tensor) -> Tensor:
        """Weights ``[B, D]`` from codes ``[B, latent]``."""
        return self.decoder(z) * self.theta_scale

    def forward(self, theta: Tensor) -> Tensor:
        """The canonical representative ``decode(encode(theta))`` ``[B, D]``."""
        return self.decode(self.encoder(theta))


#: the names of chapter 6's INR experiment (the same classes)
INREncoder, INRAutoencoder = WeightEncoder, WeightAutoencoder


@torch.no_grad()
def _outputs(spec: Spec, theta: Tensor, x: Tensor, chunk: int = 16) -> Tensor:
    """Outputs ``[B, N, out]`` of every network on shared inputs, ``chunk`` networks at a time (memory)."""
    return torch.cat([spec.forward(theta[s:s + chunk], x) for s in range(0, theta.shape[0], chunk)])


def output_kl(logits: Tensor, target_log_probs: Tensor, temperature: float = 1.0) -> Tensor:
    """``KL(p || q)`` per network ``[B]``, averaged over inputs, between the target distributions
    ``p = exp(target_log_probs)`` ``[B, N, C]`` (already temperature-scaled) and ``q = softmax(logits / T)``."""
    log_q = torch.log_softmax(logits / temperature, -1)
    return (target_log_probs.exp() * (target_log_probs - log_q)).sum(-1).mean(-1)


def fit_autoencoder(model: WeightAutoencoder, theta: Tensor, images: Tensor | None = None, *,
                    inputs: Tensor | None = None, temperature: float = 1.0, data_batch: int | None = None,
                    epochs: int = 100, lr: float = 1e-3, batch_size: int = 32, seed: int = 0) -> Tensor:
    """Train ``model`` on the networks ``theta [M, D]`` with a functional loss (paper ``004``). Returns the
    per-epoch loss ``[epochs]``.

    Pass exactly one of:

    * ``images [M, 64]``: SIRENs of 8x8 images; the loss is the pixel MSE of the decoded SIREN against its
      network's image.
    * ``inputs [N, ...]``: inputs shared by all networks (e.g. ``[N, 1, 8, 8]`` images for a CNN); the loss is
      ``KL(softmax(f(x) / T) || softmax(f_hat(x) / T))`` between the original network ``f`` and the decoded
      one ``f_hat``, averaged over inputs and networks. The originals' distributions are computed once; every
      step runs the decoded networks of a minibatch together (:meth:`~wsbook.nets.CNNSpec.forward`, one
      grouped convolution per layer) on ``data_batch`` inputs drawn afresh (default: all of ``inputs``).

    Args:
        temperature: ``T`` of the classifier loss (``> 0``; above 1 softens both distributions).
        epochs, lr, batch_size: Adam on shuffled minibatches of networks, cosine decay per epoch.
        seed: seeds the minibatch order and the input draws.
    """
    spec = model.spec
    spec.check(theta)
    M = theta.shape[0]
    if (images is None) == (inputs is None):
        raise ValueError("pass exactly one of images= (SIRENs: one image per network) and inputs= "
                         "(classifiers: inputs shared by all networks)")
    if images is not None and images.shape != (M, 64):
        raise ValueError(f"images must be [{M}, 64]; got {tuple(images.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be positive; got {temperature}")
    if data_batch is not None and data_batch < 1:
        raise ValueError(f"data_batch must be a positive number of inputs; got {data_batch}")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():   # decoder outputs start at the zoo's per-parameter scale
        model.theta_scale.copy_(theta.abs().mean(0).clamp_min(1e-3))
    model.encoder.gnn.set_normalization(model.encoder.canonical_input(theta))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()

    if images is not None:
        coords = pixel_grid(8, theta.device)

        def batch_loss(idx: Tensor) -> Tensor:
            return ((render(spec, model(theta[idx]), coords) - images[idx]) ** 2).mean()
    else:
        try:
            target = torch.log_softmax(_outputs(spec, theta, inputs) / temperature, -1)   # [M, N, C]
        except (ValueError, RuntimeError) as err:
            raise ValueError(f"inputs {tuple(inputs.shape)} do not fit the networks of {spec}: {err}") from err
        N = inputs.shape[0]
        n_draw = N if data_batch is None else min(data_batch, N)

        def batch_loss(idx: Tensor) -> Tensor:
            if n_draw == N:
                x, p = inputs, target[idx]
            else:
                rows = torch.randint(0, N, (n_draw,), generator=gen).to(inputs.device)
                x, p = inputs[rows], target[idx][:, rows]
            return output_kl(spec.forward(model(theta[idx]), x), p, temperature).mean()

    history = fit_minibatches(opt, batch_loss, M, epochs=epochs, batch_size=batch_size,
                              generator=gen, device=theta.device, what="autoencoder")
    model.eval()
    return history


@torch.no_grad()
def reconstruction_mse(model: WeightAutoencoder, theta: Tensor, images: Tensor) -> Tensor:
    """Per-INR pixel MSE of the decoded network against the image ``[B]``."""
    out = render(model.spec, model(theta), pixel_grid(8, theta.device))
    return ((out - images) ** 2).mean(1)


def accuracy_agreement(accuracy: Tensor, decoded_accuracy: Tensor) -> dict[str, float]:
    """How well reconstructions keep the accuracies of the originals (paper ``004``, CNN table):
    ``l1_error``, the mean of ``|acc - acc_decoded|``, and ``kendall_tau``, the rank correlation of the two
    accuracy vectors (tau-b, ``nan`` when one of them is constant). Both are ``[M]`` over the same networks."""
    if accuracy.dim() != 1 or accuracy.shape != decoded_accuracy.shape or accuracy.numel() < 2:
        raise ValueError(f"need two accuracy vectors [M] of one shape, M >= 2; got {tuple(accuracy.shape)} and "
                         f"{tuple(decoded_accuracy.shape)}")
    return {"l1_error": (accuracy - decoded_accuracy).abs().mean().item(),
            "kendall_tau": kendall_tau(decoded_accuracy, accuracy)}


@torch.no_grad()
def reconstruction_accuracy(model: WeightAutoencoder, theta: Tensor, x: Tensor, y: Tensor,
                            chunk: int = 16) -> dict:
    """Test accuracy of the classifiers ``theta [M, D]`` and of their reconstructions ``model(theta)`` on
    ``(x, y)``: ``{"accuracy": [M], "decoded_accuracy": [M], "l1_error", "kendall_tau"}`` (see
    :func:`accuracy_agreement`). ``chunk`` networks are run at a time."""
    model.eval()
    decoded = torch.cat([model(part) for part in theta.split(chunk)])
    acc, acc_dec = (torch.cat([accuracy(model.spec, part, x, y) for part in t.split(chunk)])
                    for t in (theta, decoded))
    return {"accuracy": acc, "decoded_accuracy": acc_dec, **accuracy_agreement(acc, acc_dec)}


def orbit_partner(spec: MLPSpec, theta: Tensor, noise: float = 0.01,
                  generator: torch.Generator | None = None) -> Tensor:
    """A random member of each network's permutation-and-sign orbit (an odd activation such as sine), plus
    Gaussian noise of std ``noise`` (the functionally equivalent pairs of paper ``004`` §5)."""
    B = spec.check(theta).shape[0]
    perms = random_permutation(spec, B, generator, device=theta.device)
    signs = [s.to(theta) for s in random_signs(spec, B, generator)]
    moved = flip_signs(spec, permute(spec, theta, perms), signs)
    return moved + noise * torch.randn(moved.shape, generator=generator).to(theta)
