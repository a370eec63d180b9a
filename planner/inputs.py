"""Reading input files, whoever wrote them: every reader of the planner goes through here.

- Only regular files, and at most :data:`~planner.limits.MAX_INPUT_BYTES` of them: a FIFO,
  ``/dev/zero`` or a directory is refused before anything is read.
- YAML: the safe subset only (object tags are refused, never executed), within a budget
  of nodes counted with every alias expanded, a few alias uses and a nesting depth, and
  with no key given twice in one mapping (YAML would silently keep the last).
- JSON: integers past Python's digit limit and nesting past the recursion limit are
  errors of the file, not crashes.

Every problem is a :class:`~planner.errors.CaseError` naming the file.
"""

from __future__ import annotations

import json
import math
import os
import stat
from typing import Any, Callable, Optional, Union

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, ScalarNode, SequenceNode
from yaml.resolver import Resolver

from .errors import CaseError, one_line
from .limits import MAX_INPUT_BYTES, MAX_NESTING, MAX_YAML_ALIASES, MAX_YAML_NODES

PathLike = Union[str, os.PathLike]

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def check_each_file_once(paths, what: str) -> None:
    """Refuse a file given twice (by any spelling of its path): its ``what`` would count twice (a runs
    file given twice doubled every score and band count of validate-published)."""
    seen: dict[str, str] = {}
    for path in paths:
        try:
            key = os.path.realpath(path)
        except (OSError, ValueError):
            continue  # its reading says what is wrong with it
        if key in seen:
            raise CaseError(os.fsdecode(path), "", f"given twice (as {seen[key]} too): give each file once, "
                                                   f"or its {what} count twice")
        seen[key] = os.fsdecode(path)


