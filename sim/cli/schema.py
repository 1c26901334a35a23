"""`servesim schema`: every scenario field with its type, default and meaning (sim.cli.schema_doc).

The listing is read from the pydantic models, so it is loaded when the command
runs, not when the parser is built (`servesim --help` stays quick).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict


def _schema(args: argparse.Namespace) -> int:
    from sim.cli.schema_doc import SCHEMA_VERSION, field_docs, format_schema

    docs = field_docs()
    if args.json:
        print(json.dumps({"schema_version": SCHEMA_VERSION,
                          "fields": [asdict(d) for d in docs]}, indent=2))
    else:
        print(format_schema(docs))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schema", help="every scenario field: type, default, meaning",
                       description="List every field a scenario file may set, with its "
                                   "type, its default and what it means.")
    p.add_argument("--json", action="store_true", help="print the fields as JSON")
    p.set_defaults(func=_schema)
