"""The engine's Llama model: construction, chunked-vs-full equivalence, HF parity and I/O."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

torch = pytest.importorskip("torch")

from gpu_engine.inputs import StepInputs, build_inputs  # noqa: E402
from gpu_engine.kv_cache import PagedKVCache  # noqa: E402
from gpu_engine.model import LlamaModel  # noqa: E402
from gpu_engine.weights import build_model  # noqa: E402
from sim.config.catalogue import get_model  # noqa: E402
from sim.config.hf_config import read_hf_config  # noqa: E402
from sim.config.specs import ModelSpec, RopeScaling  # noqa: E402

TINY = get_model("tiny")
# a small Llama-3.1-style spec whose positions cross every band of the frequency scaling
SCALED = dataclasses.replace(TINY, name="tiny-llama3", rope_theta=10000.0,
                             rope_scaling=RopeScaling(4.0, 1.0, 4.0, 64))
QWEN = ModelSpec("tiny-qwen2", 2, 48, 6, 2, 8, 96, 200, 1024, True, rope_theta=1e6,
                 rms_norm_eps=1e-6, qkv_bias=True)
# Qwen3: per-head q/k RMSNorm; one sliding layer with a window far shorter than the
# sequences; a top-2-of-4 mixture of experts
QWEN3 = ModelSpec("tiny-qwen3", 2, 48, 6, 2, 8, 96, 200, 1024, False, rope_theta=1e6,
                  rms_norm_eps=1e-6, qk_norm=True)
SLIDING = dataclasses.replace(QWEN3, name="tiny-qwen3-sliding", layer_types=("full", "sliding"),
                              sliding_window=8)
MOE = dataclasses.replace(QWEN3, name="tiny-qwen3-moe", num_experts=4, experts_per_token=2,
                          moe_intermediate_size=32)
NEW_FAMILIES = (QWEN3, SLIDING, MOE)
BLOCK = 4


def _all_rows(inputs: StepInputs) -> StepInputs:
    """Logits at every token, not only the emitters' last ones."""
    return dataclasses.replace(inputs, logits_indices=torch.arange(inputs.token_ids.shape[0]))


def _tables(rng: random.Random, lengths: list[int], num_blocks: int) -> list[list[int]]:
    """Non-contiguous, shuffled block ids (never the null block) for each length."""
    ids = list(range(1, num_blocks))
    rng.shuffle(ids)
    tables, taken = [], 0
    for length in lengths:
        count = -(-length // BLOCK)
        tables.append(ids[taken:taken + count])
        taken += count
    return tables


def _full_logits(model: LlamaModel, spec: ModelSpec, seqs: list[list[int]]) -> list:
    """One forward of whole sequences packed in one step; logits at every position."""
    cache = PagedKVCache.for_spec(spec, 64, BLOCK, torch.float32, "cpu")
    tables = _tables(random.Random(0), [len(s) for s in seqs], 64)
    inputs = build_inputs(seqs, [0] * len(seqs), tables, [True] * len(seqs), BLOCK, "cpu")
    with torch.inference_mode():
        logits = model(_all_rows(inputs), cache)
    return list(logits.split([len(s) for s in seqs]))


@pytest.mark.parametrize("spec", [TINY, SCALED, QWEN, *NEW_FAMILIES], ids=lambda s: s.name)
def test_build_model_materialises_every_parameter(spec) -> None:
    model = build_model(spec, "cpu", torch.float32, seed=1)
    params = list(model.parameters())
    assert sum(p.numel() for p in params) == spec.total_params
    assert all(p.device.type == "cpu" and not p.requires_grad for p in params)
    assert all(torch.isfinite(p).all() for p in params)
    assert model.rotary.inv_freq.dtype == torch.float32 and not model.training
    again = build_model(spec, "cpu", torch.float32, seed=1)
    other = build_model(spec, "cpu", torch.float32, seed=2)
    assert torch.equal(again.layers[0].self_attn.o_proj.weight,
                       model.layers[0].self_attn.o_proj.weight)
    assert not torch.equal(other.embed_tokens.weight, model.embed_tokens.weight)


def test_unsupported_specs_are_rejected() -> None:
    with pytest.raises(ValueError, match="attention='mla' .* not supported by the engine; "
                                         "allowed: gqa"):
        LlamaModel(read_hf_config("builtin:deepseek-v3").spec)
    hybrid = dataclasses.replace(TINY, layer_types=("linear", "full"), linear_state_elements=8)
    with pytest.raises(ValueError, match="linear/SSM layers is not supported"):
        LlamaModel(hybrid)
    with pytest.raises(ValueError, match="num_shared_experts=1 is not supported"):
        LlamaModel(dataclasses.replace(MOE, num_shared_experts=1))
    yarn = dataclasses.replace(TINY, rope_scaling=RopeScaling(4.0, 1.0, 4.0, 64, "yarn"))
    with pytest.raises(ValueError, match="rope_type='yarn'"):
        LlamaModel(yarn)


def test_random_init_keeps_activations_order_one() -> None:
    deep = ModelSpec("deep", 16, 128, 8, 2, 16, 256, 512, 4096, False)
    model = build_model(deep, "cpu", torch.float32, seed=3)
    logits = _full_logits(model, deep, [random.Random(3).choices(range(512), k=64)])[0]
    assert torch.isfinite(logits).all()
    assert 0.3 < logits.std().item() < 3.0


@pytest.mark.parametrize("spec", [TINY, QWEN, SLIDING, MOE], ids=lambda s: s.name)
def test_chunked_prefill_then_decode_equals_one_full_forward(spec) -> None:
    rng = random.Random(5)
    model = build_model(spec, "cpu", torch.float32, seed=5)
    seq_a = rng.choices(range(spec.vocab_size), k=45)  # prompt 37 + 8 decodes
    seq_b = rng.choices(range(spec.vocab_size), k=26)  # prompt 20 + 6 decodes
    full_a, full_b = _full_logits(model, spec, [seq_a, seq_b])

    cache = PagedKVCache.for_spec(spec, 40, BLOCK, torch.float32, "cpu")
    table_a, table_b = _tables(rng, [len(seq_a), len(seq_b)], 40)
    # (context, new) per step for each sequence; A chunks its prompt while B decodes
    steps = [((0, 16), (0, 20)), ((16, 14), (20, 1)), ((30, 7), (21, 1))]
    steps += [((37 + i, 1), (22 + i, 1)) for i in range(4)] + [((41 + i, 1), None)
                                                               for i in range(4)]
    emits_a = {(0, 16): False, (16, 14): False}
    compared = 0
    for work_a, work_b in steps:
        works = [(seq_a, table_a, work_a, full_a, emits_a.get(work_a, True))]
        if work_b is not None:
            works.append((seq_b, table_b, work_b, full_b, True))
        inputs = build_inputs([s[c:c + n] for s, _, (c, n), _, _ in works],
                              [c for _, _, (c, _), _, _ in works],
                              [t for _, t, _, _, _ in works], [e for *_, e in works],
                              BLOCK, "cpu", pad_seqs_to=len(works) + 1)
        with torch.inference_mode():
            logits = model(inputs, cache)
        expected = [full[c + n - 1] for _, _, (c, n), full, e in works if e]
        torch.testing.assert_close(logits, torch.stack(expected), rtol=1e-5, atol=1e-5)
        compared += len(expected)
    assert compared == 9 + 7  # A: its prompt's last chunk and 8 decodes; B: prompt and 6


def _hf_logits(tmp_path, spec: ModelSpec, seqs: list[list[int]]) -> list:
    transformers = pytest.importorskip("transformers")
    from gpu_engine.weights import hf_model_type

    cls = getattr(transformers, {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                                 "qwen3": "Qwen3ForCausalLM",
                                 "qwen3_moe": "Qwen3MoeForCausalLM"}[hf_model_type(spec)])
    hf = cls.from_pretrained(tmp_path, attn_implementation="eager").float().eval()
    with torch.no_grad():
        return [hf(torch.tensor([s])).logits[0] for s in seqs]


@pytest.mark.parametrize("spec", [TINY, SCALED, QWEN, *NEW_FAMILIES], ids=lambda s: s.name)
def test_logits_equal_transformers_on_the_same_weights(tmp_path, spec) -> None:
    pytest.importorskip("transformers")
    from gpu_engine.weights import save_hf, spec_from_hf_config

    model = build_model(spec, "cpu", torch.float32, seed=7)
    save_hf(model, spec, tmp_path)
    rng = random.Random(7)
    seqs = [rng.choices(range(spec.vocab_size), k=n) for n in (150, 9)]
    ours, theirs = _full_logits(model, spec, seqs), _hf_logits(tmp_path, spec, seqs)
    for mine, ref in zip(ours, theirs, strict=True):
        torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-5)
    expected = dataclasses.replace(spec, name=tmp_path.name)
    if spec in NEW_FAMILIES:  # the simulator's reader knows Qwen3, its MoE and windows
        assert read_hf_config(tmp_path).spec == expected
    else:
        assert spec_from_hf_config(tmp_path / "config.json") == expected


