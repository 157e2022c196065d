"""``--ess-explain``: what a launch would do, printed, with nothing loaded and no process started.

After every check the launcher runs before the model loads (flags, parallel layout, host pool against
host memory, hot slots against index_topk, hot buffers against GPU memory, the port), it prints the
argv it would hand SGLang, the SGLang fields that differ from SGLang's defaults (and who set each),
and the ESS plan with where every number came from; then the launcher exits 0. With
``--ess-explain-device cuda:N:GiB[:HostGiB]`` (node_devices.py) the plan is the one for a node of N such
GPUs (and HostGiB of host memory; without it, this machine's host memory, as the report says), on any
machine. Owns no state.
"""

from __future__ import annotations

from typing import Any

from sgl_ess.config import EssConfig
from sgl_ess.serving.redact import redact, redact_argv

from .node_devices import GIB, NodeDevices

GB = 1e9


def _gb(n) -> str:
    """Bytes for a reader, and exact (tests and scripts read the number in parentheses)."""
    if n is None:
        return "unknown"
    return f"{n / GB:.2f} GB ({n} B)" if n >= GB / 10 else f"{n / 1e6:.3f} MB ({n} B)"


def render(cfg: EssConfig, sizing: dict, sgl_argv: list[str], fields: dict[str, Any], user_set: set[str],
           sglang_defaults: dict[str, Any], flag_names: dict[str, str], devices: NodeDevices,
           layout: dict) -> str:
    """The report. `fields`: SGLang dest -> value as SGLang's parser reads `sgl_argv`; `user_set`: the
    dests the user gave; `flag_names`: dest -> SGLang's full flag name."""
    lines = ["sgl_ess.launch_server --ess-explain: preflight passed; nothing was loaded and no process started.",
             "", f"node: {devices.describe()}"]
    mem = sizing.get("host_memory", {})
    lines.append(f"host memory: MemTotal {_gb(mem.get('mem_total_bytes'))}, MemAvailable "
                 f"{_gb(mem.get('mem_available_bytes'))}, usable host memory {_gb(mem.get('usable_bytes'))} "
                 f"(MemAvailable minus the safety margin); read from {mem.get('source', 'this machine')}")
    dp_attn = " (DP attention)" if layout["dp_attention"] else ""
    lines.append(f"parallel layout: tp {layout['tp']}, dp {layout['dp']}{dp_attn}, pp {layout['pp']}, nnodes "
                 f"{layout['nnodes']}: {layout['ranks_per_node']} rank(s) per node")
    lines += ["", "SGLang arguments (the argv the launcher hands SGLang 0.5.23):",
              "  " + " ".join(redact_argv(sgl_argv)),
              "SGLang fields that differ from SGLang's defaults (as SGLang's parser reads the argv above):"]
    for dest, value in redact(fields).items():                          # key-shaped fields: values hidden
        if dest in sglang_defaults and sglang_defaults[dest] == fields[dest]:
            continue
        text = f"{dest} = {value!r}"
        who = "given" if dest in user_set else "launcher default"
        lines.append(f"  {text:<60} {flag_names.get(dest, '')} ({who})")
    lines += ["", f"ESS plan (ESS {'on' if cfg.enabled else 'off'}):"]
    if not cfg.enabled:
        lines.append(f"  token pool (SGLang's own, on the device): {sizing['tokens']} tokens ({sizing['source']})")
        return "\n".join(lines) + "\n"
    if "dsv4" in sizing:
        return "\n".join(lines + v4_lines(sizing["dsv4"], sizing, fields)) + "\n"
    model = sizing.get("model")
    if model is None:
        lines.append("  the model's config has no MLA latent: no ESS sizing applies")
        return "\n".join(lines) + "\n"
    lines.append(f"  model: {model['path']}: {model['layers']} layers, latent row {model['latent_row_bytes']} B per "
                 f"token per layer (kv cache dtype {model['kv_cache_dtype']}: {model['kv_cache_dtype_source']}), index_topk "
                 f"{model['index_topk']} (read through transformers.AutoConfig; a LongCat-Flash config through SGLang's "
                 f"get_config, layers = its attention layers)")
    pools, per_pool = sizing["pools_per_node"], sizing["host_bytes_expected"]
    who = "one per attention-TP group, shared by its ranks" if pools < layout["ranks_per_node"] else "one per rank"
    lines.append(f"  host pool per node: {_gb(sizing['host_bytes_per_node'])} = {pools} host pool(s) per node x "
                 f"{_gb(per_pool)} per pool ({who}; --ess-share-host-pool)")
    lines.append(f"  host pool per pool: {sizing['tokens']} tokens (--max-total-tokens) = ({sizing['tokens']} + "
                 f"{sizing['page_size']} padding) x {model['layers']} layers x {model['latent_row_bytes']} B")
    lines.append(f"  host pool sized by: {sizing['source']}")
    if sizing.get("pool_budget_split"):
        lines.append(f"  note: {sizing['pool_budget_split']}")
    hot = sizing.get("hot_slots_per_request")
    if hot:
        src = sizing["hot_slots_source"]                                 # core/hot_slots.py's own words
        if not (cfg.hot_slots_per_request or cfg.max_gpu_buffer_size_gb):
            src = f"default {src}, index_topk {model['index_topk']}; set --ess-hot-slots-per-request to change"
        lines.append(f"  hot slots per request: {hot} per layer ({src}); needs >= index_topk + 1 = "
                     f"{model['index_topk'] + 1}")
        dev, alloc = sizing["device_bytes_per_device"], sizing["device_allocation"]
        of = (f" of {devices.gpu_memory_bytes / GIB:.1f} GiB per GPU" if devices.has_cuda and devices.gpu_memory_bytes
              else "")
        lines.append(f"  device bytes per {'GPU' if devices.has_cuda else 'rank'} (ESS store): {_gb(dev)}{of}, "
                     f"the store's device allocation (StoreConfig.device_allocation) for {sizing['request_rows']} "
                     f"request rows (--max-running-requests per DP-attention worker + 1 padding) x "
                     f"{sizing['store_hot_slots_per_request']} hot slots x {model['layers']} layers x "
                     f"{model['latent_row_bytes']} B plus rings and speculative rows in whole pages, and state for "
                     f"{sizing['context_tokens']} context tokens ({sizing['context_tokens_source']}); an MTP draft "
                     "model's store is extra")
        lines.append("    by tensor: " + ", ".join(f"{k} {_gb(v)}" for k, v in alloc.items() if v))
    lines.append("  (SGLang's own resolution and the model load run at launch, not here)")
    return "\n".join(lines) + "\n"


