"""``python -m sgl_ess.launch_server``: SGLang's own flags plus ``--ess-*`` and ``--ess-config``.

The ESS flags are parsed and validated first (sgl_ess.config), then removed from argv; the
rest goes to SGLang's own ``prepare_server_args`` and ``run_server`` unchanged, so every
SGLang flag (and ``--config``) keeps its meaning. Missing flags get the embedded defaults:
the tiny DeepSeek-V3.2 model with random weights, 127.0.0.1, the CPU when there is no CUDA.
The validated ESS config reaches SGLang's scheduler processes as JSON in ``SGLESS_CONFIG``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from sgl_ess.config import ENV_CONFIG_JSON, FIELDS, EssConfig, EssConfigError, build_config
from sgl_ess.models import TINY_DSV32_DIR

logger = logging.getLogger("sgl_ess")

DEFAULT_PORT = 30000
DEFAULT_MAX_RUNNING_REQUESTS = 64
DEFAULT_HOST_TOKENS = 65536          # ESS on: host pool tokens when nothing sizes it
DEFAULT_DEVICE_TOKENS = 16384        # ESS off: device pool tokens when nothing sizes it


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


def _has(argv: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def _value(argv: list[str], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def _latent_row_bytes(model_path: str) -> tuple[int, int] | None:
    """(layers, bytes per token per layer in bf16) from a local config.json, or None."""
    try:
        with open(os.path.join(model_path, "config.json")) as fh:
            c = json.load(fh)
        return c["num_hidden_layers"], (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * 2
    except (OSError, KeyError, ValueError):
        return None


def fill_defaults(argv: list[str], cfg: EssConfig, has_cuda: bool) -> list[str]:
    """Add what the user left out: model, load format, host, device, backend, pool sizes."""
    out = list(argv)
    eng = cfg.engine
    if not _has(out, "--model-path") and not _has(out, "--model"):
        model = eng.get("model_name") or TINY_DSV32_DIR
        out += ["--model-path", model]
        if model == TINY_DSV32_DIR and not _has(out, "--load-format"):
            out += ["--load-format", "dummy"]
            os.environ.setdefault("SGLESS_DUMMY_INIT", "scaled")
    if not _has(out, "--host"):
        out += ["--host", "127.0.0.1"]
    if not _has(out, "--port"):
        out += ["--port", str(DEFAULT_PORT)]
    if not has_cuda and not _has(out, "--device"):
        out += ["--device", "cpu"]
    if not has_cuda and not _has(out, "--sleep-on-idle"):
        out += ["--sleep-on-idle"]   # an idle CPU scheduler otherwise spins a core
    if not _has(out, "--attention-backend"):
        out += ["--attention-backend", "ess" if (cfg.enabled or not has_cuda) else "dsa"]
    if not _has(out, "--max-running-requests"):
        out += ["--max-running-requests", str(eng.get("decode_batch_size", DEFAULT_MAX_RUNNING_REQUESTS))]
    if not _has(out, "--max-total-tokens"):
        tokens = DEFAULT_HOST_TOKENS if cfg.enabled else DEFAULT_DEVICE_TOKENS
        geo = _latent_row_bytes(_value(out, "--model-path") or "")
        if cfg.enabled and cfg.memory_pool_size_gb and geo:
            layers, row = geo
            tokens = int(cfg.memory_pool_size_gb * 1e9) // (layers * row)
        out += ["--max-total-tokens", str(tokens)]
    return out


def split_ess_argv(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(add_help=False)
    add_ess_args(p)
    return p.parse_known_args(argv)


def print_help() -> None:
    from sglang.srt.server_args import ServerArgs

    p = argparse.ArgumentParser(
        prog="python -m sgl_ess.launch_server",
        description="SGLang server with the ESS latent store. With no arguments: the embedded tiny "
                    "DeepSeek-V3.2 model (random weights) on 127.0.0.1:30000, ESS on.")
    add_ess_args(p)
    ServerArgs.add_cli_args(p)
    p.print_help()


def resolve(argv: list[str], has_cuda: bool) -> tuple[EssConfig, list[str]]:
    """ESS config + the argv for SGLang. Raises EssConfigError."""
    ns, rest = split_ess_argv(argv)
    flags = {f.name: getattr(ns, "ess_" + f.name) for f in FIELDS}
    cfg = build_config(ns.ess_config, flags)
    return cfg, fill_defaults(rest, cfg, has_cuda)


def install_status_route() -> None:
    """GET /ess/status -> host-pool and hot-buffer usage of every scheduler (DP rank)."""
    from sglang.srt.entrypoints import http_server

    if any(getattr(r, "path", None) == "/ess/status" for r in http_server.app.routes):
        return

    @http_server.app.get("/ess/status")
    async def ess_status():
        states = await http_server.get_global_state().tokenizer_manager.get_internal_state()
        cfg = os.environ.get(ENV_CONFIG_JSON)
        return {"config": json.loads(cfg) if cfg else None,
                "schedulers": [s.get("ess", {"enabled": False}) for s in states]}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print_help()
        return
    import torch

    has_cuda = torch.cuda.is_available()
    try:
        cfg, sgl_argv = resolve(argv, has_cuda)
    except EssConfigError as e:
        print(f"sgl_ess.launch_server: error: {e}", file=sys.stderr)
        sys.exit(2)
    os.environ[ENV_CONFIG_JSON] = cfg.to_json()
    if not has_cuda:
        os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

    from sglang.launch_server import run_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()
    server_args = prepare_server_args(sgl_argv)
    logger.info("%s", cfg.summary())
    logger.info("sgl_ess.launch_server: SGLang args: %s", " ".join(sgl_argv))
    install_status_route()
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)
