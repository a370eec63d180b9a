"""A Megatron-LM functional test's ``model_config.yaml`` (tests/functional_tests/test_cases/*/*/): its
``MODEL_ARGS`` mapping turned into the words ``pretrain_gpt.py`` gets, and its ``ENV_VARS`` into the
launch's environment, as the CI's tests/functional_tests/shell_test_utils/_run_training.sh builds them."""

from __future__ import annotations

import re
from typing import Optional

import yaml

from planner.errors import CaseError

# A YAML 1.2 core-schema true, which yq compares equal to `true` (_run_training.sh: select(.value == true)).
_TRUE = frozenset(("true", "True", "TRUE"))
_LATER_RUNS = re.compile(r"^MODEL_ARGS_\d+$")


def functional_test_launch(text: str, src: str) -> Optional[tuple[list[str], tuple, list[str]]]:
    """(words, environment, notes) of a functional test's model_config.yaml; None for any other text.

    environment holds (NAME, value, decided, conditional) as the bash reader gives it: ENV_VARS are
    exported (export_env_assignment) before the launch."""
    if not re.search(r"^MODEL_ARGS\s*:", text, re.MULTILINE):
        return None
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return None  # not YAML after all: a script that happens to hold the line
    if not isinstance(root, yaml.MappingNode):
        return None
    sections = {key.value: value for key, value in root.value if isinstance(key, yaml.ScalarNode)}
    arguments = sections.get("MODEL_ARGS")
    if not isinstance(arguments, yaml.MappingNode):
        raise CaseError(src, "MODEL_ARGS", "expected a mapping of Megatron-LM flags to their values")
    words = [word for key, value in arguments.value for word in _words(src, key, value)]
    notes = []
    later = sorted(name for name in sections if _LATER_RUNS.match(name))
    if later:
        # _run_training.sh takes MODEL_ARGS_<n> for the n-th run of a checkpoint-resume test only.
        notes.append(f"{src}: {', '.join(later)} configure the test's resumed runs: diagnosed is its first run, "
                     "MODEL_ARGS")
    return words, _environment(src, sections.get("ENV_VARS")), notes


def _words(src: str, key: yaml.Node, value: yaml.Node) -> list[str]:
    """The words _run_training.sh passes for one ``MODEL_ARGS`` entry: true is the switch alone, an empty
    value drops the entry, ``[a b]`` is its words, a value with spaces, ``|`` or parentheses one quoted
    word. ``${NAME}`` is kept as written: the CI sets the paths it names, which no layout reads."""
    flag = key.value if isinstance(key, yaml.ScalarNode) else None
    if not isinstance(flag, str) or not flag.startswith("-"):
        # IS_NEMO_TEST's MODEL_ARGS are NeMo recipe overrides (trainer.max_steps=...), not pretrain_gpt.py's.
        raise CaseError(src, f"MODEL_ARGS: {flag}", "is no Megatron-LM flag (a NeMo functional test's recipe "
                                                    "override?); expected --flag: value entries for pretrain_gpt.py")
    if not isinstance(value, yaml.ScalarNode):
        raise CaseError(src, f"MODEL_ARGS: {flag}", "expected one value (a number, a word or true), not a YAML "
                                                    "list or mapping")
    text = value.value.strip()
    if text in _TRUE:
        return [flag]
    if not text:
        return []
    if text.startswith("[") and text.endswith("]"):
        return [flag, *text[1:-1].split()]
    return [flag, text]


def _environment(src: str, variables: Optional[yaml.Node]) -> tuple:
    """ENV_VARS as the launch's exported environment."""
    if variables is None:
        return ()
    if not isinstance(variables, yaml.MappingNode):
        raise CaseError(src, "ENV_VARS", "expected a mapping of environment variables to their values")
    return tuple((key.value, value.value if isinstance(value, yaml.ScalarNode) else "", True, False)
                 for key, value in variables.value)
