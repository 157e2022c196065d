"""Every SGLang 0.5.23 symbol sgl-ess hooks or registers into, in one table.

``PATCHED`` are monkeypatches applied through SGLang's ``HookRegistry`` (each one explained in
patches/README.md: why the official seams were not enough). ``SEAMS`` are the official
extension points used. tests/integration/test_patch_targets.py resolves every entry against the
installed SGLang and fails, naming the entry, if one disappears.
"""

SGLANG_VERSION = "0.5.23"
ESS_BACKEND_NAME = "ess"

MODEL_SPECIFIC_ADJUSTMENTS = "sglang.srt.arg_groups.model_hook.handle_model_specific_adjustments"
INDEXER_FORWARD_NATIVE = "sglang.srt.layers.attention.dsa.dsa_indexer.Indexer.forward_native"
REQ_ROWS_FREE = "sglang.srt.mem_cache.memory_pool.ReqToTokenPool.free_rows"
DECODE_REQ_ROWS_ALLOC = "sglang.srt.disaggregation.decode.DecodeReqToTokenPool.alloc"
DECODE_REQ_ROWS_FREE = "sglang.srt.disaggregation.decode.DecodeReqToTokenPool.free"
PD_METADATA_INIT = "sglang.srt.disaggregation.utils.MetadataBuffers.__init__"
PD_METADATA_BUF_INFOS = "sglang.srt.disaggregation.utils.MetadataBuffers.get_buf_infos"
PD_METADATA_CLEAR_SLOT = "sglang.srt.disaggregation.utils.MetadataBuffers.clear_slot"
PD_METADATA_SET_BUF = "sglang.srt.disaggregation.utils.MetadataBuffers.set_buf"
PD_DECODE_COMMIT = "sglang.srt.disaggregation.decode.DecodeTransferQueue._commit_transfer_to_req"
PD_KV_MANAGER_INIT = "sglang.srt.disaggregation.common.conn.CommonKVManager.__init__"
MOONCAKE_SENDER = "sglang.srt.disaggregation.mooncake.conn.MooncakeKVSender"
PAGES_RELEASE = "sglang.srt.mem_cache.allocator.paged.PagedTokenToKVPoolAllocator._release_page_ids"
ALLOCATOR_CLEAR = "sglang.srt.mem_cache.allocator.paged.PagedTokenToKVPoolAllocator.clear"
DUMMY_WEIGHTS_INIT = "sglang.srt.model_loader.weight_utils.initialize_dummy_weights"
WEIGHTS_GROUP_INIT = "sglang.srt.model_executor.model_runner_components.weight_updater.init_custom_process_group"
SEND_GROUP_INIT = "sglang.srt.model_executor.model_runner_components.weight_exporter.init_custom_process_group"
REMOTE_GROUP_INIT = "sglang.srt.connector.remote_instance.init_custom_process_group"
DSA_BACKEND_CLASS = "sglang.srt.layers.attention.dsa_backend.DeepseekSparseAttnBackend"
DSA_MULTISTEP_CLASS = "sglang.srt.layers.attention.dsa_backend.DeepseekSparseAttnMultiStepBackend"
INDEXER_FORWARD_CUDA = "sglang.srt.layers.attention.dsa.dsa_indexer.Indexer.forward_cuda"
POOL_CELL_SIZE = "sglang.srt.model_executor.pool_configurator.DefaultPoolConfigurator._compute_cell_size"
POOL_BUDGET = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._profile_available_bytes"
RESOLVE_KV_POOL_CLASS = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._resolve_kv_pool_class"
UPDATE_HANDLERS = ("sglang.srt.managers.scheduler_components.internal_state."
                   "SchedulerInternalStateController._update_handlers")
INTERNAL_STATE = ("sglang.srt.managers.scheduler_components.internal_state."
                  "SchedulerInternalStateController.get_internal_state")
