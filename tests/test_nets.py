"""wsbook.nets: layout, batched forward against plain torch modules, initialisers, population training."""
import pytest
import torch

from wsbook import data
from wsbook.nets import CNNSpec, MLPSpec, NetSpec, accuracy, per_member_loss, train_population


@pytest.mark.parametrize("activation", ["relu", "tanh", "sine", "gelu"])
@pytest.mark.parametrize("bias", [True, False])
def test_batched_forward_equals_loop_over_modules(activation, bias):
    torch.manual_seed(0)
    spec = MLPSpec((5, 7, 6, 3), activation=activation, bias=bias, frequency=2.0)
    theta = spec.init(4, scheme="siren" if activation == "sine" else "kaiming", device="cpu")
    x = torch.randn(11, 5)
    shared = spec.forward(theta, x)
    per_member = spec.forward(theta, x.expand(4, 11, 5).contiguous())
    loop = torch.stack([spec.to_module(theta[i])(x) for i in range(4)])
    assert shared.shape == (4, 11, 3)
    torch.testing.assert_close(shared, loop, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(per_member, loop, atol=1e-6, rtol=1e-6)


def test_layout_views_are_zero_copy_and_roundtrip():
    spec = MLPSpec((3, 4, 2))
    theta = spec.init(5, device="cpu")
    assert spec.n_params == 3 * 4 + 4 + 4 * 2 + 2
    w0 = spec.weights(theta)[0]
    assert w0.shape == (5, 4, 3) and w0.data_ptr() == theta.data_ptr()
    torch.testing.assert_close(spec.pack(spec.weights(theta), spec.biases(theta)), theta)
    modules = [spec.to_module(t) for t in theta]
    torch.testing.assert_close(spec.from_modules(modules), theta)


def test_forward_is_differentiable_in_theta():
    spec = MLPSpec((2, 8, 1), activation="tanh")
    theta = spec.init(3, device="cpu").requires_grad_(True)
    spec.forward(theta, torch.randn(6, 2)).sum().backward()
    assert theta.grad is not None and theta.grad.abs().sum() > 0


def test_return_hidden_gives_post_activations():
    spec = MLPSpec((2, 8, 5, 1))
    theta = spec.init(3, device="cpu")
    out, hidden = spec.forward(theta, torch.randn(4, 2), return_hidden=True)
    assert [h.shape for h in hidden] == [(3, 4, 8), (3, 4, 5)]
    assert all((h >= 0).all() for h in hidden)


def test_wrong_shapes_raise_with_expected_and_given_sizes():
    spec = MLPSpec((3, 4, 2))
    with pytest.raises(ValueError, match=r"\[B, 26\].*\(2, 25\)"):
        spec.forward(torch.zeros(2, 25), torch.zeros(5, 3))
    with pytest.raises(ValueError, match=r"\[N, 3\]"):
        spec.forward(spec.init(2, device="cpu"), torch.zeros(5, 4))
    with pytest.raises(ValueError, match="2 networks"):
        spec.forward(spec.init(2, device="cpu"), torch.zeros(3, 5, 3))
    with pytest.raises(ValueError, match="activation"):
        MLPSpec((3, 2), activation="swish")
    with pytest.raises(ValueError, match="positive widths"):
        MLPSpec((3,))
    with pytest.raises(ValueError, match="expects"):
        spec.from_modules([torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))])
    with pytest.raises(ValueError, match="init scheme"):
        spec.init(2, scheme="orthogonal")


def test_initialisers_have_the_stated_scales():
    spec = MLPSpec((400, 300, 10), activation="sine", frequency=30.0)
    g = torch.Generator().manual_seed(0)
    xavier = spec.weights(spec.init(2, "xavier", generator=g, device="cpu"))[0]
    assert abs(xavier.std().item() - (2.0 / 700) ** 0.5) < 0.01 * (2.0 / 700) ** 0.5 * 10
    siren = spec.weights(spec.init(2, "siren", generator=g, device="cpu"))
    assert siren[0].abs().max() <= 1 / 400 + 1e-9
    assert siren[1].abs().max() <= (6 / 300) ** 0.5 / 30 + 1e-9
    he = spec.weights(spec.init(2, "kaiming_normal", generator=g, device="cpu"))[0]
    assert abs(he.std().item() / (2 / 400) ** 0.5 - 1) < 0.02


