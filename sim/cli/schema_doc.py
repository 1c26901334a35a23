"""The text of `servesim schema`: every scenario field with its type, default and meaning.

Read from the pydantic models themselves (their annotations, defaults and
Field descriptions), so the listing cannot drift from what the loader
accepts. A field that only exists in one member of a choice, such as the
`burstiness` of gamma arrivals, is listed as `workload.arrivals[process=gamma].burstiness`:
set it as `workload.arrivals.burstiness` next to `process: gamma`.
"""

from __future__ import annotations

import json
import textwrap
import types
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from sim.config.error_text import models_in
from sim.config.scenario import SCHEMA_VERSION, Scenario


@dataclass(frozen=True, slots=True)
class FieldDoc:
    """One field: where it sits, what it takes, what it is when omitted, what it means."""

    path: str
    type: str
    default: Any  # JSON-able; None with required=True means there is no default
    required: bool
    description: str


def field_docs(model: type[BaseModel] = Scenario, prefix: str = "") -> list[FieldDoc]:
    """Every field of `model` and of the sections inside it, depth first, in file order."""
    docs = []
    for name, field in model.model_fields.items():
        path = prefix + name
        members = models_in(field.annotation)
        docs.append(FieldDoc(path, _field_type(field), _default(field), field.is_required(),
                             _description(field, members)))
        for member in members:
            tag = _tag(member) if len(members) > 1 else ""
            docs.extend(field_docs(member, f"{path}[{tag}]." if tag else f"{path}."))
    return docs


def _field_type(field: FieldInfo) -> str:
    text = _type_text(field.annotation)
    limits = _limits(field.metadata)
    return f"{text} {limits}" if limits else text


def _type_text(annotation: Any) -> str:
    """A short human type: 'int >= 1 | null', 'paged | contiguous', 'list of int'."""
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is Annotated:
        limits = _limits([m for meta in args[1:] for m in _constraints(meta)])
        base = _type_text(args[0])
        return f"{base} {limits}" if limits else base
    if origin in (Union, types.UnionType):
        members = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        tags = [_tag(m).partition("=") for m in members]
        if len(members) > 1 and all(t[1] for t in tags):  # a choice of sections by a key
            choice = f"section by {tags[0][0]} ({' | '.join(t[2] for t in tags)})"
            others = [_type_text(a) for a in args if a not in members]
            nulls = ["null"] if "null" in others else []
            return " | ".join([*(o for o in others if o != "null"), choice, *nulls])
        return " | ".join(dict.fromkeys(_type_text(a) for a in args))
    if origin is Literal:
        return " | ".join(str(a) for a in args)
    if origin is list:
        return f"list of {_type_text(args[0])}" if args else "list"
    if origin is dict or annotation is dict:
        return "mapping"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        tag = _tag(annotation)
        return f"section ({tag})" if tag and annotation is not Scenario else "section"
    if annotation is Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


def _constraints(meta: Any) -> list[Any]:
    return list(meta.metadata) if isinstance(meta, FieldInfo) else [meta]


_SIGNS = ((annotated_types.Ge, "ge", ">="), (annotated_types.Gt, "gt", ">"),
          (annotated_types.Le, "le", "<="), (annotated_types.Lt, "lt", "<"),
          (annotated_types.MinLen, "min_length", "length >="))


def _limits(metadata: list[Any]) -> str:
    parts = [f"{sign} {getattr(m, attr)}" for m in metadata for kind, attr, sign in _SIGNS
             if isinstance(m, kind)]
    return ", ".join(parts)


def _tag(model: type[BaseModel]) -> str:
    """'dist=fixed' for a member of a discriminated union (its one-value Literal field)."""
    for name, field in model.model_fields.items():
        values = get_args(field.annotation) if get_origin(field.annotation) is Literal else ()
        if len(values) == 1:
            return f"{name}={values[0]}"
    return ""


def _default(field: FieldInfo) -> Any:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return None
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return value


def _description(field: FieldInfo, members: list[type[BaseModel]]) -> str:
    """The field's description, else one on its annotated type, else its section's doc."""
    if field.description:
        return field.description
    found = _annotated_description(field.annotation)
    if found:
        return found
    if len(members) == 1 and members[0].__doc__:
        return " ".join(members[0].__doc__.split("\n\n")[0].split())
    return ""


def _annotated_description(annotation: Any) -> str:
    for arg in get_args(annotation):
        if isinstance(arg, FieldInfo) and arg.description:
            return arg.description
        found = _annotated_description(arg)
        if found:
            return found
    return ""


def _shown(doc: FieldDoc) -> str:
    if doc.required:
        return " (required)"
    if isinstance(doc.default, dict):
        return ""  # a section: its fields follow with their own defaults
    return f" = {json.dumps(doc.default)}"


def format_schema(docs: list[FieldDoc]) -> str:
    lines = [f"servesim scenario schema, version {SCHEMA_VERSION}. Unknown keys are errors; "
             "`--set PATH=VALUE` sets any field.", ""]
    for doc in docs:
        lines.append(f"{doc.path}: {doc.type}{_shown(doc)}")
        if doc.description:
            lines += textwrap.wrap(doc.description, 96, initial_indent="    ",
                                   subsequent_indent="    ")
    return "\n".join(lines)