SET_EMBED_AND_HEAD = "sglang.srt.models.deepseek_v2.DeepseekV2ForCausalLM.set_embed_and_head"
DRAFT_BACKEND_CREATE = "sglang.srt.speculative.draft_utils.DraftBackendFactory._create_backend"
GET_LAST_LOC = "sglang.srt.mem_cache.allocation.get_last_loc"
DSA_POOL_CPU_COPY = "sglang.srt.mem_cache.memory_pool.DSATokenToKVPool.get_cpu_copy"
DSA_POOL_LOAD_CPU_COPY = "sglang.srt.mem_cache.memory_pool.DSATokenToKVPool.load_cpu_copy"
NEXTN_POST_LOAD = "sglang.srt.models.deepseek_nextn.DeepseekV3ForCausalLMNextN.post_load_weights"
HYV4_NEXTN_POST_LOAD = "sglang.srt.models.hunyuan_v4_nextn.HYV4ForCausalLMNextN.post_load_weights"
DSV4_NEXTN_POST_LOAD = "sglang.srt.models.deepseek_v4_nextn.DeepseekV4ForCausalLMNextN.post_load_weights"
SCHEDULER_INIT_INFO = "sglang.srt.managers.scheduler.Scheduler.get_init_info"
SCHEDULER_RUN_BATCH = "sglang.srt.managers.scheduler.Scheduler.run_batch"
SCHEDULER_PROCESS_RESULT = "sglang.srt.managers.scheduler.Scheduler.process_batch_result"
SCHEDULER_ALLOCATABLE = "sglang.srt.managers.scheduler.Scheduler.get_num_allocatable_reqs"
BATCH_INVARIANT_MODE = "sglang.srt.model_executor.model_runner.ModelRunner.maybe_enable_batch_invariant_mode"
STOP_STR_CHECK = "sglang.srt.managers.schedule_batch.Req._check_str_based_finish"
GRAMMAR_COMPILE = "sglang.srt.constrained.base_grammar_backend.BaseGrammarBackend._init_value_dispatch"

# DeepSeek-V4 on CPU with ESS off (dsv4/): stand-ins for CUDA-only calls, installed only without CUDA
DSV4_GET_ROPE_WRAPPER = "sglang.srt.models.deepseek_v4.get_rope_wrapper"
DSV4_Q_NORM_ROPE = "sglang.srt.models.deepseek_v4.fused_q_norm_rope"
DSV4_NORM_ROPE_INPLACE = "sglang.srt.models.deepseek_v4.fused_norm_rope_inplace"
DSV4_ROPE_INPLACE = "sglang.srt.models.deepseek_v4.fused_rope_inplace"
DSV4_HC_SPLIT_SINKHORN = "sglang.kernels.ops.layernorm.mhc.hc_split_sinkhorn"
DSV4_MHC_COMBINE = "sglang.kernels.ops.layernorm.mhc.mhc_combine"
DSV4_FUSED_HC_HEAD = "sglang.kernels.ops.layernorm.mhc_head.fused_hc_head"
DSV4_CHAT_ADAPTER = "sglang.srt.entrypoints.openai.chat_encoding_adapters.build_chat_encoding_adapter"
DSV4_POOL_CONFIGURE = "sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator.configure"
DSV4_CLEAR_C128_DRAFTS = ("sglang.srt.mem_cache.deepseek_v4_memory_pool.DeepSeekV4TokenToKVPool."
                          "clear_unaccepted_c128_draft_states")
DSV4_SET_EMBED_AND_HEAD = "sglang.srt.models.deepseek_v4.DeepseekV4ForCausalLM.set_embed_and_head"
DSV4_DRAFT_DECODE = "sglang.srt.speculative.draft_utils.DraftBackendFactory._create_dsv4_decode_backend"
DSV4_DRAFT_EXTEND = "sglang.srt.speculative.draft_utils.DraftBackendFactory._create_dsv4_prefill_backend"

# sgl-kernel CPU ops SGLang's EAGLE path calls on CPU (the CPU stand-in lacks them): REPLACE with torch
# versions in backends/eagle_cpu_kernels.py. The names exist only in CPU-engine processes (SGLANG_USE_CPU_ENGINE=1,
# set by the launcher without CUDA), so they are checked by tests/integration/test_spec_cpu_ops.py,
# not with PATCHED.
SPEC_CPU_OPS = {
    "sglang.kernels.ops.speculative.cache_locs.assign_draft_cache_locs_contiguous_cpu": "draft write locations",
    "sglang.kernels.ops.speculative.cache_locs.assign_extend_cache_locs_cpu": "verify / extend write locations",
    "sglang.kernels.ops.speculative.eagle.fill_bonus_tokens_cpu": "each request's bonus token after verify",
    "sglang.kernels.ops.speculative.eagle.fill_accept_out_cache_loc_cpu": "locations of accepted tokens",
    "sglang.kernels.ops.speculative.spec_tree.sgl_build_tree_kernel_efficient_cpu": "the draft tree (chain)",
    "sglang.kernels.ops.speculative.spec_tree.sgl_verify_tree_greedy_cpu": "greedy verification",
}