def test_population_training_lowers_every_members_loss():
    ds = data.load("wine", device="cpu")
    spec = MLPSpec((ds.n_features, 16, ds.n_classes))
    g = torch.Generator().manual_seed(0)
    theta0 = spec.init(12, generator=g, device="cpu")
    result = train_population(spec, theta0, ds.x_train, ds.y_train, steps=150, lr=1e-2, batch_size=32, generator=g)
    before = per_member_loss(spec, theta0, ds.x_train, ds.y_train)
    after = per_member_loss(spec, result.theta, ds.x_train, ds.y_train)
    assert result.loss_history.shape == (150, 12)
    assert (after < 0.5 * before).all(), (before, after)
    assert (accuracy(spec, result.theta, ds.x_test, ds.y_test) > 0.8).all()


def test_population_training_equals_independent_runs():
    """One Adam over [B, D] is B independent Adams: member 1 trained alone gives the same weights."""
    ds = data.load("moons", device="cpu")
    spec = MLPSpec((2, 8, 2))
    theta0 = spec.init(3, generator=torch.Generator().manual_seed(1), device="cpu")
    together = train_population(spec, theta0, ds.x_train, ds.y_train, steps=20, lr=1e-2).theta
    alone = train_population(spec, theta0[1:2], ds.x_train, ds.y_train, steps=20, lr=1e-2).theta
    torch.testing.assert_close(together[1:2], alone, atol=1e-6, rtol=1e-5)


def test_regression_training_and_checkpoints():
    ds = data.load("gap1d", device="cpu")
    spec = MLPSpec((1, 32, 1), activation="tanh")
    g = torch.Generator().manual_seed(0)
    res = train_population(spec, spec.init(4, generator=g, device="cpu"), ds.x_train, ds.y_train, steps=800,
                           lr=1e-2, task="regression", batch_size=40, checkpoint_every=200, generator=g)
    assert res.checkpoints.shape == (4, 4, spec.n_params) and res.checkpoint_steps == [200, 400, 600, 800]
    assert (res.loss_history[-20:].mean(0) < 0.5 * res.loss_history[:5].mean(0)).all()


def test_divergence_is_an_error_not_a_silent_nan():
    ds = data.load("moons", device="cpu")
    spec = MLPSpec((2, 8, 2))
    with pytest.raises(FloatingPointError, match="non-finite"):
        train_population(spec, spec.init(2, device="cpu") * 1e30, ds.x_train, ds.y_train, steps=3, lr=1e30,
                         optimizer="sgd")


