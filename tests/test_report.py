"""dev/bench/report.py's README headline: the setting most systems trained, each system's best tokens/s and device
memory there, OOM where it ran out; written only between the README's markers."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dev", "bench"))
import report  # noqa: E402


def rec(system, B, T, tps=None, mem=None, status="ok", recompute=None, **kw):
    r = dict(dict(system=system, model="llama3.2-1b", layers=16, gpu="NVIDIA H100 80GB HBM3", B=B, T=T,
                  status=status, tokens_per_s=tps, device_mem_gib=mem, date="2026-11-27T06:00:00+00:00",
                  recompute=recompute), **kw)
    if system.startswith("train_llama"):
        r["git_commit"] = "5447475abc"
    return r


RECORDS = [rec("train_llama", 4, 2048, 60000, 24.0, recompute=1),
           rec("train_llama", 8, 2048, 66000, 32.0, recompute=1),
           rec("train_llama", 8, 2048, 67000, 40.0, recompute=0),  # the faster recompute level is the one shown
           rec("hf_liger", 4, 2048, 40000, 30.0),
           rec("hf_liger", 8, 2048, 51000, 42.0),
           rec("titan_compile", 8, 2048, status="OOM"),
           rec("llmq", 4, 2048, 58000, 45.0)]


def test_the_row_is_the_setting_most_systems_trained_with_each_best():
    lines = report.headline_lines(RECORDS)
    header, _, row = lines[0].splitlines()
    cells = [c.strip() for c in row.strip("|").split("|")]
    names = [c.strip() for c in header.strip("|").split("|")]
    assert names[:2] == ["model", "B × T"] and "llmq (bf16)" in names and "torchtitan + compile" not in names
    # 4 x 2048: train_llama, HF + Liger and llmq trained (3); 8 x 2048: two trained, titan ran out (2)
    assert cells[1] == "4 × 2048", cells
    at = dict(zip(names, cells))
    assert at["train_llama"] == "60.0k, 24.0 GiB" and at["llmq (bf16)"] == "58.0k, 45.0 GiB", at
    assert at["GPU; measured; train_llama commit"] == "H100 80GB HBM3; 2026-11-27; 5447475"


def test_out_of_memory_and_the_best_recompute_level():
    recs = [r for r in RECORDS if r["system"] != "llmq"] + [rec("llmq", 8, 2048, 1000, 1.0)]
    header, _, row = report.headline_lines(recs)[0].splitlines()
    at = dict(zip([c.strip() for c in header.strip("|").split("|")], [c.strip() for c in row.strip("|").split("|")]))
    assert at["B × T"] == "8 × 2048" and at["train_llama"] == "67.0k, 40.0 GiB"
    assert at["torchtitan + compile"] == "OOM"


def test_the_readme_changes_only_between_its_markers(tmp_path):
    readme = tmp_path / "README.md"
    text = "# x\n\nbefore\n%s\nold table\n%s\nafter\n" % (report.README_BEGIN, report.README_END)
    readme.write_text(text)
    assert report.update_readme(str(readme), ["| new |"])
    assert readme.read_text() == text.replace("old table", "| new |")
    plain = tmp_path / "PLAIN.md"
    plain.write_text("no markers\n")
    assert not report.update_readme(str(plain), ["| new |"]) and plain.read_text() == "no markers\n"


def test_the_multi_gpu_table_and_the_best_of_each_side(tmp_path):
    common = dict(model="llama3.1-8b-cut", layers=32, gpu="NVIDIA H100 80GB HBM3", gpus=4, B=1, T=8192, grad_accum=1,
                  date="2026-11-27T06:00:00+00:00")
    ok = dict(common, status="ok")
    recs = [dict(ok, system="train_llama_z3", tokens_per_s=40000.0, tokens_per_s_per_gpu=10000.0, mfu=0.6,
                 peak_mem_gib=56.0, git_commit="abcdef0"),
            dict(ok, system="train_llama_fp8_z2", tokens_per_s=52000.0, tokens_per_s_per_gpu=13000.0, mfu=0.78,
                 peak_mem_gib=70.0, git_commit="abcdef0"),
            dict(ok, system="titan_fsdp", tokens_per_s=32000.0, tokens_per_s_per_gpu=8000.0, mfu=0.48,
                 peak_mem_gib=60.0),
            dict(common, system="titan_fsdp_float8", status="OOM"),
            dict(ok, system="train_llama_z3", recompute=2, tokens_per_s=36000.0, tokens_per_s_per_gpu=9000.0, mfu=0.54,
                 peak_mem_gib=44.0, device_mem_gib=45.5, git_commit="abcdef0")]
    (tmp_path / "multi_gpu_peers.jsonl").write_text("".join(report.json.dumps(r) + "\n" for r in recs))
    text = "\n".join(report.multi_gpu_section(str(tmp_path)))
    assert "| train_llama, ZeRO 3 | 10,000 | 60.0% | 56.0 GiB |" in text, text
    assert "| torchtitan FSDP2 + float8 tensorwise | OOM |" in text, text
    # another recompute level is a row of its own, named, not a duplicate of the default's
    assert "| train_llama, ZeRO 3, --recompute 2 | 9,000 | 54.0% | 44.0 GiB | 45.5 GiB |" in text, text
    assert "- bf16: the best train_llama (train_llama, ZeRO 3) 1.25x the best torchtitan (torchtitan FSDP2 + compile)" \
        in text, text
    assert "- FP8:" not in text  # torchtitan's float8 did not train: nothing to hold it against
    # a later lease's series is a table of its own: its torchtitan row neither replaces nor joins the first table's
    later = dict(ok, series="a later lease", date="2026-11-28T06:00:00+00:00")
    recs += [dict(later, system="titan_fsdp", tokens_per_s=36000.0, tokens_per_s_per_gpu=9000.0, mfu=0.54,
                  peak_mem_gib=60.0),
             dict(later, system="train_llama_z3", recompute=2, tokens_per_s=38000.0, tokens_per_s_per_gpu=9500.0,
                  mfu=0.57, peak_mem_gib=44.0, git_commit="abcdef1")]
    (tmp_path / "multi_gpu_peers.jsonl").write_text("".join(report.json.dumps(r) + "\n" for r in recs))
    text = "\n".join(report.multi_gpu_section(str(tmp_path)))
    first, second = text.split("T=8192: a later lease")
    assert "| torchtitan FSDP2 + compile | 8,000 |" in first and "| torchtitan FSDP2 + compile | 9,000 |" in second
    assert "| train_llama, ZeRO 3, --recompute 2 | 9,500 |" in second and "9,500" not in first, text
    assert "- bf16: the best train_llama (train_llama, ZeRO 3, --recompute 2) 1.06x" in second, second
    assert report.multi_gpu_section(str(tmp_path / "none")) == []


def test_a_series_is_a_table_of_its_own_and_stays_out_of_the_headline():
    later = dict(series="a later lease", date="2026-11-28T06:00:00+00:00")
    recs = RECORDS + [rec("train_llama_fp8_made", 4, 2048, 70000, 20.0, recompute=2, **later),
                      rec("titan_float8_tensorwise", 4, 2048, 65000, 22.0, **later),
                      rec("llmq", 4, 2048, 99000, 10.0, **later)]  # would win the headline's llmq cell if it counted
    text = "\n".join(report.e2e_section(recs, "/nonexistent", None))
    first, second = text.split("## llama3.2-1b, 16 layers (NVIDIA H100 80GB HBM3): a later lease")
    assert "99.0k" not in first and "58.0k" in first and "train_llama --fp8 --fp8-weights made" not in first
    assert "| train_llama --fp8 --fp8-weights made (recompute 2) / torchtitan float8 tensorwise, tokens/s |" in \
        second.replace(" | device memory", ""), second
    assert "1.08× (70.0k / 65.0k) | 0.91× (20.0 / 22.0 GiB)" in second, second
    header, _, row = report.headline_lines(recs)[0].splitlines()
    at = dict(zip([c.strip() for c in header.strip("|").split("|")], [c.strip() for c in row.strip("|").split("|")]))
    assert at["llmq (bf16)"] == "58.0k, 45.0 GiB", at


def test_a_series_of_several_micro_step_counts_is_one_table_whose_rows_name_them():
    """A lease's series ran llmq at its 16 micro-steps and train_llama at 20 (2026-11-27): one table, not one per
    count, each row saying its micro-steps."""
    lease = dict(series="one lease")
    recs = [rec("llmq", 16, 2048, 56870, 78.9, grad_accum=16, **lease),
            rec("train_llama", 12, 2048, 57131, 70.4, recompute=0, grad_accum=20, **lease)]
    text = "\n".join(report.e2e_section(recs, "/nonexistent", None))
    assert text.count("## llama3.2-1b") == 1 and "micro-steps per optimizer step" not in text, text
    assert "| 12 × 2048, 20 micro-steps |  | 57.1k" in text and "| 16 × 2048, 16 micro-steps | 56.9k" in text, text
