"""What an HTTP request meets on its way in.

  route_guard.py     outermost ASGI guard: route policy + auth, body limit, drain, operator dirs, redaction
  request_guard.py   400s naming the field and the range, in front of SGLang's app
  tokenizer.py       SGLang's TokenizerManager plus admission after tokenization and the crash handler
  health.py          ``GET /health`` reflecting ESS state
  status_route.py    ``GET /ess/status``
  runtime_config.py  ``POST /ess/overlap_level``: change the overlap level of a running server
  connection_limits.py  below the app (uvicorn's protocol): request-head deadline, connections per client
  rendezvous_bound.py   in the scheduler: the blocking routes' process-group rendezvous bounded by the guard's timeout
"""