@pytest.mark.parametrize("task,name", [("classification", "digits"), ("regression", "diabetes")])
def test_chunked_steps_equal_whole_batch_steps(task, name):
    ds = data.load(name, device="cpu")
    spec = MLPSpec((ds.n_features, 16, ds.n_outputs))
    theta0 = spec.init(3, generator=torch.Generator().manual_seed(2), device="cpu")
    whole = train_population(spec, theta0, ds.x_train, ds.y_train, steps=5, task=task, chunk_size=None)
    chunked = train_population(spec, theta0, ds.x_train, ds.y_train, steps=5, task=task, chunk_size=50)
    torch.testing.assert_close(chunked.theta, whole.theta, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(chunked.loss_history, whole.loss_history, atol=1e-5, rtol=1e-4)


# ----------------------------------------------------------- issue 10, item 9: widths are integers
@pytest.mark.parametrize("widths,error", [((3, 2.5, 2), TypeError), ((3, "4", 2), TypeError), ((3, True, 2), TypeError),
                                          ((3, 0, 2), ValueError), ((3, -4, 2), ValueError), ("32", TypeError),
                                          (7, TypeError), ((3, 4.0, 2), TypeError)])
def test_widths_must_be_positive_integers(widths, error):
    with pytest.raises(error, match="positive integer"):
        MLPSpec(widths)


def test_integer_like_widths_are_accepted():
    import numpy as np

    assert MLPSpec((np.int64(3), 4, 2)).widths == (3, 4, 2) == MLPSpec(torch.tensor([3, 4, 2])).widths
    with pytest.raises(TypeError, match="channels"):
        CNNSpec(1, (4, 2.5))
    with pytest.raises(TypeError, match="in_channels"):
        CNNSpec("1", (4,))


# ------------------------------------------------------------------------ the spec protocol
def test_both_specs_follow_the_protocol():
    mlp, cnn = MLPSpec((5, 7, 3)), CNNSpec(2, (4, 5), kernel_size=3, n_classes=3)
    for spec in (mlp, cnn):
        assert isinstance(spec, NetSpec)
        theta = spec.init(3, generator=torch.Generator().manual_seed(0), device="cpu")
        assert theta.shape == (3, spec.n_params) and spec.n_layers == len(spec.widths) - 1
        torch.testing.assert_close(spec.pack(spec.weights(theta), spec.biases(theta)), theta)
        assert [tuple(w.shape[1:]) for w in spec.weights(theta)] == [tuple(s) for s in spec.layer_shapes]
        w_sl, b_sl = spec.slices(spec.n_layers - 1)
        assert b_sl.stop == spec.n_params
    assert not isinstance((5, 7, 3), NetSpec)


def test_cnn_forward_equals_torch_modules_and_round_trips():
    g = torch.Generator().manual_seed(1)
    for act in ("relu", "tanh"):
        cnn = CNNSpec(2, (4, 5), kernel_size=3, n_classes=3, activation=act)
        theta = cnn.init(3, generator=g, device="cpu")
        x = torch.randn(6, 2, 7, 7, generator=g)
        modules = [cnn.to_module(theta[i]) for i in range(3)]
        loop = torch.stack([m(x) for m in modules])
        out, hidden = cnn.forward(theta, x, return_hidden=True)
        torch.testing.assert_close(out, loop, atol=1e-5, rtol=1e-5)
        assert [h.shape for h in hidden] == [(3, 6 * 49, 4), (3, 6 * 49, 5)]
        torch.testing.assert_close(cnn.from_modules(modules), theta)
    with pytest.raises(ValueError, match="expects"):
        cnn.from_modules([torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3, padding=0), torch.nn.ReLU(),
                                              torch.nn.Conv2d(4, 5, 3, padding=1), torch.nn.AdaptiveAvgPool2d(1),
                                              torch.nn.Flatten(), torch.nn.Linear(5, 3))])
    he = cnn.weights(cnn.init(64, "kaiming_normal", generator=g, device="cpu"))[1]
    assert abs(he.std().item() / (2 / (4 * 9)) ** 0.5 - 1) < 0.05
    with pytest.raises(ValueError, match="init scheme"):
        cnn.init(1, "siren")


def test_cnn_takes_one_image_batch_per_member_and_trains_on_own_minibatches():
    g = torch.Generator().manual_seed(2)
    cnn = CNNSpec(2, (4, 5), kernel_size=3, n_classes=3)
    theta = cnn.init(3, generator=g, device="cpu")
    x = torch.randn(3, 6, 2, 5, 5, generator=g)                  # [B, N, C, H, W]: its own images per member
    per_member = cnn.forward(theta, x)
    one_by_one = torch.cat([cnn.forward(theta[i:i + 1], x[i]) for i in range(3)])
    torch.testing.assert_close(per_member, one_by_one, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"\[3, N, 2, H, W\]"):
        cnn.forward(theta, x[:2])
    # per-member minibatches of images; chunked gradient accumulation over images equals one pass
    images, labels = torch.randn(40, 2, 5, 5, generator=g), torch.randint(0, 3, (40,), generator=g)
    runs = [train_population(cnn, theta, images, labels, steps=3, batch_size=16, chunk_size=c,
                             generator=torch.Generator().manual_seed(0)) for c in (None, 5)]
    torch.testing.assert_close(runs[0].theta, runs[1].theta, atol=1e-5, rtol=1e-4)
    assert not torch.equal(runs[0].theta, theta)
    shared = train_population(cnn, theta, images, labels, steps=3, batch_size=16, shared_batches=True,
                              generator=torch.Generator().manual_seed(0))
    assert not torch.allclose(shared.theta, runs[0].theta)       # the members did draw their own batches


@pytest.mark.parametrize("kwargs,name", [(dict(steps=0), "steps"), (dict(steps=-1), "steps"),
                                         (dict(steps=2.5), "steps"), (dict(steps=3, batch_size=0), "batch_size"),
                                         (dict(steps=3, batch_size=-4), "batch_size"),
                                         (dict(steps=3, checkpoint_every=0), "checkpoint_every")])
