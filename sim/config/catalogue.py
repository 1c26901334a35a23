"""The catalogues of known models and GPUs, and custom specs from a scenario's fields.

Why a catalogue: a scenario names `llama-3-8b` or `h100-sxm` instead of typing
their shapes and datasheet numbers, and `base: NAME` plus overrides derives a
custom one. Values from YAML or the command line are coerced to each field's
type here, with a message naming the field when they cannot be.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from sim.config.hardware import HardwareSpec
from sim.config.link import Link
from sim.config.specs import ModelSpec, RopeScaling

DEFAULT_MODEL = "llama-3-8b"  # the catalogue model a command takes when none is named


def _llama3(name: str, layers: int, hidden: int, heads: int, intermediate: int,
            context: int, scaling: RopeScaling | None = None) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, 8, hidden // heads, intermediate, 128256,
                     context, False, rope_theta=500000.0, rope_scaling=scaling,
                     rms_norm_eps=1e-5)


def _qwen25(name: str, layers: int, hidden: int, heads: int, kv_heads: int,
            intermediate: int, vocab: int, tie: bool, eps: float) -> ModelSpec:
    # Instruct config.json values (what gets served); base configs advertise 131072 positions.
    return ModelSpec(name, layers, hidden, heads, kv_heads, hidden // heads, intermediate, vocab,
                     32768, tie, rope_theta=1000000.0, rms_norm_eps=eps, qkv_bias=True)


_LLAMA31_SCALING = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                               original_max_context_tokens=8192)

MODELS: Mapping[str, ModelSpec] = MappingProxyType({
    "llama-3-8b": _llama3("llama-3-8b", 32, 4096, 32, 14336, 8192),
    "llama-3-70b": _llama3("llama-3-70b", 80, 8192, 64, 28672, 8192),
    "llama-3.1-8b": _llama3("llama-3.1-8b", 32, 4096, 32, 14336, 131072, _LLAMA31_SCALING),
    "llama-3.1-70b": _llama3("llama-3.1-70b", 80, 8192, 64, 28672, 131072, _LLAMA31_SCALING),
    "llama-3.1-405b": _llama3("llama-3.1-405b", 126, 16384, 128, 53248, 131072,
                              _LLAMA31_SCALING),
    "qwen2.5-1.5b": _qwen25("qwen2.5-1.5b", 28, 1536, 12, 2, 8960, 151936, True, 1e-6),
    "qwen2.5-7b": _qwen25("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, False, 1e-6),
    "qwen2.5-72b": _qwen25("qwen2.5-72b", 80, 8192, 64, 8, 29568, 152064, False, 1e-6),
    # Mistral-7B-v0.3: v0.1's 4096-token sliding window is gone, vocab grew to 32768.
    "mistral-7b": ModelSpec("mistral-7b", 32, 4096, 32, 8, 128, 14336, 32768, 32768, False,
                            rope_theta=1000000.0),
    "mixtral-8x7b": ModelSpec("mixtral-8x7b", 32, 4096, 32, 8, 128, 14336, 32000, 32768, False,
                              num_experts=8, experts_per_token=2, rope_theta=1000000.0),
    # CodeLlama-34B (Llama-2 architecture, GQA 8): the published A100/H100 profiles' model.
    "codellama-34b": ModelSpec("codellama-34b", 48, 8192, 64, 8, 128, 22016, 32000, 16384,
                               False, rope_theta=1000000.0),
    # Real shapes are far too slow for CPU engine tests; this one runs in milliseconds.
    "tiny": ModelSpec("tiny", 2, 64, 4, 2, 16, 128, 256, 2048, False),
    # A ~100M-parameter Llama shape: big enough that CPU engine timings mean something.
    "llama-100m": ModelSpec("llama-100m", 12, 768, 12, 4, 64, 2048, 32000, 4096, True,
                            rope_theta=500000.0),
})

_GIB = 1024**3


def _read_links() -> Mapping[str, Link]:
    """The link presets of data/links.json (each figure with its source, read there)."""
    raw = json.loads((Path(__file__).parent / "data" / "links.json").read_text())["links"]
    fields = {f.name for f in dataclasses.fields(Link)}
    return MappingProxyType({name: Link(**{k: v for k, v in entry.items() if k in fields})
                             for name, entry in raw.items()})


# Named links: what a GPU names below and a scenario may name as `link` / `host_link`.
LINKS: Mapping[str, Link] = _read_links()
_L = LINKS
# A custom GPU that names no link keeps the roofline's old assumption, NVLink-connected,
# at its own stated bandwidth; its host link is PCIe Gen5's.
DEFAULT_LINK, DEFAULT_HOST_LINK = "nvlink4", "pcie5-host"

# Datasheet numbers, dense (vendors often headline 2:4 sparsity: half of those). HBM
# capacities are binary (80 GB parts expose ~80 GiB). Fields: bf16 FLOP/s, memory, HBM
# bandwidth, the GPU-to-GPU link and the host link (LINKS: measured figures, see
# data/links.json; vendors quote NVLink/PCIe both directions summed, a link holds one
# direction as achieved), then fp8, int8 and fp4 FLOP/s (0 = no such tensor cores), and
# the SM count (AMD: compute units) from the same datasheet or its architecture paper.
HARDWARE: Mapping[str, HardwareSpec] = MappingProxyType({
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5): NVLink 4 900 GB/s, PCIe Gen5 128 GB/s
    "h100-sxm": HardwareSpec("h100-sxm", 989.4e12, 80 * _GIB, 3.35e12, _L["nvlink4"],
                             _L["pcie5-host"], 1978.9e12, 1978.9e12, sm_count=132),
    # same datasheet, PCIe card, HBM2e 2.0 TB/s; in a plain server its peers are over PCIe
    # Gen5 (a bridged pair: `link: {base: nvlink4, ...}`)
    "h100-pcie": HardwareSpec("h100-pcie", 756.0e12, 80 * _GIB, 2.0e12, _L["pcie5"],
                              _L["pcie5-host"], 1513e12, 1513e12, sm_count=114),
    # NVIDIA H200 Tensor Core GPU datasheet (SXM): H100's compute, 141 GB HBM3e at 4.8 TB/s
    "h200": HardwareSpec("h200", 989.4e12, 141 * _GIB, 4.8e12, _L["nvlink4"], _L["pcie5-host"],
                         1978.9e12, 1978.9e12, sm_count=132),
    # NVIDIA A100 datasheet (SXM4 80GB): no fp8; NVLink 3 600 GB/s, PCIe Gen4 64 GB/s
    "a100-80gb": HardwareSpec("a100-80gb", 312e12, 80 * _GIB, 2.039e12, _L["nvlink3"],
                              _L["pcie4-host"], 0.0, 624e12, sm_count=108),
    # same datasheet, SXM4 40GB: HBM2 at 1.555 TB/s
    "a100-40gb": HardwareSpec("a100-40gb", 312e12, 40 * _GIB, 1.555e12, _L["nvlink3"],
                              _L["pcie4-host"], 0.0, 624e12, sm_count=108),
    # NVIDIA L40S datasheet: no NVLink, peers over PCIe Gen4 x16; GDDR6 with ECC ~48e9 B
    "l40s": HardwareSpec("l40s", 362.05e12, 48e9, 864e9, _L["pcie4"], _L["pcie4-host"],
                         733e12, 733e12, sm_count=142),
    # NVIDIA L4 datasheet: 24 GB GDDR6 at 300 GB/s, PCIe Gen4 x16, no NVLink
    "l4": HardwareSpec("l4", 121e12, 24e9, 300e9, _L["pcie4"], _L["pcie4-host"],
                       242.5e12, 242.5e12, sm_count=58),
    # AWS publishes no A10G datasheet; NVIDIA A10 datasheet (the same GA102 part):
    # 24 GB GDDR6 at 600 GB/s, PCIe Gen4, no fp8, no NVLink
    "a10g": HardwareSpec("a10g", 125e12, 24e9, 600e9, _L["pcie4"], _L["pcie4-host"],
                         0.0, 250e12, sm_count=72),
    # NVIDIA Ada Lovelace architecture whitepaper (GeForce RTX 4090): bf16 and fp8 with
    # fp32 accumulate, int8; 24 GB GDDR6X at 1008 GB/s; no NVLink, PCIe Gen4
    "rtx-4090": HardwareSpec("rtx-4090", 165.2e12, 24e9, 1008e9, _L["pcie4"], _L["pcie4-host"],
                             330.3e12, 660.6e12, sm_count=128),
    # NVIDIA HGX B200 datasheet, per GPU: 180 GB HBM3e at 8 TB/s, NVLink 5 1.8 TB/s
    "b200": HardwareSpec("b200", 2.25e15, 180 * _GIB, 8.0e12, _L["nvlink5"], _L["pcie5-host"],
                         4.5e15, 4.5e15, 9e15, sm_count=148),
    # NVIDIA GB200 NVL72 datasheet divided by its 72 GPUs: 186 GB HBM3e at 8 TB/s each,
    # NVLink 5 1.8 TB/s, NVLink-C2C to Grace 900 GB/s
    "gb200": HardwareSpec("gb200", 2.5e15, 186 * _GIB, 8.0e12, _L["nvlink5"], _L["nvlink-c2c"],
                          5e15, 5e15, 10e15, sm_count=148),
    # NVIDIA HGX B300 (Blackwell Ultra) datasheet divided by its 8 GPUs: 288 GB HBM3e at
    # 8 TB/s, NVLink 5; int8 was cut back on Blackwell Ultra and is not listed
    "b300": HardwareSpec("b300", 2.25e15, 288 * _GIB, 8.0e12, _L["nvlink5"], _L["pcie5-host"],
                         4.5e15, 0.0, 13.5e15, sm_count=160),
    # AMD Instinct MI300X data sheet: 192 GB HBM3 at 5.3 TB/s; 7 Infinity Fabric links
    # x 64 GB/s per direction (48 usable); PCIe Gen5
    "mi300x": HardwareSpec("mi300x", 1307.4e12, 192 * _GIB, 5.3e12, _L["infinity-fabric"],
                           _L["pcie5-host"], 2614.9e12, 2614.9e12, sm_count=304),
    # AMD Instinct MI325X data sheet: MI300X's compute and links, 256 GB HBM3E at 6 TB/s
    "mi325x": HardwareSpec("mi325x", 1307.4e12, 256 * _GIB, 6.0e12, _L["infinity-fabric"],
                           _L["pcie5-host"], 2614.9e12, 2614.9e12, sm_count=304),
    # AMD Instinct MI355X data sheet: 288 GB HBM3E at 8 TB/s, MXFP4/MXFP6 cores;
    # 7 Infinity Fabric links x 76.8 GB/s per direction: MI300X's measured link is taken
    # (no MI355X figure published), so its collectives are priced a little slow
    "mi355x": HardwareSpec("mi355x", 2516.6e12, 288 * _GIB, 8.0e12, _L["infinity-fabric"],
                           _L["pcie5-host"], 5033.2e12, 5033.2e12, 10066.3e12, sm_count=256),
    # NVIDIA RTX PRO 6000 Blackwell (Server and Workstation Editions, the same GB202 with
    # 188 SMs at 600 W; GTC 2025 announcement and product pages): 96 GB GDDR7 (96 GiB
    # exposed, BAR1 98304 MiB) at 1792 GB/s, PCIe Gen5 x16, no NVLink. Tensor rates from
    # the headline 4,000 AI TOPS (fp4, 2:4 sparse): dense fp4 2,000, fp8 1,000, bf16 500
    # TFLOP/s (Blackwell's 2:1 steps); int8 is not stated and is priced at bf16's
    "rtx-pro-6000": HardwareSpec("rtx-pro-6000", 500e12, 96 * _GIB, 1792e9, _L["pcie5"],
                                 _L["pcie5-host"], 1000e12, 0.0, 2000e12, sm_count=188),
    # NVIDIA H20 (Hopper for China, Nov 2023; no public NVIDIA datasheet, figures as
    # reported from it, e.g. willitrunai.com/gpus/h20-96gb): 96 GB HBM3 at 4.0 TB/s,
    # dense bf16 148, fp8 and int8 296 TFLOP/s, 78 SMs (Geekbench), NVLink 4 900 GB/s,
    # PCIe Gen5
    "h20": HardwareSpec("h20", 148e12, 96 * _GIB, 4.0e12, _L["nvlink4"], _L["pcie5-host"],
                        296e12, 296e12, sm_count=78),
    # NVIDIA L20 (Ada AD102 for China, Nov 2023; figures as reported from its spec sheet,
    # e.g. topcpu.net/en/gpu-c/a40-pcie-vs-l20): 48 GB GDDR6 at 864 GB/s, 92 SMs, PCIe
    # Gen4 x16, no NVLink; dense bf16 119.5, fp8 and int8 239 TFLOP/s (a third of L40S's)
    "l20": HardwareSpec("l20", 119.5e12, 48e9, 864e9, _L["pcie4"], _L["pcie4-host"],
                        239e12, 239e12, sm_count=92),
})


def _lookup(kind: str, catalogue: Mapping[str, Any], name: str) -> Any:
    key = str(name).strip().lower()
    if key not in catalogue:
        raise ValueError(f"unknown {kind} {name!r}; known: {', '.join(catalogue)}")
    return catalogue[key]


def get_model(name: str) -> ModelSpec:
    return _lookup("model", MODELS, name)


def get_hardware(name: str) -> HardwareSpec:
    return _lookup("hardware", HARDWARE, name)


def get_link(name: str) -> Link:
    return _lookup("link", LINKS, name)


_LINK_KINDS = {"bandwidth_bytes_per_s": "float", "latency_s": "float", "generation": "int",
               "line_rate_gbit_per_s": "float"}


def link_from_fields(value: str | Link | Mapping[str, Any]) -> Link:
    """A link: a LINKS name, a Link, or a mapping of Link fields (`base: <LINKS name>` plus
    overrides, e.g. {base: pcie5, latency_s: 2.0e-5}); a message names what is wrong."""
    if isinstance(value, Link):
        return value
    if isinstance(value, str):
        return get_link(value)
    if not isinstance(value, Mapping):
        raise ValueError(f"link must be a name ({', '.join(LINKS)}) or a mapping of Link "
                         f"fields, got {value!r}")
    fields = dict(value)
    values: dict[str, Any] = {}
    if "base" in fields:
        values = spec_fields(get_link(fields.pop("base")))
    kinds = [f.name for f in dataclasses.fields(Link)]
    for field, item in fields.items():
        if field not in kinds:
            raise ValueError(f"unknown Link field {field!r}; allowed: {', '.join(kinds)} "
                             f"(and base)")
        values[field] = None if item is None and field == "bandwidth_bytes_per_s" else \
            _coerce("Link", field, _LINK_KINDS.get(field, "str"), item)
    missing = [f.name for f in dataclasses.fields(Link)
               if f.name not in values and f.default is dataclasses.MISSING]
    if missing:
        raise ValueError(f"Link is missing field(s): {', '.join(missing)} (or give base: "
                         f"one of {', '.join(LINKS)})")
    return Link(**values)


_TRUE, _FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


def _coerce(cls_name: str, field: str, kind: str, value: Any) -> Any:
    """Turn a YAML or command-line value into the field's type, or say why not."""
    try:
        if kind == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in _TRUE or text in _FALSE:
                return text in _TRUE
        elif kind == "int":
            number = float(value) if isinstance(value, str) else value
            if not isinstance(number, bool) and float(number).is_integer():
                return int(number)
        elif kind == "float":
            if not isinstance(value, bool):
                return float(value)
        elif kind == "str":
            return str(value)
        elif kind.startswith("tuple"):
            if isinstance(value, list | tuple):
                return tuple(str(item) for item in value)
        elif kind == "Link":
            return link_from_fields(value)
        elif value is None or isinstance(value, RopeScaling):
            return value
        elif isinstance(value, Mapping):
            return RopeScaling(**value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{cls_name} field {field}={value!r}: {exc}") from None
    raise ValueError(f"{cls_name} field {field}={value!r}: expected {kind}")


def spec_fields(spec: Any) -> dict[str, Any]:
    """A spec's fields as a mapping (what *_from_fields accepts back)."""
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}


