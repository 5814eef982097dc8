"""Flows over your own networks (wsbook.weightflow.checkpoints): a directory of ordinary PyTorch MLP or CNN
state dicts in, a flow fitted and sampled, the samples back out as state dicts that load into a fresh
``nn.Sequential``; and a clear error, naming the file, for every checkpoint that cannot join."""
from __future__ import annotations

import re
from collections import OrderedDict

import pytest
import torch
from torch import nn

from wsbook.nets import CNNSpec, MLPSpec
from wsbook.weightflow import (ChannelField, CheckpointError, EuclideanChart, GeometricChart, NeuronField, WeightFlow,
                               load_checkpoints, save_checkpoints)
from wsbook.weightflow.checkpoints import checkpoint_files


def mlp(widths=(4, 6, 3), bias=True, act=nn.ReLU) -> nn.Sequential:
    layers: list[nn.Module] = []
    for k, (i, o) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(nn.Linear(i, o, bias=bias))
        if k < len(widths) - 2:
            layers.append(act())
    return nn.Sequential(*layers)


def trained_mlps(n=6, widths=(4, 6, 3), seed=0, steps=5) -> list[nn.Sequential]:
    """``n`` tiny MLPs, each a few Adam steps into fitting a random 3-class problem."""
    torch.manual_seed(seed)
    x, y = torch.randn(32, widths[0]), torch.randint(0, widths[-1], (32,))
    nets = []
    for _ in range(n):
        net = mlp(widths)
        opt = torch.optim.Adam(net.parameters(), lr=1e-2)
        for _ in range(steps):
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
        nets.append(net)
    return nets


def save_each(nets, directory, stem="net"):
    """One ``torch.save(net.state_dict(), ...)`` per network, as a user saves them."""
    directory.mkdir(exist_ok=True)
    for k, net in enumerate(nets):
        torch.save(net.state_dict(), directory / f"{stem}_{k}.pt")


@pytest.fixture
def own_dir(tmp_path):
    """A directory as a user has it: one ``torch.save(net.state_dict(), ...)`` per network."""
    nets = trained_mlps()
    directory = tmp_path / "mine"
    save_each(nets, directory)
    (directory / "notes.txt").write_text("not a checkpoint, and not read")
    return directory, nets


def test_loading_stacks_the_files_as_from_modules_does(own_dir):
    directory, nets = own_dir
    spec, theta = load_checkpoints(directory)
    assert spec == MLPSpec((4, 6, 3)) and theta.shape == (6, spec.n_params)
    assert torch.equal(theta, spec.from_modules(nets))
    assert [p.name for p in checkpoint_files(directory)] == [f"net_{k}.pt" for k in range(6)]
    x = torch.randn(5, 4)
    with torch.no_grad():
        torch.testing.assert_close(spec.forward(theta, x)[2], nets[2](x))


def test_round_trip_load_fit_sample_save_and_run(own_dir, tmp_path):
    directory, _ = own_dir
    spec, theta = load_checkpoints(directory)
    chart = GeometricChart(spec, reference=theta[0])
    flow = WeightFlow(chart, NeuronField(spec, hidden=16, anchored=True), coupling="ot")
    gen = torch.Generator().manual_seed(0)
    fit = flow.fit(theta, steps=3, generator=gen, progress=False)
    assert torch.isfinite(fit.losses).all()
    samples = flow.sample(4, steps=4, generator=gen)
    paths = save_checkpoints(spec, samples, tmp_path / "out", prefix="sample")
    assert [p.name for p in paths] == [f"sample_{k:03d}.pt" for k in range(4)]
    x = torch.randn(7, 4)
    for k, path in enumerate(paths):
        net = mlp()                                     # a fresh module of the user's
        net.load_state_dict(torch.load(path))           # strict: the keys are nn.Sequential's
        with torch.no_grad():
            torch.testing.assert_close(net(x), spec.forward(samples[k], x)[0])
    spec_back, theta_back = load_checkpoints(tmp_path / "out")
    assert spec_back == spec and torch.equal(theta_back, samples)
    # each file holds its own network, not a view of the whole population's storage
    for t in torch.load(paths[0]).values():
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size()