def test_train_population_rejects_bad_sizes_by_name(kwargs, name):
    """Issue 10, item 10: a bad size is a ValueError naming the argument (not IndexError / ZeroDivisionError)."""
    ds = data.load("moons", device="cpu")
    spec = MLPSpec((2, 4, 2))
    with pytest.raises(ValueError, match=name):
        train_population(spec, spec.init(2, device="cpu"), ds.x_train, ds.y_train, **kwargs)


def test_task_vocabulary_is_one_and_strict():
    ds = data.load("moons", device="cpu")
    spec = MLPSpec((2, 4, 2))
    theta = spec.init(2, generator=torch.Generator().manual_seed(0), device="cpu")
    loss = per_member_loss(spec, theta, ds.x_train, ds.y_train, "classification")
    assert loss.shape == (2,) and (loss > 0).all()
    for old in ("cross_entropy", "categorical", "mse", "gaussian"):     # the old loss names are not a second vocabulary
        with pytest.raises(ValueError, match="is called"):
            per_member_loss(spec, theta, ds.x_train, ds.y_train, old)
    with pytest.raises(ValueError, match="unknown task"):
        per_member_loss(spec, theta, ds.x_train, ds.y_train, "hinge")


def test_divergence_names_the_first_bad_step():
    """The loop checks every step: a loss that turns NaN at step 2 is reported as step 2."""
    from wsbook.loop import descend, make_optimizer

    w = torch.zeros(3, requires_grad=True)
    opt = make_optimizer([w], "sgd", lr=0.1)
    values = [1.0, 1.0, float("nan"), 1.0]
    with pytest.raises(FloatingPointError, match="step 2 of 4"):
        descend(lambda s: (w * 0).sum() + values[s], opt, 4, progress=False, desc="toy")
    opt = make_optimizer([w], "sgd", lr=0.1)
    with pytest.raises(FloatingPointError, match="step 2 of 4"):   # blocks of checks name the same step
        descend(lambda s: (w * 0).sum() + values[s], opt, 4, progress=False, check_every=3)


def test_minibatches_cover_each_epoch_once_per_member():
    from wsbook.loop import Minibatches

    g = torch.Generator().manual_seed(0)
    per_member = Minibatches(10, 3, members=4, generator=g)
    assert per_member.per_epoch == 3
    epoch = torch.cat([per_member(s) for s in range(3)], 1)               # [4, 9]: no repeats within a member
    assert epoch.shape == (4, 9) and all(len(set(row.tolist())) == 9 for row in epoch)
    assert not torch.equal(epoch[0], epoch[1])                             # members shuffle independently
    shared = Minibatches(10, 4, generator=g, drop_last=False)
    parts = [shared(s) for s in range(shared.per_epoch)]
    assert [len(p) for p in parts] == [4, 4, 2] and sorted(torch.cat(parts).tolist()) == list(range(10))
    assert Minibatches(10, None).__call__(0) is None and Minibatches(10, 10)(0) is None
    with pytest.raises(ValueError, match="batch_size"):
        Minibatches(10, 0)


def test_descend_schedule_ema_and_checkpoint_hooks():
    """The loop steps the cosine schedule to min_lr, keeps an EMA, calls on_step once per step, and the
    history of a per-member loss is [steps, B]."""
    from wsbook.loop import EMA, descend, make_optimizer

    model = torch.nn.Linear(2, 1)
    ema = EMA(model, 0.5)
    opt = make_optimizer(model.parameters(), "adamw", lr=0.1)
    seen = []
    x = torch.randn(8, 2, generator=torch.Generator().manual_seed(0))
    run = descend(lambda s: ((model(x) - 1) ** 2).view(4, 2).mean(1), opt, 30, schedule="cosine", min_lr=0.01,
                  ema=ema, on_step=seen.append, progress=False)
    assert run.losses.shape == (30, 4) and seen == list(range(30))
    assert abs(opt.param_groups[0]["lr"] - 0.01) < 1e-9
    assert (run.losses[-1] < run.losses[0]).all()
    assert not torch.equal(ema.module.weight, model.weight)                 # lags behind the model
    with pytest.raises(ValueError, match="optimizer"):
        make_optimizer(model.parameters(), "lbfgs", lr=0.1)