def read_bytes(path: PathLike, limit: int = MAX_INPUT_BYTES, expected: str = "an input file") -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes, or a CaseError naming it."""
    source = os.fsdecode(path)
    try:
        # O_NONBLOCK: opening a FIFO with no writer would otherwise wait for ever.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise CaseError(source, "", "file not found") from None
    except (OSError, ValueError) as error:  # permissions, a NUL byte in the name, ...
        raise CaseError(source, "", f"cannot be read ({getattr(error, 'strerror', None) or error})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise CaseError(source, "", f"expected a regular file, got {kind}")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        data = b"".join(chunks)
    except OSError as error:
        raise CaseError(source, "", f"cannot be read ({error.strerror or error})") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise CaseError(source, "", f"larger than {limit // 2**20} MiB; expected {expected} no larger than that")
    return data


def read_text(path: PathLike, expected: str = "UTF-8 text") -> str:
    """The UTF-8 text of an input file (a byte-order mark dropped), or a CaseError naming it."""
    try:
        return read_bytes(path).decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise CaseError(os.fsdecode(path), "", f"expected {expected}: the file is not UTF-8 text (byte "
                                               f"0x{error.object[error.start]:02x} at offset {error.start})") from None


# --- YAML -------------------------------------------------------------------------------

class _Refused(Exception):
    """Raised inside the loader; read_yaml turns it into a CaseError for the file."""

    def __init__(self, key: str, expected: str):
        super().__init__(expected)
        self.key = key
        self.expected = expected


def _line(mark) -> str:
    return f" at line {mark.line + 1}" if mark is not None else ""


class _BudgetComposer(Composer):
    """PyYAML's composer, counting every node it builds, aliases expanded.

    An alias costs the size of the node it repeats, so a document that would expand
    past MAX_YAML_NODES is refused after at most that much work, however deep its
    aliases nest.
    """

    def __init__(self, max_nodes: int = MAX_YAML_NODES) -> None:
        super().__init__()
        self.max_nodes = max_nodes
        self.nodes = 0
        self.aliases = 0
        self.depth = 0
        self.sizes: dict[str, int] = {}

    def _spend(self, count: int, mark) -> None:
        self.nodes += count
        if self.nodes > self.max_nodes:
            raise _Refused("", f"holds more than {self.max_nodes:,} YAML nodes (aliases expanded){_line(mark)}; "
                               "expected a smaller document")

    def compose_node(self, parent, index):
        event = self.peek_event()
        if self.check_event(AliasEvent):
            if event.anchor in self.anchors:
                self.aliases += 1
                if self.aliases > MAX_YAML_ALIASES:
                    raise _Refused("", f"uses more than {MAX_YAML_ALIASES} YAML aliases{_line(event.start_mark)}")
                self._spend(self.sizes.get(event.anchor, 1), event.start_mark)
            return super().compose_node(parent, index)
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise _Refused("", f"nested more than {MAX_NESTING} levels deep{_line(event.start_mark)}")
        before = self.nodes
        self._spend(1, event.start_mark)
        node = super().compose_node(parent, index)
        self.depth -= 1
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self.sizes[anchor] = self.nodes - before
        return node


def _path_to(root, target, path: str = "", seen: Optional[set] = None) -> Optional[str]:
    """The dotted key (``cluster.options[1].memory``) of ``target`` under ``root``, a node tree."""
    seen = set() if seen is None else seen
    if root is target:
        return path
    if id(root) in seen:
        return None
    seen.add(id(root))
    if isinstance(root, MappingNode):
        for key, value in root.value:
            name = key.value if isinstance(key, ScalarNode) else "?"
            here = f"{path}.{name}" if path else str(name)
            found = here if key is target else _path_to(value, target, here, seen)
            if found is not None:
                return found
    elif isinstance(root, SequenceNode):
        for i, item in enumerate(root.value):
            found = _path_to(item, target, f"{path}[{i}]", seen)
            if found is not None:
                return found
    return None


class _CheckedConstructor(SafeConstructor):
    """Numbers past Python's digit limit, or past the float range without saying .inf, are the
    file's error naming their key, not a crash nor an infinity."""

    root = None  # the document's node tree, set before it is constructed: the refusal's key

    def _sized(self, construct, node):
        try:
            value = construct(self, node)
        except ValueError:
            value = None
        if value is None or (isinstance(value, float) and math.isinf(value) and "inf" not in node.value.lower()):
            raise _Refused(_path_to(self.root, node) or "", f"expected a number of sensible size (a finite "
                                                             f"float), got a number of {len(node.value):,} "
                                                             f"characters{_line(node.start_mark)}") from None
        return value

    def _not_base_60(self, node) -> None:
        """YAML 1.1 reads digits joined by colons in base 60 (``seq_len: 1:08:16`` is 4096, ``1:30`` is 90):
        a time or a ratio a user typed, never the number they meant. Refused naming its key."""
        if ":" in node.value:
            raise _Refused(_path_to(self.root, node) or "",
                           f"expected a number, got {one_line(node.value, 40)}, which YAML 1.1 reads in base 60"
                           f"{_line(node.start_mark)}; write the number in digits, or quote it for text")

    def construct_yaml_int(self, node):
        self._not_base_60(node)
        return self._sized(SafeConstructor.construct_yaml_int, node)

    def construct_yaml_float(self, node):
        self._not_base_60(node)
        return self._sized(SafeConstructor.construct_yaml_float, node)


_CheckedConstructor.add_constructor("tag:yaml.org,2002:int", _CheckedConstructor.construct_yaml_int)
_CheckedConstructor.add_constructor("tag:yaml.org,2002:float", _CheckedConstructor.construct_yaml_float)

# Events from libyaml's C parser where PyYAML has it (several times faster on the preset
# files every run reads), composed in Python so that the budget holds.
try:
    from yaml._yaml import CParser

    class _Parser(CParser):
        pass
except ImportError:  # pragma: no cover - PyYAML without libyaml
    from yaml.parser import Parser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    class _Parser(Reader, Scanner, Parser):  # type: ignore[no-redef]
        def __init__(self, stream) -> None:
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            Parser.__init__(self)


class BoundedLoader(_BudgetComposer, _Parser, _CheckedConstructor, Resolver):
    def __init__(self, stream, max_nodes: int = MAX_YAML_NODES) -> None:
        _Parser.__init__(self, stream)
        _BudgetComposer.__init__(self, max_nodes)
        _CheckedConstructor.__init__(self)
        Resolver.__init__(self)


MERGE_TAG = "tag:yaml.org,2002:merge"


def _merge_sources(node) -> list:
    """The mappings a mapping's ``<<`` keys merge into it, in order, each once, with the ``<<`` key
    that merges it."""
    sources, counted = [], set()
    for key, value in node.value:
        if isinstance(key, ScalarNode) and key.tag == MERGE_TAG:
            for source in value.value if isinstance(value, SequenceNode) else [value]:
                if isinstance(source, MappingNode) and id(source) not in counted:
                    counted.add(id(source))
                    sources.append((source, key))
    return sources