def test_deeper_nets_without_bias_other_activations_and_nested_checkpoints(tmp_path):
    torch.manual_seed(1)
    nets = [mlp((3, 5, 4, 2), bias=False, act=nn.Tanh) for _ in range(3)]
    for k, net in enumerate(nets):       # a training loop's checkpoint, the model under "model_state_dict"
        torch.save({"epoch": 3, "model_state_dict": net.state_dict(), "optimizer": {"lr": 0.1}},
                   tmp_path / f"ckpt_{k}.pth")
    spec, theta = load_checkpoints(tmp_path, activation="tanh")
    assert spec == MLPSpec((3, 5, 4, 2), activation="tanh", bias=False)
    assert torch.equal(theta, spec.from_modules(nets))
    paths = save_checkpoints(spec, theta, tmp_path / "back")
    fresh = mlp((3, 5, 4, 2), bias=False, act=nn.Tanh)
    fresh.load_state_dict(torch.load(paths[1]))
    x = torch.randn(2, 3)
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), nets[1](x))
    with pytest.raises(ValueError, match="activation"):
        load_checkpoints(tmp_path, activation="swish")


class Named(nn.Module):
    """A user's own module with named layers, not an ``nn.Sequential``."""

    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(4, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        return self.head(torch.relu(self.hidden(x)))


def test_like_names_the_layers_of_the_users_own_module(tmp_path):
    torch.manual_seed(2)
    nets = [Named() for _ in range(3)]
    save_each(nets, tmp_path)
    spec, theta = load_checkpoints(tmp_path)
    assert torch.equal(theta, spec.from_modules(nets))
    for like in (Named(), nets[0].state_dict(), tmp_path / "net_0.pt"):
        paths = save_checkpoints(spec, theta, tmp_path / "out", like=like, overwrite=True)
        net = Named()
        net.load_state_dict(torch.load(paths[2]))
        x = torch.randn(3, 4)
        with torch.no_grad():
            torch.testing.assert_close(net(x), nets[2](x))
    with pytest.raises(ValueError, match="like"):
        save_checkpoints(spec, theta, tmp_path / "bad", like=mlp((4, 7, 3)))
    with pytest.raises(TypeError, match="like"):
        save_checkpoints(spec, theta, tmp_path / "bad", like=42)


def _error(directory, name) -> str:
    with pytest.raises(CheckpointError) as info:
        load_checkpoints(directory)
    assert info.value.path.name == name and name in str(info.value)
    return str(info.value)


def test_a_different_architecture_is_named(own_dir):
    directory, _ = own_dir
    torch.save(mlp((4, 8, 3)).state_dict(), directory / "net_9_wider.pt")
    message = _error(directory, "net_9_wider.pt")
    assert "same architecture" in message and "net_0.pt" in message and "(8, 4)" in message


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nan_or_inf_weights_are_named(own_dir, bad):
    directory, nets = own_dir
    state = nets[0].state_dict()
    state["2.weight"][1, 1] = bad
    torch.save(state, directory / "net_3.pt")
    message = _error(directory, "net_3.pt")
    assert "NaN or infinite" in message and "'2.weight'" in message


def test_a_normalisation_layer_or_another_convolution_is_named(tmp_path):
    conv1d = nn.Sequential(nn.Conv1d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4, 2))
    torch.save(conv1d.state_dict(), tmp_path / "conv1d.pt")
    assert "1-D or 3-D convolution" in _error(tmp_path, "conv1d.pt")
    (tmp_path / "conv1d.pt").unlink()
    norm = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3))
    torch.save(norm.state_dict(), tmp_path / "norm.pt")
    assert "running_mean" in _error(tmp_path, "norm.pt")
    (tmp_path / "norm.pt").unlink()
    layer_norm = nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6), nn.Linear(6, 3))
    torch.save(layer_norm.state_dict(), tmp_path / "ln.pt")
    assert "[6]" in _error(tmp_path, "ln.pt")


