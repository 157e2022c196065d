"""The launcher's command line read by SGLang's own parser: which SGLang flags the user set, and the
argv handed to SGLang rebuilt from those parsed values.

Why: SGLang's argparse parser accepts any unambiguous prefix of a flag (``--model-p``, ``--tp 8``,
``--max-total-tok``). A hand-written scanner that looks for ``--model-path`` misses them, adds its
own default, and argparse's "last one wins" then serves the default. Here one parser holds
SGLang's flags (``ServerArgs.add_cli_args``) and the launcher's (``--ess-*``, the guard/operations
flags), so prefixes are resolved, and ambiguities refused, over all of them at once. SGLang's
defaults are replaced by ``argparse.SUPPRESS``: a dest appears in the parsed namespace exactly when
the user set it. SGLang's ``--config FILE.yaml`` is merged first with SGLang's own
``ConfigArgumentMerger``, as ``prepare_server_args`` does.

``canonical_argv`` writes each set value back under the flag's full name, and checks the rebuilt
argv parses to the same values (a value that cannot be written back stops the launch with
PreflightError rather than reach SGLang changed). Reads ``argparse.ArgumentParser._actions``, as
SGLang's own ConfigArgumentMerger does. Owns no state beyond one cached parser.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Any, Callable

from sgl_ess.serving.preflight import PreflightError

_DEPRECATION_LOGGER = "sglang.srt.arg_groups.argparse_actions"   # print_deprecated_warning's logger


class _Parser(argparse.ArgumentParser):
    """argparse's errors as PreflightError (one line, exit 2 in the launcher) instead of usage + exit."""

    def error(self, message: str):
        raise PreflightError(f"{message} (python -m sgl_ess.launch_server --help lists every flag)")


@dataclass
class Parsed:
    own: argparse.Namespace        # the launcher's flags (--ess-*, guard/operations), with their defaults
    sglang: dict[str, Any]         # SGLang dests the user set (on the command line or in --config), parsed