def _given(node, memo: dict) -> dict:
    """{(tag, name): the key node that gives it} of a mapping, merges resolved as the YAML merge spec
    says (the mapping's own keys over what it merges, an earlier source over a later), each mapping
    resolved once (``memo``, by node: a chain of merges is walked once, not once per level)."""
    if id(node) in memo:
        return memo[id(node)]
    memo[id(node)] = {}  # a merge cycle gives nothing more
    given: dict = {}
    for source, _ in _merge_sources(node):
        for name, key in _given(source, memo).items():
            given.setdefault(name, key)
    for key, _ in node.value:
        if isinstance(key, ScalarNode) and key.tag != MERGE_TAG:
            given[(key.tag, key.value)] = key
    memo[id(node)] = given
    return given


def _duplicate_key(node, path: str = "", seen: Optional[set] = None,
                   memo: Optional[dict] = None) -> Optional[tuple[str, Any]]:
    """(dotted key, mark) of the first key given twice in one mapping, or by two of the mappings
    ``<<`` merges into it, else None."""
    seen = set() if seen is None else seen
    memo = {} if memo is None else memo
    if id(node) in seen:
        return None
    seen.add(id(node))
    if isinstance(node, MappingNode):
        keys: set = set()
        for key, value in node.value:
            name = key.value if isinstance(key, ScalarNode) else None
            here = f"{path}.{name}" if path and name is not None else (name or path)
            if name is not None and key.tag != MERGE_TAG:
                if (key.tag, name) in keys:
                    return here, key.start_mark
                keys.add((key.tag, name))
            _no_bare_merge(value, str(here))
            found = _duplicate_key(value, str(here), seen, memo)
            if found:
                return found
        # Two merged mappings that give one key from two key nodes: which wins is PyYAML's order, not
        # the spec's (it took the later of ``<<: [{global_batch_size: 64}, {global_batch_size: 128}]``, a
        # batch the user did not mean): refused, as a key given twice in one mapping is, across every
        # ``<<`` of the mapping and what its sources merge in turn. One key reached by two routes (a base
        # both sources merge) is given once; a key the mapping gives itself is what merging is for.
        sources = _merge_sources(node)
        if len(sources) > 1:
            merged: dict = {}
            for source, merge_key in sources:
                for given_name, given_key in _given(source, memo).items():
                    if given_name in keys:
                        continue
                    if merged.setdefault(given_name, given_key) is not given_key:
                        name = given_name[1]
                        return (f"{path}.{name}" if path else name), merge_key.start_mark
    elif isinstance(node, SequenceNode):
        for i, item in enumerate(node.value):
            # Each item named by its index, as the readers name list items (cluster.options[2]): a key
            # merged twice into the third option was "cluster.options.gpu_hour_cost".
            _no_bare_merge(item, f"{path}[{i}]")
            found = _duplicate_key(item, f"{path}[{i}]", seen, memo)
            if found:
                return found
    return None


def _no_bare_merge(node, key: str) -> None:
    """A plain ``<<`` where a value goes (``name: <<``) is YAML's merge key, which only a key may be:
    PyYAML said "could not determine a constructor for the tag 'tag:yaml.org,2002:merge'"."""
    if isinstance(node, ScalarNode) and node.tag == MERGE_TAG:
        raise _Refused(key, f"<< is YAML's merge key{_line(node.start_mark)}; quote it (\"<<\") to use it as "
                            "a string")


def load_yaml(text: str, source: str, max_nodes: int = MAX_YAML_NODES) -> Any:
    """Safe-load YAML text within the budget (``max_nodes``: a case file's is smaller); ``source``
    names it in errors."""
    loader = BoundedLoader(text, max_nodes)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        duplicate = _duplicate_key(node)
        if duplicate:
            key, mark = duplicate
            raise _Refused(key, f"given twice in one mapping (or the mappings << merges into it){_line(mark)}; "
                                "expected each key once")
        loader.root = node
        return loader.construct_document(node)
    except _Refused as refused:
        raise CaseError(source, refused.key, refused.expected) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or "malformed"
        if isinstance(error, yaml.reader.ReaderError) and isinstance(error.character, int):
            # A character YAML refuses (a NUL byte): no mark, but its position in the text.
            before = text[:error.position]
            where = f" at line {before.count(chr(10)) + 1}, column {len(before) - before.rfind(chr(10))}"
            problem = f"{error.reason} (#x{error.character:04x})"
        raise CaseError(source, "", f"expected valid YAML: {problem}{where}") from None
    except RecursionError:
        raise CaseError(source, "", "expected valid YAML: nested too deeply to read") from None
    finally:
        loader.dispose()


