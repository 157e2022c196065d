"""Who may call which route: every route of SGLang's app (plus sgl-ess's) in one table.

Pure Python (no torch, no sglang). ``ROUTES`` classifies each path pattern; ``decide()`` turns a
class, the keys the server was started with and the bearer token a request presented into an
answer. A test walks the live app's route table and fails on any path this table does not name,
so an SGLang upgrade that adds a route is caught before it ships open.

Classes:
  public     load-balancer probes (/health, /ready, /ping): anyone, always
  inference  requests that run the model, and their helpers (tokenize, sessions): the user key
             when --api-key is set (the admin key is accepted too), else anyone
  status     read-only state (model info, /server_info with secrets redacted, /ess/status,
             /metrics, the API schema): same rule as inference
  operator   routes that change what every client sees (abort, flush, pause, weights, profiler,
             logging, overlap level): only the admin key; OFF when --admin-api-key is not set
  blocking   routes that can block the scheduler indefinitely (distributed weight-update groups,
             remote-instance weight transfer): off unless --guard-enable-blocking-routes true, then
             operator rules plus a reachability check and a timeout (route_guard.py)

Auth matrix (what ``decide`` returns; 401 = key missing or wrong, 403 = route off):

| class     | no keys   | --api-key only     | --admin-api-key only | both keys          |
| --------- | --------- | ------------------ | -------------------- | ------------------ |
| public    | anyone    | anyone             | anyone               | anyone             |
| inference | anyone    | user key           | anyone               | user or admin key  |
| status    | anyone    | user key           | anyone               | user or admin key  |
| operator  | 403 (off) | 403 (off)          | admin key            | admin key          |
| blocking  | 403 (off) | 403 (off)          | 403 unless enabled   | 403 unless enabled |
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass
from typing import Optional

PUBLIC, INFERENCE, STATUS, OPERATOR, BLOCKING = "public", "inference", "status", "operator", "blocking"
CLASSES = (PUBLIC, INFERENCE, STATUS, OPERATOR, BLOCKING)

ROUTES: dict[str, str] = {
    # probes
    "/health": PUBLIC, "/health_generate": PUBLIC, "/ready": PUBLIC, "/ping": PUBLIC, "/": PUBLIC,
    # inference (every route that builds a GenerateReqInput / EmbeddingReqInput, and helpers)
    "/generate": INFERENCE, "/encode": INFERENCE, "/classify": INFERENCE,
    "/v1/completions": INFERENCE, "/v1/chat/completions": INFERENCE, "/v1/embeddings": INFERENCE,
    "/v1/classify": INFERENCE, "/v1/score": INFERENCE, "/v1/decisions": INFERENCE, "/v1/rerank": INFERENCE,
    "/v1/responses": INFERENCE, "/v1/responses/{response_id}": INFERENCE,
    "/v1/responses/{response_id}/cancel": INFERENCE, "/v1/messages": INFERENCE,
    "/v1/messages/count_tokens": INFERENCE, "/v1/systemone": INFERENCE, "/v1/audio/transcriptions": INFERENCE,
    "/v1/realtime": INFERENCE, "/invocations": INFERENCE, "/vertex_generate": INFERENCE,
    "/api/chat": INFERENCE, "/api/generate": INFERENCE,
    "/tokenize": INFERENCE, "/v1/tokenize": INFERENCE, "/detokenize": INFERENCE, "/v1/detokenize": INFERENCE,
    "/parse_function_call": INFERENCE, "/separate_reasoning": INFERENCE,
    "/open_session": INFERENCE, "/close_session": INFERENCE,
    # read-only status
    "/get_model_info": STATUS, "/model_info": STATUS, "/v1/models": STATUS, "/v1/models/{model:path}": STATUS,
    "/api/tags": STATUS, "/api/show": STATUS, "/server_info": STATUS, "/get_server_info": STATUS,
    "/list_external_corpora": STATUS, "/ess/status": STATUS, "/metrics": STATUS,
    "/openapi.json": STATUS, "/docs": STATUS, "/docs/oauth2-redirect": STATUS, "/redoc": STATUS,
    # operator: changes what every client sees, or writes files on the server
    "/abort_request": OPERATOR, "/flush_cache": OPERATOR, "/pause_generation": OPERATOR,
    "/continue_generation": OPERATOR, "/slow_down": OPERATOR, "/set_internal_state": OPERATOR,
    "/configure_logging": OPERATOR, "/start_profile": OPERATOR, "/stop_profile": OPERATOR,
    "/set_trace_level": OPERATOR, "/freeze_gc": OPERATOR, "/dumper/{method}": OPERATOR,
    "/start_expert_distribution_record": OPERATOR, "/stop_expert_distribution_record": OPERATOR,
    "/dump_expert_distribution_record": OPERATOR,
    "/update_weights_from_disk": OPERATOR, "/update_weights_from_tensor": OPERATOR,
    "/update_weights_from_ipc": OPERATOR, "/begin_weight_update": OPERATOR, "/end_weight_update": OPERATOR,
    "/update_weight_version": OPERATOR, "/get_weights_by_name": OPERATOR, "/weights_checker": OPERATOR,
    "/release_memory_occupation": OPERATOR, "/resume_memory_occupation": OPERATOR,
    "/load_lora_adapter": OPERATOR, "/load_lora_adapter_from_tensors": OPERATOR, "/unload_lora_adapter": OPERATOR,
    "/add_external_corpus": OPERATOR, "/remove_external_corpus": OPERATOR,
    "/hicache/storage-backend": OPERATOR, "/hicache/storage-backend/clear": OPERATOR,
    "/get_hicache_l3_cache_layout": OPERATOR, "/pd_role_switch": OPERATOR,
    "/get_remote_instance_transfer_engine_info": OPERATOR, "/remote_instance_transfer_engine_info": OPERATOR,
    "/ess/overlap_level": OPERATOR,
    # can block the scheduler in a rendezvous with a peer the client names
    "/init_weights_update_group": BLOCKING, "/destroy_weights_update_group": BLOCKING,
    "/update_weights_from_distributed": BLOCKING, "/init_weights_send_group_for_remote_instance": BLOCKING,
    "/send_weights_to_remote_instance": BLOCKING,
}

_PARAM = re.compile(r"\{([^}:]+)(:path)?\}")


def _regex(pattern: str) -> re.Pattern:
    out, pos = [], 0
    for m in _PARAM.finditer(pattern):
        out.append(re.escape(pattern[pos:m.start()]))
        out.append(".+" if m.group(2) else "[^/]+")
        pos = m.end()
    out.append(re.escape(pattern[pos:]))
    return re.compile("^" + "".join(out) + "$")


_EXACT = {p: c for p, c in ROUTES.items() if "{" not in p}
_PATTERNS = [(_regex(p), c) for p, c in ROUTES.items() if "{" in p]


def classify(path: str) -> Optional[str]:
    """The class of a request path, or None when the table does not name it."""
    if path in _EXACT:
        return _EXACT[path]
    if path.startswith("/metrics"):
        return STATUS                                   # the Prometheus app is mounted under /metrics
    for rx, cls in _PATTERNS:
        if rx.match(path):
            return cls
    return None


# operator routes SGLang's launcher itself calls after warmup, with the launcher's internal token; allowed
# for that token even where operator routes are off (no --admin-api-key), so the default server starts clean
LAUNCHER_ROUTES = frozenset({"/freeze_gc"})


@dataclass(frozen=True)
class Keys:
    api_key: Optional[str] = None           # --api-key (users)
    admin_api_key: Optional[str] = None     # --admin-api-key (operators)
    internal_token: Optional[str] = None    # the launcher's own warmup requests (never logged)
    enable_blocking_routes: bool = False    # --guard-enable-blocking-routes


@dataclass(frozen=True)
class Decision:
    status: int                 # 0: allowed; else 401 / 403 / 404
    message: str = ""

    @property
    def allowed(self) -> bool:
        return self.status == 0


ALLOW = Decision(0)


def bearer(authorization: Optional[str]) -> Optional[str]:
    """The token of an ``Authorization: Bearer TOKEN`` header (None if absent or another scheme)."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _is(token: Optional[str], key: Optional[str]) -> bool:
    return bool(token and key) and hmac.compare_digest(token.encode(), key.encode())


