"""Exit codes of ``python -m sgl_ess.launch_server``: one per cause, so a supervisor can tell a bad
flag from a taken port from a crash. Every non-zero exit prints one line on stderr starting with
``sgl_ess.launch_server: error:`` (configuration) or ``sgl_ess.launch_server: fatal:`` (runtime).

| code | name           | when                                                                      |
| ---- | -------------- | ------------------------------------------------------------------------- |
| 0    | OK             | clean shutdown (SIGTERM / Ctrl-C; SIGTERM to the whole process group too) |
| 2    | CONFIG         | a flag, YAML value or combination refused; checked before the model loads |
| 3    | PORT_IN_USE    | ``--host:--port`` already has a listener; checked before the model loads  |
| 4    | STARTUP_FAILED | a server process died before the server was ready (model load, pools)    |
| 5    | PROCESS_DIED   | the scheduler, detokenizer or another server process died while serving   |

None of these is 137 (128 + SIGKILL), which supervisors read as "killed for memory".
"""

OK = 0
CONFIG = 2
PORT_IN_USE = 3
STARTUP_FAILED = 4
PROCESS_DIED = 5

NAMES = {OK: "OK", CONFIG: "CONFIG", PORT_IN_USE: "PORT_IN_USE", STARTUP_FAILED: "STARTUP_FAILED",
         PROCESS_DIED: "PROCESS_DIED"}