def read_yaml(path: PathLike) -> Any:
    """An input YAML file, read and loaded within the bounds above."""
    return load_yaml(read_text(path, "YAML"), os.fsdecode(path))


# --- JSON -------------------------------------------------------------------------------

# Digits an integer in a JSON input may have: a 64-bit integer's 19, with room.
MAX_JSON_INT_DIGITS = 30


class _LongNumber:
    """An integer of more digits than any input needs, kept unconverted so that its key can be named."""

    def __init__(self, digits: int):
        self.digits = digits


def _long_number_key(value: Any, key: str = "") -> Optional[tuple[str, int]]:
    """The dotted key of the first over-long integer in a loaded JSON document, and its digits."""
    if isinstance(value, _LongNumber):
        return key, value.digits
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        found = _long_number_key(v, f"{key}.{k}" if key else str(k))
        if found:
            return found
    return None


class _DuplicateKey(Exception):
    def __init__(self, key: str):
        self.key = key


def _object_without_duplicates(pairs: list) -> dict:
    """A JSON object whose keys are all different: Python's reader keeps the last of a repeated key
    silently (a ``zero_optimization`` given twice read as its second stage), the YAML reader refuses."""
    data = dict(pairs)
    if len(data) < len(pairs):
        seen = set()
        raise _DuplicateKey(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return data


class _TooManyValues(Exception):
    pass


def load_json(text: str, source: str, parse_float: Callable[[str], Any] = float, loads: Callable[..., Any] = json.loads,
              syntax: str = "valid JSON") -> Any:
    """JSON text, or a CaseError naming ``source``: malformed, too deep, a key given twice in one
    object, a number too long (naming its key), or more numbers and members than a config holds
    (MAX_YAML_NODES, the YAML files' bound: a ds_config of 5.5 million zeros took 29 s to diagnose,
    each number through a Python hook, five readings over). ``parse_float`` reads a number with a
    fraction or an exponent; ``loads`` is json.loads or a reader taking its hooks (hjson's), whose
    errors say ``syntax``."""
    count = [0]

    def counted(value: Any) -> Any:
        count[0] += 1
        if count[0] > MAX_YAML_NODES:
            raise _TooManyValues
        return value

    def number(digits: str) -> Any:
        return counted(int(digits) if len(digits.lstrip("-")) <= MAX_JSON_INT_DIGITS
                       else _LongNumber(len(digits.lstrip("-"))))

    try:
        data = loads(text, parse_int=number, parse_float=lambda digits: counted(parse_float(digits)),
                          object_pairs_hook=lambda pairs: counted(_object_without_duplicates(pairs)))
    except _TooManyValues:
        raise CaseError(source, "", f"holds more than {MAX_YAML_NODES:,} numbers and objects; expected a "
                                    "configuration file") from None
    except _DuplicateKey as error:
        raise CaseError(source, one_line(error.key, 80), "given twice in one object; expected each key once") from None
    except RecursionError:
        raise CaseError(source, "", f"expected {syntax}: nested too deeply to read") from None
    except ValueError as error:  # json's JSONDecodeError, hjson's HjsonDecodeError (long integers are caught above)
        where = f" at line {error.lineno}, column {error.colno}" if hasattr(error, "lineno") else ""
        raise CaseError(source, "", f"expected {syntax}: {getattr(error, 'msg', error)}{where}") from None
    long_number = _long_number_key(data)
    if long_number:
        raise CaseError(source, long_number[0], f"a number of {long_number[1]:,} digits; expected a number of at "
                                                f"most {MAX_JSON_INT_DIGITS} digits")
    return data


def read_json(path: PathLike) -> Any:
    return load_json(read_text(path, "valid JSON"), os.fsdecode(path))

