"""A user's YAML in, plain data or one ScenarioError out: reading files safely.

Everything a person types reaches the schema through here, so a mistake of
any shape (a file that is not YAML, a document nested 3,000 levels deep, a
5,000-digit number, an alias that expands a billion times) is one message
naming the input and the field, never a traceback from a parser.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import yaml

# A scenario nests a handful of levels (workload.prompt_tokens.values); 32 is far
# beyond any real file and far below the depth where a parser or repr() recurses out.
MAX_DEPTH = 32
# Values read, counting a YAML alias each time it is used: enough for inline
# empirical length lists, and a stop for alias bombs that expand exponentially.
MAX_VALUES = 1_000_000
# No field needs more than 64 bits; larger ints only make numpy and str() fail later.
MAX_INT = 2**63 - 1
# A scenario or compare spec is a few kilobytes (inline empirical lengths a few hundred);
# a larger input is a wrong path (`servesim run /dev/zero`, a trace given as the scenario).
MAX_FILE_BYTES = 16 * 2**20


class ScenarioError(Exception):
    """A user mistake in a scenario: printed as is, never as a traceback."""


def parse_yaml(text: str, source: str, check: bool = True) -> Any:
    """`text` as plain data; every way it can fail is one ScenarioError naming `source`.

    `check` False leaves `check_plain` to the caller, who knows the field's path.
    PyYAML is imported here, not at the top: a run of the built-in default scenario
    parses no YAML and should not pay the parser's import (~15 ms).
    """
    import yaml

    try:
        data = yaml.load(text, Loader=_loader_class())  # noqa: S506 - a SafeLoader subclass
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
    """A YAML file's data; a missing, unreadable, special or oversized file is a ScenarioError."""
    return parse_yaml(read_text_bounded(path, kind, MAX_FILE_BYTES, ScenarioError), str(path))


def read_text_bounded(path: Path, kind: str, max_bytes: int,
                      error: type[Exception] = ValueError) -> str:
    """A regular file's UTF-8 text, refused (as `error`, naming the file) before it is read
    when it is not a regular file (a directory, /dev/zero, a pipe) or holds more than
    `max_bytes`: so no input can make servesim read without end."""
    try:
        if not path.exists():
            raise error(f"{path}: no such {kind} file")
        if path.is_dir():
            raise error(f"{path}: cannot read: is a directory, not a {kind} file")
        if not path.is_file():
            raise error(f"{path}: cannot read: not a regular file (a device or pipe); give a "
                        f"{kind} file")
        size = path.stat().st_size
        if size > max_bytes:
            raise error(f"{path}: {size:,} bytes is more than a {kind} file may hold "
                        f"(at most {max_bytes:,})")
        with path.open("rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError as err:
        raise error(f"{path}: cannot read: {err.strerror or err}") from None
    if len(data) > max_bytes:  # grew while read
        raise error(f"{path}: more than a {kind} file may hold (at most {max_bytes:,} bytes)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise error(f"{path}: not a text file (byte {data[err.start]:#04x} at offset "
                    f"{err.start} is not UTF-8); give a {kind} file") from None


def _loader_class() -> type:
    """PyYAML's SafeLoader, but a key given twice in one mapping is an error, not the last
    one silently winning (`<<` merge keys may still be overridden, as YAML intends)."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Any:
            first_line: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    if key not in first_line:
                        first_line[key] = line
                        continue
                except TypeError:  # an unhashable key: SafeLoader reports it below
                    continue
                shown = repr(key) if len(repr(key)) <= 60 else repr(key)[:57] + "..."
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {shown} given twice (give each key once): first at line "
                    f"{first_line[key]}, again", key_node.start_mark)
            return super().construct_mapping(node, deep=deep)

    return StrictLoader


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