PATCHED = {
    WEIGHTS_GROUP_INIT: "AROUND: a call without timeout= gets --guard-blocking-timeout-s (torch's default: 30 min), "
                        "so a silent peer of /init_weights_update_group cannot hold the scheduler longer "
                        "(routes/rendezvous_bound.py)",
    SEND_GROUP_INIT: "AROUND: the same for the remote-instance weight send group",
    REMOTE_GROUP_INIT: "AROUND: the same for the remote-instance connector's group",
    MODEL_SPECIFIC_ADJUSTMENTS: "AROUND: answer torch.cuda.get_device_capability() with (9, 0) during DSA "
                                "argument resolution when CUDA is absent",
    INDEXER_FORWARD_NATIVE: "REPLACE: exact pure-torch lightning indexer (SGLang raises NotImplementedError)",
    REQ_ROWS_FREE: "AFTER: close the ESS hot buffer of every freed request row (finish/abort/retract)",
    DECODE_REQ_ROWS_ALLOC: "AROUND (PD decode node): open a cold hot buffer for each row given to a new request "
                           "(its KV comes by transfer; no extend opens it)",
    DECODE_REQ_ROWS_FREE: "BEFORE (PD decode node): close the hot buffer of the freed row",
    PD_METADATA_INIT: "AFTER (PD, ESS on): one more metadata buffer, the warm hot-buffer state (pd_warmup.py)",
    PD_METADATA_BUF_INFOS: "AFTER (PD, ESS on): register that buffer last, so SGLang's transfer carries it",
    PD_METADATA_CLEAR_SLOT: "AFTER (PD, ESS on): a freed metadata slot holds no warm state",
    PD_METADATA_SET_BUF: "AFTER (PD prefill, ESS on): write the request's warm state (LRU order per layer)",
    PD_DECODE_COMMIT: "BEFORE (PD decode, ESS on): warm the request's hot buffer from it when its KV has landed",
    PD_KV_MANAGER_INIT: "BEFORE (PD): KV buffers in the ESS host pool are NIXL memory kind DRAM; AFTER "
                        "(Mooncake): the manager's peer-layout validation also refuses a decode peer "
                        "whose latent page bytes differ (pd_layout.py)",
    PAGES_RELEASE: "BEFORE: zero the host rows of token pages SGLang frees (rows hold user data)",
    ALLOCATOR_CLEAR: "BEFORE: zero every host row when SGLang clears its allocator (flush_cache)",
    DUMMY_WEIGHTS_INIT: "AROUND: with SGLESS_DUMMY_INIT=scaled, unit-variance random weights (embedded model)",
    INTERNAL_STATE: "AFTER (three hooks): ESS host-pool / hot-buffer usage (ess), the pool split / queue "
                    "(ess_ops) and the EAGLE draft runner's store (ess.draft) into the scheduler's internal state",
    SCHEDULER_INIT_INFO: "AFTER: once per scheduler when it is ready: memory report, metrics thread",
    SCHEDULER_RUN_BATCH: "AFTER (--ess-slo-tpot-ms only): the end of each decode step, the SLO controller's sample; "
                         "AROUND (launcher-started processes): the step watchdog times it (scheduler_watchdog.py)",
    SCHEDULER_PROCESS_RESULT: "AROUND (launcher-started processes): the step watchdog times it (scheduler_watchdog.py)",
    SCHEDULER_ALLOCATABLE: "AROUND (--ess-slo-tpot-ms only): new requests admitted up to the SLO controller's cap",
    BATCH_INVARIANT_MODE: "AROUND: without CUDA/XPU, deterministic mode skips SGLang's GPU-only batch-invariant "
                          "kernels (seeded sampling stays on)",
    DSA_BACKEND_CLASS: "REPLACE (CUDA, ESS on): SGLang's DSA backend subclass whose decode reads the slot space",
    DSA_MULTISTEP_CLASS: "REPLACE (CUDA, ESS on): its EAGLE draft container's subclass that gives ESS the draft "
                         "graph's capture batch, warm-ups and replays (cuda_multistep.py)",
    INDEXER_FORWARD_CUDA: "AROUND (CUDA, ESS on): submit a decode batch's miss fetch right after its top-k",
    POOL_CELL_SIZE: "AROUND (CUDA, ESS on): price a token's GPU bytes without its latent row (it lives on the host)",
    POOL_BUDGET: "AROUND (CUDA, ESS on): take the ESS store's device bytes out of SGLang's pool budget",
    RESOLVE_KV_POOL_CLASS: "AROUND: ESS on -> the DSA pool class gets host-backed latent buffers (host_pool_class.py)",
    SET_EMBED_AND_HEAD: "AROUND: EAGLE/NextN draft shares embed + LM head; no torch.cuda sync calls without CUDA",
    DRAFT_BACKEND_CREATE: "AROUND: add 'ess' to the EAGLE draft backend factory's hard-coded backend maps",
    GET_LAST_LOC: "AROUND: EAGLE decode allocation on CPU tensors uses SGLang's torch get_last_loc "
                  "(its dispatch keys on the backend name)",
    DSA_POOL_CPU_COPY: "AROUND (no CUDA): a PD decode node's retraction backup of a request's KV and index "
                       "keys; no torch.cuda.synchronize calls without CUDA",
    DSA_POOL_LOAD_CPU_COPY: "AROUND (no CUDA): its restore when the retracted request resumes; the same",
    NEXTN_POST_LOAD: "BEFORE: with SGLESS_DUMMY_INIT=scaled, shape the embedded model's random MTP layer "
                     "(sgl_ess/models/mtp_init.py) so drafts are sometimes accepted",
    HYV4_NEXTN_POST_LOAD: "BEFORE: the same for Hunyuan V4's MTP layer (its own post_load_weights, which does not "
                          "reach DeepseekV3ForCausalLMNextN's)",
    DSV4_NEXTN_POST_LOAD: "BEFORE: the same for DeepSeek-V4's MTP layer (e_proj / h_proj, its own post_load_weights)",
    STOP_STR_CHECK: "AROUND (launcher-started processes): stop_regex searched with RE2, or Python re under a "
                    "deadline, within --guard-pattern-budget-ms per request and step (observe/pattern_eval.py)",
    GRAMMAR_COMPILE: "AFTER (launcher-started processes): a compiled grammar whose start allows no token becomes "
                     "SGLang's InvalidGrammarObject (a 400, not a 500 at the first step; observe/grammar_check.py)",
    UPDATE_HANDLERS: "AFTER: accept ess_prefetch_overlap_level in /set_internal_state (runtime level switch)",
    DSV4_GET_ROPE_WRAPPER: "AROUND (no CUDA): a V4 window-only layer's rotary_emb (unused off NPU) without "
                           "rope_scaling gets SGLang's plain get_rope, not get_rope_cpu's assert (dsv4/rope_table.py)",
    DSV4_POOL_CONFIGURE: "AROUND (no CUDA, V4 runner only): V4's own packed-FP8 pool passes the CPU MHA FP8 check "
                         "(AMX + intel_amx), which is for a quant V4 never uses (dsv4/pool_check.py)",
    DSV4_CLEAR_C128_DRAFTS: "AROUND (CPU pool): nothing to clear after an MTP verify; the CPU dsv4 arm keeps no "
                            "compressor state in the pool (dsv4/pool_check.py)",
    DSV4_SET_EMBED_AND_HEAD: "AROUND (no CUDA): EAGLE's draft shares V4's embedding and LM head; torch.cpu has no "
                             "empty_cache for its closing call (dsv4/embed_head.py)",
    DSV4_DRAFT_DECODE: "AROUND (CPU draft runner): EAGLE's multi-step draft decode container of CPU dsv4 arms "
                       "(dsv4/draft_backends.py), not the CUDA trtllm / HIP one",
    DSV4_DRAFT_EXTEND: "AROUND (CPU draft runner): the draft extend's CPU dsv4 arm, not the CUDA trtllm backend",
    DSV4_Q_NORM_ROPE: "AROUND (no CUDA, CPU tensors): V4's query head norm + RoPE in torch (dsv4/norm_rope.py)",
    DSV4_NORM_ROPE_INPLACE: "AROUND (no CUDA, CPU tensors): V4's window row norm + RoPE in torch (dsv4/norm_rope.py)",
    DSV4_ROPE_INPLACE: "AROUND (no CUDA, CPU tensors): V4's (inverse) RoPE of the output in torch (dsv4/norm_rope.py)",
    DSV4_HC_SPLIT_SINKHORN: "AROUND (no CUDA, CPU tensors): V4's hyper-connection pre/post/comb split with "
                            "Sinkhorn in torch, not TileLang (dsv4/hyper_connections.py)",
    DSV4_FUSED_HC_HEAD: "AROUND (no CUDA, CPU tensors): the last hyper-connection by SGLang's own torch "
                        "hc_head_torch, not Triton (dsv4/hyper_connections.py)",
    DSV4_CHAT_ADAPTER: "AROUND (no CUDA, V4 chat spec, deepseek-recipe not installed): an adapter that refuses "
                       "chat requests with SGLang's install hint, so the server starts and /generate serves "
                       "(dsv4/chat_encoding.py)",
    DSV4_MHC_COMBINE: "AROUND (no CUDA, CPU tensors): V4's hyper-connection combine in torch, not Triton "
                      "(dsv4/hyper_connections.py)",
}

