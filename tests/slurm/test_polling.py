"""The test clusters' poll cap (tests/slurm/polling.py) does what the SLURM tests count on: the
executor plugin's growing wait stops at the cap, and nothing changes without the variable."""

import os
import subprocess
import sys

from tests.slurm.polling import POLL_S, fast_polling

PROBE = """
import snakemake_executor_plugin_slurm as plugin
executor = object.__new__(plugin.Executor)
executor._next_seconds_between_status_checks = None
executor.next_seconds_between_status_checks = 95  # the plugin's wait after nine empty checks
print(executor.next_seconds_between_status_checks)
"""


def probe(env: dict[str, str]) -> float:
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout)


def test_the_plugin_wait_is_capped_only_where_the_test_asks():
    plain = {k: v for k, v in os.environ.items() if k != "VCLOUD_TEST_SLURM_POLL_S"}
    assert probe(fast_polling(dict(plain))) == float(POLL_S)
    assert probe(plain) == 95  # the plugin as users have it


def test_the_pace_folder_goes_on_the_path_once():
    env = fast_polling(fast_polling({"PYTHONPATH": "/elsewhere"}))
    assert env["PYTHONPATH"].split(os.pathsep)[1:] == ["/elsewhere"]
    assert env["PYTHONPATH"].endswith("pace" + os.pathsep + "/elsewhere")
