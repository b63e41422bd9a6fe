"""The console launcher (agentobs.console.serve): Streamlit's own CLI, with the console's modules imported first."""

from __future__ import annotations

import subprocess
import sys

from agentobs.console import APP, command


def test_command_runs_streamlit_through_the_launcher_on_loopback():
    cmd = command(port=1234)
    assert cmd[1:5] == ["-m", "agentobs.console.serve", "run", str(APP)]
    assert cmd[cmd.index("--server.address") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--server.port") + 1] == "1234"


def test_preload_imports_every_listed_module_in_a_fresh_process():
    # a fresh interpreter: none of PRELOAD is imported before, all of it after, and nothing failed
    code = ("import sys; from agentobs.console import serve; "
            "before = sorted(m for m in serve.PRELOAD if m in sys.modules); failed = serve.preload(); "
            "print(failed); print(sorted(set(serve.PRELOAD) - set(sys.modules))); print('pandas' in before); "
            "from streamlit import delta_generator as d; print(d._use_warning_has_been_displayed)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # and Streamlit's once-per-process "run it with `streamlit run`" check (an inspect.stack() of the first
    # page, ~0.18 s) is settled: the launcher is `streamlit run`
    assert out.stdout.splitlines() == ["[]", "[]", "False", "True"]


def test_the_launcher_hands_its_arguments_to_streamlit():
    out = subprocess.run([sys.executable, "-m", "agentobs.console.serve", "version"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Streamlit, version ")
    # the preload's imports do not print Streamlit's "no runtime yet" cache warnings at every start
    assert "No runtime found" not in out.stderr, out.stderr
