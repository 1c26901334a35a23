"""A user's YAML in, plain data or one ScenarioError out: reading files safely, and
pydantic's error reports turned into lines a user can act on.

Everything a person types reaches the schema through here, so a mistake of
any shape (a file that is not YAML, a document nested 3,000 levels deep, a
5,000-digit number, an alias that expands a billion times) is one message
naming the input and the field, never a traceback from a parser.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

# A scenario nests a handful of levels (workload.prompt_tokens.values); 32 is far
# beyond any real file and far below the depth where a parser or repr() recurses out.
MAX_DEPTH = 32
# Values read, counting a YAML alias each time it is used: enough for inline
# empirical length lists, and a stop for alias bombs that expand exponentially.
MAX_VALUES = 1_000_000
# No field needs more than 64 bits; larger ints only make numpy and str() fail later.
MAX_INT = 2**63 - 1


class ScenarioError(Exception):
    """A user mistake in a scenario: printed as is, never as a traceback."""


def parse_yaml(text: str, source: str, check: bool = True) -> Any:
    """`text` as plain data; every way it can fail is one ScenarioError naming `source`.

    `check` False leaves `check_plain` to the caller, who knows the field's path.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ScenarioError(f"{source}: not valid YAML: {_yaml_problem(err)}") from None
    except RecursionError:
        raise ScenarioError(f"{source}: nested too deeply to read (a scenario nests a few "
                            f"levels, at most {MAX_DEPTH})") from None
    except ValueError as err:  # a 5,000-digit integer, a timestamp such as 2024-13-45
        raise ScenarioError(f"{source}: not valid YAML: {_value_problem(err)}") from None
    if check:
        check_plain(data, source)
    return data


def read_yaml(path: Path, kind: str) -> Any:
    """A YAML file's data; a missing or unreadable file is a ScenarioError."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ScenarioError(f"{path}: no such {kind} file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ScenarioError(f"{path}: cannot read: {getattr(err, 'strerror', None) or err}"
                            ) from None
    return parse_yaml(text, str(path))


def check_plain(data: Any, source: str) -> None:
    """Refuse data too deep, too large or self-referencing to validate and report safely.

    Walks iteratively (no recursion to run out of) and names the first offending field.
    """
    stack: list[tuple[Any, tuple[str, ...], frozenset[int]]] = [(data, (), frozenset())]
    seen = 0
    while stack:
        node, path, ancestors = stack.pop()
        seen += 1
        where = ".".join(path) or "(top level)"
        if seen > MAX_VALUES:
            raise ScenarioError(f"{source}: more than {MAX_VALUES:,} values (counting each use "
                                "of a YAML alias); a scenario is far smaller")
        if isinstance(node, bool) or not isinstance(node, int | dict | list | set):
            continue
        if isinstance(node, int):
            if abs(node) > MAX_INT:
                digits = len(str(node)) if node.bit_length() < 14000 else "thousands of"
                raise ScenarioError(f"{source}: {where}: an integer of {digits} digits is out "
                                    "of range (no field takes more than 2**63 - 1)")
            continue
        if len(path) >= MAX_DEPTH:
            raise ScenarioError(f"{source}: {where}: nested more than {MAX_DEPTH} levels deep "
                                "(a scenario nests a few)")
        if id(node) in ancestors:
            raise ScenarioError(f"{source}: {where}: contains itself (a YAML alias loop)")
        inner = ancestors | {id(node)}
        if isinstance(node, dict):  # keys are values too: a huge int key breaks str() later
            stack.extend((key, (*path, "(key)"), inner) for key in node if isinstance(key, int))
            items: Any = [(_key_text(key), value) for key, value in node.items()]
        else:
            items = enumerate(node)
        stack.extend((value, (*path, str(key)), inner) for key, value in items)


def _key_text(key: Any) -> str:
    """A mapping key as a path part; an int too large to print is checked, not printed."""
    return "(key)" if isinstance(key, int) and abs(key) > MAX_INT else str(key)


def _value_problem(err: ValueError) -> str:
    text = str(err)
    if "integer string conversion" in text:
        return "an integer has more than 4300 digits"
    return text.splitlines()[0] if text else type(err).__name__


def _yaml_problem(err: yaml.YAMLError) -> str:
    """PyYAML's multi-line report squeezed to 'what, at line L, column C'."""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    mark = getattr(err, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{where}"


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
    if show_value and repr(value) not in message:
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
