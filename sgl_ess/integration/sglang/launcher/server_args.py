"""``python -m sgl_ess.launch_server``: SGLang's own flags plus ``--ess-*``, ``--ess-config`` and the
request-guard / operations flags (``--guard-*``, ``--metrics-*``, ``--health-*``).

Order of events (everything before "load the model" takes seconds):
  1. read the whole command line with SGLang's own parser, which holds the launcher's flags too
     (sglang_flags.py: SGLang's flag prefixes resolve as SGLang resolves them), and validate the ESS
     and operations flags (sgl_ess.config, sgl_ess.serving.ops_config); take the API keys out of the
     arguments and hide a key given on the command line (auth_keys.py) before anything slower runs;
  2. fill the launcher's defaults and size the token pool (launcher_defaults.py), check hot-slot
     feasibility and that ``--host:--port`` is free (sgl_ess.serving.preflight); with
     ``--ess-explain`` print the plan (explain.py) and exit 0 here;
  3. set the process environment (process_env.py), load the plugins, let SGLang resolve its args;
  4. install /ess/status, the request guard, /health and (outermost) the route guard on SGLang's
     app; start SGLang's HTTP server with sgl-ess's TokenizerManager (tokenizer.py), crash handler
     (crash_handler.py) and the warmup that authenticates with the internal token (auth_keys.py).
``--api-key`` / ``--admin-api-key`` never reach SGLang (auth_keys.py): the route guard enforces them.
Exit codes: sgl_ess.serving.exit_codes (2 configuration, 3 port in use, 4 startup, 5 crash).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from sgl_ess.config import ENV_CONFIG_JSON, FIELDS, EssConfigError, build_config
from sgl_ess.serving import exit_codes
from sgl_ess.serving.ops_config import ENV_OPS_JSON, OpsConfigError, add_ops_args, build_ops_config
from sgl_ess.serving.preflight import PortInUse, PreflightError, check_port
from sgl_ess.serving.redact import redact_argv
from sgl_ess.serving.route_policy import Keys

from . import auth_keys, node_devices, process_env
from ..routes import route_guard
from .argv_view import flag_value, has_flag, int_flag, parallel_layout
from .launcher_defaults import fill_defaults, sizing_json
from ..routes.status_route import ENV_POOL_SIZING

logger = logging.getLogger("sgl_ess")
PROG = "python -m sgl_ess.launch_server"


def add_ess_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("ESS (sgl-ess)", "Offload-centric latent cache for sparse-attention MLA models.")
    g.add_argument("--ess-config", metavar="FILE.yaml", default=None,
                   help="YAML file with an 'ess_config' block (and optionally 'inference_engine'); "
                        "--ess-* flags override it.")
    for f in FIELDS:
        flag = "--ess-" + f.name.replace("_", "-")
        meta = "{" + ",".join(f.choices) + "}" if f.choices else ("BOOL" if f.type is bool else f.type.__name__.upper())
        g.add_argument(flag, dest="ess_" + f.name, default=None, metavar=meta,
                       help=f"{f.help} (default: {f.default})")


_FLAGS = None


def sglang_flags():
    """SGLang's parser with the launcher's flags on it (sglang_flags.py), built once per process."""
    global _FLAGS
    if _FLAGS is None:
        from .sglang_flags import SGLangFlags

        _FLAGS = SGLangFlags(lambda p: (add_ess_args(p), add_explain_args(p), add_ops_args(p)))
    return _FLAGS


def add_explain_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("Explain (check a deployment before it starts)")
    g.add_argument("--ess-explain", action="store_true",
                   help="Run every check the launcher makes before the model loads, print the SGLang arguments "
                        "it would pass and the ESS plan (host pool per node and per pool, hot slots, device bytes, "
                        "and what each default was computed from), and exit 0 without loading the model or "
                        "starting any process.")
    g.add_argument("--ess-explain-device", metavar="SPEC", default="auto", help=node_devices.SPEC_HELP)


def split_argv(argv: list[str]) -> tuple[argparse.Namespace, list[str], dict]:
    """(the launcher's own flags, SGLang's flags under their full names, the SGLang dests the user set),
    all read by SGLang's own parser (sglang_flags.py). Raises PreflightError."""
    flags = sglang_flags()
    parsed = flags.parse(argv)
    return parsed.own, flags.canonical_argv(parsed.sglang), parsed.sglang


