"""One frozen ESS configuration, built from ``--ess-*`` flags, an ``--ess-config`` YAML file
and ``SGLESS_*`` environment variables, validated once.

Precedence (later wins): defaults < YAML file < environment < command-line flags.
The YAML format is the user's (ESS.md §5)::

    inference_engine: {model_name: ..., attention_mode: sparse, decode_batch_size: 64}
    ess_config:
      enabled: true
      offload_target: cpu_memory
      prefetch_overlap_level: full      # none | da | dba | full
      max_gpu_buffer_size_gb: 16
      memory_pool_size_gb: 200

No torch, no sglang here: this module is imported by the launcher before anything heavy.
The validated config travels to SGLang's scheduler processes as JSON in ``SGLESS_CONFIG``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from sgl_ess.prefetch.predictors import PREDICTORS   # a name table only: imports nothing heavy

# Prefix SGLESS_, not SGL_: SGLang rewrites every SGL_* variable to SGLANG_* with a warning.
ENV_CONFIG_JSON = "SGLESS_CONFIG"  # validated config, JSON; set by the launcher for child processes

OFFLOAD_TARGETS = ("cpu_memory",)
OVERLAP_LEVELS = ("none", "da", "dba", "full")
PREFETCH_ENGINES = ("auto", "worker", "stream", "inline")
ATTENTION_MODES = ("sparse",)
SPECULATIVE_PREFETCH = tuple(PREDICTORS)          # off, next_layer, last_step, score_ema, lstm
SHARE_HOST_POOL = ("auto", "on", "off")


class EssConfigError(ValueError):
    """A configuration value was refused. The message names the key, the value and what is allowed."""


@dataclass(frozen=True)
class EssField:
    name: str
    type: type
    default: Any
    help: str
    choices: tuple = ()
    minimum: float | None = None


# The one table of ESS settings: flag ``--ess-<name with dashes>``, YAML ``ess_config.<name>``,
# env ``SGLESS_<NAME>``.
FIELDS: tuple[EssField, ...] = (
    EssField("enabled", bool, True,
             "Keep the latent history in the host pool and only top-k hot rows per request on the device. "
             "false = SGLang's own layout (every latent in the device pool)."),
    EssField("offload_target", str, "cpu_memory", "Where the full latent history lives.", OFFLOAD_TARGETS),
    EssField("prefetch_overlap_level", str, "da",
             "Hide host->device fetches behind compute: none (fetch, then attend) | da (dual attention: attend "
             "to the resident rows while the misses are in flight, merge by log-sum-exp) | dba (dual-batch: "
             "split the batch in two, each half's fetch hides behind the other's indexer and attention) | full "
             "(per-layer choice from --ess-overlap-profile).", OVERLAP_LEVELS),
    EssField("prefetch_engine", str, "auto",
             "Who moves rows: worker (a prefetch process per model runner, coordinated over ZMQ, sharing the host "
             "pool and staging ring; CPU) | stream (zero-copy kernels on a side CUDA stream of the scheduler; "
             "GPU) | inline (the scheduler thread itself; the fallback) | auto (stream on CUDA; on CPU the worker "
             "when the machine has >= 4 cores, else inline: on 2 cores the worker only competes with the model).",
             PREFETCH_ENGINES),
    EssField("overlap_profile", str, "",
             "JSON file with the per-layer overlap mode for prefetch_overlap_level=full (write one with "
             "`python -m bench prefetch --write-profile FILE`). Empty = the packaged profile "
             "(sgl_ess/attention/profiles/default.json, measured on a 2-core CPU)."),
    EssField("ring_slots", int, 0,
             "Staging-ring rows per ring group (landed misses wait here until committed to their LRU slots). "
             "0 = max-running-requests x index_topk / 8. A full ring places the overflow straight in hot slots.",
             minimum=0),
    EssField("max_gpu_buffer_size_gb", float, 0.0,
             "Device memory for all hot buffers together, in GB. 0 = derive from --ess-hot-slots-per-request "
             "x --max-running-requests.", minimum=0.0),
    EssField("memory_pool_size_gb", float, 0.0,
             "Host memory for the latent history of all requests, in GB per NODE, split evenly over the node's "
             "host pools (one per rank, or one per attention-TP group sharing it). 0 = a default: from "
             "--max-total-tokens when given, else on CUDA the node's usable host memory, on CPU 65536 tokens "
             "per pool (--ess-explain shows which).", minimum=0.0),
    EssField("hot_slots_per_request", int, 0,
             "Device latent slots per request per layer (the hot buffer). Must be >= the model's index_topk + 1. "
             "0 = derive from --ess-max-gpu-buffer-size-gb, else 4 x index_topk.", minimum=0),
    EssField("speculative_prefetch", str, "off",
             "Speculative prefetch tier: stage rows a layer will probably select before it plans, with spare "
             "bandwidth only (never needed for correctness): off | next_layer (layer l+1 selects what layer l "
             "selected) | last_step (a layer selects what it selected last step) | score_ema (positions by an "
             "exponential moving average of how often the layer selected them) | lstm (a small learned model; "
             "needs --ess-predictor-checkpoint). The predictor runs on the scheduler thread after each plan.",
             SPECULATIVE_PREFETCH),
    EssField("predictor_checkpoint", str, "",
             "Checkpoint of the lstm predictor, loaded at start (train one with `python -m "
             "sgl_ess.prefetch.train_lstm --trace FILE --out CKPT`); a missing or incompatible file is refused. "
             "Required with speculative_prefetch=lstm, ignored otherwise."),
    EssField("predictor_min_precision", float, 0.1,
             "Learning-augmented LRU: when the speculative predictor's precision (rows used / rows staged) over "
             "the last --ess-predictor-window predictions drops below this, stage nothing (plain LRU) and keep "
             "scoring its predictions in shadow; stage again once they reach it. 0 = never fall back.",
             minimum=0.0),
    EssField("predictor_window", int, 64,
             "Predictions (one per plan that staged rows) over which --ess-predictor-min-precision is measured.",
             minimum=1),
    EssField("trace_file", str, "",
             "Record every layer's top-k of every plan (plus opens, closes, warmups and reserved rows) to this "
             "JSONL file (format sgl_ess.topk_trace/1) for offline study: `python -m bench prefetch --predictors "
             "... --trace FILE`, `python -m sgl_ess.prefetch.train_lstm`. {pid} in the path becomes the process id "
             "(one file per scheduler rank); an existing file is refused. Measurement only: it copies indices to "
             "the host every layer. Empty = off."),
    EssField("spec_slots", int, 0,
             "Rows per layer parity for speculative staging. 0 = max-running-requests x index_topk / 8 when "
             "speculative_prefetch is on.", minimum=0),
    EssField("warmup_queries", int, 32,
             "Prefill query positions whose top-k ids pre-load the hot buffer before the first decode step.",
             minimum=0),
    EssField("lock_host_memory", bool, False,
             "mlock the host latent pool and (on CPU) the slot space, in the scheduler and the prefetch worker, so "
             "latent rows are never swapped to disk. Needs RLIMIT_MEMLOCK >= those bytes per process (ulimit -l; "
             "systemd LimitMEMLOCK; docker --ulimit memlock) or CAP_IPC_LOCK; checked before the model loads. "
             "Latent mappings are excluded from core dumps and sealed against resizing with or without it."),
    EssField("share_host_pool", str, "auto",
             "With attention TP > 1: one host pool per attention-TP group per node, shared by its ranks (one owner "
             "writes, the others map it and read after the owner's per-layer write count) | off (every rank its own "
             "copy) | auto (shared on CPU; on CUDA one per rank, since the CUDA ordering - stream memory operations "
             "on the owner's and readers' compute streams - has not run on a GPU) | on (shared on CUDA too; needs "
             "--ess-prefetch-engine stream or auto).", SHARE_HOST_POOL),
    EssField("tp_split_fetch", bool, False,
             "With attention TP > 1: each rank reads 1/tp of a step's misses from host memory and the attention-TP "
             "group all-gathers them, so each rank's host reads drop to 1/tp (MLA rows are the same on every rank). "
             "Trades host-link bytes for an all-gather per layer-step; `python -m bench tp_split` measures it. "
             "Ignored with attention TP 1."),
    EssField("cuda_graph", bool, False,
             "CUDA: let SGLang capture ESS decode steps in CUDA graphs (decode graphs only; prefill graphs stay off). "
             "Off: --cuda-graph-backend-{decode,prefill} disabled is added, and a decode graph flag of the user's is "
             "refused. NOT YET RUN ON A GPU: capture and replay are checked on CPU by a graph double (ops recorded "
             "once and replayed on the same tensors). With MTP the target verify and draft decode steps are captured "
             "too; the draft extend runs eager (SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1 is set unless given); "
             "Two-Batch Overlap's decode and verify children are captured too. Needs the stream prefetch engine; "
             "refused with --ess-speculative-prefetch, --ess-share-host-pool on and SGLANG_ENABLE_METADATA_GLUE_GRAPH "
             "(--ess-tp-split-fetch's fixed-size exchange is captured). Ignored without CUDA."),
    EssField("slo_tpot_ms", float, 0.0,
             "Decode TPOT target in ms: new requests are admitted only while the measured inter-token latency "
             "(percentile --ess-slo-itl-percentile of recent decode steps) stays within it; running requests are "
             "never preempted. 0 = off (SGLang's own batching). Needs attention TP 1.", minimum=0.0),
    EssField("slo_itl_percentile", float, 50.0,
             "Which percentile of recent decode-step times the SLO target applies to (50 = median).",
             minimum=1.0),
    EssField("slo_min_batch", int, 1,
             "The SLO controller never caps running requests below this.", minimum=1),
    EssField("enable_mtp", bool, None,
             "MTP (speculative multi-token: EAGLE / NextN) compatibility mode. Unset = follow SGLang's "
             "--speculative-algorithm; true requires it (EAGLE or NEXTN, --speculative-eagle-topk 1); false refuses "
             "it. Checked at launch (integration/sglang/launcher/compat.py)."),
    EssField("enable_two_batch_overlap", bool, None,
             "Two-Batch-Overlap compatibility mode. Unset = follow SGLang's --enable-two-batch-overlap; true requires "
             "it, false refuses it. TBO needs GPUs with expert parallelism or DP attention: refused on CPU."),
)
FIELD_BY_NAME = {f.name: f for f in FIELDS}


@dataclass(frozen=True)
class EssConfig:
    enabled: bool = True
    offload_target: str = "cpu_memory"
    prefetch_overlap_level: str = "da"
    prefetch_engine: str = "auto"
    overlap_profile: str = ""
    ring_slots: int = 0
    max_gpu_buffer_size_gb: float = 0.0
    memory_pool_size_gb: float = 0.0
    hot_slots_per_request: int = 0
    speculative_prefetch: str = "off"
    predictor_checkpoint: str = ""
    predictor_min_precision: float = 0.1
    predictor_window: int = 64
    trace_file: str = ""
    spec_slots: int = 0
    warmup_queries: int = 32
    lock_host_memory: bool = False
    share_host_pool: str = "auto"
    tp_split_fetch: bool = False
    cuda_graph: bool = False
    slo_tpot_ms: float = 0.0
    slo_itl_percentile: float = 50.0
    slo_min_batch: int = 1
    enable_mtp: bool | None = None                 # None: follow SGLang's --speculative-algorithm
    enable_two_batch_overlap: bool | None = None   # None: follow SGLang's --enable-two-batch-overlap
    # Keys of ``inference_engine`` in the YAML file, mapped onto SGLang flags by the launcher.
    engine: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["engine"] = dict(self.engine)
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "EssConfig":
        return cls(**json.loads(text))

    def summary(self) -> str:
        parts = [f"{f.name}={getattr(self, f.name)}" for f in FIELDS]
        return "ESS config: " + ", ".join(parts)


def _coerce(f: EssField, value: Any, source: str) -> Any:
    where = f"{source} key '{f.name}'"
    if f.type is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
        raise EssConfigError(f"{where}: got {value!r}; expected true or false")
    if f.type in (int, float):
        if isinstance(value, bool):
            raise EssConfigError(f"{where}: got {value!r}; expected a number")
        try:
            out = f.type(value)
        except (TypeError, ValueError):
            raise EssConfigError(f"{where}: got {value!r}; expected {'an integer' if f.type is int else 'a number'}")
        if f.type is int and isinstance(value, float) and value != int(value):
            raise EssConfigError(f"{where}: got {value!r}; expected an integer")
        if f.minimum is not None and out < f.minimum:
            raise EssConfigError(f"{where}: got {value!r}; expected a value >= {f.minimum:g}")
        return out
    out = str(value)
    if f.choices and out not in f.choices:
        raise EssConfigError(f"{where}: got {value!r}; allowed: {', '.join(f.choices)}")
    return out


def _validate_engine(engine: Mapping[str, Any], source: str) -> dict:
    allowed = {"model_name", "attention_mode", "decode_batch_size"}
    unknown = sorted(set(engine) - allowed)
    if unknown:
        raise EssConfigError(f"{source} key 'inference_engine.{unknown[0]}': unknown; allowed: {', '.join(sorted(allowed))}")
    out = dict(engine)
    if "attention_mode" in out and out["attention_mode"] not in ATTENTION_MODES:
        raise EssConfigError(f"{source} key 'inference_engine.attention_mode': got {out['attention_mode']!r}; "
                             f"allowed: {', '.join(ATTENTION_MODES)} (ESS needs a sparse-attention model)")
    if "decode_batch_size" in out:
        v = out["decode_batch_size"]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise EssConfigError(f"{source} key 'inference_engine.decode_batch_size': got {v!r}; expected an integer >= 1")
    return out


def load_yaml(path: str) -> dict:
    import yaml

    try:
        with open(path) as fh:
            data = yaml.safe_load(fh) or {}
    except FileNotFoundError:
        raise EssConfigError(f"--ess-config: file {path!r} does not exist")
    except yaml.YAMLError as e:
        raise EssConfigError(f"--ess-config: {path!r} is not valid YAML: {e}")
    if not isinstance(data, dict):
        raise EssConfigError(f"--ess-config: {path!r} must hold a mapping with an 'ess_config' block; got {type(data).__name__}")
    unknown = sorted(set(data) - {"ess_config", "inference_engine"})
    if unknown:
        raise EssConfigError(f"{path}: unknown top-level key {unknown[0]!r}; allowed: ess_config, inference_engine")
    return data


def build_config(yaml_path: str | None = None, flags: Mapping[str, Any] | None = None,
                 environ: Mapping[str, str] | None = None) -> EssConfig:
    """Merge defaults < YAML < environment < flags and validate every value once.

    ``flags`` maps field names to values given on the command line (None = not given).
    Raises EssConfigError naming the key, the value received and what is allowed.
    """
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {f.name: f.default for f in FIELDS}
    engine: dict = {}
    if yaml_path:
        data = load_yaml(yaml_path)
        block = data.get("ess_config") or {}
        if not isinstance(block, dict):
            raise EssConfigError(f"{yaml_path} key 'ess_config': expected a mapping, got {type(block).__name__}")
        for k, v in block.items():
            if k not in FIELD_BY_NAME:
                raise EssConfigError(f"{yaml_path} key 'ess_config.{k}': unknown; allowed: {', '.join(FIELD_BY_NAME)}")
            values[k] = _coerce(FIELD_BY_NAME[k], v, yaml_path)
        engine = _validate_engine(data.get("inference_engine") or {}, yaml_path)
    for f in FIELDS:
        env_name = "SGLESS_" + f.name.upper()
        if env_name in environ:
            values[f.name] = _coerce(f, environ[env_name], f"environment variable {env_name}:")
    for name, v in (flags or {}).items():
        if v is not None:
            values[name] = _coerce(FIELD_BY_NAME[name], v, "flag --ess-" + name.replace("_", "-") + ":")
    cfg = EssConfig(**values, engine=engine)
    _check_consistency(cfg)
    return cfg


def _check_consistency(cfg: EssConfig) -> None:
    if cfg.overlap_profile:
        if not os.path.isfile(cfg.overlap_profile):
            raise EssConfigError(f"key 'overlap_profile': file {cfg.overlap_profile!r} does not exist")
    if cfg.speculative_prefetch == "lstm" and not cfg.predictor_checkpoint:
        raise EssConfigError("key 'speculative_prefetch': 'lstm' needs a trained model; set predictor_checkpoint "
                             "(--ess-predictor-checkpoint; train one with `python -m sgl_ess.prefetch.train_lstm "
                             "--trace FILE --out CKPT`)")
    if cfg.predictor_checkpoint and not os.path.isfile(cfg.predictor_checkpoint):
        raise EssConfigError(f"key 'predictor_checkpoint': file {cfg.predictor_checkpoint!r} does not exist")
    if cfg.predictor_min_precision > 1.0:
        raise EssConfigError(f"key 'predictor_min_precision': got {cfg.predictor_min_precision!r}; expected a "
                             "fraction in [0, 1]")
    # enable_mtp / enable_two_batch_overlap are checked against SGLang's own flags at launch, where
    # those are known (sgl_ess/integration/sglang/launcher/compat.py).


def config_from_env(environ: Mapping[str, str] | None = None) -> EssConfig | None:
    """The config the launcher validated, or None when this process was not started by it."""
    environ = os.environ if environ is None else environ
    text = environ.get(ENV_CONFIG_JSON)
    return EssConfig.from_json(text) if text else None