def _from_fields(cls: type, catalogue: Mapping[str, Any], fields: Mapping[str, Any]) -> Any:
    fields = dict(fields)
    kinds = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    if cls is ModelSpec and "config" in fields:
        if "base" in fields:
            raise ValueError("model: give config or base, not both")
        from sim.config.hf_config import read_hf_config  # config.json's reader, for those

        values = spec_fields(read_hf_config(fields.pop("config")).spec)
    elif "base" in fields:
        base = _lookup(cls.__name__.removesuffix("Spec").lower(), catalogue, fields.pop("base"))
        values = {name: getattr(base, name) for name in kinds}
        if fields and "name" not in fields:
            values["name"] = f"{base.name} (custom)"
    for field, value in fields.items():
        if field not in kinds:
            extra = "base, config" if cls is ModelSpec else f"base, {', '.join(_BANDWIDTHS)}"
            raise ValueError(f"unknown {cls.__name__} field {field!r}; allowed: "
                             f"{', '.join(kinds)} (and {extra})")
        values[field] = _coerce(cls.__name__, field, kinds[field], value)
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in values
               and f.default is dataclasses.MISSING]
    if missing:
        raise ValueError(f"{cls.__name__} is missing field(s): {', '.join(missing)}")
    return cls(**values)


def model_from_fields(fields: Mapping[str, Any]) -> ModelSpec:
    """A custom model: every required field, or `base: <catalogue name>` or `config:
    <config.json, its folder or builtin:NAME>` plus overrides (e.g. kv_dtype: fp8)."""
    return _from_fields(ModelSpec, MODELS, fields)