def print_help() -> None:
    """The ESS and operations groups first, then SGLang's own flags (``ess`` among the backends)."""
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices
    from sglang.srt.server_args import ServerArgs

    from ..targets import ESS_BACKEND_NAME

    p = argparse.ArgumentParser(
        prog=PROG, add_help=False, usage=f"{PROG} [ESS flags] [guard/operations flags] [SGLang flags]",
        description="SGLang server with the ESS latent store. With no arguments: the embedded tiny "
                    "DeepSeek-V3.2 model (random weights) on 127.0.0.1:30000, ESS on. Exit codes: "
                    "0 ok, 2 configuration refused, 3 port in use, 4 startup failed, 5 a server process died.")
    add_ess_args(p)
    add_explain_args(p)
    add_ops_args(p)
    print(p.format_help())
    if ESS_BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([ESS_BACKEND_NAME])
    sp = argparse.ArgumentParser(prog=PROG, usage=argparse.SUPPRESS,
                                 description="SGLang 0.5.23 server flags (unchanged; the launcher fills model, "
                                             "host, device, backend and pool size when they are not given):")
    ServerArgs.add_cli_args(sp)
    print(sp.format_help())


def node_for(ns: argparse.Namespace) -> node_devices.NodeDevices:
    """The devices planned for: --ess-explain-device with --ess-explain, else this machine's."""
    forced = node_devices.parse_spec(ns.ess_explain_device)
    if forced is not None and not ns.ess_explain:
        raise PreflightError(f"--ess-explain-device {ns.ess_explain_device} without --ess-explain: a server runs on "
                             "the devices it has; add --ess-explain to see the plan for that node")
    return forced or node_devices.detect()


def check_parallel(sgl_argv: list[str]) -> None:
    """Parallel layouts SGLang would stop on (compat.parallel_refusals), from the parsed flags: before the
    plugins load and anything starts. Raises PreflightError."""
    from . import compat

    flags = sglang_flags()
    args = argparse.Namespace(**{**flags.defaults, **flags.parse(sgl_argv, quiet=True).sglang})
    refused = compat.parallel_refusals(args)
    if refused:
        raise PreflightError("; ".join(refused))


def explain(cfg, sizing: dict, sgl_argv: list[str], user_set: dict, devices) -> None:
    """--ess-explain: the report, then exit 0."""
    from . import explain as report

    flags = sglang_flags()
    fields = flags.parse(sgl_argv, quiet=True).sglang
    print(report.render(cfg, sizing, sgl_argv, fields, set(user_set), flags.defaults,
                        {d: flags.flag(d) for d in fields}, devices, parallel_layout(sgl_argv)), end="", flush=True)
    sys.exit(0)


