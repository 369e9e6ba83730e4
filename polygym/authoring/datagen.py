"""The shared command line of dataset generation scripts (each environment's ``data/generate.py``).

An environment's generator owns its task: how rows are built, from which seed. What every generator
shares lives here, so that all of them take the same flags and write files the same way:

- ``python data/generate.py`` writes every split next to the script (``<split>.jsonl``);
- ``--split NAME`` writes only that split;
- ``--output PATH`` writes one split (``--split``'s, else the first one, ``example``) to PATH;
- ``--output-dir DIR`` writes the splits into DIR instead of next to the script.

Files are written the way the shipped ones were, so a seeded generator reproduces them byte for
byte (environment tests check that): ``json.dumps`` with its default separators and non-ASCII
characters kept as they are, one row a line, UTF-8. A generator with options of its own builds the
parser with ``generator_parser``, adds them, and hands the parsed arguments to ``write_splits``;
one without calls ``generator_main``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from polygym.jsonl import write_jsonl

Rows = list[dict[str, Any]]
BuildSplits = Callable[[list[str]], Mapping[str, Rows]]
"""Called once with the names of the splits to write; returns at least those (it may return all)."""


def per_split(build: Callable[[str], Rows]) -> BuildSplits:
    """A ``BuildSplits`` for generators that build each split on its own (only the wanted ones run)."""
    return lambda wanted: {split: build(split) for split in wanted}


def generator_parser(doc: str, splits: Iterable[str], data_dir: Path) -> argparse.ArgumentParser:
    """The flags every generator takes; ``--split`` only when there is more than one split."""
    names = list(splits)
    parser = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    one = f"--split's, default {names[0]}" if len(names) > 1 else names[0]
    parser.add_argument("--output", type=Path, help=f"write one split ({one}) to this JSONL file")
    if len(names) > 1:
        parser.add_argument("--split", choices=names, help="write only this split (default: all)")
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=data_dir,
        help="where to write the splits (default: next to the script)",
    )
    return parser


def write_splits(args: argparse.Namespace, splits: Iterable[str], build_splits: BuildSplits) -> None:
    """Build the splits the parsed ``args`` ask for and write each one where they say."""
    names = list(splits)
    chosen = getattr(args, "split", None)
    wanted = [chosen] if chosen else names[:1] if args.output is not None else names
    built = build_splits(wanted)
    for split in wanted:
        path = args.output or args.output_dir / f"{split}.jsonl"
        print(f"wrote {write_jsonl(built[split], path, readable=True)} rows to {path}")


def generator_main(
    build_splits: BuildSplits,
    splits: Iterable[str],
    data_dir: Path,
    doc: str,
    argv: Sequence[str] | None = None,
) -> None:
    """The whole command line of a generator with no options of its own."""
    names = list(splits)
    write_splits(generator_parser(doc, names, data_dir).parse_args(argv), names, build_splits)