class SGLangFlags:
    """One parser for SGLang's flags and the launcher's; built once per process (SGLang's parser
    has ~500 flags)."""

    def __init__(self, add_own_args: Callable[[argparse.ArgumentParser], None]):
        from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices
        from sglang.srt.server_args import ServerArgs

        from ..targets import ESS_BACKEND_NAME

        if ESS_BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
            add_attention_backend_choices([ESS_BACKEND_NAME])     # as the plugin does in every process
        self.parser = _Parser(prog="python -m sgl_ess.launch_server", add_help=False)
        ServerArgs.add_cli_args(self.parser)
        self.defaults: dict[str, Any] = {}                      # SGLang's argparse default per dest
        self.actions: dict[str, list[argparse.Action]] = {}     # dest -> its SGLang actions
        for a in self.parser._actions:
            if a.dest in (argparse.SUPPRESS, "help") or not a.option_strings:
                continue
            self.defaults.setdefault(a.dest, a.default)
            self.actions.setdefault(a.dest, []).append(a)
            a.default = argparse.SUPPRESS                        # set by the user <=> present after parsing
            a.required = False                                   # --model-path: the launcher has a default
        for acts in self.actions.values():                       # a deprecated spelling is written back last
            acts.sort(key=lambda a: type(a).__name__.startswith("Deprecated"))
        add_own_args(self.parser)

    # --- reading -------------------------------------------------------------------------------
    def parse(self, argv: list[str], quiet: bool = False) -> Parsed:
        """Raises PreflightError for an unknown or ambiguous flag or a refused value. `quiet`: no
        deprecation warning (for a second reading of flags already read once)."""
        if quiet:
            with _quiet():
                return self.parse(argv)
        ns = self.parser.parse_args(argv)
        if "config" in vars(ns):                                 # SGLang's --config FILE.yaml, merged as it does
            argv = self._merge_config(argv)
            ns = self.parser.parse_args(argv)
        own = argparse.Namespace(**{k: v for k, v in vars(ns).items() if k not in self.actions})
        return Parsed(own=own, sglang=self._sglang_values(ns))

    def _sglang_values(self, ns: argparse.Namespace) -> dict[str, Any]:
        return {k: v for k, v in vars(ns).items() if k in self.actions}

    def _merge_config(self, argv: list[str]) -> list[str]:
        from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

        argv = [t for a in argv for t in (a.split("=", 1) if a.startswith("--config=") else [a])]
        if "--config" not in argv:
            raise PreflightError("--config: spell it in full (--config FILE.yaml); SGLang merges the file only then")
        try:
            return ConfigArgumentMerger(self.parser).merge_config_with_args(argv)
        except (ValueError, OSError) as e:
            raise PreflightError(f"--config: {e}") from None

    # --- writing -------------------------------------------------------------------------------
    def canonical_argv(self, values: dict[str, Any]) -> list[str]:
        """SGLang argv that parses to exactly `values` (dest -> parsed value), each flag under its full
        name. Raises PreflightError for a value no spelling of its flag reproduces."""
        out = []
        for dest, value in values.items():
            out += self._write(dest, value)
        return out

    def _write(self, dest: str, value: Any) -> list[str]:
        if dest not in self.actions:
            raise PreflightError(f"internal: {dest!r} is not an SGLang 0.5.23 server argument")
        for action in self.actions[dest]:
            for tokens in _spellings(action, value):
                if self._reads_back(tokens, dest, value):
                    return tokens
        flag = self.actions[dest][0].option_strings[0]
        raise PreflightError(f"{flag}: the parsed value {value!r} cannot be written back for SGLang unchanged; "
                             "spell it differently (or report it against sgl_ess/.../launcher/sglang_flags.py)")

    def _reads_back(self, tokens: list[str], dest: str, value: Any) -> bool:
        try:
            with _quiet():
                got = vars(self.parser.parse_args(tokens))
        except (PreflightError, SystemExit):
            return False
        return dest in got and got[dest] == value and set(got) - set(vars(self._own_defaults())) == {dest}

    def _own_defaults(self) -> argparse.Namespace:
        if not hasattr(self, "_own_ns"):
            self._own_ns = self.parser.parse_args([])
        return self._own_ns

    def flag(self, dest: str) -> str:
        """The full name of SGLang's flag for `dest` (for messages)."""
        return self.actions[dest][0].option_strings[0]


@contextlib.contextmanager
def _quiet():
    """SGLang's deprecation warnings off: they are SGLang's to give, once, when it parses the argv."""
    log = logging.getLogger(_DEPRECATION_LOGGER)
    was, log.disabled = log.disabled, True
    try:
        with contextlib.redirect_stderr(None):
            yield
    finally:
        log.disabled = was


def _spellings(action: argparse.Action, value: Any):
    """Candidate argv fragments for `value` under `action`'s first long name (verified by the caller)."""
    name = next((o for o in action.option_strings if o.startswith("--")), action.option_strings[0])
    if isinstance(action, argparse.BooleanOptionalAction):
        yield [name if value else next(o for o in action.option_strings if o.startswith("--no-"))]
        return
    if action.nargs == 0:
        yield [name]
        return
    if action.nargs == "?":
        yield [name]
    if action.nargs in ("*", "+") or (isinstance(action.nargs, int) and action.nargs > 1):
        items = list(value or [])
        yield [name, *(_texts(v)[0] for v in items)]
        yield [name, *(json.dumps(v) if not isinstance(v, str) else v for v in items)]
        return
    for text in _texts(value):
        yield [f"{name}={text}"] if text.startswith("-") else [name, text]


def _texts(value: Any) -> list[str]:
    out = []
    if isinstance(value, str):
        out.append(value)
    if isinstance(value, (dict, list)):
        out.append(json.dumps(value))
    for attr in ("value", "name"):                              # enums
        v = getattr(value, attr, None)
        if isinstance(v, str):
            out.append(v)
    out.append(str(value))
    return list(dict.fromkeys(out))
