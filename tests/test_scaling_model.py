"""dev/bench/scaling_model.py's step model: the bytes per parameter of the weights' gathers, the gradients'
reductions (issue 29's compressed communication) and the updated weights' gather (issue 28's --update-gather
delta) scale exactly the collectives that move them, and bf16's 2 bytes give the model as it was."""
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
    assert step(stage, mode) == step(stage, mode, wbytes=2.0, gbytes=2.0, ubytes=2.0)


@pytest.mark.parametrize("stage,mode", [(0, "flat"), (1, "flat"), (1, "host"), (3, "flat"), (3, "host")])
def test_halving_the_bytes_halves_the_collectives_that_move_them(stage, mode):
    base, half_w, half_g = step(stage, mode), step(stage, mode, wbytes=1.0), step(stage, mode, gbytes=1.0)
    assert half_w["t_grad"] == base["t_grad"] and half_g["t_grad"] == pytest.approx(base["t_grad"] / 2)
    assert half_g["t_gather_micro"] == base["t_gather_micro"]
    assert half_w["t_gather_micro"] == pytest.approx(base["t_gather_micro"] / 2)
    # the gather of the updated weights after AdamW stays exact bf16 whatever stage 3's gathers move
    assert half_g["t_gather_after"] == base["t_gather_after"] == half_w["t_gather_after"]
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


def _netscale(run, hosts, ms, tps, date, **extra):
    return {"check": "netscale", "run": run, "model": "llama3.2-1b", "params": 1235814400, "stage": 1,
            "mode": "flat", "hosts": hosts, "gpus_per_host": 1, "micro_steps": 16, "B": 8, "T": 2048,
            "tokens_per_s_per_gpu": tps, "ms": ms, "date": date, **extra}


def test_quantized_runs_put_codes_on_the_wire_and_take_their_own_leases_one_gpu_time():
    recs = [_netscale("one_old", 1, 3800.0, 69000.0, None), _netscale("one_new", 1, 3700.0, 70000.0, "2026-11-27"),
            _netscale("old", 2, 4400.0, 59000.0, None),
            _netscale("int8", 2, 4400.0, 59000.0, "2026-11-27", grad_reduce="int8", weight_gather="e4m3"),
            _netscale("fp32", 2, 5300.0, 49000.0, "2026-11-27", grad_reduce="fp32", grad_bytes_per_param=4.0)]
    pts, skipped = scaling_model.trainer_points(recs)
    by_run = {p["run"]: p for p in pts}
    assert skipped == 0 and set(by_run) == {"old", "int8", "fp32"}
    assert by_run["old"]["gbytes"] == by_run["old"]["wbytes"] == 2.0
    assert by_run["int8"]["gbytes"] == by_run["int8"]["wbytes"] == 1.0 + 4.0 / 128
    assert by_run["fp32"]["gbytes"] == 4.0  # a record's own bytes field wins
    assert by_run["old"]["t_micro"] == pytest.approx(3.8 / 16)  # the undated one-GPU run
    assert by_run["int8"]["t_micro"] == pytest.approx(3.7 / 16)  # the same lease's


def test_flat_stage_3_queues_the_last_micro_steps_sums_behind_its_gathers():
    """Flat stage 3 on one link: micro-steps before the last take the longer of compute and gathers; the last one
    also carries the gradient sums on the same link; the last bucket's share of the sums comes after it."""
    p = step(3, "flat")
    tg, tr = p["t_gather_micro"], p["t_grad"]
    assert tg == pytest.approx(2 * 14 * (2.0 / 16) * 31 / 32) and tr == pytest.approx(2.0 * 31 / 32)
    assert p["t_step"] == pytest.approx(max(0.5, tg) + max(0.5, tg + tr) + 0.15 * tr)
    assert p["t_exposed"] == pytest.approx(p["t_step"] - 2 * 0.5)


