"""The tiny-model cache under concurrent use: processes that ask for the same model at once all
get a complete folder (one builds, the others wait and load its result), also when they are
ranks of a torch.distributed group (where transformers writes weights on rank 0 only)."""
import multiprocessing as mp
import os


def build_and_load(cache: str, rank: int, world: int, rendezvous: str, queue) -> None:
    os.environ["OMNI_RL_CACHE"] = cache
    try:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
        from transformers import AutoModelForCausalLM

        from omni_rl.models.loading import resolve_model_path

        # Ranks 1 and 2 race for the build; rank 0 comes after them (so a rank other than 0 builds).
        if rank != 0:
            path = resolve_model_path("tiny:qwen3")
            AutoModelForCausalLM.from_pretrained(path)
        dist.barrier()
        if rank == 0:
            path = resolve_model_path("tiny:qwen3")
            AutoModelForCausalLM.from_pretrained(path)
        queue.put(("ok", path))
        dist.destroy_process_group()
    except Exception as err:  # reported to the test, which fails with it
        queue.put(("error", f"{type(err).__name__}: {err}"))


def test_concurrent_builds_all_load(tmp_path):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    args = (str(tmp_path / "cache"), 3, str(tmp_path / "rendezvous"))
    procs = [ctx.Process(target=build_and_load, args=(args[0], rank, *args[1:], queue)) for rank in range(3)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert all(kind == "ok" for kind, _ in results), results
    assert len({path for _, path in results}) == 1
    leftovers = [f.name for f in (tmp_path / "cache" / "tiny").iterdir() if f.is_dir() and f.name.startswith(".")]
    assert leftovers == []  # no staging folders left behind


def test_a_changed_builder_module_gets_a_folder_of_its_own(tmp_path, monkeypatch):
    """The cache folder's name carries a digest of the builder module's source, so a tiny model
    built by an older version of its builder is not reused."""
    import importlib.util
    import sys

    from omni_rl.models.loading import builder_digest, resolve_model_path
    from omni_rl.models.registry import TINY_MODELS

    def load(source: str):
        file = tmp_path / "some_builder.py"
        file.write_text(source)
        spec = importlib.util.spec_from_file_location("some_builder", file)
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, "some_builder", module)
        spec.loader.exec_module(module)
        return module.build

    first = builder_digest(load("def build(folder):\n    pass\n"))
    assert first == builder_digest(load("def build(folder):\n    pass\n"))
    assert first != builder_digest(load("def build(folder):\n    return None\n"))

    monkeypatch.setenv("OMNI_RL_CACHE", str(tmp_path / "cache"))
    path = resolve_model_path("tiny:qwen3")
    assert str(path).endswith(builder_digest(TINY_MODELS.get("qwen3")))