def cnn(channels=(4, 5), kernel=3, n_classes=3) -> nn.Sequential:
    """A user's CNN in CNNSpec's layout: same-padding convolutions, global average pooling, a Linear head."""
    layers: list[nn.Module] = []
    for i, o in zip((2, *channels[:-1]), channels):
        layers += [nn.Conv2d(i, o, kernel, padding=kernel // 2), nn.ReLU()]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels[-1], n_classes))


def test_cnn_checkpoints_load_fit_sample_save_and_run(tmp_path):
    torch.manual_seed(3)
    nets = [cnn() for _ in range(5)]
    save_each(nets, tmp_path, "cnn")
    spec, theta = load_checkpoints(tmp_path)
    assert spec == CNNSpec(2, (4, 5), kernel_size=3, n_classes=3)
    assert torch.equal(theta, spec.from_modules(nets))
    x = torch.randn(6, 2, 7, 7)
    with torch.no_grad():
        torch.testing.assert_close(spec.forward(theta, x)[3], nets[3](x))
    flow = WeightFlow(EuclideanChart(spec), ChannelField(spec, hidden=8, edge_dim=4), coupling="ot")
    gen = torch.Generator().manual_seed(0)
    assert torch.isfinite(flow.fit(theta, steps=3, generator=gen, progress=False).losses).all()
    samples = flow.sample(3, steps=4, generator=gen)
    paths = save_checkpoints(spec, samples, tmp_path / "out")
    for k, path in enumerate(paths):
        net = cnn()                                     # a fresh module of the user's: the keys are its own
        net.load_state_dict(torch.load(path))
        with torch.no_grad():
            torch.testing.assert_close(net(x), spec.forward(samples[k], x)[0])
        assert list(torch.load(path)) == list(spec.to_module(samples[k]).state_dict())
    spec_back, theta_back = load_checkpoints(tmp_path / "out")
    assert spec_back == spec and torch.equal(theta_back, samples)
    one = CNNSpec(1, (3,), kernel_size=5, n_classes=2, activation="tanh")
    net = one.to_module(one.init(1, device="cpu"))
    torch.save(net.state_dict(), tmp_path / "out" / "one.pt")
    back = load_checkpoints(tmp_path / "out", pattern="one.pt", activation="tanh")
    assert back[0] == one and torch.equal(back[1][0], one.from_modules([net])[0])
    assert list(torch.load(save_checkpoints(one, back[1], tmp_path / "one")[0])) == list(net.state_dict())


@pytest.mark.parametrize("channels", [(3,), (3, 4), (3, 4, 5)])
def test_saved_cnns_have_to_modules_keys_and_like_names_them(tmp_path, channels):
    spec = CNNSpec(2, channels, kernel_size=3, n_classes=3)
    theta = spec.init(2, device="cpu")
    paths = save_checkpoints(spec, theta, tmp_path / "plain")
    module = spec.to_module(theta[0])
    assert list(torch.load(paths[0])) == list(module.state_dict())
    module.load_state_dict(torch.load(paths[1]))                          # strict
    assert torch.equal(spec.from_modules([module]), theta[1:])
    users = cnn(channels)                                                 # the user's own layout
    users.load_state_dict(torch.load(save_checkpoints(spec, theta, tmp_path / "like", like=users)[0]))
    assert torch.equal(spec.from_modules([users]), theta[:1])
    with pytest.raises(ValueError, match="like"):
        save_checkpoints(spec, theta, tmp_path / "bad", like=cnn((*channels[:-1], 7)))


@pytest.mark.parametrize("net, needle", [
    (nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 2)),
     "global average"),
    (nn.Sequential(nn.Conv2d(1, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 6), nn.ReLU(),
                   nn.Linear(6, 2)), "one Linear head"),
    (nn.Sequential(nn.Conv2d(1, 4, 3), nn.Conv2d(4, 4, 5), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                   nn.Linear(4, 2)), "one square kernel"),
    (nn.Sequential(nn.Conv2d(1, 4, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2)), "odd size"),
    (nn.Sequential(nn.Conv2d(1, 4, 3, bias=False), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2)),
     "without bias"),
    (nn.Sequential(nn.Linear(4, 4), nn.Unflatten(1, (1, 2, 2)), nn.Conv2d(1, 4, 3)), "after a Linear"),
    (nn.Sequential(nn.Conv2d(1, 4, 3), nn.Conv2d(4, 2, 3)), "0 Linear layers"),
])
def test_a_cnn_that_is_not_a_cnnspec_is_named(tmp_path, net, needle):
    torch.save(net.state_dict(), tmp_path / "net.pt")
    assert needle in _error(tmp_path, "net.pt")


def test_a_cnn_needs_an_activation_a_cnnspec_has(tmp_path):
    save_each([cnn()], tmp_path)
    with pytest.raises(ValueError, match="CNN's activation"):
        load_checkpoints(tmp_path, activation="gelu")