def test_fp8_runs_at_stage_3_gather_one_byte_codes_and_want_an_fp8_one_gpu_run():
    """--fp8 at stage 3 gathers E4M3 codes (weight_gather fp8_codes, or auto in records since then; records from
    before say nothing and gathered bf16); an fp8 run takes its one-GPU time from an fp8 run, not a bf16 one."""
    recs = [_netscale("one_bf16", 1, 3700.0, 70000.0, "2026-11-27"),
            _netscale("codes", 2, 5000.0, 50000.0, "2026-11-27", stage=3, precision="fp8", weight_gather="fp8_codes"),
            _netscale("auto", 2, 5000.0, 50000.0, "2026-11-28", stage=3, precision="fp8", weight_gather="auto"),
            _netscale("one_fp8", 1, 3000.0, 85000.0, "2026-11-28", precision="fp8"),
            _netscale("before", 2, 5000.0, 50000.0, "2026-11-28", stage=3, precision="fp8"),
            _netscale("bf16_auto", 2, 5000.0, 50000.0, "2026-11-28", stage=3, weight_gather="auto")]
    recs.append(_netscale("one_bf16_28", 1, 3600.0, 71000.0, "2026-11-28"))
    pts, skipped = scaling_model.trainer_points(recs)
    by_run = {p["run"]: p for p in pts}
    assert skipped == 1 and "codes" not in by_run  # no fp8 one-GPU run on its date
    assert by_run["auto"]["wbytes"] == 1.0 and by_run["auto"]["t_micro"] == pytest.approx(3.0 / 16)
    assert by_run["before"]["wbytes"] == 2.0 and by_run["bf16_auto"]["wbytes"] == 2.0
    assert by_run["bf16_auto"]["t_micro"] == pytest.approx(3.6 / 16)


def test_a_point_takes_the_one_gpu_run_of_its_lease_and_micro_steps():
    def rec(run, hosts, micro, ms, lease):
        return {"check": "qmatrix", "run": run, "model": "llama3.2-1b", "params": 1235814400, "stage": 1,
                "mode": "flat", "hosts": hosts, "gpus_per_host": 1, "micro_steps": micro, "B": 8, "T": 2048,
                "tokens_per_s_per_gpu": 1000.0, "ms": ms, "lease": lease}
    recs = [rec("one_m1", 1, 1, 250.0, "b"), rec("one_m16", 1, 16, 3700.0, "b"), rec("other_lease", 1, 1, 300.0, "a"),
            rec("p_m1", 2, 1, 900.0, "b"), rec("p_m16", 2, 16, 4400.0, "b"), rec("p_m8", 2, 8, 2300.0, "b")]
    pts, skipped = scaling_model.trainer_points(recs)
    t = {p["run"]: p["t_micro"] for p in pts}
    assert skipped == 0 and t["p_m1"] == pytest.approx(0.250) and t["p_m16"] == pytest.approx(3.7 / 16)
    # no one-GPU run at 8 micro-steps in lease b: its last one-GPU run, per micro-step
    assert t["p_m8"] == pytest.approx(3.7 / 16)


def test_quantized_sums_take_the_all_to_all_points_where_there_are_some():
    """Gradient bytes other than bf16's 2 are ZeRO++'s all-to-all: timed by nccl_bench's all_to_all fit of the link
    where it has points, else as a reduce-scatter of the codes (and the notes say so); bf16 sums stay ring ones."""
    slow = {"alpha": 0.0, "beta": 4e-9}  # an all-to-all at a quarter of the ring's bandwidth
    fits = {("reduce_scatter", "net"): LINK, ("all_gather", "net"): LINK, ("all_to_all", "net"): slow,
            ("reduce_scatter", "nvlink"): LINK, ("all_gather", "nvlink"): LINK}
    notes = set()
    lookup = scaling_model.make_measured_lookup(fits, LINK, notes, {"run": "test"})

    def grad(mode, gbytes):
        return scaling_model.step_time(1, mode, hosts=4, gpn=8, micro=2, t_micro=0.5, nparams=P, links=LINKS,
                                       lookup=lookup, tail=0.15, gbytes=gbytes)["t_grad"]

    codes = 1.0 + 4.0 / 128
    assert grad("flat", 2.0) == pytest.approx(2.0 * 31 / 32)  # the ring's fit
    assert grad("flat", codes) == pytest.approx(4 * codes * 31 / 32)  # the all-to-all's, at the codes' bytes
    assert not notes
    # over hosts: in-host over NVLink (no all_to_all points there: a reduce-scatter of the codes), across over net
    assert grad("host", codes) == pytest.approx(codes * 7 / 8 + 4 * codes / 8 * 3 / 4)
    assert notes == {"quantized sums over nvlink: no all_to_all points, timed as a reduce-scatter of the codes"}


