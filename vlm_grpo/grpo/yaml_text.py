"""Settings YAML, read strictly: plain YAML only, duplicate keys refused, every problem one line saying where.

PyYAML's safe loader never builds Python objects, but its errors are multi-line tracebacks, it lets the last of two
equal keys win silently (a `max_steps` set twice in one file), and nested aliases of a few hundred bytes expand to
gigabytes once the settings are written back. Here a duplicate key is an error naming both lines, aliases that expand
past MAX_EXPANDED_NODES values are refused before anything is built, a tag that would build an object
(`!!python/object/...`) is refused by name, and malformed input reads `run.yaml:3:5: mapping values are not allowed
here`.
"""

from __future__ import annotations

import re
from typing import Any

import yaml


MAX_EXPANDED_NODES = 100_000  # a settings file has hundreds; nested aliases of 0.5 KB can expand to billions


class YAMLProblem(ValueError):
    """Malformed or refused YAML; the message is one line that starts with where the problem is."""


class _StrictLoader(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first_line: dict[Any, int] = {}
            for key_node, _value in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    hash(key)
                except TypeError:
                    continue  # the safe loader's own error names an unhashable key
                if key in first_line:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (first set on line {first_line[key] + 1})", key_node.start_mark)
                first_line[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


    def get_single_data(self):
        node = self.get_single_node()
        if node is None:
            return None
        size = _expanded_size(node, {})
        if size > MAX_EXPANDED_NODES:
            raise yaml.constructor.ConstructorError(
                None, None, f"the aliases expand to more than {MAX_EXPANDED_NODES:,} values (about {size:,}); "
                "settings need far fewer: write the values out", node.start_mark)
        return self.construct_document(node)


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """Values in `node` once every alias is written out (what dumping or copying it makes), counted in time
    proportional to the file: an alias is the same node object, its size is computed once."""
    key = id(node)
    if key not in sizes:
        sizes[key] = 1  # a node that holds itself counts once (the safe loader refuses to build it anyway)
        if isinstance(node, yaml.SequenceNode):
            sizes[key] = 1 + sum(_expanded_size(child, sizes) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            sizes[key] = 1 + sum(_expanded_size(k, sizes) + _expanded_size(v, sizes) for k, v in node.value)
    return sizes[key]


_TAG = re.compile(r"could not determine a constructor for the tag '(?:tag:yaml\.org,2002:)?(.*)'")


def _problem(err: yaml.YAMLError) -> str:
    text = getattr(err, "problem", None) or str(err).splitlines()[0]
    tag = _TAG.search(text)
    if tag:
        name = tag.group(1)
        shown = name if name.startswith("!") else f"!!{name}"
        return f"tag {shown!r} is not allowed: settings are plain YAML (no tags that build objects or run code)"
    context = getattr(err, "context", None)
    return f"{text} ({context})" if context else text


def load_yaml(text: str, source: str, inline: bool = False) -> Any:
    """`text` parsed; `source` names it in errors (a file path, or a setting for an inline value): a file's errors
    read `path:line:column: problem`, an inline value's `line L, column C: problem`."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        if inline:
            where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
            raise YAMLProblem(f"{text!r} is not valid YAML: {where}{_problem(err)}") from None
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise YAMLProblem(f"{where}: {_problem(err)}") from None