def _die(code: int, message: str) -> None:
    kind = "error" if code in (exit_codes.CONFIG, exit_codes.PORT_IN_USE) else "fatal"
    print(f"sgl_ess.launch_server: {kind}: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def _reason(e: BaseException) -> str:
    """The exception's first line; for a bare assert, where SGLang asserted (file:line: source)."""
    text = str(e).strip()
    if text:
        return text.splitlines()[0]
    import traceback

    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return type(e).__name__
    f = frames[-1]
    return f"{type(e).__name__} at {os.path.basename(f.filename)}:{f.lineno}: {(f.line or '').strip()}"


def _serve(server_args, keys: Keys) -> None:
    from sglang.launch_server import run_server

    from . import crash_handler
    from ..routes import tokenizer

    if server_args.smg_grpc_mode or server_args.encoder_only or server_args.use_ray:
        if keys.api_key or keys.admin_api_key:
            _die(exit_codes.CONFIG, "--api-key / --admin-api-key are enforced by sgl-ess's HTTP route guard, "
                                    "which gRPC, encoder-only and Ray front ends bypass; drop the keys or the "
                                    "front-end flag")
        return run_server(server_args)                  # other front ends: SGLang's own dispatch
    from sglang.srt.entrypoints.http_server import launch_server

    def on_ready():
        auth_keys.end_warmup()
        crash_handler.on_ready()

    launch_server(server_args, init_tokenizer_manager_func=tokenizer.init_tokenizer_manager,
                  launch_callback=on_ready, execute_warmup_func=auth_keys.warmup_func(keys))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print_help()
        return
    try:
        ns, rest, user_set = split_argv(argv)
        rest, found_keys = auth_keys.take_keys(rest, key_files=ns)   # first: keys leave the command line now
        check_parallel(rest)
        devices = node_for(ns)
        has_cuda = devices.has_cuda
        cfg = build_config(ns.ess_config, {f.name: getattr(ns, "ess_" + f.name) for f in FIELDS})
        sgl_argv, sizing = fill_defaults(rest, cfg, has_cuda, devices)
        ops = build_ops_config(ns, enable_metrics=has_flag(sgl_argv, "--enable-metrics"),
                               enable_deterministic_inference=has_flag(sgl_argv, "--enable-deterministic-inference"))
        host, port = flag_value(sgl_argv, "--host"), int_flag(sgl_argv, "--port")
        check_port(host, port)
    except PortInUse as e:
        _die(exit_codes.PORT_IN_USE, str(e))
    except (EssConfigError, OpsConfigError, PreflightError) as e:
        _die(exit_codes.CONFIG, str(e))
    if ns.ess_explain:
        explain(cfg, sizing, sgl_argv, user_set, devices)
    keys = Keys(api_key=found_keys["--api-key"], admin_api_key=found_keys["--admin-api-key"],
                internal_token=route_guard.new_internal_token(),
                enable_blocking_routes=ops.guard_enable_blocking_routes)
    os.environ[ENV_CONFIG_JSON] = cfg.to_json()
    os.environ[ENV_OPS_JSON] = ops.to_json()
    os.environ[ENV_POOL_SIZING] = sizing_json(sizing)
    process_env.apply(host, has_cuda, int_flag(sgl_argv, "--nnodes") or 1, flag_value(sgl_argv, "--dist-init-addr"),
                      flag_value(sgl_argv, "--disaggregation-mode"))

    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args

    from . import compat, crash_handler
    from ..routes import health, request_guard, runtime_config, status_route
    from .. import ops_hooks

    load_plugins()
    if not ops_hooks.is_loaded():
        _die(exit_codes.CONFIG, "the sgl_ess_ops plugin entry point did not load (see the log above); "
                                "reinstall sgl-ess: bash launch/setup.sh, or pip install -e .")
    try:
        server_args = prepare_server_args(sgl_argv)
        refused = compat.parallel_refusals(server_args)
        if refused:
            _die(exit_codes.CONFIG, "; ".join(refused))
        server_args.custom_sigquit_handler = crash_handler.launch_phase_handler
        server_args.resolve_once()                      # SGLang's own checks, still before the model loads
    except (ValueError, TypeError, AssertionError) as e:   # SGLang states many of its checks as asserts
        _die(exit_codes.CONFIG, f"SGLang refused the arguments: {_reason(e)}")
    process_env.bind_cpu_threads(server_args, has_cuda)
    logger.info("%s", cfg.summary())
    logger.info("sgl_ess.launch_server: pool: %s", sizing_json(sizing))
    logger.info("sgl_ess.launch_server: SGLang args: %s", " ".join(redact_argv(sgl_argv)))
    logger.info("%s", auth_keys.startup_line(keys))
    status_route.install()
    runtime_config.install_route()                      # POST /ess/overlap_level (runtime_config.py)
    request_guard.install(ops)
    health.install(ops.health_timeout_s)
    route_guard.install(ops, keys)                      # last added = outermost: every request meets it first
    try:
        _serve(server_args, keys)
        if int(getattr(server_args, "node_rank", 0) or 0) > 0:
            # a node other than 0 serves no HTTP: SGLang returns only once its schedulers ended (a SIGTERM to
            # this launcher would have ended it first), so this is a crash of this node or of its peers
            crash_handler.fatal_exit(exit_codes.PROCESS_DIED,
                                     f"the scheduler processes of node rank {server_args.node_rank} ended while "
                                     "serving (their error, or the peer that failed, is above)")
    except KeyboardInterrupt:
        pass
    except Exception as e:  # noqa: BLE001 - one line and a distinct code instead of a bare traceback
        logger.exception("server failed")
        code = exit_codes.PROCESS_DIED if crash_handler.is_ready() else exit_codes.STARTUP_FAILED
        crash_handler.fatal_exit(code, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": "))
    finally:
        process_env.cleanup()
        from sglang.srt.utils import kill_process_tree

        kill_process_tree(os.getpid(), include_parent=False)
