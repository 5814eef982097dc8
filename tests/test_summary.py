"""The discussion's table of verdicts (summary.verdicts): one row per criterion of the results chapters, each
carrying the verdict, mean and standard error of the table that judged it on its test runs."""
import math

import pandas as pd

from wsbook.experiments import flows, mnist_flows as mf, posterior_flows as pf, summary


def zoo_table(chosen: str, verdict: str, gap: float | None) -> pd.DataFrame:
    """A verdict table of flows.test_report's shape whose chosen row has every verdict ``verdict``."""
    columns = ["MMD² verdict", "memorisation verdict", "accuracy verdict", "BMA-64 NLL verdict",
               "MMD² vs baseline"] + (["gap verdict"] if gap is not None else [])
    row = {"accuracy": 0.9, "accuracy_se": 0.01, "bma_nll": 0.3, "bma_nll_se": 0.02, "mmd_ratio": 1.7,
           "mmd_ratio_se": 0.2, "nn_ratio": 1.01, "nn_ratio_se": 0.003} | {c: verdict for c in columns}
    table = pd.DataFrame({chosen: row, "plain baseline": {k: "—" if "verdict" in k or "vs" in k else 0.0
                                                          for k in row}}).T
    table.attrs.update(selected=chosen, mmd_goal=2.0, nn_goal=(1.0, 0.95), accuracy_gap=gap)
    return table


def test_verdicts_carry_each_tables_verdict_for_the_flow_it_chose(monkeypatch):
    monkeypatch.setattr(summary, "breast_cancer_sizes", lambda: (8, 2))
    monkeypatch.setattr(flows, "breast_cancer_candidates", lambda: {})
    monkeypatch.setattr(flows, "verdict_table", lambda *a, **k: zoo_table("bc flow", "level", None))
    monkeypatch.setattr(mf, "verdict_table", lambda: zoo_table("mnist flow", "missed", 0.03))
    monkeypatch.setattr(flows, "cnn_verdict_table", lambda field=None: zoo_table(f"cnn {field}", "met", 0.03))
    post = pd.DataFrame({"flow": {"tv": 0.02, "tv_se": 0.001, "mmd2": 0.01, "mmd2_se": 0.002, "TV vs VI": "met",
                                  "MMD² vs VI": "level"},
                         pf.VI_ROW: {"tv": 0.03, "tv_se": 0.001, "mmd2": 0.012, "mmd2_se": 0.001, "TV vs VI": "—",
                                     "MMD² vs VI": "—"}}).T
    post.attrs["selected"] = "flow"
    monkeypatch.setattr(pf, "verdict_table", lambda task: post)
    wide = pd.DataFrame({"flow at the new width": {"accuracy": 0.4, "accuracy_se": 0.02,
                                                   "transfer verdict": "missed"}}).T
    wide.attrs.update(chosen="channel flow", accuracy_gap=0.03)
    monkeypatch.setattr(flows, "cnn_width_transfer", lambda: wide)
    mlp_wide = pd.DataFrame({"flow at the new width": {"accuracy": 0.8, "accuracy_se": 0.01,
                                                       "transfer verdict": "level"}}).T
    mlp_wide.attrs.update(chosen="neuron flow", accuracy_gap=0.03)
    monkeypatch.setattr(mf, "width_transfer_verdict", lambda: mlp_wide)

    cost = pd.DataFrame({"ratio_n": [0.5, 2.0], "verdict": ["missed", "met only over 10x the samples"]},
                        index=["slow flow", "fast flow"])
    table = summary.verdicts(cost=cost)
    assert list(table.columns) == list(summary.VERDICT_COLUMNS)
    bc = table.loc["8, breast cancer"]
    assert set(bc["verdict"]) == {"level"} and set(bc["networks"]) == {"bc flow"} and len(bc) == 4
    assert bc.loc["nearest-neighbour ratio", "mean"] == 1.01 and bc.loc["BMA-64 NLL", "se"] == 0.02
    assert "at most 2" in bc.loc["MMD² over the perfect generator's", "criterion"]
    mn = table.loc["8b, MNIST"]
    wide_row = mn.loc["width transfer to 784-32-10"]
    assert wide_row["verdict"] == "level" and wide_row["networks"] == "neuron flow" and wide_row["mean"] == 0.8
    assert "above both ensembles" in wide_row["criterion"]
    mn = mn.drop("width transfer to 784-32-10")
    assert set(mn["verdict"]) == {"missed"} and "within 0.03" in mn.loc["accuracy", "criterion"]
    cnn = table.loc["8d, CNN"]
    assert cnn.loc["equivariant field against the plain baseline", "networks"] == "cnn channel"
    # against the flat table's chosen flow: equal means read level
    flat = cnn.loc["equivariant field against the best flat field"]
    assert flat["networks"] == "cnn channel" and flat["verdict"] == "level"
    assert cnn.loc["accuracy", "networks"] == "cnn None" and cnn.loc["accuracy", "verdict"] == "met"
    assert cnn.loc["channel-width transfer", "verdict"] == "missed"
    assert cnn.loc["channel-width transfer", "networks"] == "channel flow"
    posterior = table.loc["8c, posterior"]
    assert posterior.loc["TV to the test HMC run", "verdict"] == "met"
    assert posterior.loc["MMD² to the test HMC run", "verdict"] == "level"
    assert "0.012" in posterior.loc["MMD² to the test HMC run", "criterion"]        # VI's own mean, for scale
    assert posterior.loc["cost", "networks"] == "fast flow" and posterior.loc["cost", "mean"] == 2.0
    assert posterior.loc["cost", "verdict"] == "met only over 10x the samples"

    refused = summary.verdicts(cost="no breast-cancer cost can be measured")
    row = refused.loc[("8c, posterior", "cost")]
    assert row["verdict"] == "not measured" and math.isnan(row["mean"])