def test_train_population_leaves_the_allocator_alone(monkeypatch):
    """Training changes no process-wide setting: the program tunes the allocator once at its start
    (``setup_chapter``, ``python -m wsbook``), never a library call."""
    from wsbook import config

    calls = []
    monkeypatch.setattr(config, "tune_allocator", lambda: calls.append(1) or True)
    g = torch.Generator().manual_seed(0)
    spec = MLPSpec((2, 4, 2))
    x = torch.randn(16, 2, generator=g)
    train_population(spec, spec.init(3, generator=g, device="cpu"), x, (x[:, 0] > 0).long(), steps=2, lr=1e-2,
                     progress=False)
    assert calls == []


def test_accuracy_is_one_definition_for_networks_and_for_predictives():
    """``nets.accuracy`` (networks on inputs) and ``bayes.accuracy`` (a predictive) both are
    :func:`output_accuracy`: the fraction of points whose top class is the label."""
    from wsbook import bayes
    from wsbook.nets import output_accuracy

    g = torch.Generator().manual_seed(0)
    spec = MLPSpec((3, 5, 4))
    theta = spec.init(6, generator=g, device="cpu")
    x, y = torch.randn(50, 3, generator=g), torch.randint(0, 4, (50,), generator=g)
    logits = spec.forward(theta, x)
    expected = torch.tensor([[float(logits[b, n].argmax() == y[n]) for n in range(50)] for b in range(6)]).mean(1)
    assert torch.equal(output_accuracy(logits, y), expected)
    assert torch.equal(accuracy(spec, theta, x, y), expected)
    assert torch.equal(bayes.accuracy(logits, y), expected)
    assert torch.equal(bayes.accuracy(bayes.predictive_probs(spec, theta, x), y), expected)


def _reference_forward(spec: MLPSpec, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The feature-major forward with one slice view per layer and out-of-place activations: what
    MLPSpec.forward computes, written without its split views and in-place ReLU."""
    B = theta.shape[0]
    h_t = x.transpose(-2, -1)
    for layer, (o, i) in enumerate(spec.layer_shapes):
        w_slice, b_slice = spec.slices(layer)
        w = theta[:, w_slice].reshape(B, o, i)
        b = theta[:, b_slice] if b_slice is not None else None
        if layer == 0 and x.dim() == 2:
            if b is not None:
                w_aug = torch.cat([w, b.unsqueeze(2)], dim=2).reshape(B * o, i + 1)
                z = (w_aug @ torch.cat([h_t, h_t.new_ones(1, h_t.shape[1])], dim=0)).view(B, o, -1)
            else:
                z = (w.reshape(B * o, i) @ h_t).view(B, o, -1)
        else:
            z = torch.baddbmm(b.unsqueeze(2), w, h_t) if b is not None else torch.bmm(w, h_t)
        if layer == spec.n_layers - 1:
            return z.transpose(1, 2)
        h_t = spec.act(z)


@pytest.mark.parametrize("activation", ["relu", "tanh"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forward_and_gradient_equal_the_per_layer_slice_reference_bit_for_bit(activation, bias, shared, dtype):
    g = torch.Generator().manual_seed(0)
    spec = MLPSpec((30, 16, 16, 2), activation=activation, bias=bias)
    theta = spec.init(32, generator=g, device="cpu", dtype=dtype)
    x = torch.randn(341, 30, generator=g, dtype=dtype)
    x = x if shared else x.expand(32, 341, 30).contiguous()
    upstream = torch.randn(32, 341, 2, generator=g, dtype=dtype)
    results = []
    for forward in (spec.forward, lambda t, xx: _reference_forward(spec, t, xx)):
        t = theta.clone().requires_grad_(True)
        out = forward(t, x)
        (grad,) = torch.autograd.grad((out * upstream).sum(), t)
        results.append((out.detach(), grad))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_minibatch_rows_are_taken_as_advanced_indexing_would():
    from wsbook.nets import _take_rows

    g = torch.Generator().manual_seed(0)
    x, y, targets = torch.randn(50, 7, generator=g), torch.randint(0, 3, (50,), generator=g), torch.randn(50, 2)
    for idx in (torch.randint(0, 50, (9,), generator=g), torch.randint(0, 50, (4, 9), generator=g)):
        for data_ in (x, y, targets):
            assert torch.equal(_take_rows(data_, idx), data_[idx])