SEAMS = {
    "sglang.srt.plugins.load_plugins": "entry point group sglang.srt.plugins, called in every process",
    "sglang.srt.plugins.hook_registry.HookRegistry.register": "applies the PATCHED hooks",
    "sglang.srt.layers.attention.attention_registry.register_attention_backend": "registers 'ess'",
    "sglang.srt.arg_groups.resolution_hooks.register_resolution_hook":
        "compat.py: refuse flag combinations ESS does not serve (step handle_other_validations)",
    "sglang.srt.arg_groups.choices.add_attention_backend_choices": "lets --attention-backend accept 'ess'",
    "sglang.srt.models.deepseek_common.attention_backend_handler.AttentionBackendRegistry.register":
        "DeepSeek attention takes the absorbed-MLA path under 'ess'",
    "sglang.srt.layers.attention.base_attn_backend.AttentionBackend": "base class of the ess backend",
    "sglang.srt.mem_cache.memory_pool.DSATokenToKVPool.kv_buffer": "latent buffers aliased to the host pool",
    "sglang.srt.entrypoints.http_server.app": "FastAPI app: the /ess/status route",
    "sglang.srt.model_executor.forward_context.get_req_to_token_pool": "indexer reads req_to_token",
    "sglang.srt.model_executor.forward_context.get_token_to_kv_pool": "indexer reads/writes index keys",
    # operations (launcher, guard, admission, crash handling, metrics)
    "sglang.srt.entrypoints.http_server.launch_server": "launcher: init_tokenizer_manager_func= and launch_callback=",
    "sglang.srt.entrypoints.engine.init_tokenizer_manager": "TokenizerManagerClass=EssTokenizerManager",
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request":
        "extended in the EssTokenizerManager subclass: admission after tokenization",
    "sglang.srt.managers.tokenizer_manager.SignalHandler.running_phase_sigquit_handler":
        "overridden in a subclass set as signal_handler_class: one line + exit code on a dead child",
    "sglang.srt.entrypoints.http_server.get_global_state": "guard / admission read vocab, model names, pool size",
    "sglang.srt.entrypoints.openai.protocol.DEFAULT_MODEL_NAME": "the model name SGLang clients send by default",
    "sglang.srt.arg_groups.choices.add_deterministic_attention_backend_choices": "'ess' is deterministic",
    "sglang.srt.arg_groups.choices.add_radix_supported_deterministic_attention_backend_choices":
        "SGLang requires it for DeepSeek models in deterministic mode",
    "sglang.srt.environ.envs.SGLANG_DISTRIBUTED_INIT_METHOD_OVERRIDE": "file:// rendezvous: no TCPStore on all interfaces",
    "sglang.srt.environ.envs.SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "off without CUDA: no 60 s wait on a crash",
    "sglang.srt.environ.envs.SGLANG_PYSPY_DUMP_BEFORE_CRASH": "off without CUDA: no 5 s wait on a crash",
    # serving surface (issue 20): route guard, keys, shutdown
    "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request":
        "extended in EssTokenizerManager: the guard's field rules on every route's request object",
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._tokenize_texts":
        "extended in EssTokenizerManager: long prompts tokenized in a worker thread",
    "sglang.srt.managers.tokenizer_manager.TokenizerManager.sigterm_watchdog":
        "extended in EssTokenizerManager: bounded drain (shutdown.py), then SGLang's exit path",
    "sglang.srt.managers.tokenizer_manager.TokenizerManager.abort_request": "shutdown.end_all: abort_all",
    "sglang.srt.managers.tokenizer_manager.SignalHandler.sigterm_handler":
        "extended in EssSignalHandler: SIGTERM starts the drain (503 to new requests) at once",
    "sglang.srt.runtime_context.get_serving": "auth_keys.py: the warmup's internal token (override())",
}
