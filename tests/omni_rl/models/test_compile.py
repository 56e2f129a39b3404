"""`model.compile_options`: bound at load, regional compilation of the declared blocks, no recompile
when the batch changes, LoRA and gradient checkpointing through compiled blocks.

The compiled runs here use the `aot_eager` backend: dynamo's and AOTAutograd's graph capture with
eager kernels, which checks that the blocks are captured and wired (inductor's code generation
costs minutes per model on a loaded CPU). Even that capture takes tens of seconds, so those tests
are `long`; the default run checks the load-time rules and the cache's place. Inductor's numerics
are checked for every adapter by the shared suite (tests/adapters/diffusion_suite.py, test 6,
`long`) and measured by benchmarks/compile.py.
"""
import pytest
import torch
from torch._dynamo.utils import counters

from omni_rl.compose import load_config
from omni_rl.config.schema import LoraConfig, ModelConfig
from omni_rl.errors import ConfigError, OmniConfigError
from omni_rl.models import build_model
from omni_rl.models.diffusion import PromptLengthOptions
from omni_rl.models.compile import CompileOptions, compile_modules, inductor_cache_dir

TRACE = CompileOptions(enabled=True, backend="aot_eager")


def test_the_block_is_bound_at_load_and_refuses_what_it_cannot_take():
    cfg = load_config(["model.compile_options.enabled=true", "model.compile_options.mode=max-autotune-no-cudagraphs"])
    assert cfg.model.compile_options == CompileOptions(enabled=True, mode="max-autotune-no-cudagraphs")
    assert load_config([]).model.compile_options == CompileOptions()  # off by default
    with pytest.raises(ConfigError, match=r"model.compile_options.backend='tvm': expected one of inductor"):
        load_config(["model.compile_options.backend=tvm"])
    with pytest.raises(ConfigError, match=r"model.compile_options.fullgraph=True: the model's compilation has no option"):
        load_config(["model.compile_options.fullgraph=true"])
    with pytest.raises(ConfigError, match=r"mode='reduce-overhead': a mode is inductor's"):
        load_config(["model.compile_options.backend=aot_eager", "model.compile_options.mode=reduce-overhead"])


def test_cuda_graphs_are_refused_on_a_cpu():
    with pytest.raises(OmniConfigError, match=r"mode='reduce-overhead': CUDA graphs need a CUDA device"):
        compile_modules({"m": torch.nn.Linear(2, 2)}, (), CompileOptions(enabled=True, mode="reduce-overhead"),
                        torch.device("cpu"))


def test_the_inductor_cache_is_under_the_project_cache_unless_named(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("OMNI_RL_CACHE", str(tmp_path / "cache"))
    assert inductor_cache_dir(CompileOptions()) == tmp_path / "cache" / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "theirs"))  # the user's environment wins
    assert inductor_cache_dir(CompileOptions()) == tmp_path / "theirs"
    assert inductor_cache_dir(CompileOptions(cache_dir=str(tmp_path / "mine"))) == tmp_path / "mine"


@pytest.fixture(scope="module")
def pair():
    """The demo's tiny SD3 with LoRA and gradient checkpointing, eager and compiled, same weights."""
    def build(compile_options):
        torch.manual_seed(0)
        cfg = ModelConfig(path="tiny:sd3", adapter_options=PromptLengthOptions(max_sequence_length=16),
                          lora=LoraConfig(enabled=True, rank=4, alpha=8), gradient_checkpointing=True,
                          compile_options=compile_options)
        return build_model(cfg, torch.device("cpu"))

    eager, compiled = build(CompileOptions()), build(TRACE)
    gen = torch.Generator().manual_seed(1)  # LoRA B starts at 0: give the LoRA path a part in the forward
    lora = {n: torch.randn(t.shape, generator=gen) * 0.1 for n, t in eager.named_trainable_tensors().items()}
    eager.load_named_tensors(lora)
    compiled.load_named_tensors(lora)
    return eager, compiled


def inputs(model, batch: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, *model.latent_shape(32, 32), generator=gen)
    sigma = torch.rand(batch, generator=gen)
    cond = model.encode_prompts(["a cat", "a very small dog on a table", "fog"][:1] * batch)
    return x, sigma, cond


@pytest.mark.long  # dynamo's capture of the two blocks: half a minute quiet, minutes on a loaded 2-core machine
def test_each_repeated_block_is_compiled_and_the_batch_may_change_without_a_recompile(pair):
    eager, compiled = pair
    blocks = [m for m in compiled.transformer.modules() if isinstance(m, compiled.compile_block_classes())]
    assert len(blocks) == compiled.transformer.config.num_layers >= 2
    assert all(b._compiled_call_impl is not None for b in blocks)
    assert all(b._compiled_call_impl is None for b in eager.transformer.modules())
    graphs = None
    for batch in (3, 1, 5):  # CFG doubles them: 6, 2, 10 rows
        x, sigma, cond = inputs(eager, batch, seed=batch)
        with torch.no_grad():
            want = eager.predict_velocity(x, sigma, cond, 4.5)
            got = compiled.predict_velocity(x, sigma, cond, 4.5)
        # aot_eager runs eager's kernels on the captured graph: equal up to the order of a few ops.
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        if graphs is None:
            graphs = counters["stats"]["unique_graphs"]
    assert counters["stats"]["unique_graphs"] == graphs  # batches of 1 and 5 reused the first graphs


@pytest.mark.long  # the training graphs' capture: a minute and more on a loaded 2-core machine
def test_lora_gradients_flow_through_compiled_checkpointed_blocks(pair):
    eager, compiled = pair
    x, sigma, cond = inputs(eager, 2)
    grads = []
    for model in (eager, compiled):
        model.transformer.zero_grad(set_to_none=True)
        model.predict_velocity(x, sigma, cond, 4.5).square().mean().backward()
        grads.append({n: p.grad for n, p in model.transformer.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys() and all("lora" in n for n in grads[0])
    for name, grad in grads[0].items():
        assert grads[1][name] is not None, name
        torch.testing.assert_close(grads[1][name], grad, atol=1e-5, rtol=1e-4, msg=name)
    assert any(float(g.abs().max()) > 0 for g in grads[1].values())
