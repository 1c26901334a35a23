"""Pydantic's validation report rewritten as one line per problem, in the user's own terms.

A user wants the YAML path they typed (`workload.arrivals.rate`), what is
wrong and the allowed values; pydantic reports union member names, URLs and
prefixes. This is that translation, kept apart from the schema it describes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ValidationError

from sim.config.checks import allows_bool


def format_errors(err: ValidationError, source: str, root: type[BaseModel]) -> str:
    """One line per problem: field path, what is wrong, the value given.

    Pydantic's raw report names union members in locations, adds URLs and
    prefixes; a user wants the YAML path they typed and the allowed values.
    `root` is the model validated (its fields name the top level).
    """
    problems: dict[str, tuple[list[str], str]] = {}  # path -> messages, value shown
    for problem in err.errors(include_url=False):
        path, message, shown = _describe(problem, root)
        messages, _ = problems.setdefault(path, ([], shown))
        if message not in messages:
            messages.append(message)
    lines = [f"{path}: {_join(messages)}{shown}" for path, (messages, shown) in problems.items()]
    if len(lines) == 1:
        return f"{source}: {lines[0]}"
    return "\n".join([f"{source}: {len(lines)} problems", *(f"  {line}" for line in lines)])


def boolean_for_number(data: Any, root: type[BaseModel]) -> str | None:
    """The path of the first true/false given where the schema takes no boolean, or None.

    Pydantic reads true as 1 for an int field (`--set scheduler.max_num_seqs=true` became
    1 seat); YAML's booleans are never numbers here. Walks the raw data beside the
    schema (every model a discriminated union allows), iteratively.
    """
    stack: list[tuple[Any, tuple[str, ...], list[type[BaseModel]]]] = [(data, (), [root])]
    while stack:
        node, path, models = stack.pop()
        items: Any = node.items() if isinstance(node, Mapping) else (
            enumerate(node) if isinstance(node, list) else ())
        for key, value in items:
            if isinstance(key, int):  # a list's item: same models
                stack.append((value, (*path, str(key)), models))
                continue
            owners = [m for m in models if key in m.model_fields]
            if not owners:
                continue
            kinds = [m.model_fields[key].annotation for m in owners]
            if isinstance(value, bool) and not any(allows_bool(k) for k in kinds):
                return ".".join((*path, str(key)))
            inner = list(dict.fromkeys(sub for k in kinds for sub in models_in(k)))
            if inner and isinstance(value, Mapping | list):
                stack.append((value, (*path, str(key)), inner))
    return None


def _describe(problem: Mapping[str, Any], root: type[BaseModel]) -> tuple[str, str, str]:
    """(field path, message, ' (got VALUE)' or '') for one pydantic error."""
    kind, loc, value = problem["type"], tuple(problem["loc"]), problem.get("input")
    parts, models = _clean_loc(loc, root)
    message = _NOISE.sub("", problem["msg"])
    lead = _FIELD_LEAD.match(message) if not parts else None
    if lead:  # a cross-section check names the field it is about: report it there
        parts, message = lead["path"].split("."), lead["rest"]
    show_value = kind not in ("missing", "extra_forbidden")
    if kind == "extra_forbidden":
        _, owners = _clean_loc(loc[:-1], root)
        allowed = list(dict.fromkeys(name for m in owners for name in m.model_fields))
        message = "unknown key" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        key = str(problem.get("ctx", {}).get("discriminator", "")).strip("'")
        tags = [t for m in models for t in _literal_values(m, key)]
        parts.append(key)
        if kind == "union_tag_invalid":
            value = problem["ctx"]["tag"]
            message = f"unknown value {value!r}"
        else:
            message, show_value = "missing", False
        message += f"; allowed: {', '.join(tags)}" if tags else ""
    elif isinstance(value, Mapping) and kind.endswith("_error"):
        show_value = False  # a section-level check: its message names the values
    shown = ""
    if show_value and (message.startswith("Input should") or repr(value) not in message):
        text = repr(value)
        shown = f" (got {text if len(text) <= 60 else text[:57] + '...'})"
    return ".".join(parts) or "(top level)", message, shown


_NOISE = re.compile(r"^(Value error|Assertion failed), | or (instance of \w+|object to extract "
                    r"fields from)")


_FIELD_LEAD = re.compile(r"^(?P<path>[a-z_]+(?:\.[a-z_]+)+): (?P<rest>.*)$", re.DOTALL)


def _join(messages: list[str]) -> str:
    """'should be a valid string' + 'should be a valid dictionary' -> one 'or' sentence."""
    lead = "Input should be "
    if len(messages) > 1 and all(m.startswith(lead) for m in messages):
        return lead + " or ".join(m.removeprefix(lead) for m in messages)
    return "; ".join(messages)


def _clean_loc(loc: tuple[Any, ...], root: type[BaseModel]
               ) -> tuple[list[str], list[type[BaseModel]]]:
    """The user's field path for a pydantic location, and the model(s) it ends in.

    Walks the schema so union member names ('poisson', 'str', 'function-after[...]')
    are dropped while real keys, even unknown ones, are kept.
    """
    models: list[type[BaseModel]] = [root]
    parts: list[str] = []
    for part in loc:
        if isinstance(part, int):
            parts.append(str(part))
            continue
        owners = [m for m in models if part in m.model_fields]
        if owners:
            parts.append(part)
            models = list(dict.fromkeys(
                sub for m in owners for sub in models_in(m.model_fields[part].annotation)))
        elif any(part in _literal_values(m) for m in models):
            models = [m for m in models if part in _literal_values(m)]
        elif not models and _is_union_tag(part):
            continue
        else:
            parts.append(part)
            models = []
    return parts, models


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models a field can hold, through Optional, unions and Annotated."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in models_in(arg)]


def _literal_values(model: type[BaseModel], key: str | None = None) -> list[str]:
    """Values of single-choice Literal fields: the tags of a discriminated union."""
    values = []
    for name, field in model.model_fields.items():
        if (key is None or name == key) and get_origin(field.annotation) is Literal:
            values.extend(str(v) for v in get_args(field.annotation))
    return values


def _is_union_tag(part: Any) -> bool:
    """Member names pydantic gives plain-type unions, e.g. 'str', 'dict[str,any]'."""
    return isinstance(part, str) and (
        "[" in part or part in ("str", "int", "float", "bool", "none", "list", "dict"))