@pytest.mark.parametrize("stage,mode", [(1, "flat"), (2, "flat"), (1, "host"), (2, "host"), (3, "host")])
def test_the_updates_changes_shrink_only_the_gather_that_crosses_the_ring_or_the_hosts(stage, mode):
    """--update-gather delta: flat, the whole gather after AdamW moves the changes; over hosts only its part across
    them (a host's GPUs still gather their group's shares in bf16 at stages 1 and 2); nothing else moves."""
    base, half = step(stage, mode), step(stage, mode, ubytes=1.0)
    assert half["t_grad"] == base["t_grad"] and half["t_gather_micro"] == base["t_gather_micro"]
    across = 2.0 / 8 * 3 / 4  # 1/G of the bf16 weights over the 4 hosts
    if mode == "flat":
        assert half["t_gather_after"] == pytest.approx(base["t_gather_after"] / 2)
    else:
        assert base["t_gather_after"] - half["t_gather_after"] == pytest.approx(across / 2)
    assert half["t_step"] <= base["t_step"]


def test_a_delta_gather_record_puts_the_changes_on_the_wire():
    recs = [_netscale("one", 1, 3650.0, 71800.0, "2026-11-27"),
            _netscale("delta", 2, 4010.0, 65300.0, "2026-11-27", grad_reduce="int8", update_gather="delta"),
            _netscale("own", 2, 4010.0, 65300.0, "2026-11-27", update_gather="delta", update_bytes_per_param=1.3)]
    by_run = {p["run"]: p for p in scaling_model.trainer_points(recs)[0]}
    assert by_run["delta"]["ubytes"] == scaling_model.DELTA_BYTES and by_run["delta"]["wbytes"] == 2.0
    assert by_run["own"]["ubytes"] == 1.3 and by_run["own"]["gbytes"] == 2.0


def test_runs_at_other_socket_settings_take_their_own_fits():
    """NCCL's sockets at 4 threads x 2 connections (the trainer's setting over TCP, or set by hand) are another link
    than at NCCL's defaults: nccl_bench points and trainer points carry the setting into their link kind, NVLink
    never does, and a record at 1 x 1 or saying nothing is at the defaults."""
    def bench(sockets, seconds, group="all", world=2, hosts=2):
        r = {"bench": "nccl", "collective": "all_gather", "group": group, "ranks": 2, "world": world, "hosts": hosts,
             "bytes": 1 << 28, "seconds": seconds}
        return {**r, "sockets": sockets} if sockets else r
    links = {p["label"] or "": p["link"] for p in scaling_model.nccl_points([
        {**bench("4x2", 0.02), "label": "a"}, {**bench("1x1", 0.03), "label": "b"}, {**bench(None, 0.03), "label": "c"},
        {**bench("4x2", 0.001, group="host", world=4), "label": "d"},
        {**bench("4x2", 0.02, world=4), "label": "e"}])}
    assert links == {"a": "net@4x2", "b": "net", "c": "net", "d": "nvlink", "e": "net_mixed@4x2"}

    def point(**kw):
        return {"check": "netscale", "run": "p", "model": "llama3.2-1b", "params": 1235814400, "stage": 1,
                "mode": "host", "hosts": 2, "gpus_per_host": 2, "micro_steps": 8, "B": 8, "T": 2048,
                "tokens_per_s_per_gpu": 1000.0, "one_gpu": {"ms": 3700.0, "micro_steps": 16}, **kw}
    pts, _ = scaling_model.trainer_points([point(sockets="4x2"), point(socket_threads=4, socks_per_thread=2),
                                          point(sockets="1x1"), point()])
    assert [scaling_model.point_links(p) for p in pts] == (
        [{"host": "nvlink", "across": "net@4x2", "flat": "net_mixed@4x2"}] * 2
        + [{"host": "nvlink", "across": "net", "flat": "net_mixed"}] * 2)
    # a mixed ring at 4 x 2 without points of its own borrows the net's at 4 x 2, not the defaults'
    fast, slow = {"alpha": 0.0, "beta": 1e-10}, {"alpha": 0.0, "beta": 1e-9}
    notes = set()
    lookup = scaling_model.make_measured_lookup({("all_gather", "net@4x2"): fast, ("all_gather", "net"): slow},
                                                LINK, notes, {"run": "test"})
    assert lookup("all_gather", "net_mixed@4x2") is fast and lookup("all_gather", "net_mixed") is slow