# The bandwidth fields a GPU mapping has always taken: each sets its link's bandwidth.
_BANDWIDTHS = {"interconnect_bandwidth_bytes_per_s": "link",
               "host_link_bandwidth_bytes_per_s": "host_link"}


def hardware_from_fields(fields: Mapping[str, Any]) -> HardwareSpec:
    """A custom GPU: every field, or `base: <catalogue name>` plus overrides.

    `link` / `host_link` take a LINKS name or a mapping of Link fields; without them (and
    without a base) a GPU takes DEFAULT_LINK and DEFAULT_HOST_LINK. The older
    `interconnect_bandwidth_bytes_per_s` / `host_link_bandwidth_bytes_per_s` set the
    bandwidth of those links, after `link` / `host_link`."""
    fields = dict(fields)
    bandwidths = {_BANDWIDTHS[key]: (key, fields.pop(key)) for key in list(fields)
                  if key in _BANDWIDTHS}
    if "base" not in fields:
        fields.setdefault("link", DEFAULT_LINK)
        fields.setdefault("host_link", DEFAULT_HOST_LINK)
    spec = _from_fields(HardwareSpec, HARDWARE, fields)
    links = {}
    for name, (key, value) in bandwidths.items():
        try:
            links[name] = dataclasses.replace(getattr(spec, name), bandwidth_bytes_per_s=_coerce(
                "HardwareSpec", key, "float", value))
        except ValueError as err:
            raise ValueError(f"HardwareSpec field {key}={value!r}: {err}") from None
    return dataclasses.replace(spec, **links) if links else spec
