"""`servesim capacity`'s input: the model (catalogue, fields, a config.json), its dtypes
(and the deprecated --dtype-bytes), and the numbers, each refused with the flag it came
from (exit 2 in sim.cli.capacity)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sim.config.catalogue import DEFAULT_MODEL, get_model, model_from_fields, spec_fields
from sim.config.dtypes import get_dtype
from sim.config.hf_config import read_hf_config
from sim.config.specs import ModelSpec


def number(kind: Callable[[str], float], flag: str, text: str, allowed: str,
            ok: Callable[[float], bool]) -> Any:
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise ValueError(f"{flag} {text!r}: must be {allowed}")
    return value


def positive_int(flag: str, text: str) -> int:
    return number(int, flag, text, "a positive integer", lambda v: v > 0)


def context_tokens(text: str) -> int:
    """A token count, or NNk for NN x 1024 (model cards' 128k is 131,072 tokens)."""
    if text.strip().lower().endswith("k"):
        try:
            value = int(text.strip()[:-1]) * 1024
        except ValueError:
            value = 0
        if value > 0:
            return value
    return number(int, "--context", text, "a positive integer, or NNk for NN x 1024 "
                   "(128k = 131,072)", lambda v: v > 0)


def _parse_field(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--model-field {text!r}: must be KEY=VALUE, e.g. num_layers=40")
    return key.strip(), value.strip()


_DEPRECATED_DTYPE_BYTES = {2.0: "bf16", 1.0: "fp8", 4.0: "fp32"}


def _dtype_overrides(args: argparse.Namespace) -> dict[str, str]:
    """--weight-dtype/--expert-dtype/--kv-dtype, and the deprecated --dtype-bytes (both)."""
    fields = {}
    if args.dtype_bytes is not None:
        value = number(float, "--dtype-bytes", args.dtype_bytes, "2, 1 or 4 (deprecated: "
                        "use --weight-dtype and --kv-dtype, e.g. bf16, fp8, int4, mxfp4)",
                        lambda v: v in _DEPRECATED_DTYPE_BYTES)
        name = _DEPRECATED_DTYPE_BYTES[value]
        print(f"servesim capacity: --dtype-bytes is deprecated and will be removed; use "
              f"--weight-dtype {name} --kv-dtype {name}", file=sys.stderr)
        fields = {"weight_dtype": name, "kv_dtype": name}
    for flag, field in (("weight_dtype", "weight_dtype"), ("expert_dtype", "expert_dtype"),
                        ("kv_dtype", "kv_dtype")):
        value = getattr(args, flag)
        if value is not None:
            try:
                get_dtype(value)
            except ValueError as err:
                raise ValueError(f"--{flag.replace('_', '-')}: {err}") from None
            fields[field] = value
    return fields


def load_model(args: argparse.Namespace) -> ModelSpec:
    fields: dict[str, Any] = {}
    if args.config:
        if args.model or args.model_file:
            raise ValueError("--config: give one of --config, --model and --model-file")
        loaded = read_hf_config(args.config)
        for line in loaded.notes:
            print(f"servesim capacity: note: {line}", file=sys.stderr)
        fields = spec_fields(loaded.spec)
    elif args.model_file:
        from sim.config.yaml_input import ScenarioError, read_yaml

        path = Path(args.model_file)
        try:  # bounded, regular files only, duplicate keys refused (sim.config.yaml_input)
            loaded_fields = read_yaml(path, "model")
        except ScenarioError as err:
            lead = "" if "cannot read" in str(err) else "cannot read: "
            raise ValueError(f"--model-file: {lead}{err}") from None
        if not isinstance(loaded_fields, dict):
            raise ValueError(f"--model-file {str(path)!r}: must hold a mapping of model fields")
        fields.update(loaded_fields)
    fields.update(_parse_field(text) for text in args.model_fields)
    fields.update(_dtype_overrides(args))
    if not fields:
        return get_model(args.model or DEFAULT_MODEL)
    if not args.config:
        fields.setdefault("base", args.model or DEFAULT_MODEL)  # what --help promises
    return model_from_fields(fields)