def v4_lines(v: dict, sizing: dict, fields: dict | None = None) -> list[str]:
    """The ESS plan of DeepSeek-V4 (launcher/v4_plan.py's sizing `v`): host side, device side, hot buffer, and
    with `fields` (SGLang's parsed arguments) naming a speculative algorithm, what MTP adds."""
    c4, d = len(v["c4_layer_ids"]), v["head_dim"]
    dev, e4 = v["device_bytes_per_request"], v["entry_bytes"]
    window_rows = dev["window"] // (v["layers"] * e4)
    ids = ", ".join(map(str, v["c4_layer_ids"]))
    pool_source = ("--max-total-tokens" if sizing["source"] == "--max-total-tokens" else
                   "the launcher's default on CPU; set --max-total-tokens to change")
    return [
        f"  model: {v['path']}: DeepseekV4ForCausalLM, {v['layers']} layers = {c4} C4 (layers {ids}) + "
        f"{v['c128_layers']} C128 + {v['window_only_layers']} window only, a {v['window_tokens']}-token window per "
        f"layer, head_dim {d}, index_topk {v['index_topk']}, index_head_dim {v['index_head_dim']} (its config.json "
        "through transformers.AutoConfig; bytes by the simulator's arithmetic, sim/dsv4.py, as `python -m "
        "sgl_ess.sim v4`)",
        f"  to host (ESS's host store, dsv4/c4_store.py): the C4 entries, 1 per 4 tokens in each of the {c4} C4 "
        "layers",
        f"    entry: SGLang's V4 FP8 row, {e4} B (FP8 NoPE, a scale byte per 64 values + 1 pad, BF16 RoPE; the "
        f"layout of a GPU node's V4 pool): host bytes per token {v['host_bytes_per_token']:g} = {c4} C4 layers x "
        f"{e4} B / 4",
        f"    host store: {_gb(v['host_store_bytes'])} = {v['c4_locations']} C4 locations (the {v['pool_tokens']}-"
        f"location KV pool // 4: whole 256-token pages of --max-total-tokens {sizing['tokens']} + SGLang's padding "
        f"page) x {c4} C4 layers x {v['entry_bytes']} B; an entry lives at its block's last token location // 4, "
        "as in SGLang's pool, so the radix cache shares it",
        f"  on the device, per request (SGLang's V4 layout, at {v['context_tokens']} context tokens): "
        f"{_gb(v['device_bytes_per_request_total'])} = window {_gb(dev['window'])} (fixed per request: "
        f"{v['layers']} layers x {window_rows} rows, the {v['window_tokens']}-token window in "
        f"{v['swa_page_tokens']}-token SWA pages, worst case, x {e4} B) + C128 entries {_gb(dev['c128_entries'])} "
        f"+ C4 index keys {_gb(dev['c4_index_keys'])} ({v['indexer_bytes_per_entry']} B per entry) + compressor "
        f"state {_gb(dev['compressor_state'])}",
        f"  hot buffer: {v['hot_entries_per_request']} C4 entries per request and C4 layer ({v['hot_source']}; "
        f"needs >= index_topk + 1 = {v['index_topk'] + 1}): {c4} x {v['hot_entries_per_request']} x "
        f"{v['entry_bytes']} B = {_gb(v['hot_buffer_bytes_per_request'])} per request; the store's slot space and LRU "
        f"state for {v['request_rows']} request rows: {_gb(v['store_device_bytes'])}",
        "    by tensor: " + ", ".join(f"{k} {_gb(b)}" for k, b in v["store_device_allocation"].items() if b),
        "  in this CPU slice the device side is host memory too: the arm's float32 side rows (window rows "
        "rounded as the FP8 layout, compressor projections; grown on demand) and SGLang's own V4 pool (its FP8 "
        f"layout), {sizing['tokens']} "
        f"tokens ({pool_source})",
    ] + _v4_mtp_lines(v, fields or {}) + [
        "  (SGLang's own resolution and the model load run at launch, not here)",
    ]


def _v4_mtp_lines(v: dict, fields: dict) -> list[str]:
    """MTP on DeepSeek-V4 (EAGLE / NEXTN through its NextN layer, chain drafts)."""
    algo = fields.get("speculative_algorithm")
    if not algo:
        return []
    n = fields.get("speculative_num_draft_tokens")
    per_layer = v["device_bytes_per_request"]["window"] // max(1, v["layers"])
    return [
        f"  MTP (--speculative-algorithm {algo}, {n} draft tokens per verify): each verify resolves its {n} "
        f"top-{v['index_topk']} sets per request as ONE union per C4 layer through the hot buffer (entries past "
        f"it read from host rows for that step; the drafts' own entries never stored); the draft's NextN layer is "
        f"window-only (compress ratio 0): no host store, its window on the device, {_gb(per_layer)} per request "
        "(1 layer, the target's window rows per layer)",
    ]
