"""No secret in a log line: every log record of the process passes ``redact_repr`` (secret-shaped
``name='value'`` fields, e.g. SGLang's ``ServerArgs(...)`` repr with ``ssl_keyfile_password``) and
``redact_command_line`` (``--admin-api-key X``). Installed as the logging record factory, so it
holds for every logger and handler, including ones SGLang configures later; once per process
(ops_hooks.py, loaded in every SGLang process, and the launcher)."""

from __future__ import annotations

import logging

from sgl_ess.serving.redact import redact_command_line, redact_repr

_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    base = logging.getLogRecordFactory()

    def factory(*args, **kwargs):
        record = base(*args, **kwargs)
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is logging's own business
            return record
        clean = redact_command_line(redact_repr(text))
        if clean != text:
            record.msg, record.args = clean, ()
        return record

    logging.setLogRecordFactory(factory)
