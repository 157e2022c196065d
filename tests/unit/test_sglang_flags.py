"""Issue 33, item 4: the launcher reads SGLang's flags with SGLang's own parser, and the argv it hands
SGLang is rebuilt from the parsed values - so an abbreviated flag keeps the user's value and no flag
is lost or changed on the way (sgl_ess/integration/sglang/launcher/sglang_flags.py)."""

import argparse
import json

import pytest

pytest.importorskip("sglang")

from sgl_ess.config import build_config  # noqa: E402
from sgl_ess.integration.sglang.launcher import launcher_defaults as ld  # noqa: E402
from sgl_ess.integration.sglang.launcher import argv_view as av  # noqa: E402
from sgl_ess.integration.sglang.launcher.server_args import sglang_flags, split_argv  # noqa: E402
from sgl_ess.models import TINY_DSV32_DIR  # noqa: E402
from sgl_ess.serving.preflight import PreflightError  # noqa: E402


@pytest.fixture(scope="module")
def flags():
    return sglang_flags()


def _sample(action: argparse.Action):
    """One value SGLang's parser accepts for `action`, as argv text (None: no value taken)."""
    if action.nargs == 0:
        return None
    if action.choices:
        one = sorted(map(str, action.choices))[-1]
    else:
        name = getattr(action.type, "__name__", "")
        one = {"int": "3", "float": "0.25", "human_readable_int": "4k", "loads": '{"a": -1}',
               "json_list_type": '["x"]'}.get(name, "some-value")
    return [one, one] if action.nargs in ("+", "*") else [one]


def test_every_sglang_flag_reads_back_unchanged(flags):
    """For each of SGLang 0.5.23's flags: parse a value, write it back under the full name, parse again."""
    checked, unparsable = 0, []
    for dest, actions in flags.actions.items():
        for action in actions:
            for opt in action.option_strings:
                values = _sample(action)
                argv = [opt, *(values or [])]
                try:
                    first = flags.parse(argv).sglang
                except PreflightError:
                    unparsable.append(opt)                  # the sample value is not one SGLang takes
                    continue
                again = flags.parse(flags.canonical_argv(first)).sglang
                assert again == first, (opt, first, flags.canonical_argv(first))
                checked += 1
    assert checked > 0.9 * (checked + len(unparsable)), unparsable


@pytest.mark.parametrize("argv,dest,value", [
    (["--model-p", "/models/x"], "model_path", "/models/x"),
    (["--max-total-tok", "1000"], "max_total_tokens", 1000),
    (["--tp", "8"], "tp_size", 8),
    (["--tensor-parallel-size=4"], "tp_size", 4),
    (["--attention-data-parallel-size", "2"], "attn_dp_size", 2),
    (["--json-model-override-args", '{"a": -1}'], "json_model_override_args", '{"a": -1}'),
])
def test_prefixes_and_aliases_read_as_sglang_reads_them(flags, argv, dest, value):
    assert flags.parse(argv).sglang == {dest: value}


def test_abbreviated_flags_keep_the_users_values_through_the_launchers_defaults():
    """The issue's two cases: before, the launcher's own default was appended and won."""
    _, rest, user = split_argv(["--model-p", TINY_DSV32_DIR, "--max-total-tok", "1000", "--ess-hot-slots", "40"])
    assert user == {"model_path": TINY_DSV32_DIR, "max_total_tokens": 1000}
    out, sizing = ld.fill_defaults(rest, build_config(None, {}, environ={}), has_cuda=False)
    assert out.count("--model-path") == 1 and av.flag_value(out, "--model-path") == TINY_DSV32_DIR
    assert out.count("--max-total-tokens") == 1 and av.flag_value(out, "--max-total-tokens") == "1000"
    assert sizing["tokens"] == 1000 and sizing["source"] == "--max-total-tokens"
    parsed = sglang_flags().parse(out).sglang                     # what SGLang itself will read
    assert parsed["model_path"] == TINY_DSV32_DIR and parsed["max_total_tokens"] == 1000


def test_launcher_flags_and_sglang_flags_share_one_parser():
    ns, rest, _ = split_argv(["--ess-mem", "3", "--tp-size", "2"])
    assert ns.ess_memory_pool_size_gb == "3" and rest == ["--tp-size", "2"]
    with pytest.raises(PreflightError, match="ambiguous option: --t could match"):
        split_argv(["--t", "2"])
    with pytest.raises(PreflightError, match="unrecognized arguments: --no-such-flag"):
        split_argv(["--no-such-flag"])


def test_sglang_config_file_is_merged_as_sglang_merges_it(tmp_path):
    cfg = tmp_path / "sglang.yaml"
    cfg.write_text("model-path: /from/yaml\nmax-total-tokens: 2048\nenable-metrics: true\n")
    _, rest, user = split_argv(["--config", str(cfg), "--max-total-tokens", "4096"])
    assert user == {"model_path": "/from/yaml", "max_total_tokens": 4096, "enable_metrics": True}   # CLI wins
    assert "--config" not in rest and av.flag_value(rest, "--model-path") == "/from/yaml"


def test_sglang_defaults_are_recorded_for_the_explain_report(flags):
    assert flags.defaults["tp_size"] == 1 and flags.defaults["max_total_tokens"] is None
    assert json.dumps(flags.flag("tp_size")) == '"--tp-size"'


def test_every_flag_the_launcher_reads_is_sglangs_full_name(flags):
    """The launcher reads the argv that canonical_argv wrote: a flag it looks up under an alias or a
    prefix would never be found (argv_view._ALIASES lists aliases beside their full names)."""
    import pathlib
    import re

    from sgl_ess.integration.sglang.launcher import argv_view

    root = pathlib.Path(argv_view.__file__).parent
    read = set()
    for p in root.glob("*.py"):
        read |= set(re.findall(r'(?:has_flag|flag_value|int_flag)\(\w+, "(--[a-z0-9-]+)"', p.read_text()))
    aliases = {f for names in argv_view._ALIASES.values() for f in names}
    opt2dest = {o: d for d, acts in flags.actions.items() for a in acts for o in a.option_strings}
    assert len(read) > 20
    wrong = {f: flags.flag(opt2dest[f]) if f in opt2dest else "not an SGLang flag" for f in read
             if (f not in opt2dest or flags.flag(opt2dest[f]) != f) and f not in aliases}
    assert not wrong, wrong


def test_a_forced_device_is_for_explain_only():
    from sgl_ess.integration.sglang.launcher.server_args import node_for

    ns, _, _ = split_argv(["--ess-explain", "--ess-explain-device", "cuda:8:141"])
    assert node_for(ns).has_cuda and node_for(ns).gpus == 8
    ns, _, _ = split_argv(["--ess-explain-device", "cuda:8:141"])
    with pytest.raises(PreflightError, match="without --ess-explain"):
        node_for(ns)
