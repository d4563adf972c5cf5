"""dev/bench/scaling_model.py's step model: the bytes per parameter of the weights' gathers and the gradients'
reductions (issue 29's compressed communication) scale exactly the collectives that move them, and bf16's 2
bytes give the model as it was."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "dev", "bench"))
import scaling_model  # noqa: E402

# a link of pure bandwidth: 1 GB/s, no latency, so a collective's time is its bytes * (n - 1) / n / 1e9
LINK = {"alpha": 0.0, "beta": 1e-9}
LINKS = {"flat": "net", "host": "nvlink", "across": "net"}
P = 1_000_000_000  # parameters


def step(stage, mode, **kw):
    return scaling_model.step_time(stage, mode, hosts=4, gpn=8, micro=2, t_micro=0.5, nparams=P, links=LINKS,
                                   lookup=lambda coll, link: LINK, tail=0.15, shape=(16, P // 16), **kw)


@pytest.mark.parametrize("stage,mode", [(0, "flat"), (1, "flat"), (2, "host"), (3, "flat"), (3, "host")])
def test_bf16_bytes_are_the_default(stage, mode):
    assert step(stage, mode) == step(stage, mode, wbytes=2.0, gbytes=2.0)


@pytest.mark.parametrize("stage,mode", [(0, "flat"), (1, "flat"), (1, "host"), (3, "flat"), (3, "host")])
def test_halving_the_bytes_halves_the_collectives_that_move_them(stage, mode):
    base, half_w, half_g = step(stage, mode), step(stage, mode, wbytes=1.0), step(stage, mode, gbytes=1.0)
    assert half_w["t_grad"] == base["t_grad"] and half_g["t_grad"] == pytest.approx(base["t_grad"] / 2)
    for part in ("t_gather_after", "t_gather_micro"):
        assert half_g[part] == base[part] and half_w[part] == pytest.approx(base[part] / 2)
    assert half_w["t_step"] <= base["t_step"] and half_g["t_step"] <= base["t_step"]


def test_flat_stage_1_on_4_hosts_of_8_by_hand():
    """32 ranks at 1 GB/s: the reduce-scatter of 2 GB of gradients takes 2 * 31/32 s, of which 2/3 of the 0.5 s
    micro-step hides all but the larger of its last 15% and what overruns the backward; the all-gather after the
    update the same seconds, less the third of a micro-step the next forward hides."""
    p = step(1, "flat")
    t = 2.0 * 31 / 32
    assert p["t_grad"] == pytest.approx(t) and p["t_gather_after"] == pytest.approx(t)
    exposed = max(0.15 * t, t - 0.5 * 2 / 3) + max(0.0, t - 0.5 / 3)
    assert p["t_step"] == pytest.approx(2 * 0.5 + exposed)