def decide(path: str, token: Optional[str], keys: Keys) -> Decision:
    cls = classify(path)
    if cls is None:
        return Decision(404, f"{path}: no such route on this server")
    if cls == PUBLIC:
        return ALLOW
    admin = _is(token, keys.admin_api_key) or _is(token, keys.internal_token)
    if cls in (INFERENCE, STATUS):
        if not keys.api_key or admin or _is(token, keys.api_key):
            return ALLOW
        return Decision(401, "missing or wrong API key: send 'Authorization: Bearer <key>' with the server's "
                             "--api-key")
    if cls == BLOCKING and not keys.enable_blocking_routes:
        return Decision(403, f"{path} is off on this server: it can block the scheduler in a rendezvous with a "
                             f"peer the request names. Restart with --guard-enable-blocking-routes true (and "
                             f"--admin-api-key) to use it")
    if path in LAUNCHER_ROUTES and _is(token, keys.internal_token):
        return ALLOW                                    # SGLang's own post-warmup /freeze_gc, keys or not
    if not keys.admin_api_key:
        return Decision(403, f"{path} is an operator route, and operator routes are off on this server: restart "
                             f"with --admin-api-key to enable them")
    if admin:
        return ALLOW
    return Decision(401, f"{path} is an operator route: send 'Authorization: Bearer <key>' with the server's "
                         f"--admin-api-key")