def test_layers_that_do_not_chain_or_mix_biases_are_named(tmp_path):
    torch.save(OrderedDict([("a.weight", torch.zeros(6, 4)), ("a.bias", torch.zeros(6)),
                            ("b.weight", torch.zeros(3, 5)), ("b.bias", torch.zeros(3))]), tmp_path / "gap.pt")
    assert "not a chain" in _error(tmp_path, "gap.pt")
    (tmp_path / "gap.pt").unlink()
    torch.save(OrderedDict([("a.weight", torch.zeros(6, 4)), ("a.bias", torch.zeros(6)),
                            ("b.weight", torch.zeros(3, 6))]), tmp_path / "mixed.pt")
    assert "no bias" in _error(tmp_path, "mixed.pt")
    (tmp_path / "mixed.pt").unlink()
    torch.save({"0.weight": torch.zeros(6, 4, dtype=torch.long)}, tmp_path / "ints.pt")
    assert "floating" in _error(tmp_path, "ints.pt")
    (tmp_path / "ints.pt").unlink()
    # a later file whose biases differ from the first file's, in one layer only
    for bias in (True, False):
        first = mlp((4, 6, 3), bias=bias).state_dict()
        later = mlp((4, 6, 3), bias=bias).state_dict()
        if bias:
            del later["2.bias"]
        else:
            later["2.bias"] = torch.zeros(3)
        torch.save(first, tmp_path / "a.pt")
        torch.save(later, tmp_path / "b.pt")
        assert "same architecture" in _error(tmp_path, "b.pt")
    spec = MLPSpec((4, 6, 3))
    with pytest.raises(ValueError, match="like"):
        save_checkpoints(spec, spec.init(1, device="cpu"), tmp_path / "out", like=later)


@pytest.mark.parametrize("name, write, needle", [
    ("tensor.pt", lambda p: torch.save(torch.zeros(3, 4), p), "tensor of shape [3, 4], not a state dict"),
    ("list.pt", lambda p: torch.save([torch.zeros(2)], p), "list, not a state dict"),
    ("empty.pt", lambda p: torch.save({}, p), "empty dict"),
    ("mixed.pt", lambda p: torch.save({"0.weight": torch.zeros(2, 2), "epoch": 3}, p), "'epoch' is an int"),
    ("text.pt", lambda p: p.write_text("hello"), "cannot be read"),
    ("module.pt", lambda p: torch.save(mlp(), p), "cannot be read"),
])
def test_a_file_that_is_not_a_state_dict_is_named(own_dir, name, write, needle):
    directory, _ = own_dir
    write(directory / name)
    message = _error(directory, name)
    assert needle in message and "torch.save(model.state_dict(), path)" in message


def test_empty_or_missing_directories(tmp_path):
    (tmp_path / "readme.md").write_text("no checkpoints here")
    (tmp_path / ".hidden.pt").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=re.escape(f"no checkpoint files (*.pt, *.pth) in {tmp_path}")):
        load_checkpoints(tmp_path)
    with pytest.raises(FileNotFoundError, match="no directory"):
        load_checkpoints(tmp_path / "absent")
    with pytest.raises(NotADirectoryError):
        load_checkpoints(tmp_path / "readme.md")
    spec, theta = MLPSpec((2, 3, 2)), MLPSpec((2, 3, 2)).init(2)
    save_checkpoints(spec, theta, tmp_path / "w", prefix="net")
    assert load_checkpoints(tmp_path / "w", pattern="net_*.pt")[1].shape == (2, spec.n_params)


def test_saving_refuses_to_overwrite_bad_networks_and_other_specs(tmp_path):
    spec = MLPSpec((2, 3, 2))
    theta = spec.init(3, generator=torch.Generator().manual_seed(0))
    save_checkpoints(spec, theta, tmp_path)
    with pytest.raises(FileExistsError, match="sample_000.pt"):
        save_checkpoints(spec, theta + 1, tmp_path)
    assert torch.equal(load_checkpoints(tmp_path)[1], theta), "a refused save must write nothing"
    save_checkpoints(spec, theta + 1, tmp_path, overwrite=True)
    assert torch.equal(load_checkpoints(tmp_path)[1], theta + 1)
    bad = theta.clone()
    bad[1, 0] = float("nan")
    with pytest.raises(ValueError, match="row 1"):
        save_checkpoints(spec, bad, tmp_path / "nan")
    assert not (tmp_path / "nan").exists()
    with pytest.raises(ValueError, match="shape"):
        save_checkpoints(spec, theta[:, :-1], tmp_path / "short")
    with pytest.raises(ValueError, match="prefix"):
        save_checkpoints(spec, theta, tmp_path / "p", prefix="a/b")
    with pytest.raises(TypeError, match="MLPSpec or a CNNSpec"):
        save_checkpoints("not a spec", theta, tmp_path / "p")
    # 1,001 networks get four digits, so the files sort in the population's order
    many = save_checkpoints(spec, spec.init(1001), tmp_path / "many")
    assert many[0].name == "sample_0000.pt" and many[-1].name == "sample_1000.pt"
