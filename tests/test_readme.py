"""The README's example, run as a reader would copy it, with fewer networks and training steps: the flow's
networks reach the population's mean test accuracy within 0.05."""
import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parent.parent / "README.md"
#: the sizes the test shrinks (README text -> test text); the recipe itself is unchanged
REDUCED = {"spec.init(256)": "spec.init(128)", "steps=1000,": "steps=500,", "flow.sample(512,": "flow.sample(128,"}


def example_blocks() -> list[str]:
    """The two Python blocks of the README's section "The library in one example"."""
    text = README.read_text()
    section = text[text.index("## The library in one example"):]
    section = section[:section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_readme_example_samples_networks_as_accurate_as_its_population():
    blocks = example_blocks()
    assert len(blocks) == 2
    code = "\n".join(blocks)
    for full, small in REDUCED.items():
        assert full in code, f"the README example no longer contains {full!r}"
        code = code.replace(full, small)
    torch.manual_seed(0)
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)
    bayes, ds = namespace["bayes"], namespace["ds"]
    population = float(bayes.accuracy(namespace["p"], ds.y_test).mean())
    flow = float(bayes.accuracy(namespace["q"], ds.y_test).mean())
    assert population > 0.9, population
    assert flow >= population - 0.05, (flow, population)