def test_load_hf_round_trip_single_and_sharded(tmp_path) -> None:
    pytest.importorskip("safetensors")
    from safetensors.torch import load_file, save_file

    from gpu_engine.weights import save_hf

    model = build_model(QWEN, "cpu", torch.float32, seed=11)
    save_hf(model, QWEN, tmp_path)
    seqs = [list(range(30))]
    loaded = build_model(QWEN, "cpu", torch.float32, weights_dir=tmp_path)
    torch.testing.assert_close(_full_logits(loaded, QWEN, seqs)[0],
                               _full_logits(model, QWEN, seqs)[0], rtol=0, atol=0)

    tensors = load_file(tmp_path / "model.safetensors")
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, tmp_path / file)
    index = {"weight_map": {k: file for file, keys in shards.items() for k in keys}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "model.safetensors").unlink()
    sharded = build_model(QWEN, "cpu", torch.float32, seed=99, weights_dir=tmp_path)
    for mine, ref in zip(sharded.parameters(), model.parameters(), strict=True):
        assert torch.equal(mine, ref)


def test_weight_and_config_errors_name_the_problem(tmp_path) -> None:
    pytest.importorskip("safetensors")
    from safetensors.torch import load_file, save_file

    from gpu_engine.weights import load_hf, save_hf, spec_from_hf_config

    model = build_model(TINY, "cpu", torch.float32)
    save_hf(model, TINY, tmp_path)
    wider = dataclasses.replace(TINY, intermediate_size=256)
    with pytest.raises(ValueError, match=r"mlp\.\w+_proj\.weight has shape"):
        load_hf(build_model(wider, "cpu", torch.float32), tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_proj\.weight"):
        load_hf(model, tmp_path)
    with pytest.raises(ValueError, match="no model.safetensors"):
        load_hf(model, tmp_path / "nowhere")
    with pytest.raises(ValueError, match="not found"):
        spec_from_hf_config(tmp_path / "nowhere" / "config.json")
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="rope_type='yarn'.*allowed: default, llama3"):
        spec_from_hf_config(tmp_path)


def test_sliding_window_models_take_the_torch_backend() -> None:
    """The Triton kernel has no window: such models run on the masked torch backend."""
    from gpu_engine.attention import attention_backend

    assert attention_backend("cuda", SLIDING.sliding_window) == "torch"
    assert attention_backend("cpu") == "torch"
