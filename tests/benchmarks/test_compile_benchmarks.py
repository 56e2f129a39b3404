"""benchmarks/compile_learning.py and benchmarks/compile_threads.py, without starting a run: the
learning summary's rise, spread and gap verdicts, and the count of parallel regions read from
inductor's generated code."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(arm, seed, rise, gap):
    return {"arm": arm, "seed": seed, "timed_out": False, "rise": rise, "gap_max": gap, "ratio_dev_max": 0.0,
            "step_s": [5.0, 2.0, 2.0]}


def test_the_learning_summary_judges_the_compiled_rise_against_the_eager_seeds_spread():
    m = load("compile_learning")
    runs = [run("eager", 0, 0.10, 0.0), run("compiled", 0, 0.12, 1e-7),
            run("eager", 1, 0.20, 0.0), run("compiled", 1, 0.18, 2e-7)]
    s = m.summarize(runs)
    assert abs(s["eager_spread"] - 0.10) < 1e-12 and s["same_rise_within_spread"] and s["gap_within_bound"]
    assert s["compiled"]["gap_max"] == 2e-7 and abs(s["paired_rise_delta"]["1"] + 0.02) < 1e-12
    assert s["compiled"]["step_s_median"] == 2.0  # the first step (the compile) left out
    far = m.summarize(runs[:2] + [run("eager", 1, 0.11, 0.0), run("compiled", 1, 0.40, 3e-5)])
    assert not far["same_rise_within_spread"] and not far["gap_within_bound"]


WRAPPER = """
from torch._inductor.async_compile import AsyncCompile
async_compile = AsyncCompile()
cpp_fused_add_0 = async_compile.cpp_pybinding(['float*'], '''
extern "C" void kernel(float* out) {
    #pragma omp parallel num_threads(2)
    { }
}
''')
cpp_fused_mul_1 = async_compile.cpp_pybinding(['float*'], '''
extern "C" void kernel(float* out) {
    for (int i = 0; i < 4; i++) { }
}
''')

def call(args):
    buf0 = extern_kernels.mm(args[0], args[1])
    cpp_fused_add_0(buf0)
    cpp_fused_mul_1(buf0)
    cpp_fused_add_0(buf0)
    return (buf0,)

def benchmark_compiled_module():
    cpp_fused_add_0(None)
"""


def test_parallel_regions_are_counted_per_call_of_a_graph(tmp_path):
    m = load("compile_threads")
    (tmp_path / "ab").mkdir()
    (tmp_path / "ab" / "cabc.py").write_text(WRAPPER)
    (tmp_path / "ab" / "other.py").write_text("x = 1\n")  # not a wrapper: skipped
    [graph] = m.kernel_counts(tmp_path)
    assert graph == {"file": "cabc.py", "kernels": 2, "parallel_kernels": 1, "kernel_calls": 3,
                     "parallel_region_calls": 2, "extern_calls": 1}


def test_results_of_other_seeds_merge_into_one_summary_and_a_repeated_seed_is_refused(tmp_path):
    m = load("compile_learning")
    for name, seed, rise in (("a", 0, 0.1), ("b", 1, 0.2)):
        body = {"benchmark": "compile_learning", "recipe": "r", "threads": 1, "command": name, "date": "d",
                "runs": [run("eager", seed, rise, 0.0), run("compiled", seed, rise, 0.0)]}
        (tmp_path / f"{name}.json").write_text(json.dumps(body))
    out = tmp_path / "all.json"
    m.merge(m.parse_args(["--merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(out)]))
    merged = json.loads(out.read_text())
    assert merged["seeds"] == [0, 1] and merged["summary"]["eager"]["rises"] == [0.1, 0.2]
    with pytest.raises(SystemExit, match="a seed's arm appears twice"):
        m.merge(m.parse_args(["--merge", str(tmp_path / "a.json"), str(tmp_path / "a.json"), "--out", str(out)]))


def test_library_kernels_are_told_from_the_rest_in_a_real_profile():
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    m = load("compile")
    x, w = torch.randn(64, 64), torch.randn(64, 64)
    image, kernel = torch.randn(1, 3, 16, 16), torch.randn(4, 3, 3, 3)
    q = torch.randn(2, 2, 16, 8)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.mm(x, w)
        F.linear(x, w, torch.zeros(64))  # addmm underneath
        F.conv2d(image, kernel)
        F.scaled_dot_product_attention(q, q, q)
        torch.tanh(x).exp()  # elementwise: what a compiler fuses, not a library kernel
    got = m.kernel_seconds(prof)
    assert got["gemm"] > 0 and got["convolution"] > 0 and got["attention"] > 0
    assert got["library"] == pytest.approx(got["gemm"] + got["convolution"] + got["attention"], rel=1e-9)
    assert got["library"] < got["total"]
