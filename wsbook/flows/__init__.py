"""Generic (Riemannian) conditional flow matching, built from separate parts: a coupling, a path, a
vector-field model, a trainer, an ODE solver and a likelihood estimator (Lipman et al. 2023; Tong et al.
2023; Chen & Lipman 2024). Nothing here knows about neural-network weights."""
from wsbook.flows.couplings import IndependentCoupling, OTCoupling, coupling_cost, make_coupling, ot_assignment
from wsbook.flows.likelihood import LikelihoodResult, divergence, log_likelihood, rademacher
from wsbook.flows.metrics import mmd2, straightness, wasserstein2, wasserstein2_from_costs
from wsbook.flows.models import TimeEmbedding, TimeMLP, time_features
from wsbook.flows.paths import GeodesicPath, LinearPath, check_time
from wsbook.flows.solvers import ODEResult, manifold_step, solve_ode
from wsbook.flows.toys import (GaussianMixture, VonMisesFisherMixture, eight_gaussians, ring_mixture,
                               standard_normal, two_moons)
from wsbook.flows.train import FlowTrainResult, cfm_loss, train_flow

__all__ = [
    "IndependentCoupling", "OTCoupling", "coupling_cost", "make_coupling", "ot_assignment",
    "LikelihoodResult", "divergence", "log_likelihood", "rademacher",
    "mmd2", "straightness", "wasserstein2", "wasserstein2_from_costs", "TimeEmbedding", "TimeMLP", "time_features",
    "GeodesicPath", "LinearPath", "check_time", "ODEResult", "manifold_step", "solve_ode",
    "GaussianMixture", "VonMisesFisherMixture", "eight_gaussians", "ring_mixture", "standard_normal", "two_moons",
    "FlowTrainResult", "cfm_loss", "train_flow",
]
