# A notification callback of the Ansible tests (tests/tests/ansible.rs): every task result, one
# JSON line each, appended to the file named by $AGENTRUN_TEST_RESULTS. It records what Ansible
# reports; it changes nothing.
from __future__ import annotations

import json
import os

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: results
type: notification
short_description: write every task result as a JSON line (agent-run's tests)
description: Appends one JSON object a result to the file named by AGENTRUN_TEST_RESULTS.
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "results"
    CALLBACK_NEEDS_ENABLED = True

    def _write(self, status, result):
        path = os.environ.get("AGENTRUN_TEST_RESULTS")
        if not path:
            return
        line = json.dumps(
            {
                "host": result.host.get_name(),
                "task": result.task.get_name(),
                "status": status,
                "result": dict(result.result),
            },
            default=str,
            sort_keys=True,
        )
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")

    def v2_runner_on_ok(self, result):
        self._write("ok", result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._write("failed", result)

    def v2_runner_on_unreachable(self, result):
        self._write("unreachable", result)

    def v2_runner_on_skipped(self, result):
        self._write("skipped", result)
